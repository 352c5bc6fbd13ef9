"""The expert layout of a LoRA adapter, from its key names and shapes alone (torch-free).

API (shared by inspect, verify, ``remap --experts`` and merge)::

    from adapterdoc.adapter.expert_picture import expert_picture, classify, ExpertKey, ExpertBlock, ExpertPicture

    pic = expert_picture({name: shape, ...}, config=AdapterConfig | None, num_experts=None)
    pic.layout            # "per-expert" | "fused" | "3d" | "mixed" | None (no routed-expert LoRA)
    pic.experts           # routed experts per block when known (base config, fused rows / r, else highest index + 1)
    pic.blocks            # [ExpertBlock], one per MoE block with expert or shared-expert LoRA, sorted by path
    pic.shared            # shared-expert modules carrying LoRA (``...mlp.shared_expert.gate_proj``)
    pic.one_sided         # blocks whose gate or up is targeted without the other (PEFT refuses to fuse them)
    pic.to_dict()         # the JSON form (inspect's ``experts`` object)

    classify(parse_key(name), shape)  -> ExpertKey | None   # one key: which block, form, projection, expert

- **per-expert**: ``<block>.experts.{e}.<leaf>.lora_[AB].weight`` with ``<leaf>`` one of a registry spelling's
  ``Experts.per_expert`` (``gate_proj/up_proj/down_proj``, Mixtral's ``w1/w3/w2``) -> projection ``gate``/``up``/``down``.
- **fused** (PEFT's ParamWrapper on transformers 5's 3-D experts): ``<block>.experts.base_layer.lora_[AB].weight``
  (the inner wrapper: ``gate_up_proj``, PEFT nests in the experts module's parameter order) and
  ``<block>.experts.lora_[AB].weight`` (the outer one: ``down_proj``); ``lora_A [r·E, in]``, ``lora_B [out, r·E]``.
  With one wrapper only, the config's ``target_parameters`` says which parameter it is (projection ``gate_up`` or
  ``down``; ``?`` when nothing tells).
- **3d**: ``<block>.experts.<fused name>.lora_[AB].weight`` (vLLM's 3-D MoE LoRA form, the parameter name in the key).

``ExpertKey.block`` is the experts container's path (``model.layers.0.mlp.experts``, wrapper removed); shared-expert
modules attach to the block whose parent they share (``model.layers.0.mlp``). Paths are module paths without
``base_model.model.``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from adapterdoc.adapter import AdapterConfig, LoraKey, parse_key
from adapterdoc.layouts import EXPERT_SPELLINGS, Experts

PROJECTIONS = ("gate", "up", "down")
"""The per-expert projections, in the order ``Experts.per_expert`` lists their leaf names."""
FUSED_PROJECTIONS = ("gate_up", "down")
"""The fused parameters' projections, in the order ``Experts.fused`` lists their names."""

_PER_EXPERT = re.compile(r"^(?P<block>.+\.experts)\.(?P<e>\d+)\.(?P<leaf>[^.]+)$")
_FUSED = re.compile(r"^(?P<block>.+\.experts)(?P<inner>(?:\.base_layer)*)$")
_THREE_D = re.compile(r"^(?P<block>.+\.experts)\.(?P<leaf>[^.]+)$")
_FACTORS = ("lora_A", "lora_B")


