"""The LoRA keys and shapes PEFT creates for an adapter config on a base, from ``config.json`` alone (torch-free).

The registry's module tree (:mod:`adapterdoc.layouts.trees`) stands in for the meta-device model and PEFT 0.21's
injection rules are applied to it: ``all-linear`` (every Linear but the output layer), the minimal-suffix rewrite of
long target lists, ``target_modules`` / ``exclude_modules`` / ``modules_to_save`` / ``layers_to_transform``
(:func:`adapterdoc.adapter.peft_selects`), ``target_parameters`` (nested ParamWrappers over fused experts),
``rank_pattern`` / ``alpha_pattern``, embeddings (``lora_embedding_A/B``) and ``modules_to_save`` copies. Then an
adapter's names and shapes are matched the way ``PeftModel.load_adapter`` matches them.

Anything outside what is modelled (a LoRA variant, a field with a non-default value, a target PEFT would refuse or
handle specially, a key PEFT's transformers conversion could rename) raises :class:`~adapterdoc.layouts.trees.Unmodeled`,
and verify builds the base on the meta device instead (:mod:`adapterdoc.ml.meta`, the oracle this module is tested
against in ``tests/verify/test_expected_keys.py``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapterdoc.adapter import (
    WRAPPER,
    AdapterConfig,
    parse_key,
    pattern_key,
    peft_selects,
)
from adapterdoc.layouts import LAYOUTS, tower_segment
from adapterdoc.layouts.trees import EMBEDDING, EXPERTS, LINEAR, Node, Tree, Unmodeled, build_tree
from adapterdoc.ml.meta import ExpectedModel, KeyMatch, Shapes
from adapterdoc.verify.expected_config import (
    AdapterUnmodeled,
    KeysUnmodeled,
    PeftRefuses,
    alpha_error,
    check_config,
    layer_errors,
    rank_error,
)
from adapterdoc.verify.expected_load import has_renames, load_rename
from adapterdoc.verify.expected_moe import convert_config, convert_keys

ADAPTER = "default"
_MIN_TARGETS_FOR_OPTIMIZATION = 20
"""peft.utils.constants.MIN_TARGET_MODULES_FOR_OPTIMIZATION: longer target lists are condensed to suffixes."""
_EXPERT_PARAMS = ("gate_up_proj", "down_proj")

if TYPE_CHECKING:
    from adapterdoc.bases import BaseSpec


@dataclass(frozen=True)
class RegistryMatch:
    """How ``PeftModel.load_adapter`` matches an adapter's names and shapes to the keys the registry expects
    (the :class:`~adapterdoc.ml.meta.KeyMatcher` of a registry :class:`~adapterdoc.ml.meta.ExpectedModel`), as
    :class:`~adapterdoc.ml.meta.PeftLoad` finds them on the meta device."""

    tree: Tree
    """The tree, for PEFT's load-time renames and per-expert → fused key conversion (:func:`convert_keys`)."""
    aux: frozenset[str] = frozenset()
    """Expected keys of ``modules_to_save`` copies (never reported missing, as PEFT's loader does not)."""
    by_model_name: Mapping[str, str] = field(default_factory=dict)
    """Model naming (``lora_A.default.weight``) → saved naming, for adapters that kept the adapter name."""

    def match(self, model: ExpectedModel, shapes: Shapes) -> KeyMatch:
        converted = False
        if has_renames(self.tree.model_type, self.tree.model_class):
            with contextlib.suppress(Unmodeled):  # only candidates scored for a move get here: unrenamed
                renamed = load_rename(self.tree.model_type, self.tree.model_class, shapes)
                converted, shapes = set(renamed) != set(shapes), renamed  # the meta path's `converted`
        if self.tree.peft_moe is not None:
            try:
                shapes, fused = convert_keys(self.tree, shapes)
                converted = converted or fused
            except Unmodeled:  # only renamed candidates scored for a move get here; judged unconverted
                pass
        expected = model.expected
        loaded: dict[str, tuple[int, ...]] = {}
        unexpected: list[str] = []
        for key, shape in shapes.items():
            saved = key if key in expected else self.by_model_name.get(key)
            if saved is None:
                unexpected.append(key)
            else:
                loaded[saved] = tuple(shape)
        missing = sorted(
            k + ".weight" if k.endswith(".lora_magnitude_vector") else k  # the meta path names the model key
            for k in expected
            if k not in loaded and k not in self.aux
        )
        mismatch = sorted((k, s, expected[k]) for k, s in loaded.items() if s != expected[k])
        return KeyMatch(missing, sorted(unexpected), mismatch, len(loaded), converted)


