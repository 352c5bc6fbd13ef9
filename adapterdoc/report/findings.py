"""Findings: the data every command produces and every renderer consumes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from adapterdoc.codes import Severity

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
    line: int | None = None
    """For a finding about a config field (a ``key`` without a dot): the 1-based line of that field in the
    ``adapter_config.json`` of ``path`` (the file, or the adapter folder holding it), set when the finding is made
    (:func:`make`); the CI formats attach the finding there. ``None`` (and no ``line`` in the JSON) otherwise."""

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def make(
    code: str,
    message: str,
    *,
    severity: Severity | None = None,
    key: str | None = None,
    path: str | None = None,
    hint: str | None = None,
    line: int | None = None,
) -> Finding:
    """A finding for a catalogued code; the severity defaults to the catalogue's. A finding about a config field
    (``key`` without a dot, ``path`` an adapter folder or its ``adapter_config.json``) gets that field's line
    (:func:`adapterdoc.adapter.lines.config_field_line`) unless ``line`` is given."""
    from adapterdoc.codes import get_code

    info = get_code(code)
    if line is None and key and path and "." not in key:
        from adapterdoc.adapter.lines import config_field_line

        line = config_field_line(path, key)
    return Finding(
        code=code,
        severity=severity or info.severity,
        message=message,
        key=key,
        path=path,
        hint=hint,
        line=line,
    )


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.code))
