"""What ``adapterdoc merge`` returns: :class:`MergeReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapterdoc.report.base import FrozenReport, envelope
from adapterdoc.report.findings import sort_findings


@dataclass(frozen=True)
class MergeReport(FrozenReport):
    """What a merge did (or would have done) and why it passed or failed."""

    adapter: str
    base: str
    out: str | None
    """The merged folder; ``None`` when nothing was written."""
    dtype: str
    applied: list[str] = field(default_factory=list)
    """Adapter modules (and saved whole weights) merged into the base."""
    unused: list[str] = field(default_factory=list)
    """Adapter modules that matched no base tensor (each also an AD501 finding)."""
    model_class: str | None = None
    tensors: int = 0
    """Tensors written."""
    merged_tensors: int = 0
    """Tensors changed by the adapter."""
    bytes_written: int = 0
    seconds: float = 0.0
    plan: str | None = None
    """The planner that ran: ``headers`` (config files and headers alone) or ``meta-model`` (transformers and
    PEFT on the meta device)."""
    plan_fallback: str | None = None
    """Why the header plan could not vouch for this merge, where the meta-model plan ran instead."""
    quantization: str | None = None
    """The base's quantization in words, when it is quantized."""
    requantize: bool = False
    dry_run: bool = False
    survival: list[dict[str, object]] = field(default_factory=list)
    """Per quantized module the adapter changes: what survives quantizing the merged weight again
    (:meth:`adapterdoc.merge.survival.Survival.to_dict`)."""

    def body(self) -> dict[str, object]:
        return {
            "adapter": self.adapter,
            "base": self.base,
            "out": self.out,
            "dtype": self.dtype,
            "model_class": self.model_class,
            "applied": self.applied,
            "unused": self.unused,
            "tensors": self.tensors,
            "merged_tensors": self.merged_tensors,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "plan": self.plan,
            "plan_fallback": self.plan_fallback,
            "quantization": self.quantization,
            "requantize": self.requantize,
            "dry_run": self.dry_run,
            "survival": self.survival,
        }

    def to_dict(self) -> dict[str, object]:
        """The envelope with the findings in their sorted order (they are collected as the plan finds them)."""
        return envelope(self.ok, sort_findings(self.findings), self.body())
