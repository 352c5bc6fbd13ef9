"""Human rendering of a :class:`~adapterdoc.report.convert_report.ConvertReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.registry import Group, View, register
from adapterdoc.report.render import Writer, write_findings

if TYPE_CHECKING:
    from adapterdoc.report.convert_report import ConvertReport


def _view(report: ConvertReport) -> View:
    return View("convert", [Group(report.input, report.findings, path=report.input)])


@register("ConvertReport", view=_view)
def render_convert(report: ConvertReport, *, width: int | None = None) -> str:
    w = Writer(width)
    w.para(
        (report.input, "bold"),
        f"({report.source_format}: {'; '.join(report.evidence) or 'detected'})",
        hang=2,
    )
    w.para(
        ("✓" if report.ok else "✗", "green" if report.ok else "bold red"),
        f"{' → '.join(report.route)}:",
        (report.out, "bold"),
        f"({report.tensors} tensors{', ' + report.outtype if report.outtype else ''})",
        indent=2,
        hang=4,
    )
    for note in report.notes:
        w.para("note:", note, indent=4, hang=6)
    write_findings(w, report.findings, context=(report.input,))
    return w.getvalue()
