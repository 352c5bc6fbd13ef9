"""Findings: the data every command produces and every renderer consumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One observation about an input, with a stable code from the catalogue (``adapterdoc explain CODE``)."""

    code: str
    severity: Severity
    message: str
    key: str | None = None
    """The tensor name, module path or config field the finding is about."""
    path: str | None = None
    """The file or adapter the finding is about."""
    hint: str | None = None
    """What to do about it, e.g. the exact ``adapterdoc remap ...`` command."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def make(code: str, message: str, *, severity: Severity | None = None, **kw: Any) -> Finding:
    """A finding for a catalogued code; the severity defaults to the catalogue's."""
    from adapterdoc.codes import get_code

    info = get_code(code)
    return Finding(code=code, severity=severity or info.severity, message=message, **kw)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.code))