@dataclass(frozen=True)
class ExpertKey:
    """One expert LoRA tensor, classified."""

    key: str
    """The tensor name as saved."""
    block: str
    """The experts container's module path (``model.layers.0.mlp.experts``)."""
    form: str
    """``per-expert``, ``fused`` or ``3d``."""
    projection: str
    """``gate``, ``up``, ``down`` (per-expert), ``gate_up``, ``down`` (fused, 3d) or ``?`` (a lone fused wrapper
    nothing identifies)."""
    expert: int | None
    """The expert index (per-expert), else ``None``."""
    role: str
    """``lora_A`` or ``lora_B``."""
    leaf: str
    """The name as spelled: ``gate_proj``, ``w1``, ``gate_up_proj``; for fused keys ``base_layer`` / ``experts``."""
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class ExpertBlock:
    """The expert LoRA of one MoE block."""

    path: str
    """The experts container (``model.layers.0.mlp.experts``)."""
    layout: str | None
    """``per-expert``, ``fused``, ``3d``, ``mixed`` or ``None`` (only the shared expert carries LoRA)."""
    experts: int | None = None
    """Routed experts in this block, when known."""
    experts_from: str | None = None
    """Where :attr:`experts` comes from: ``config`` (given), ``rank`` (fused rows / r) or ``keys`` (highest index
    + 1, a lower bound)."""
    covered: dict[str, list[int]] = field(default_factory=dict)
    """Projection → the experts whose LoRA for it is present (per-expert; a fused LoRA covers every expert, listed
    as ``range(experts)`` when the count is known, else ``[]``)."""
    keys: list[ExpertKey] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)
    """Shared-expert modules of the same MoE block carrying LoRA."""
    fused_rank: dict[str, int] = field(default_factory=dict)
    """Fused projection → the per-expert rank of its LoRA (``rows / experts``), when the experts count is known."""

    @property
    def projections(self) -> set[str]:
        return set(self.covered)

    @property
    def one_sided(self) -> str | None:
        """``gate`` or ``up`` when one is targeted without the other (per-expert), else ``None``."""
        p = self.projections
        if "gate" in p and "up" not in p:
            return "gate"
        if "up" in p and "gate" not in p:
            return "up"
        return None

    def missing(self) -> dict[str, list[int]]:
        """Per-expert projections present for some experts but not all: projection → the missing experts."""
        if self.layout != "per-expert" or not self.experts:
            return {}
        out = {}
        for proj, have in self.covered.items():
            lack = sorted(set(range(self.experts)) - set(have))
            if lack:
                out[proj] = lack
        return out


@dataclass(frozen=True)
class ExpertPicture:
    """The expert layout and coverage of a whole adapter."""

    blocks: list[ExpertBlock]
    layout: str | None
    """``per-expert``, ``fused``, ``3d``, ``mixed`` (blocks or keys of several forms) or ``None`` (no routed expert
    carries LoRA)."""
    experts: int | None
    """Routed experts per block (the largest any block shows), when known."""
    experts_from: str | None
    shared: list[str]
    """Every shared-expert module with LoRA."""

    @property
    def routed(self) -> list[ExpertBlock]:
        """Blocks whose routed experts carry LoRA."""
        return [b for b in self.blocks if b.layout is not None]

    @property
    def one_sided(self) -> list[ExpertBlock]:
        return [b for b in self.routed if b.one_sided]

    @property
    def partial(self) -> list[ExpertBlock]:
        return [b for b in self.routed if b.missing()]

    def coverage(self) -> dict[str, dict[str, int | None]]:
        """Projection → ``{"blocks": n, "experts": covered (block, expert) pairs, "of": blocks × experts}``."""
        out: dict[str, dict[str, int | None]] = {}
        routed = self.routed
        for proj in (*PROJECTIONS, "gate_up", "?"):
            with_it = [b for b in routed if proj in b.covered]
            if not with_it:
                continue
            pairs = sum(len(b.covered[proj]) for b in with_it)
            total = None if self.experts is None else len(routed) * self.experts
            out[proj] = {
                "blocks": len(with_it),
                "experts": pairs if pairs or total is None else 0,
                "of": total,
            }
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "layout": self.layout,
            "experts": self.experts,
            "experts_from": self.experts_from,
            "blocks": len(self.routed),
            "coverage": self.coverage(),
            "shared": len(self.shared),
            "one_sided": [{"block": b.path, "only": b.one_sided} for b in self.one_sided],
            "missing": {b.path: b.missing() for b in self.partial},
        }


def _spellings() -> Sequence[Experts]:
    return EXPERT_SPELLINGS


_SHARED: dict[int, frozenset[str]] = {}
"""The shared-expert segment names of :data:`EXPERT_SPELLINGS`, per registry size (a registration makes a new
entry; lookups cost nothing)."""


def _shared_names() -> frozenset[str]:
    n = len(EXPERT_SPELLINGS)
    names = _SHARED.get(n)
    if names is None:
        names = _SHARED[n] = frozenset(s for sp in EXPERT_SPELLINGS for s in sp.shared)
    return names


def split_per_expert(module: str) -> tuple[str, int, str] | None:
    """``(block, expert, leaf)`` of a per-expert module path ``{block}.{e}.{leaf}`` (``block`` ending in
    ``.experts``); ``None`` for any other path. The one reading of a per-expert path (inspect, verify, remap)."""
    m = _PER_EXPERT.match(module)
    return (m["block"], int(m["e"]), m["leaf"]) if m else None


