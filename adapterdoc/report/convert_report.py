"""The report of ``adapterdoc convert``: what was converted into what, where, and the exact-but-worth-saying facts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adapterdoc.report.base import FrozenReport, pick


@dataclass(frozen=True, kw_only=True)
class ConvertReport(FrozenReport):
    """One conversion: ``ok`` when no finding is an error (a refusal is exit 3 and no report). Built once, by
    :func:`~adapterdoc.formats.convert.convert`, when the conversion is written."""

    input: str
    source_format: str
    target_format: str
    out: str
    tensors: int = 0
    evidence: Sequence[str] = ()
    """Why the input was read as ``source_format``."""
    route: Sequence[str] = ()
    """The formats passed through (``mlx → peft → gguf``)."""
    outtype: str | None = None
    notes: Sequence[str] = ()

    def body(self) -> dict[str, object]:
        body = pick(self, ("input", "source_format", "target_format", "out", "tensors"))
        lists = {name: list(getattr(self, name)) for name in ("evidence", "route")}
        return {**body, **lists, "outtype": self.outtype, "notes": list(self.notes)}
