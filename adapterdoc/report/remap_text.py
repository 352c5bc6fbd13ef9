"""Human rendering of a :class:`~adapterdoc.remap.RemapReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from adapterdoc.report.render import capture_console, findings_table

if TYPE_CHECKING:
    from adapterdoc.remap import RemapReport

SHOWN = 12
"""Renames listed in the table; the rest are counted (``--json`` lists up to a thousand)."""


def render_remap(report: RemapReport) -> str:
    console, buf = capture_console()
    move = {"vl": "--vl", "to": "--to", "rule": "--rule"}[report.mode]
    layouts = ""
    if report.source_layout or report.target_layout:
        layouts = f"  {report.source_layout or '?'} → {report.target_layout or '?'}"
    console.print(f"[bold]{escape(report.input)}[/]  remap {move}{escape(layouts)}")
    verb = "would rename" if report.dry_run else "renamed"
    console.print(f"{verb} {report.renamed} key(s)   strategy: [bold]{report.strategy}[/]")
    if report.mapping:
        table = Table(title="Renames", show_lines=False)
        table.add_column("old", overflow="fold")
        table.add_column("new", overflow="fold")
        for old, new in list(report.mapping.items())[:SHOWN]:
            table.add_row(escape(old), escape(new))
        console.print(table)
        if report.renamed > SHOWN:
            console.print(f"... and {report.renamed - SHOWN} more (--json lists them)")
    for c in report.config_changes:
        console.print(
            f"adapter_config.json {c.field} ({c.how}): {escape(repr(c.old))} → {escape(repr(c.new))}"
        )
    if report.out:
        console.print(f"output folder: {escape(report.out)}")
    for path in report.written:
        console.print(f"{'would write' if report.dry_run else 'wrote'} {escape(path)}")
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    if report.findings:
        console.print(findings_table(report.findings))
    return buf.getvalue()