def _per_expert_projection(leaf: str) -> str | None:
    for sp in _spellings():
        if leaf in sp.per_expert:
            return PROJECTIONS[sp.per_expert.index(leaf)]
    return None


def _fused_projection(leaf: str) -> str | None:
    for sp in _spellings():
        if leaf in sp.fused:
            return FUSED_PROJECTIONS[sp.fused.index(leaf)]
    return None


def is_shared_expert(module: str) -> bool:
    """Whether ``module`` sits in (or is) a shared expert of an MoE block (``...mlp.shared_expert.gate_proj``)."""
    return not _shared_names().isdisjoint(module.split("."))


def classify(key: LoraKey, shape: Sequence[int] = (), *, fused_hint: str | None = None) -> ExpertKey | None:
    """The expert reading of one LoRA factor (``lora_A``/``lora_B``), or ``None`` for a key that is not a routed
    expert's. A fused key's projection follows the nesting (``base_layer``: ``gate_up``; the outer wrapper:
    ``down``) unless ``fused_hint`` names the one fused projection the config targets."""
    if key.role not in _FACTORS or ".experts" not in key.module:  # every expert form has `.experts` in it
        return None
    m = _PER_EXPERT.match(key.module)
    if m:
        proj = _per_expert_projection(m["leaf"])
        if proj is not None:
            return ExpertKey(
                key.key, m["block"], "per-expert", proj, int(m["e"]), key.role, m["leaf"], tuple(shape)
            )
    m = _FUSED.match(key.module)
    if m:
        inner = bool(m["inner"])
        proj = fused_hint or ("gate_up" if inner else "down")
        return ExpertKey(
            key.key,
            m["block"],
            "fused",
            proj,
            None,
            key.role,
            "base_layer" if inner else "experts",
            tuple(shape),
        )
    m = _THREE_D.match(key.module)
    if m:
        proj = _fused_projection(m["leaf"])
        if proj is not None:
            return ExpertKey(key.key, m["block"], "3d", proj, None, key.role, m["leaf"], tuple(shape))
    return None


def _targeted_fused(config: AdapterConfig | None) -> list[str]:
    if config is None:
        return []
    out = []
    for p in config.target_parameters:
        proj = _fused_projection(p.rpartition(".")[2])
        if proj and proj not in out:
            out.append(proj)
    return out


def expert_picture(
    shapes: Mapping[str, Sequence[int]] | Iterable[tuple[str, Sequence[int]]],
    *,
    config: AdapterConfig | None = None,
    num_experts: int | None = None,
    keys: Sequence[LoraKey] | None = None,
) -> ExpertPicture:
    """Classify every expert key of an adapter (tensor name → shape) and gather them per MoE block.

    ``config`` (the adapter's) tells a lone fused wrapper's parameter and the rank that turns fused rows into an
    experts count; ``num_experts`` (the base config's routed-experts count) makes per-expert coverage exact.
    ``keys``: the names already parsed (``parse_key`` of each name of ``shapes``, in its order), so a caller that
    has them does not parse them again."""
    items = list(shapes.items() if isinstance(shapes, Mapping) else shapes)
    parsed = keys if keys is not None else [parse_key(k) for k, _ in items]
    targeted = _targeted_fused(config)
    lone_hint = targeted[0] if len(targeted) == 1 else None
    # (index, key, shape, fused block) of each A/B whose module has `.experts` in it (every expert form does)
    factors: list[tuple[int, LoraKey, Sequence[int], str | None]] = []
    fused_modules: dict[str, set[str]] = {}
    # shared-expert modules by the index of their first A/B key: an expert form's module (`.experts` in it) and
    # any other module never share a name, so the two passes below find each module once, in key order
    found_shared: list[tuple[int, str]] = []
    seen: set[str] = set()  # modules already looked at for a shared expert
    for i, (k, (_, shape)) in enumerate(zip(parsed, items)):
        if k.role not in _FACTORS:
            continue
        if ".experts" not in k.module:  # no expert form: only a shared expert's test is left
            if k.module not in seen:
                seen.add(k.module)
                if is_shared_expert(k.module):
                    found_shared.append((i, k.module))
            continue
        m = _FUSED.match(k.module)
        if m:
            fused_modules.setdefault(m["block"], set()).add(k.module)
        factors.append((i, k, shape, m["block"] if m else None))
    block_keys: dict[str, list[ExpertKey]] = {}
    for i, k, shape, fused_block in factors:
        hint = None
        if fused_block is not None and len(fused_modules[fused_block]) == 1:
            hint = lone_hint or "?"
        ek = classify(k, shape, fused_hint=hint)
        if ek is None:
            if k.module not in seen:
                seen.add(k.module)
                if is_shared_expert(k.module):
                    found_shared.append((i, k.module))
            continue
        block_keys.setdefault(ek.block, []).append(ek)
    shared = [mod for _, mod in sorted(found_shared)]
    block_shared: dict[str, list[str]] = {p: [] for p in block_keys}
    for mod in shared:  # attach each shared expert to the block with the same parent (``...mlp``)
        block_shared.setdefault(f"{_shared_parent(mod)}.experts", []).append(mod)
    ordered = [
        _block(p, block_keys.get(p, []), block_shared[p], config, num_experts)
        for p in sorted(block_shared, key=_natural)
    ]
    forms = {b.layout for b in ordered if b.layout is not None}
    layout = None if not forms else forms.pop() if len(forms) == 1 else "mixed"
    counted = [b for b in ordered if b.experts is not None]
    experts = max((b.experts for b in ordered if b.experts is not None), default=None)
    source = next((b.experts_from for b in counted if b.experts == experts), None)
    return ExpertPicture(ordered, layout, experts, source, sorted(shared, key=_natural))


