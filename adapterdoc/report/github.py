"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` annotation per finding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.codes import catalogue

if TYPE_CHECKING:
    from adapterdoc.report.findings import Finding
    from adapterdoc.verify import VerifyRun

LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(s: str) -> str:
    """The message part of a workflow command (GitHub's escaping: %, CR, LF)."""
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    """A property value (``file=``, ``title=``): also ``:`` and ``,``."""
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def render_github(run: VerifyRun) -> str:
    lines: list[str] = []
    for report in run.adapters:
        if report.error:
            props = f"file={escape_property(report.adapter)},title={escape_property('adapterdoc: unusable input')}"
            lines.append(f"::error {props}::{escape_data(report.error)}")
            continue
        for f in report.findings:
            lines.append(annotation(f, report.adapter))
    failed = sum(1 for a in run.adapters if not a.ok)
    lines.append(f"adapterdoc verify: {len(run.adapters) - failed} of {len(run.adapters)} adapter(s) passed")
    return "\n".join(lines) + "\n"


def annotation(f: Finding, adapter: str) -> str:
    info = catalogue().get(f.code)
    title = f"{f.code} {info.name}" if info else f.code
    msg = f.message
    if f.key:
        msg += f" (key: {f.key})"
    if f.hint:
        msg += f"\nfix: {f.hint}"
    props = f"file={escape_property(f.path or adapter)},title={escape_property(title)}"
    return f"::{LEVEL[f.severity]} {props}::{escape_data(msg)}"
