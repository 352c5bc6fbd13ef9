"""Planning a merge from headers alone, where they can vouch for it: no transformers, no peft, no torch.

The base's module tree comes from the registry for a registry family (:func:`adapterdoc.layouts.trees.build_tree`:
names, kinds and weight shapes of ``named_modules()`` from ``config.json``), and for any other plain causal LM from
the base's own tensor names (:func:`adapterdoc.merge.header_tree.header_tree`: its Linear modules inside the layers,
for a class transformers loads without converting keys). The adapter config gives the modules PEFT wraps
(:func:`adapterdoc.adapter.peft_selects`) and each one's scaling (``lora_alpha / r``, ``/ sqrt(r)`` with rsLoRA,
``rank_pattern`` / ``alpha_pattern`` by PEFT's ``get_pattern_key``); the headers give every tensor's name, dtype
and shape. When every adapter module is a plain LoRA ``Linear`` or ``Embedding`` that PEFT creates for the config,
whose weight is stored whole under its own in-memory name, the plan is the one :func:`adapterdoc.merge.plan.make_plan`
builds on the meta-device model (``tests/merge/test_header_plan.py`` proves it byte for byte on every tiny layout,
``tests/merge/test_header_plan_any_family.py`` on tiny models of families outside the registry).

Anything else is :class:`Unvouched` (its message says why), and the meta-model plan runs instead: DoRA, LoRA bias,
``modules_to_save``, trainable tokens, whole weights, fused experts or ``target_parameters``, a model type with
load-time conversions, tied embeddings, a key or config field not listed here, any shape or name that does not fit;
outside the registry also LoRA on an embedding or the output head, a transposed (Conv1D) base, remote code, a
quantized base, and a target that could name a module without parameters (which no header shows).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping

from adapterdoc.adapter import parse_key, pattern_key, peft_selects
from adapterdoc.checkpoint import Checkpoint
from adapterdoc.layouts.registry import LAYOUTS
from adapterdoc.layouts.trees import EMBEDDING, LINEAR, TREES, Node, Tree, Unmodeled, build_tree
from adapterdoc.merge.edits import HEADERS, Edit, Plan
from adapterdoc.merge.header_tree import HEADER_LAYOUT, header_tree
from adapterdoc.merge.plan import finish_plan
from adapterdoc.ml.inject import LoraTarget
from adapterdoc.ml.names import Piece
from adapterdoc.st.dtypes import FLOAT_DTYPES
from adapterdoc.verify.expected_config import METADATA, MODELLED, TASK_TYPES

_OFF: tuple[object, ...] = (None, False, {}, [], 0, "", ())
"""Values of a LoraConfig field that switch nothing on."""
_HANDLED = MODELLED - {"modules_to_save", "target_parameters", "use_dora", "lora_bias"}
"""The fields this planner reads: those verify's registry path models (:data:`~adapterdoc.verify.expected_config.MODELLED`)
but the four that make layers or keys it leaves to the meta-model plan (set to anything but off, they send it there).
:data:`~adapterdoc.verify.expected_config.METADATA` are the fields that change nothing PEFT creates."""
_RENAMED_LEAVES = ("gamma", "beta", "weight_g", "weight_v")
"""Parameter names transformers renames on load for every model (legacy LayerNorm and weight-norm spellings)."""
_ROLES = {LINEAR: ("lora_A", "lora_B"), EMBEDDING: ("lora_embedding_A", "lora_embedding_B")}


class Unvouched(Exception):
    """The header plan cannot vouch for this merge; the message says why (the meta-model plan runs instead)."""


def header_plan(
    adapter: Checkpoint, base: Checkpoint, dtype: str, *, config: Mapping[str, object] | None = None
) -> Plan:
    """The merge plan from headers and config files alone; :class:`Unvouched` where the registry cannot say.
    ``config``: the config to plan with instead of the base's ``config.json`` (a quantized base's decoded view)."""
    assert adapter.adapter_config is not None
    tree = _tree(base, config)
    raw = adapter.adapter_config.raw
    selected = _selected(tree, raw)
    groups = _groups(adapter)
    if set(groups) != set(selected):
        extra = sorted(set(groups) - set(selected)) or sorted(set(selected) - set(groups))
        raise Unvouched(f"the adapter's modules are not the ones PEFT creates (e.g. `{extra[0]}`)")
    edits: dict[str, list[Edit]] = {}
    pieces: dict[str, Piece] = {}
    applied: list[str] = []
    for name, node in selected.items():  # the model's module order, as PEFT merges them
        target = _target(node, raw, groups[name], adapter, base)
        keys = groups[name]
        a_role, b_role = _ROLES[node.kind]
        edits[target.param] = [Edit("lora", name, {"A": keys[a_role], "B": keys[b_role]}, target)]
        pieces[target.param] = Piece(target.param, target.param)
        applied.append(name)
    return finish_plan(
        adapter, base, dtype, edits, pieces, applied=applied, model_class=tree.model_class, planner=HEADERS
    )


def _tree(base: Checkpoint, config: Mapping[str, object] | None) -> Tree:
    """The base's module tree, if the base's on-disk names are its in-memory names as they load: the registry's
    for a registry family, else the one read off the base's own headers (:mod:`adapterdoc.merge.header_tree`)."""
    path = os.path.join(base.root, "config.json")
    raw: object = config
    try:
        if raw is None:
            with open(path, "rb") as f:
                raw = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise Unvouched(f"config.json cannot be read: {e}") from None
    if not isinstance(raw, dict) or "auto_map" in raw:
        raise Unvouched("config.json is not a plain transformers config")
    if not _in_registry(raw):
        try:
            return header_tree(raw, base.tensors)
        except Unmodeled as e:
            raise Unvouched(str(e)) from None
    try:
        tree = build_tree(raw)
    except Unmodeled as e:
        raise Unvouched(str(e)) from None
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
    ) as e:  # a config value the builder did not expect
        raise Unvouched(f"the registry's tree builder failed: {type(e).__name__}: {e}") from None
    if tree.load_conversion or tree.peft_moe is not None:
        raise Unvouched(f"transformers or PEFT convert {tree.model_type} checkpoints on load")
    names = set(tree.names)
    for key in base.tensors:
        owner, _, leaf = key.rpartition(".")
        if owner not in names or leaf in _RENAMED_LEAVES:
            raise Unvouched(f"the base tensor `{key}` is not stored under its in-memory name")
    return tree


