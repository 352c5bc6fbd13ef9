"""PEFT's per-expert → fused rewrites on the registry's tree (torch-free), for model types with
:attr:`~adapterdoc.layouts.trees.Tree.peft_moe`: the adapter config at injection and the adapter's keys at load.

The rules come from peft 0.21.2 ``utils/transformers_weight_conversion.py`` read against transformers 5.24
``conversion_mapping.py`` (the ``qwen2_moe`` pattern): they are data here
(:class:`~adapterdoc.layouts.registry.PeftMoeConversion`), applied by our own code.

* **Config** (``_convert_peft_config_moe``, run first thing in ``inject_adapter``): a string ``target_modules``
  is resolved to leaf names (``all-linear``: every Linear's leaf but the output layer's, plus every old leaf;
  a regex: the leaves of the module and parameter names it matches, plus an old leaf whose fused parameter's
  container matches as ``<container>.<old>``); then each target equal to an old leaf or ending in ``.old``
  moves to ``target_parameters`` as its new name, the fused pairs must be whole, and a whole pair sets
  ``rank_pattern`` / ``alpha_pattern`` ``.*\\.<fused>`` to ``r`` / ``lora_alpha`` times its size.
* **Keys** (``convert_peft_adapter_state_dict_for_transformers`` at ``load_adapter``): per-expert LoRA tensors
  ``<block>.experts.<e>.<gate|up|down>_proj.lora_<A|B>.weight`` of a complete, uniform block are merged over the
  experts (gate and up concatenated along the rank, ``lora_B`` block-diagonal) into
  ``<block>.experts.base_layer.lora_*`` (gate/up) and ``<block>.experts.lora_*`` (down), flattened the way PEFT's
  fused ParamWrapper stores them. Anything less regular raises :class:`Unmodeled`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from adapterdoc.adapter import WRAPPER, peft_selects
from adapterdoc.layouts.trees import EMBEDDING, EXPERTS, LINEAR, Tree
from adapterdoc.verify.expected_config import AdapterUnmodeled, KeysUnmodeled, PeftRefuses

_PER_EXPERT = re.compile(
    r"^"
    + re.escape(WRAPPER)
    + r"(?P<block>.+)\.experts\.(?P<e>\d+)\.(?P<leaf>[^.]+)\.(?P<ab>lora_[AB])\.weight$"
)


Targets = str | list[str] | set[str] | None
"""``target_modules`` as PEFT reads it: a regex, names, or none."""


def _param_keys(tree: Tree) -> list[tuple[str, str, bool]]:
    """(parameter name, its leaf, whether the registry knows it exists) for PEFT's regex resolution."""
    out: list[tuple[str, str, bool]] = []
    for node in tree.nodes:
        own = node.params if node.kind in (LINEAR, EMBEDDING, EXPERTS) else tree.other_params.get(node.name)
        if own is not None:
            out += [(f"{node.name}.{p}", p, True) for p, _ in own]
        elif tree.own is not None:
            out += [(f"{node.name}.{p}", p, True) for p in tree.own.get(node.name, ())]
        else:  # a norm, conv or container: whether it owns a weight/bias is not in the tree
            out += [(f"{node.name}.{p}", p, False) for p in ("weight", "bias")]
    return out


def _resolve(tree: Tree, tm: str, excl: str | list[str] | None, mts: list[str] | None) -> set[str]:
    """``_resolve_string_target_modules`` on the tree."""
    conv = tree.peft_moe
    assert conv is not None
    olds = [old for old, _ in conv.renames]
    if tm.lower() == "all-linear":
        linear = {n.name for n in tree.nodes if n.kind == LINEAR} - {tree.output_embedding}
        return {name.rpartition(".")[2] for name in linear} | set(olds)
    matched = {n.name.rpartition(".")[2] for n in tree.nodes if peft_selects(n.name, tm, excl, mts)}
    params = _param_keys(tree)
    for key, leaf, known in params:
        if peft_selects(key, tm, excl, mts):
            if not known:
                raise AdapterUnmodeled(
                    f"target_modules regex matches `{key}`, a parameter the registry cannot vouch for"
                )
            matched.add(leaf)
    containers: dict[str, list[str]] = {}
    for key, leaf, known in params:
        if known:
            containers.setdefault(leaf, []).append(key.rpartition(".")[0])
    for old, new in conv.renames:
        if old not in matched and any(
            peft_selects(f"{c}.{old}", tm, excl, mts) for c in containers.get(new, ())
        ):
            matched.add(old)
    return matched


