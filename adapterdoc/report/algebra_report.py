"""What ``adapterdoc combine`` and ``adapterdoc resize`` return: :class:`AlgebraReport`, one :class:`ModuleRow` per
module (rank in → out, kept energy, relative error) and the total."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from adapterdoc.report.base import FrozenReport


def kept_share(energy: float, error: float) -> float:
    """Share of ``‖ΔW‖_F²`` (``energy``) kept when ``‖ΔW − ΔŴ‖_F`` is ``error`` (1 for a zero delta)."""
    return 1.0 if energy == 0 else 1.0 - error**2 / energy


def relative_error(energy: float, error: float) -> float:
    """``‖ΔW − ΔŴ‖_F / ‖ΔW‖_F`` (0 for a zero delta)."""
    return 0.0 if energy == 0 else error / math.sqrt(energy)


@dataclass(frozen=True)
class ModuleRow:
    """One module of the result: its rank before and after and how far the written delta is from the exact one."""

    module: str
    rank_in: int
    """The rank of the exact delta's factors (``combine``: the sum of the sources' ranks)."""
    rank_out: int
    effective_rank: int | None
    """The numerical rank of the exact delta (None where not computed: ``cat``)."""
    energy: float
    """``‖ΔW‖_F²`` of the exact delta."""
    error: float
    """``‖ΔW − ΔŴ‖_F``."""

    @property
    def kept_energy(self) -> float:
        return kept_share(self.energy, self.error)

    @property
    def rel_error(self) -> float:
        return relative_error(self.energy, self.error)

    def to_dict(self) -> dict[str, object]:
        return {
            "module": self.module,
            "rank_in": self.rank_in,
            "rank_out": self.rank_out,
            "effective_rank": self.effective_rank,
            "kept_energy": self.kept_energy,
            "rel_error": self.rel_error,
        }


@dataclass(frozen=True)
class AlgebraReport(FrozenReport):
    """The result of ``combine`` or ``resize``: what was read, what was written, per module and in total."""

    command: str
    inputs: Sequence[str]
    method: str
    """``cat``, ``svd`` (combine); ``rank``, ``energy``, ``max-error`` (resize)."""
    out: str
    weights: Sequence[float] = ()
    modules: Sequence[ModuleRow] = ()
    written: Sequence[str] = ()
    notes: Sequence[str] = field(default_factory=list)

    @property
    def total_energy(self) -> float:
        return sum(m.energy for m in self.modules)

    @property
    def total_error(self) -> float:
        """``sqrt(Σ error²)``: ‖ΔW − ΔŴ‖_F over every module together."""
        return math.sqrt(sum(m.error**2 for m in self.modules))

    @property
    def total_rel_error(self) -> float:
        """``sqrt(Σ error²) / sqrt(Σ ‖ΔW‖²)`` over every module."""
        return relative_error(self.total_energy, self.total_error)

    @property
    def total_kept_energy(self) -> float:
        return kept_share(self.total_energy, self.total_error)

    @property
    def exact(self) -> bool:
        return all(m.error == 0 for m in self.modules)

    def body(self) -> dict[str, object]:
        return {
            "command": self.command,
            "inputs": list(self.inputs),
            "method": self.method,
            "weights": list(self.weights),
            "out": self.out,
            "modules": [m.to_dict() for m in self.modules],
            "total": {
                "modules": len(self.modules),
                "rank_in": sum(m.rank_in for m in self.modules),
                "rank_out": sum(m.rank_out for m in self.modules),
                "kept_energy": self.total_kept_energy,
                "rel_error": self.total_rel_error,
                "max_rel_error": max((m.rel_error for m in self.modules), default=0.0),
            },
            "written": list(self.written),
            "notes": list(self.notes),
        }
