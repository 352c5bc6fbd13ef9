"""The reports of `adapterdoc train` (:class:`TrainReport`) and `adapterdoc eval` (:class:`EvalReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapterdoc.report.base import FrozenReport, pick


@dataclass(frozen=True)
class TrainReport(FrozenReport):
    """One run of `adapterdoc train`: where it wrote, its losses, and the doctor's verdict on the adapter."""

    base: str
    layout: str
    """The registry layout; ``""`` (JSON ``null``) for a base outside the registry."""
    out: str
    adapter: str | None = None
    steps: int = 0
    train_loss: dict[str, float | None] = field(default_factory=dict)
    val_loss: dict[str, float | None] | None = None
    verify: dict[str, object] = field(default_factory=dict)
    """The doctor's verdict (verify against the same base, lora_B, towers)."""
    num_processes: int = 1
    seconds: float = 0.0
    tokens_per_s: float | None = None
    is_main: bool = True
    """False on the other processes of a multi-process run (they report nothing)."""
    canaries: str | None = None
    """``OUT/canaries.json`` for `adapterdoc probe`, when the run wrote one."""

    def body(self) -> dict[str, object]:
        names = ("adapter", "canaries", "steps", "train_loss", "val_loss", "verify", "base", "layout", "out")
        d = pick(self, (*names, "num_processes", "tokens_per_s"))
        return {**d, "layout": self.layout or None, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class EvalReport(FrozenReport):
    """`adapterdoc eval`: loss and accuracy of the base and of base + adapter on the same rows."""

    adapter: str
    base_spec: str
    base: dict[str, float] = field(default_factory=dict)
    adapted: dict[str, float] = field(default_factory=dict)
    rows: int = 0
    improvement: float | None = None
    min_improvement: float | None = None

    def body(self) -> dict[str, object]:
        return {
            "base": self.base,
            "adapter": self.adapted,
            "adapter_path": self.adapter,
            "base_model": self.base_spec,
            "rows": self.rows,
            "improvement": self.improvement,
            "min_improvement": self.min_improvement,
        }
