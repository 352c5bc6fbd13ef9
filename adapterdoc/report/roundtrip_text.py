"""Human rendering of a :class:`~adapterdoc.roundtrip.RoundtripReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from adapterdoc.report.render import capture_console, findings_table

if TYPE_CHECKING:
    from adapterdoc.roundtrip import RoundtripReport

_STYLE = {"pass": "green", "fail": "bold red", "skipped": "yellow"}


def render_roundtrip(report: RoundtripReport) -> str:
    console, buf = capture_console()
    console.print(f"[bold]{report.input}[/]  layout: {report.layout}  base: {report.base or '(none)'}")
    table = Table(title="Round trips")
    for col in ("check", "result", "detail", "s"):
        table.add_column(col, overflow="fold", justify="right" if col == "s" else "left")
    for c in report.checks:
        table.add_row(c.name, f"[{_STYLE[c.status]}]{c.status}[/]", c.detail, f"{c.seconds:.2f}")
    console.print(table)
    if report.findings:
        console.print(findings_table(report.findings))
    passed = sum(c.status == "pass" for c in report.checks)
    failed = sum(c.status == "fail" for c in report.checks)
    skipped = sum(c.status == "skipped" for c in report.checks)
    console.print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return buf.getvalue()
