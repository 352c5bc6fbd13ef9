"""The weights audit's result types: one :class:`ModuleDelta` per LoRA module (or expert), :class:`TensorRead` per
factor, and the :class:`Audit` of one adapter with the thresholds it reports. Data only, frozen; :mod:`adapterdoc.audit`
builds them once."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from adapterdoc.report.base import pick
from adapterdoc.report.findings import Finding

ENERGY = 0.99
"""Share of a module's ``‖ΔW‖_F²`` its effective rank keeps."""
INERT_RELATIVE = 1e-3
"""A module is inert when its delta norm is at most this fraction of the RMS delta norm over all modules."""


MODULE_JSON = (
    "module",
    "rank",
    "delta_norm",
    "effective_rank",
    "inert",
    "share",
    "numerical_rank",
    "scaling",
    "kind",
    "expert",
    "parameter",
    "layer",
    "leaf",
    "dtype",
)
"""The JSON fields of one audited module (``modules`` of ``inspect --weights --json``), in order."""


@dataclass(frozen=True)
class ModuleDelta:
    """One LoRA module's (or one expert's) change, as the audit measured it."""

    module: str
    """The module path without ``base_model.model.`` (fused experts keep ``.base_layer``)."""
    kind: str
    """``linear``, ``embedding`` or ``experts`` (one entry per expert)."""
    rank: int
    """The factors' rank (per expert for fused experts)."""
    scaling: float | None
    delta_norm: float | None
    """``|scaling| · ‖B A‖_F``; ``None`` when a factor holds NaN/Inf."""
    effective_rank: int | None
    numerical_rank: int | None
    share: float | None = None
    inert: bool = False
    expert: int | None = None
    parameter: str | None = None
    """For fused experts: the expert parameter (``gate_up_proj``, ``down_proj``), from the wrapper nesting."""
    layer: int | None = None
    group: str = ""
    """The path before the layer index (``model.layers``), or ``""`` for modules outside any layer stack."""
    leaf: str = ""
    """The path after the layer index, expert index removed (``self_attn.q_proj``, ``mlp.experts.gate_proj``)."""
    dtype: str = ""
    nonfinite: int = 0

    def to_dict(self) -> dict[str, object]:
        return pick(self, MODULE_JSON)


@dataclass(frozen=True)
class TensorRead:
    """What decoding one factor found (verify's lora_B zero scan reads these)."""

    scanned: bool
    nonzero: bool = False
    nonfinite: int = 0


@dataclass(frozen=True)
class Audit:
    """The weights audit of one adapter."""

    path: str
    modules: list[ModuleDelta] = field(default_factory=list)
    tensors: dict[str, TensorRead] = field(default_factory=dict)
    """Every factor read (tensor name → result), including those of incomplete modules."""
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0

    @property
    def measured(self) -> list[ModuleDelta]:
        return [m for m in self.modules if m.delta_norm is not None]

    @property
    def total_norm(self) -> float:
        """‖ΔW‖_F of the whole adapter (modules as disjoint blocks)."""
        return math.sqrt(sum(m.delta_norm**2 for m in self.modules if m.delta_norm is not None))

    @property
    def inert_count(self) -> int:
        return sum(1 for m in self.modules if m.inert)

    @property
    def inert_share(self) -> float:
        n = len(self.measured)
        return self.inert_count / n if n else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "modules": len(self.modules),
            "inert": self.inert_count,
            "inert_share": self.inert_share,
            "total_delta_norm": self.total_norm,
            "bytes_read": self.bytes_read,
            "energy": ENERGY,
            "inert_relative": INERT_RELATIVE,
            "notes": list(self.notes),
        }

    def to_dict(self) -> dict[str, object]:
        return {"weights": self.summary(), "modules": [m.to_dict() for m in self.modules]}


def leaves(audit: Audit) -> Iterator[tuple[str, list[ModuleDelta]]]:
    """Entries grouped by (group, leaf) in first-seen order (for the text summary)."""
    seen: dict[str, list[ModuleDelta]] = {}
    for m in audit.modules:
        seen.setdefault(f"{m.group}.*.{m.leaf}" if m.group else m.leaf, []).append(m)
    yield from seen.items()
