"""Human rendering of an :class:`~adapterdoc.report.algebra_report.AlgebraReport`: the inputs, the worst modules
(rank in → out, kept energy, relative error) and the total."""

from __future__ import annotations

from adapterdoc.report.algebra_report import AlgebraReport
from adapterdoc.report.render import MORE, Writer, columns, plural, write_findings

SHOWN = 8
"""Modules listed (the largest relative errors first); ``--json`` lists every one."""


def render_algebra(report: AlgebraReport, *, width: int | None = None) -> str:
    w = Writer(width)
    w.para((report.out, "bold"), hang=2)
    inputs = ", ".join(
        f"{w_:g} × {p}" if report.weights else p
        for p, w_ in zip(report.inputs, report.weights or [1.0] * len(report.inputs), strict=True)
    )
    w.para(f"{report.command} ({report.method}) of", inputs, indent=2)
    exact = "exact" if report.exact else f"relative error {report.total_rel_error:.3g}"
    w.para(
        f"{plural(len(report.modules), 'module')}, rank "
        f"{sum(m.rank_in for m in report.modules)} → {sum(m.rank_out for m in report.modules)} in all, "
        f"kept energy {report.total_kept_energy:.6f}, {exact}",
        indent=2,
    )
    worst = sorted(report.modules, key=lambda m: -m.rel_error)[:SHOWN]
    rows = [["module", "rank", "kept energy", "rel. error"]] + [
        [m.module, f"{m.rank_in} → {m.rank_out}", f"{m.kept_energy:.6f}", f"{m.rel_error:.3g}"] for m in worst
    ]
    for row in columns(rows, right=(2, 3)):
        w.line(*row, indent=4)
    if len(report.modules) > SHOWN:
        w.para(f"… {len(report.modules) - SHOWN} more ({MORE})", indent=4)
    for path in report.written:
        w.para("wrote", path, indent=2)
    for note in report.notes:
        w.para("note:", note, indent=2)
    write_findings(w, report.findings, context=(report.out,))
    return w.getvalue()
