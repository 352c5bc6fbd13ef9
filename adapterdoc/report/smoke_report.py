"""The report of `adapterdoc train-smoke` (:class:`SmokeReport`): one :class:`LayoutRun` per layout, each with the
result of every doctor check (:class:`CheckResult`), in the order of :data:`CHECK_NAMES`. All three are frozen:
each is built once, from the finished step's results (issue 28)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adapterdoc.report.base import FrozenReport, pick
from adapterdoc.report.findings import Finding, has_errors

CHECK_NAMES = (
    "loss",
    "towers",
    "inspect",
    "verify",
    "reload",
    "lora_b",
    "remap",
    "merge",
    "experts",
    "experts_trip",
)
"""The doctor checks train-smoke runs on each trained adapter, in order."""


@dataclass(frozen=True)
class CheckResult:
    """One check on one layout's run: passed, failed or skipped, what it measured, and how."""

    name: str
    ok: bool | None
    """``None``: skipped (e.g. no text-only counterpart)."""
    detail: str
    implementation: str
    seconds: float = 0.0
    value: float | None = None
    """The measured quantity (max |Δ| of outputs, count of non-zero lora_B, ...)."""
    code: str | None = None
    """The AD6xx code reported when the check fails."""

    def to_dict(self) -> dict[str, object]:
        return {**pick(self, ("ok", "detail", "implementation", "value")), "seconds": round(self.seconds, 4)}


@dataclass(frozen=True)
class LayoutRun:
    """One layout's reference run: its losses and accuracies, its checks, where it wrote, or why it failed."""

    layout: str
    objective: str | None = None
    train_loss_before: float | None = None
    train_loss_after: float | None = None
    val_loss_before: float | None = None
    val_loss_after: float | None = None
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    """Answer-token accuracy (masked tokens for MLM, classes for the pooled head) on the validation rows."""
    checks: Sequence[CheckResult] = ()
    seconds: float = 0.0
    train_seconds: float = 0.0
    out: str | None = None
    adapter_dir: str | None = None
    error: str | None = None
    findings: Sequence[Finding] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.ok is not False for c in self.checks)

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "layout": self.layout,
            "ok": self.ok,
            "objective": self.objective,
            "loss_before": self.train_loss_before,
            "loss_after": self.train_loss_after,
            "val_loss_before": self.val_loss_before,
            "val_loss_after": self.val_loss_after,
            "accuracy_before": self.accuracy_before,
            "accuracy_after": self.accuracy_after,
            "checks": {c.name: c.to_dict() for c in self.checks},
            "seconds": round(self.seconds, 3),
            "train_seconds": round(self.train_seconds, 3),
            "out": self.out,
            "adapter": self.adapter_dir,
            "error": self.error,
        }


@dataclass(frozen=True, kw_only=True)
class SmokeReport(FrozenReport):
    """Every layout's run and checks; ``ok`` only when every run passed and no finding is an error."""

    runs: Sequence[LayoutRun]
    steps: int
    out: str | None
    """``None`` when the outputs went to a temporary folder that is gone."""
    seconds: float
    import_seconds: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs) and not has_errors(self.findings)

    def body(self) -> dict[str, object]:
        timings = {"seconds": round(self.seconds, 3), "import_seconds": round(self.import_seconds, 3)}
        return {"layouts": [r.to_dict() for r in self.runs], **pick(self, ("steps", "out")), **timings}
