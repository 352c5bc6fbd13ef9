"""Zero LoRA an engine needs added (``remap --for``): a module whose ``lora_A`` and ``lora_B`` are both zero has
``B A = 0``, so PEFT's outputs do not change, and the engine then loads what it dropped or failed on. Which modules
is the engine's own rule (its profile's :meth:`~adapterdoc.engines.base.Profile.zero_lora`: TGI and LoRAX add a layer
type on the layers that lack it, SGLang the q/k/v and gate/up partners it stacks); this module writes them.

The new tensors take the shapes of the base's modules (``[r, in]``, ``[out, r]``: the base is needed, ``--base``
or a local ``base_model_name_or_path``) and the dtype of the adapter's own factors, and are appended to the
streamed copy as zeros. adapter_config.json is rewritten so that PEFT builds exactly the modules the file holds
(the added leaf names in ``target_modules``, ``layers_to_transform`` / ``layers_pattern`` dropped; the module
paths when nothing shorter selects exactly them).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from adapterdoc.adapter import WRAPPER, fused_expert_owner, parse_key
from adapterdoc.adapter.targets import peft_selects
from adapterdoc.engines.base import Profile
from adapterdoc.engines.zero_lora import (
    LAYER,
    BaseModules,
    Factors,
    FillInput,
    Missing,
    describe,
    read_base,
)
from adapterdoc.errors import RefusedError
from adapterdoc.remap.for_engine.tensors import Group
from adapterdoc.report.remap_report import ConfigChange
from adapterdoc.st.compose import Spec
from adapterdoc.st.header import Header

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
    profile: Profile,
    raw: dict[str, object],
    names: list[tuple[str, tuple[int, ...]]],
    dtypes: dict[str, str],
    base: str | None,
    path: str,
    notes: list[str],
) -> Filled | None:
    """What zero LoRA ``profile``'s rule adds to the adapter whose tensors are ``names`` (after the earlier steps;
    ``dtypes`` by name), and ``raw`` rewritten for it in place; ``None`` when nothing is needed."""
    factors = _factors(names)
    if not factors:
        return None
    a = FillInput(factors, raw, base, path, notes)
    wanted = profile.zero_lora(a)
    if wanted is None or not wanted.missing:
        return None
    missing, bm = wanted.missing, wanted.base
    if bm is None:
        spec = a.spec()
        if spec is None:
            raise RefusedError(
                path,
                f"AD269: {profile.name} needs zero LoRA added ({describe(missing)}), whose shapes come from the base; "
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
    return _build(missing, factors, every, dtypes, raw, bm, path, profile.name)


def _factors(names: list[tuple[str, tuple[int, ...]]]) -> Factors:
    """LoRA module (no wrapper) → role → (tensor, shape), for 2-D lora_A / lora_B weights."""
    out: Factors = {}
    for name, shape in names:
        k = parse_key(name)
        if k.role in ("lora_A", "lora_B") and len(shape) == 2 and k.adapter_name is None:
            out.setdefault(k.module, {})[k.role] = (name, shape)
    return out


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
    # the config's fields as PEFT reads them (adapter_config.json values, passed through as they are)
    tm = cast("str | Collection[str] | None", raw.get("target_modules"))
    if isinstance(tm, str) and tm.lower() == "all-linear":
        tm = sorted({n.rpartition(".")[2] for n in bm.linear if n != bm.output_embedding})
    exclude = cast("str | Collection[str] | None", raw.get("exclude_modules"))
    layers = cast("int | Collection[int] | None", raw.get("layers_to_transform"))
    pattern = cast("str | Iterable[str] | None", raw.get("layers_pattern"))
    for m in bm.capable | wanted:
        picked = peft_selects(
            m, tm, exclude_modules=exclude, layers_to_transform=layers, layers_pattern=pattern
        )
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


def rewrite_entry(kind: str | None, filled: Filled) -> dict[str, object]:
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
    profile: Profile,
    kind: str | None,
    raw: dict[str, object],
    names: list[tuple[str, tuple[int, ...]]],
    groups: list[Group] | None,
    view: Header,
    base: str | None,
    path: str,
) -> FillStep | None:
    """The fill step of ``remap --for``: ``raw`` updated; what ``profile``'s rule added (``None``: nothing, and
    nothing noted). ``kind`` names the rule in the ``rewrites`` entry (:attr:`EngineNeeds.fill`)."""
    import json

    from adapterdoc.remap.for_engine import config as C
    from adapterdoc.remap.for_engine.tensors import identity_groups

    if groups is not None:
        dtypes = {s.name: s.dtype for g in groups for s in g[0]}
    else:
        dtypes = {n: t.dtype for n, t in view.tensors.items()}
    before = json.loads(json.dumps(raw))
    notes: list[str] = []
    filled = plan_fill(profile, raw, names, dtypes, base, path, notes)
    if filled is None:
        return FillStep(groups, names, notes=tuple(notes)) if notes else None
    groups = (groups if groups is not None else identity_groups(view)) + zero_groups(filled.specs)
    return FillStep(
        groups,
        names + [(s.name, s.shape) for s in filled.specs],
        tuple(C.changes(before, raw, "fill")),
        rewrite_entry(kind, filled),
        tuple(notes),
    )
