"""The report of ``adapterdoc convert``: what was converted into what, where, and the exact-but-worth-saying facts."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapterdoc.report.base import Report, pick


@dataclass
class ConvertReport(Report):
    """One conversion: ``ok`` when no finding is an error (a refusal is exit 3 and no report)."""

    input: str
    source_format: str
    target_format: str
    out: str
    tensors: int = 0
    evidence: list[str] = field(default_factory=list)
    """Why the input was read as ``source_format``."""
    route: list[str] = field(default_factory=list)
    """The formats passed through (``mlx → peft → gguf``)."""
    outtype: str | None = None
    notes: list[str] = field(default_factory=list)

    def body(self) -> dict[str, object]:
        names = (
            "input",
            "source_format",
            "target_format",
            "out",
            "tensors",
            "evidence",
            "route",
            "outtype",
            "notes",
        )
        return pick(self, names)