def _in_registry(raw: Mapping[str, object]) -> bool:
    """Whether a registry layout describes this config's model type (and class, where the config names one)."""
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return (str(raw.get("model_type")), archs[0]) in TREES or any(
            lay.model_type == raw.get("model_type") and lay.model_class == archs[0]
            for lay in LAYOUTS.values()
        )
    return any(lay.model_type == raw.get("model_type") for lay in LAYOUTS.values())


def _number(value: object, what: str, *, integer: bool) -> int | float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (integer and (not isinstance(value, int) or value <= 0))
    ):
        raise Unvouched(f"{what} is {value!r}")
    return value


def _strings(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Unvouched(f"`{what}` is not a list of names")
    return value


def _patterns(raw: Mapping[str, object], field: str, *, integer: bool) -> dict[str, int | float]:
    value = raw.get(field) or {}
    if not isinstance(value, dict):
        raise Unvouched(f"`{field}` is not an object")
    out: dict[str, int | float] = {}
    for k, v in value.items():
        try:
            re.compile(rf"(.*\.)?({k})$")
        except re.error:
            raise Unvouched(f"`{field}` key {k!r} is not a valid regex") from None
        out[k] = _number(v, f"`{field}[{k!r}]`", integer=integer)
    return out


def _check_config(raw: Mapping[str, object]) -> None:
    """Every field of the adapter config is one this planner models, or switched off."""
    if str(raw.get("peft_type") or "LORA").upper() != "LORA":
        raise Unvouched("peft_type is not LORA")
    for key, value in raw.items():
        if key in METADATA or key in _HANDLED or value in _OFF:
            continue
        raise Unvouched(f"adapter config field `{key}` = {value!r}")
    if raw.get("task_type") not in TASK_TYPES:
        raise Unvouched(f"task_type {raw.get('task_type')!r}")
    if raw.get("bias", "none") != "none":
        raise Unvouched(f"bias {raw.get('bias')!r}")
    if raw.get("fan_in_fan_out", False) is not False:
        raise Unvouched("fan_in_fan_out is set")
    if raw.get("init_lora_weights", True) not in (True, False, "gaussian"):
        raise Unvouched(f"init_lora_weights {raw.get('init_lora_weights')!r}")
    if raw.get("use_rslora", False) not in (True, False):
        raise Unvouched(f"use_rslora {raw.get('use_rslora')!r}")
    dropout = raw.get("lora_dropout", 0.0)
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool):
        raise Unvouched(f"lora_dropout {dropout!r}")