# --------------------------------------------------------------------------------------------- the adapter config


def _strings(value: object, name: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AdapterUnmodeled(f"`{name}` is not a list of strings")
    return value


def _as_set_snapshot(value: object) -> object:
    if isinstance(value, (set, frozenset, list, tuple)):
        value = sorted(value)
    elif isinstance(value, dict):
        value = dict(sorted(value.items()))
    return value or None


def _snapshot(
    tm: object, tp: object, rank: Mapping[str, object], alpha: Mapping[str, object], mts: object
) -> dict[str, object]:
    """The fields :func:`adapterdoc.ml.meta._snapshot` records, in its normal form."""
    return {
        "target_modules": _as_set_snapshot(tm),
        "target_parameters": _as_set_snapshot(tp),
        "rank_pattern": _as_set_snapshot(rank),
        "alpha_pattern": _as_set_snapshot(alpha),
        "modules_to_save": _as_set_snapshot(mts),
    }


def _minimal_targets(targets: set[str], others: set[str]) -> set[str]:
    """peft.tuners.tuners_utils._find_minimal_target_modules."""

    def suffixes(s: str) -> list[str]:
        parts = s.split(".")
        return [".".join(parts[i:]) for i in range(len(parts))][::-1]

    other_suffixes = {x for item in others for x in suffixes(item)}
    required: set[str] = set()
    for item, sufs in sorted(((t, suffixes(t)) for t in targets), key=lambda tup: tup[1]):
        for suffix in sufs:
            if suffix in required or suffix in other_suffixes:
                continue
            if not any(item.endswith("." + r) for r in required):
                required.add(suffix)
                break
    return required or set(targets)


# --------------------------------------------------------------------------------------------- injection


def registry_adapter(
    tree: Tree, acfg: AdapterConfig, shapes: Shapes | None = None, base: BaseSpec | None = None
) -> ExpectedModel:
    """What PEFT creates for ``acfg`` on ``tree``; :class:`Unmodeled` when the registry cannot say exactly.

    ``shapes`` (the adapter's tensor names and shapes) lets the registry refuse adapters whose keys PEFT's loader
    would rename or read in ways not modelled here (per-expert keys, DoRA magnitudes, whole weights)."""
    raw = acfg.raw
    check_config(raw, acfg.path)
    if raw.get("task_type") == "CAUSAL_LM" and LAYOUTS[tree.layout].is_encoder:
        raise AdapterUnmodeled(
            "task_type CAUSAL_LM on an encoder (PEFT's causal-LM model needs generation methods)"
        )
    r = raw.get("r", 8)
    tm_raw = raw.get("target_modules")
    tm: Any = tm_raw if isinstance(tm_raw, str) else _strings(tm_raw, "target_modules")
    excl_raw = raw.get("exclude_modules")
    excl: Any = excl_raw if isinstance(excl_raw, str) else _strings(excl_raw, "exclude_modules")
    tp: list[str] | set[str] | None = _strings(raw.get("target_parameters"), "target_parameters")
    mts_raw = raw.get("modules_to_save")
    if isinstance(mts_raw, str):
        raise AdapterUnmodeled(
            "modules_to_save is a string, whose letters PEFT matches one by one (AD114): not modelled"
        )
    mts = _strings(mts_raw, "modules_to_save")
    rank_pattern, alpha_pattern = dict(raw.get("rank_pattern") or {}), dict(raw.get("alpha_pattern") or {})
    ltt, lp = raw.get("layers_to_transform"), raw.get("layers_pattern")
    if ltt is not None and not (
        (isinstance(ltt, int) and not isinstance(ltt, bool))
        or (isinstance(ltt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ltt))
    ):
        raise AdapterUnmodeled("layers_to_transform is not an int or a list of ints (AD114): not modelled")
    if lp is not None and not isinstance(lp, str):
        _strings(lp, "layers_pattern")
    if tm is None and tp is None:
        raise AdapterUnmodeled("no target_modules: PEFT would pick its default targets for the model type")
    if tp is not None and any(p.rpartition(".")[2] not in _EXPERT_PARAMS for p in tp):
        raise AdapterUnmodeled("target_parameters other than fused-expert gate_up_proj/down_proj")
    if shapes is not None:
        _check_keys(shapes, tree.peft_moe is not None)

    before = _snapshot(set(tm) if isinstance(tm, list) else tm, tp, rank_pattern, alpha_pattern, mts)
    try:
        tm, tp, rank_pattern, alpha_pattern = convert_config(
            tree, tm, tp, rank_pattern, alpha_pattern, raw, excl, mts
        )
    except PeftRefuses as e:
        return _refused(tree, base, before, str(e))
    except re.error as e:
        raise AdapterUnmodeled(f"a pattern is not a valid regex: {e}") from None
    if tp and raw.get("lora_dropout", 0.0) != 0:
        raise AdapterUnmodeled("lora_dropout != 0 with target_parameters (PEFT refuses it)")
    nodes = {n.name: n for n in tree.nodes}
    names = tree.names
    try:
        if isinstance(tm, str) and tm.lower() == "all-linear":
            tm = {n.name for n in tree.nodes if n.kind == LINEAR} - {tree.output_embedding}
        elif isinstance(tm, list):
            tm = set(tm)
        if isinstance(tm, set) and len(tm) >= _MIN_TARGETS_FOR_OPTIMIZATION:
            if "" in tm:
                raise AdapterUnmodeled("an empty target_modules entry")
            suffixes = tuple("." + s for s in tm)
            others = {n for n in names if n not in tm and not n.endswith(suffixes)}
            condensed = _minimal_targets(tm, others)
            if len(condensed) < len(tm):
                tm = condensed
        selected = [n for n in names if peft_selects(n, tm, excl, mts, ltt, lp)]
        saved_copies = _modules_to_save(tree, mts, nodes)
    except re.error as e:
        raise AdapterUnmodeled(f"a pattern is not a valid regex: {e}") from None

    expected: dict[str, tuple[int, ...]] = {}
    by_model: dict[str, str] = {}
    injected: list[str] = []

    errors: list[str] = []
    dora, lora_bias = bool(raw.get("use_dora")), bool(raw.get("lora_bias"))  # PEFT tests truthiness (AD112)

    def add(key: str, shape: tuple[int, ...], model_key: str) -> None:
        expected[WRAPPER + key] = shape
        by_model[WRAPPER + model_key] = WRAPPER + key

    def rank_of(name: str) -> int:
        k = pattern_key(rank_pattern, name)
        rank = rank_pattern[k] if k is not None else r
        a = pattern_key(alpha_pattern, name)
        alpha = alpha_pattern[a] if a is not None else raw.get("lora_alpha", 8)
        why = rank_error(rank) or alpha_error(alpha)
        if why:
            errors.append(why)
            return 1
        assert isinstance(rank, int)  # rank_error passes ints only
        return int(rank)

    for name in selected:
        node = nodes[name]
        if node.kind not in (LINEAR, EMBEDDING):
            raise AdapterUnmodeled(
                f"target `{name}` is a {node.kind} module (PEFT wraps it differently or refuses it)"
            )
        if tree.tied and name in (tree.output_embedding, tree.input_embedding):
            raise AdapterUnmodeled(f"target `{name}` shares its weight with the tied embeddings")
        rank = rank_of(name)
        weight = dict(node.params)["weight"]
        if node.kind == LINEAR:
            add(f"{name}.lora_A.weight", (rank, weight[1]), f"{name}.lora_A.{ADAPTER}.weight")
            add(f"{name}.lora_B.weight", (weight[0], rank), f"{name}.lora_B.{ADAPTER}.weight")
            if lora_bias:
                add(f"{name}.lora_B.bias", (weight[0],), f"{name}.lora_B.{ADAPTER}.bias")
            out_dim = weight[0]
        else:
            if lora_bias:
                errors.append(f"lora_bias=True is not supported for {name}'s Embedding layer.")
            add(f"{name}.lora_embedding_A", (rank, weight[0]), f"{name}.lora_embedding_A.{ADAPTER}")
            add(f"{name}.lora_embedding_B", (weight[1], rank), f"{name}.lora_embedding_B.{ADAPTER}")
            out_dim = weight[1]
        if dora:
            mag = f"{name}.lora_magnitude_vector"
            add(mag, (out_dim,), f"{mag}.{ADAPTER}.weight")
        injected.append(name)

    params: Collection[str] = tp or ()
    for node in tree.nodes if params else ():
        router = node.name in tree.other_params
        hits = [
            (p, shape)
            for p, shape in (tree.other_params[node.name] if router else node.params)
            if f"{node.name}.{p}" in params or any(f"{node.name}.{p}".endswith(f".{t}") for t in params)
        ]
        if not hits:
            continue
        if (node.kind != EXPERTS and not router) or node.name in selected:
            raise AdapterUnmodeled(
                f"target_parameters reach `{node.name}`, which is not a fused-expert module"
            )
        if dora or lora_bias:
            raise AdapterUnmodeled("use_dora / lora_bias with target_parameters (PEFT's ParamWrapper)")
        for depth, (p, shape) in enumerate(hits):
            path = node.name + ".base_layer" * (len(hits) - 1 - depth)
            rank = rank_of(f"{node.name}.{p}")
            experts, dim1, dim2 = shape if len(shape) == 3 else (1, *shape)
            add(f"{path}.lora_A.weight", (rank * experts, dim2), f"{path}.lora_A.{ADAPTER}.weight")
            add(f"{path}.lora_B.weight", (dim1, rank * experts), f"{path}.lora_B.{ADAPTER}.weight")
        injected.append(node.name)
    if not injected:
        targets = sorted(tm) if isinstance(tm, (set, list)) else tm
        return _refused(tree, base, before, f"Target modules {targets} not found in the base model.")
    errors += filter(None, [layer_errors(raw)])
    if errors:
        return _refused(tree, base, before, errors[0])

    aux: set[str] = set()
    for name in saved_copies:
        for p, shape in nodes[name].params:
            add(f"{name}.{p}", shape, f"{name}.modules_to_save.{ADAPTER}.{p}")
            aux.add(WRAPPER + f"{name}.{p}")
    renamed = shapes
    if shapes is not None and tree.load_conversion:
        if not has_renames(tree.model_type, tree.model_class):
            raise KeysUnmodeled(f"PEFT's load-time conversion for {tree.model_type} is not modelled")
        renamed = load_rename(tree.model_type, tree.model_class, shapes)
    converted = convert_keys(tree, renamed)[0] if renamed is not None and tree.peft_moe else renamed
    for key in converted or ():
        if key in expected or key not in (
            renamed or {}
        ):  # expected, or written by the modelled expert conversion
            continue
        if parse_key(key).role == "full":
            raise KeysUnmodeled(
                f"adapter key `{key}` may name a base weight (PEFT's loader would compare it)"
            )
    after = _snapshot(tm, tp, rank_pattern, alpha_pattern, mts)
    return ExpectedModel(
        base=base,
        model_class=tree.model_class,
        model_type=tree.model_type,
        base_modules=tuple(names),
        lora_capable_leaves=_leaf_kinds(tree),
        expected=expected,
        injected_modules=tuple(sorted(set(injected))),
        config_before=before,
        config_after=after,
        matcher=RegistryMatch(tree, frozenset(aux), by_model),
        layout=tree.layout,
        source="registry",
    )


def _refused(tree: Tree, base: BaseSpec | None, before: dict[str, object], why: str) -> ExpectedModel:
    """PEFT raises on injection (the meta path's ``inject_error``): nothing is expected, every key unexpected."""
    return ExpectedModel(
        base=base,
        model_class=tree.model_class,
        model_type=tree.model_type,
        base_modules=tuple(tree.names),
        lora_capable_leaves=_leaf_kinds(tree),
        expected={},
        injected_modules=(),
        config_before=before,
        config_after=before,
        layout=tree.layout,
        inject_error=why,
        source="registry",
    )


def _modules_to_save(tree: Tree, mts: list[str] | None, nodes: Mapping[str, Node]) -> list[str]:
    """Modules PEFT copies for ``modules_to_save`` (``name.endswith(entry)``), where the registry can say exactly."""
    out: list[str] = []
    for entry in mts or ():
        hits = [n for n in tree.names if n.endswith(entry)]
        for name in hits:
            node = nodes[name]
            if node.kind not in (LINEAR, EMBEDDING):
                raise AdapterUnmodeled(f"modules_to_save `{entry}` reaches `{name}`, a {node.kind} module")
            if not re.match(rf"(^|.*\.){entry}($|\..*)", name):
                raise AdapterUnmodeled(f"modules_to_save `{entry}` matches `{name}` as a suffix only")
            if tree.tied and name in (tree.output_embedding, tree.input_embedding):
                raise AdapterUnmodeled(f"modules_to_save `{name}` shares its weight with the tied embeddings")
            out.append(name)
    if len(set(out)) != len(out) or any(a != b and b.startswith(a + ".") for a in out for b in out):
        raise AdapterUnmodeled("modules_to_save entries overlap")
    return out


def _check_keys(shapes: Mapping[str, tuple[int, ...]], converts: bool) -> None:
    """Refuse keys PEFT reads in ways not modelled; per-expert keys are :func:`convert_keys`' to judge where
    PEFT converts them (``converts``)."""
    for key in shapes:
        k = parse_key(key)
        if k.role not in (
            "lora_A",
            "lora_B",
            "lora_B.bias",
            "magnitude",
            "lora_embedding_A",
            "lora_embedding_B",
            "full",
        ):
            raise KeysUnmodeled(f"adapter key `{key}` ({k.role}) is read by PEFT in ways not modelled")
        if not converts and re.search(r"\.experts\.\d+\.", k.module):
            raise KeysUnmodeled(f"per-expert key `{key}`: PEFT's transformers conversion may fuse it")
        if k.role == "full" and not key.startswith(WRAPPER):
            raise KeysUnmodeled(f"adapter key `{key}` is not a LoRA tensor")


def _leaf_kinds(tree: Tree) -> dict[str, bool]:
    """:func:`adapterdoc.ml.meta._leaf_kinds` on the registry tree."""
    leaves: dict[str, bool] = {}
    for node in tree.nodes:
        fused = any(len(shape) == 3 for _, shape in node.params)
        if node.kind not in (LINEAR, EMBEDDING) and not fused:
            continue
        leaf = node.name.rpartition(".")[2]
        key = "experts" if fused and leaf == "experts" else leaf
        leaves[key] = leaves.get(key, False) or tower_segment(node.name) is None
    return leaves


__all__ = ["RegistryMatch", "Unmodeled", "build_tree", "registry_adapter"]
