"""The report of ``adapterdoc roundtrip``: each round trip run on copies of the adapter, and its verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adapterdoc.report.base import FrozenReport
from adapterdoc.report.findings import has_errors


@dataclass(frozen=True)
class Check:
    """One round trip and its verdict."""

    name: str
    status: str
    """``pass``, ``fail`` or ``skipped``."""
    detail: str = ""
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RoundtripReport(FrozenReport):
    """Every round trip of one adapter: ``ok`` when none failed and no finding is an error. Built once, by
    :func:`~adapterdoc.roundtrip.roundtrip`, from the checks every trip returned."""

    input: str
    layout: str
    base: str | None
    checks: Sequence[Check] = ()

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks) and not has_errors(self.findings)

    def body(self) -> dict[str, object]:
        return {
            "input": self.input,
            "layout": self.layout,
            "base": self.base,
            "checks": [c.__dict__ for c in self.checks],
            "passed": sum(c.status == "pass" for c in self.checks),
            "failed": sum(c.status == "fail" for c in self.checks),
            "skipped": sum(c.status == "skipped" for c in self.checks),
        }