def _selected(tree: Tree, raw: Mapping[str, object]) -> dict[str, Node]:
    """The modules PEFT wraps for ``raw`` on ``tree``, in module order (each a plain Linear or Embedding)."""
    _check_config(raw)
    _number(raw.get("r", 8), "r", integer=True)
    _number(raw.get("lora_alpha", 8), "lora_alpha", integer=False)
    _patterns(raw, "rank_pattern", integer=True)
    _patterns(raw, "alpha_pattern", integer=False)
    tm = raw.get("target_modules")
    excl = raw.get("exclude_modules")
    ltt, lp = raw.get("layers_to_transform"), raw.get("layers_pattern")
    if not isinstance(excl, str) and excl is not None:
        excl = _strings(excl, "exclude_modules")
    targets: str | set[str]
    if isinstance(tm, str) and tm.lower() == "all-linear":
        targets = {n.name for n in tree.nodes if n.kind == LINEAR} - {tree.output_embedding}
        if ltt is not None or lp is not None:
            raise Unvouched("all-linear with layers_to_transform")
    elif isinstance(tm, str):
        if ltt is not None or lp is not None:
            raise Unvouched("a target_modules regex with layers_to_transform")
        targets = tm
    else:
        targets = set(_strings(tm, "target_modules"))
    if ltt is not None:
        if not (isinstance(ltt, int) and not isinstance(ltt, bool)) and not (
            isinstance(ltt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ltt)
        ):
            raise Unvouched("layers_to_transform is not an int or a list of ints")
        if (
            len(targets) >= 20
        ):  # PEFT condenses long lists to suffixes, which layers_to_transform then filters
            raise Unvouched("a long target_modules list with layers_to_transform")
    if lp is not None and (ltt is None or not isinstance(lp, str)):
        raise Unvouched("layers_pattern")
    try:
        picked = [n for n in tree.nodes if peft_selects(n.name, targets, excl, None, ltt, lp)]
        if tree.layout == HEADER_LAYOUT:
            _check_unseen(tree, targets)
    except re.error as e:
        raise Unvouched(f"a target pattern is not a valid regex: {e}") from None
    if not picked:
        raise Unvouched("PEFT would create no LoRA module")
    for node in picked:
        if node.kind not in _ROLES:
            raise Unvouched(f"`{node.name}` is not a plain Linear or Embedding here ({node.kind})")
        if tree.tied and node.name in (tree.output_embedding, tree.input_embedding):
            raise Unvouched(f"`{node.name}` shares its weight with the tied embeddings")
    return {n.name: n for n in picked}


_UNSEEN = "\x00"
"""A module name no checkpoint stores: a target that matches it as a child of a stored module could match the
modules a header cannot show (activations, dropouts, rotary embeddings: they have no tensors)."""