def convert_config(
    tree: Tree,
    tm: Targets,
    tp: list[str] | set[str] | None,
    rank: dict[str, object],
    alpha: dict[str, object],
    raw: Mapping[str, object],
    excl: str | list[str] | None,
    mts: list[str] | None,
) -> tuple[Targets, list[str] | set[str] | None, dict[str, object], dict[str, object]]:
    """(target_modules, target_parameters, rank_pattern, alpha_pattern) after PEFT's config rewrite."""
    conv = tree.peft_moe
    if conv is None:
        return tm, tp, rank, alpha
    if isinstance(tm, str):
        resolved = _resolve(tree, tm, excl, mts)
        if not resolved:
            return tm, tp, rank, alpha
        tm = resolved
    rank, alpha = dict(rank), dict(alpha)
    params = set(tp or ())
    remaining: set[str] = set()
    matched: dict[str, set[str]] = {new: set() for new, _ in conv.fused}
    for target in set(tm or ()):
        hit = next(((o, n) for o, n in conv.renames if target == o or target.endswith(f".{o}")), None)
        if hit is None:
            remaining.add(target)
            continue
        params.add(hit[1])
        matched.setdefault(hit[1], set()).add(hit[0])
    for new, olds in conv.fused:
        present = matched.get(new, set())
        if 0 < len(present) < len(olds):
            missing = ", ".join(sorted(set(olds) - present))
            raise PeftRefuses(
                f"cannot convert target(s) {', '.join(sorted(present))} without also "
                f"targeting {missing} because they are fused into {new}"
            )
        if len(present) == len(olds) and len(olds) > 1:
            # the values as the config holds them: PEFT doubles them as they are (verify judges them later)
            r: Any = raw.get("r", 8)
            lora_alpha: Any = raw.get("lora_alpha", 8)
            rank[rf".*\.{re.escape(new)}"] = int(r) * len(olds)
            alpha[rf".*\.{re.escape(new)}"] = lora_alpha * len(olds)
    return remaining, params, rank, alpha


def convert_keys(
    tree: Tree, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, tuple[int, ...]], bool]:
    """The adapter's names and shapes after PEFT's load-time conversion, and whether it renamed any; keys it would
    merge in ways not modelled (an incomplete or ragged block, a non-MoE ``experts`` path) raise Unmodeled."""
    conv = tree.peft_moe
    groups: dict[str, dict[tuple[str, str], dict[int, tuple[int, ...]]]] = {}
    out: dict[str, tuple[int, ...]] = {}
    for key, shape in shapes.items():
        m = _PER_EXPERT.match(key)
        if m is None:
            out[key] = tuple(shape)
            continue
        if conv is None:
            raise KeysUnmodeled(f"per-expert key `{key}` on a model type PEFT does not convert")
        groups.setdefault(m["block"], {}).setdefault((m["leaf"], m["ab"]), {})[int(m["e"])] = tuple(shape)
    if not groups:
        return out, False
    assert conv is not None  # per-expert keys on a model type PEFT does not convert raised above
    nodes = {n.name: n for n in tree.nodes}
    fused_of = {old: new for old, new in conv.renames}
    for block, parts in groups.items():
        node = nodes.get(f"{block}.experts")
        if node is None or node.kind != EXPERTS:
            raise KeysUnmodeled(
                f"per-expert keys under `{block}`, which is not a fused-experts block of this base"
            )
        experts = dict(node.params)["gate_up_proj"][0]
        leaves = {leaf for leaf, _ in parts}
        if not leaves <= {"gate_proj", "up_proj", "down_proj"} or ("gate_proj" in leaves) != (
            "up_proj" in leaves
        ):
            raise KeysUnmodeled(
                f"per-expert keys under `{block}` that PEFT's conversion would merge partially"
            )
        for (leaf, ab), by_e in parts.items():
            if sorted(by_e) != list(range(experts)) or len(set(by_e.values())) != 1:
                raise KeysUnmodeled(
                    f"per-expert `{leaf}.{ab}` under `{block}` is not one uniform tensor per expert"
                )
            if any(len(s) != 2 for s in by_e.values()):
                raise KeysUnmodeled(f"per-expert `{leaf}.{ab}` under `{block}` is not 2-D")
            if (leaf, "lora_B" if ab == "lora_A" else "lora_A") not in parts:
                raise KeysUnmodeled(f"per-expert `{leaf}` under `{block}` has only {ab}")
        for new in dict.fromkeys(fused_of[leaf] for leaf, _ in parts):
            olds = [o for o, n in conv.renames if n == new]
            path = f"{WRAPPER}{block}.experts" + (".base_layer" if len(olds) > 1 else "")
            a = [parts[(o, "lora_A")][0] for o in olds]
            b = [parts[(o, "lora_B")][0] for o in olds]
            if len({s[1] for s in a}) != 1:
                raise KeysUnmodeled(f"per-expert lora_A of {', '.join(olds)} under `{block}` differ in width")
            ra, rb = sum(s[0] for s in a), sum(s[1] for s in b)
            for key, shape in (
                (f"{path}.lora_A.weight", (experts * ra, a[0][1])),
                (f"{path}.lora_B.weight", (sum(s[0] for s in b), experts * rb)),
            ):
                if key in out:
                    raise KeysUnmodeled(f"`{key}` is in the adapter and PEFT's conversion also writes it")
                out[key] = shape
    return out, True