def _shared_parent(module: str) -> str:
    names = _shared_names()
    parts = module.split(".")
    for i, seg in enumerate(parts):
        if seg in names:
            return ".".join(parts[:i])
    return module.rpartition(".")[0]


def _natural(path: str) -> list[int | str]:
    return [int(t) if t.isdigit() else t for t in _DIGITS.split(path)]


_DIGITS = re.compile(r"(\d+)")


def _block(
    path: str,
    keys: list[ExpertKey],
    shared: list[str],
    config: AdapterConfig | None,
    num_experts: int | None,
) -> ExpertBlock:
    """One block, whole: its layout, experts count and coverage from its classified keys."""
    forms = {k.form for k in keys}
    layout = None if not forms else forms.pop() if len(forms) == 1 else "mixed"
    per = [k for k in keys if k.form == "per-expert"]
    other = [k for k in keys if k.form != "per-expert"]
    experts: int | None = None
    experts_from: str | None = None
    if num_experts:
        experts, experts_from = num_experts, "config"
    else:
        rows = _fused_count(other, config, path)
        if rows is not None:
            experts, experts_from = rows, "rank"
        elif per:
            experts, experts_from = max(k.expert or 0 for k in per) + 1, "keys"
    roles: dict[tuple[int | None, str], set[str]] = {}
    for k in per:
        roles.setdefault((k.expert, k.projection), set()).add(k.role)
    covered: dict[str, list[int]] = {}
    for k in per:
        have = covered.setdefault(k.projection, [])
        if k.expert is not None and roles[(k.expert, k.projection)] == {"lora_A", "lora_B"}:
            have.append(k.expert)
    for proj, have in covered.items():
        covered[proj] = sorted(set(have))
    fused_rank: dict[str, int] = {}
    for k in other:
        covered[k.projection] = list(range(experts)) if experts else []
        if experts and k.role == "lora_A" and len(k.shape) == 2 and k.shape[0] % experts == 0:
            fused_rank[k.projection] = k.shape[0] // experts
    return ExpertBlock(path, layout, experts, experts_from, covered, keys, shared, fused_rank)


def _fused_count(keys: list[ExpertKey], config: AdapterConfig | None, block: str) -> int | None:
    """Experts from a fused / 3-D ``lora_A``: rows / r (``rank_pattern`` for the parameter's path, else ``r``), or
    the leading dimension of a 3-D tensor."""
    for k in keys:
        if k.role != "lora_A":
            continue
        if len(k.shape) == 3:
            return k.shape[0]
        if config is None or len(k.shape) != 2 or k.projection == "?":
            continue
        name = _fused_name(k.projection)
        r = config.rank_for(f"{block}.{name}") if name else config.r
        if r and k.shape[0] % r == 0:
            return k.shape[0] // r
    return None


def _fused_name(projection: str) -> str | None:
    for sp in _spellings():
        if projection in FUSED_PROJECTIONS:
            return sp.fused[FUSED_PROJECTIONS.index(projection)]
    return None