def _check_unseen(tree: Tree, targets: str | set[str]) -> None:
    """A tree read off headers lacks the modules without parameters, which PEFT would also match (and refuse):
    every name in a target list must be a stored module's name, and a target regex must match no child of a stored
    module that the header does not show: neither any child at all nor one named by a word of the regex that names
    no stored module (``act_fn`` in ``.*mlp\\.(down_proj|act_fn)``)."""
    names = tree.names
    if isinstance(targets, str):
        known = set(names)
        words = sorted(
            set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", targets)) - {n.rpartition(".")[2] for n in names}
        )
        for parent in ("", *names):
            for child in (_UNSEEN, *words):
                probe = f"{parent}.{child}" if parent else child
                if probe not in known and re.fullmatch(targets, probe):
                    shown = probe.replace(_UNSEEN, "*")
                    raise Unvouched(
                        f"the target_modules regex also matches `{shown}`, a module without tensors the header cannot show"
                    )
        return
    for target in sorted(targets):
        if not any(n == target or n.endswith(f".{target}") for n in names):
            raise Unvouched(
                f"target_modules names `{target}`, which is no module the base stores a tensor for"
            )


def _groups(adapter: Checkpoint) -> dict[str, dict[str, str]]:
    """Module → role → key, for an adapter of plain LoRA factors as PEFT saves them."""
    groups: dict[str, dict[str, str]] = {}
    for key in adapter.tensors:
        lk = parse_key(key)
        if not lk.wrapped or lk.adapter_name or lk.role not in ("lora_A", "lora_B", *_ROLES[EMBEDDING]):
            raise Unvouched(f"adapter key `{key}` is not a plain LoRA factor")
        groups.setdefault(lk.module, {})[lk.role] = key
    return groups


def _target(
    node: Node, raw: Mapping[str, object], keys: dict[str, str], adapter: Checkpoint, base: Checkpoint
) -> LoraTarget:
    """PEFT's layer for ``node`` (rank and scaling as ``_create_and_replace`` / ``update_layer`` compute them),
    checked against the adapter's factors and the base's stored weight."""
    rank_pattern = _patterns(raw, "rank_pattern", integer=True)
    alpha_pattern = _patterns(raw, "alpha_pattern", integer=False)
    rk, ak = pattern_key(rank_pattern, node.name), pattern_key(alpha_pattern, node.name)
    rank = rank_pattern[rk] if rk is not None else raw.get("r", 8)
    assert isinstance(rank, (int, float))  # checked by _selected
    r = int(rank)
    alpha = alpha_pattern[ak] if ak is not None else raw.get("lora_alpha", 8)
    assert isinstance(alpha, (int, float))
    scaling = alpha / math.sqrt(r) if raw.get("use_rslora", False) else alpha / r
    weight = dict(node.params)["weight"]
    if node.kind == LINEAR:
        a_shape, b_shape = (r, weight[1]), (weight[0], r)
    else:
        a_shape, b_shape = (r, weight[0]), (weight[1], r)
    a_role, b_role = _ROLES[node.kind]
    if set(keys) != {a_role, b_role}:
        raise Unvouched(f"`{node.name}` has {', '.join(sorted(keys))}, not {a_role} and {b_role}")
    for role, want in ((a_role, a_shape), (b_role, b_shape)):
        if tuple(adapter.tensors[keys[role]].shape) != want:
            raise Unvouched(f"`{keys[role]}` is not {list(want)}")
    param = f"{node.name}.weight"
    info = base.tensors.get(param)
    if info is None or tuple(info.shape) != tuple(weight) or info.dtype not in FLOAT_DTYPES:
        raise Unvouched(f"the base does not store `{param}` whole as a {list(weight)} float tensor")
    return LoraTarget(
        module=node.name,
        kind=node.kind,
        param=param,
        scaling=float(scaling),
        rank=r,
        a_shape=a_shape,
        b_shape=b_shape,
    )


__all__ = ["Unvouched", "header_plan"]
