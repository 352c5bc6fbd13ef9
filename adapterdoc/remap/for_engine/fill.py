"""Zero LoRA an engine needs added (``remap --for``, :attr:`EngineNeeds.fill`): a module whose ``lora_A`` and
``lora_B`` are both zero has ``B A = 0``, so PEFT's outputs do not change, and the engine then loads what it
dropped or failed on.

- ``layer-types`` (TGI, LoRAX): a layer type is loaded only when every layer of the served model has it (one
  missing layer drops the type everywhere). The type is added, with its rank, on every layer that lacks it; when
  the base itself has no such module in some layer (a hybrid stack) no fill makes the type load: refused (AD269).
- ``sglang-pairs`` (SGLang ``normalize_qkv_proj`` / ``normalize_gate_up_proj``): a ``q_proj`` needs its
  ``v_proj`` (a KeyError otherwise) and its ``k_proj`` when the layer has any; a ``k_proj`` / ``v_proj`` without
  ``q_proj`` and an ``up_proj`` without ``gate_proj`` are never stacked (skipped). The missing partners are added.

The new tensors take the shapes of the base's modules (``[r, in]``, ``[out, r]``: the base is needed, ``--base``
or a local ``base_model_name_or_path``) and the dtype of the adapter's own factors, and are appended to the
streamed copy as zeros. adapter_config.json is rewritten so that PEFT builds exactly the modules the file holds
(the added leaf names in ``target_modules``, ``layers_to_transform`` / ``layers_pattern`` dropped; the module
paths when nothing shorter selects exactly them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.adapter import WRAPPER, fused_expert_owner, parse_key
from adapterdoc.adapter.targets import peft_selects
from adapterdoc.errors import RefusedError
from adapterdoc.remap.for_engine.fill_base_model import LAYER, BaseModules, layer_count, read_base, resolve
from adapterdoc.remap.for_engine.tensors import Group
from adapterdoc.report.remap_report import ConfigChange
from adapterdoc.st.compose import Spec
from adapterdoc.st.header import Header

if TYPE_CHECKING:
    from adapterdoc.bases import BaseSpec

_TEXT = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.([^.]+)$")
_ATTN = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"})
_MLP = frozenset({"gate_proj", "up_proj", "down_proj", "c_fc", "c_proj"})
_LAYER_FIELDS = ("layers_to_transform", "layers_pattern")
CHUNK = 1 << 22


@dataclass(frozen=True)
class Filled:
    """The zero tensors to append and the ``rewrites`` entry."""

    specs: tuple[Spec, ...]
    modules: Mapping[str, tuple[int, ...]]
    """Leaf → layers it was added on."""
    bytes_added: int


def plan_fill(
    kind: str | None,
    raw: dict[str, object],
    names: list[tuple[str, tuple[int, ...]]],
    dtypes: dict[str, str],
    base: str | None,
    path: str,
    engine: str,
    notes: list[str],
) -> Filled | None:
    """What zero LoRA ``kind`` adds to the adapter whose tensors are ``names`` (after the earlier steps; ``dtypes``
    by name), and ``raw`` rewritten for it in place; ``None`` when nothing is needed."""
    if kind is None:
        return None
    factors = _factors(names)
    if not factors:
        return None
    named = raw.get("base_model_name_or_path")
    spec = resolve(base, named if isinstance(named, str) else None)
    if kind == "layer-types":
        wanted = _layer_types(factors, raw, spec, path, engine, notes)
    elif kind == "sglang-pairs":
        wanted = _pairs(factors)
    else:
        raise ValueError(f"unknown fill {kind!r}")
    if wanted is None:
        return None
    missing, bm = wanted
    if not missing:
        return None
    if bm is None:
        if spec is None:
            raise RefusedError(
                path,
                f"AD269: {engine} needs zero LoRA added ({_what(missing)}), whose shapes come from the base; "
                "pass --base (the model folder the server loads)",
            )
        bm = read_base(spec)
    every = {
        parse_key(n).module
        for n, _ in names
        if parse_key(n).is_lora
        and not (
            raw.get("target_parameters") and fused_expert_owner(parse_key(n).module).endswith(".experts")
        )
    }
    return _build(missing, factors, every, dtypes, raw, bm, path, engine)


# -------------------------------------------------------------------------------------------- what is missing


Factors = dict[str, dict[str, tuple[str, tuple[int, ...]]]]
"""LoRA module (no wrapper) → role → (tensor, shape)."""


def _factors(names: list[tuple[str, tuple[int, ...]]]) -> Factors:
    """LoRA module (no wrapper) → role → (tensor, shape), for 2-D lora_A / lora_B weights."""
    out: Factors = {}
    for name, shape in names:
        k = parse_key(name)
        if k.role in ("lora_A", "lora_B") and len(shape) == 2 and k.adapter_name is None:
            out.setdefault(k.module, {})[k.role] = (name, shape)
    return out


Missing = dict[str, str]
"""Module to add → the adapter module it copies its dtype and key spelling from."""


def _layer_types(
    factors: Factors,
    raw: dict[str, object],
    spec: BaseSpec | None,
    path: str,
    engine: str,
    notes: list[str],
) -> tuple[Missing, BaseModules | None] | None:
    have: dict[tuple[str, str], dict[int, str]] = {}
    for module, roles in factors.items():
        m = _TEXT.match(module)
        if m and len(roles) == 2 and m.group(3) in (_ATTN if m.group(2) == "self_attn" else _MLP):
            have.setdefault((m.group(2), m.group(3)), {})[int(m.group(1))] = module
    if not have:
        return None
    top = max(i for layers in have.values() for i in layers) + 1
    counted = layer_count(spec) if spec is not None else None
    nlayers = max(top, counted or 0)
    gaps = any(len(layers) < nlayers for layers in have.values())
    if spec is None:
        if gaps or any(raw.get(f) for f in _LAYER_FIELDS):
            missing = {
                _name(b, leaf, i): next(iter(v.values())) for (b, leaf), v in have.items() for i in range(top)
            }
            missing = {m: like for m, like in missing.items() if m not in factors}
            raise RefusedError(
                path,
                f"AD269: {engine} drops a layer type unless every layer has it, and which layers the base has is "
                f"unknown ({_what(missing) if missing else 'layers_to_transform is set'}); pass --base",
            )
        notes.append("the base is unknown: layer types checked against the adapter's own layers only")
        return None
    if not gaps and counted is not None:
        return None  # every type on every layer the base's config counts: nothing to read
    bm = read_base(spec)
    nlayers = max(nlayers, bm.nlayers)
    missing: Missing = {}
    lacking: dict[str, list[int]] = {}
    for (block, leaf), layers in sorted(have.items()):
        like = layers[min(layers)]
        for i in range(nlayers):
            if i in layers:
                continue
            module = _name(block, leaf, i)
            if module in bm.linear:
                missing[module] = like
            else:
                lacking.setdefault(leaf, []).append(i)
    if lacking:
        from adapterdoc.engines.text_keys import layers_text
        from adapterdoc.remap.for_engine.base_model import serving_elsewhere

        leaf, where = next(iter(sorted(lacking.items())))
        instead = serving_elsewhere(engine, raw, sorted(factors), spec, dropped=leaf)
        raise RefusedError(
            path,
            f"AD269: the base has no {leaf} in layer(s) {layers_text(where)} of {nlayers}, and {engine} loads a layer "
            f"type only when every layer has it: it drops {leaf} whatever is added; {instead}",
        )
    return missing, bm


def _name(block: str, leaf: str, i: int) -> str:
    return f"model.layers.{i}.{block}.{leaf}"


def _pairs(factors: Factors) -> tuple[Missing, None]:
    from adapterdoc.layouts import tower_segment

    parents: dict[str, dict[str, str]] = {}
    k_in_layer: set[str] = set()
    for module in factors:
        parent, _, leaf = module.rpartition(".")
        m = LAYER.search(module)
        if m is None or ".experts." in module or tower_segment(module) is not None:
            continue
        if leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            parents.setdefault(parent, {})[leaf] = module
            if leaf == "k_proj":
                k_in_layer.add(m.group(1))
    missing: Missing = {}
    for parent, leaves in sorted(parents.items()):
        layer = LAYER.search(parent + ".")
        like = next(iter(leaves.values()))
        if leaves.keys() & {"q_proj", "k_proj", "v_proj"}:
            need = {"q_proj", "v_proj"} | ({"k_proj"} if layer and layer.group(1) in k_in_layer else set())
            for leaf in sorted(need - leaves.keys()):
                missing[f"{parent}.{leaf}"] = leaves.get("q_proj", like)
        if "up_proj" in leaves and "gate_proj" not in leaves:
            missing[f"{parent}.gate_proj"] = leaves["up_proj"]
    return missing, None


def _what(missing: Missing) -> str:
    leaves = sorted({m.rpartition(".")[2] for m in missing})
    return f"{len(missing)} module(s): {', '.join(leaves)}"


# ----------------------------------------------------------------------------------- the tensors and the config


def _build(
    missing: Missing,
    factors: Factors,
    every: set[str],
    dtypes: dict[str, str],
    raw: dict[str, object],
    bm: BaseModules,
    path: str,
    engine: str,
) -> Filled:
    from adapterdoc.remap.for_engine import config as C

    absent = sorted(m for m in missing if m not in bm.linear)
    if absent:
        raise RefusedError(
            path,
            f"AD269: {engine} needs zero LoRA on `{absent[0]}`, which is no Linear module of the base "
            f"({bm.source}): no fill is possible; check --base, or merge the adapter into the base",
        )
    specs: list[Spec] = []
    modules: dict[str, list[int]] = {}
    cfg = C.parse(raw)
    for module, like in sorted(missing.items()):
        out_f, in_f = bm.linear[module]
        rank = cfg.rank_for(module)
        a_name = factors[like]["lora_A"][0]
        wrap = WRAPPER if a_name.startswith(WRAPPER) else ""
        dtype = dtypes[a_name]
        for role, shape in (("lora_A", (rank, in_f)), ("lora_B", (out_f, rank))):
            specs.append(Spec(f"{wrap}{module}.{role}.weight", dtype, shape))
        m = LAYER.search(module)
        modules.setdefault(module.rpartition(".")[2], []).append(int(m.group(1)) if m else -1)
    _targets(raw, every | set(missing), bm, path)
    return Filled(tuple(specs), {leaf: tuple(v) for leaf, v in modules.items()}, sum(s.nbytes for s in specs))


def _targets(raw: dict[str, object], wanted: set[str], bm: BaseModules, path: str) -> None:
    """``raw`` rewritten so that PEFT selects exactly ``wanted`` among the base's LoRA-capable modules: the first
    of (the added leaf names, layer fields dropped), (the leaf names, no exclusions), (the module paths)."""
    leaves = sorted({m.rpartition(".")[2] for m in wanted})
    tm = raw.get("target_modules")
    candidates: list[dict[str, object]] = []
    if isinstance(tm, list):
        candidates.append(
            {"target_modules": tm + [x for x in leaves if x not in tm], **dict.fromkeys(_LAYER_FIELDS)}
        )
    elif isinstance(tm, str):
        candidates.append({**dict.fromkeys(_LAYER_FIELDS)})
    candidates.append({"target_modules": leaves, "exclude_modules": None, **dict.fromkeys(_LAYER_FIELDS)})
    candidates.append(
        {"target_modules": sorted(wanted), "exclude_modules": None, **dict.fromkeys(_LAYER_FIELDS)}
    )
    for change in candidates:
        new = {**raw, **change}
        if _selects(new, bm, wanted):
            for key, value in change.items():
                if value is None:
                    if key in raw:
                        raw[key] = None
                else:
                    raw[key] = value
            return
    raise RefusedError(
        path, "AD269: no target_modules makes PEFT build exactly the filled modules on this base"
    )


def _selects(raw: dict[str, object], bm: BaseModules, wanted: set[str]) -> bool:
    tm = raw.get("target_modules")
    if isinstance(tm, str) and tm.lower() == "all-linear":
        tm = sorted({n.rpartition(".")[2] for n in bm.linear if n != bm.output_embedding})
    kw = {
        "exclude_modules": raw.get("exclude_modules"),
        "layers_to_transform": raw.get("layers_to_transform"),
        "layers_pattern": raw.get("layers_pattern"),
    }
    for m in bm.capable | wanted:
        picked = peft_selects(m, tm, **kw)
        if m in bm.capable and picked != (m in wanted):
            return False
        if m not in bm.capable and not picked:
            return False
    return True


def zero_groups(specs: Sequence[Spec]) -> list[Group]:
    """One streamed group per zero tensor."""

    def producer(n: int) -> Callable[[], Iterator[bytes]]:
        def run() -> Iterator[bytes]:
            left = n
            while left:
                take = min(left, CHUNK)
                yield bytes(take)
                left -= take

        return run

    return [([s], producer(s.nbytes)) for s in specs]


def rewrite_entry(kind: str, filled: Filled) -> dict[str, object]:
    return {
        "rewrite": "fill",
        "fill": kind,
        "modules": sum(len(v) for v in filled.modules.values()),
        "added": {leaf: sorted(layers) for leaf, layers in sorted(filled.modules.items())},
        "tensors": len(filled.specs),
        "bytes_added": filled.bytes_added,
        "exact": True,
    }


@dataclass(frozen=True)
class FillStep:
    """The fill step's result: the groups with the zeros appended, the tensor names with them, the config changes,
    the ``rewrites`` entry (``None``: nothing added) and the notes."""

    groups: list[Group] | None
    names: list[tuple[str, tuple[int, ...]]]
    changes: tuple[ConfigChange, ...] = ()
    rewrite: Mapping[str, object] | None = None
    notes: tuple[str, ...] = ()


def fill_step(
    kind: str | None,
    raw: dict[str, object],
    names: list[tuple[str, tuple[int, ...]]],
    groups: list[Group] | None,
    view: Header,
    base: str | None,
    path: str,
    engine: str,
) -> FillStep | None:
    """The fill step of ``remap --for``: ``raw`` updated; what it added (``None``: nothing, and nothing noted)."""
    import json

    from adapterdoc.remap.for_engine import config as C
    from adapterdoc.remap.for_engine.tensors import identity_groups

    if groups is not None:
        dtypes = {s.name: s.dtype for g in groups for s in g[0]}
    else:
        dtypes = {n: t.dtype for n, t in view.tensors.items()}
    before = json.loads(json.dumps(raw))
    notes: list[str] = []
    filled = plan_fill(kind, raw, names, dtypes, base, path, engine, notes)
    if filled is None:
        return FillStep(groups, names, notes=tuple(notes)) if notes else None
    assert kind is not None
    groups = (groups if groups is not None else identity_groups(view)) + zero_groups(filled.specs)
    return FillStep(
        groups,
        names + [(s.name, s.shape) for s in filled.specs],
        tuple(C.changes(before, raw, "fill")),
        rewrite_entry(kind, filled),
        tuple(notes),
    )
