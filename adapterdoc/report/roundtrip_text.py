"""Human rendering of a :class:`~adapterdoc.roundtrip.RoundtripReport`: one line per round trip with its
detail below, and a pytest-like summary line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.registry import one_group, register
from adapterdoc.report.render import Writer, write_findings

if TYPE_CHECKING:
    from adapterdoc.report.roundtrip_report import RoundtripReport

_MARK = {"pass": ("✓", "green"), "fail": ("✗", "bold red"), "skipped": ("–", "yellow")}
_ORDER = ("fail", "pass", "skipped")
_WORD = {"fail": "failed", "pass": "passed", "skipped": "skipped"}


@register("RoundtripReport", view=one_group("roundtrip", "input"))
def render_roundtrip(report: RoundtripReport, *, width: int | None = None) -> str:
    w = Writer(width)
    w.para((report.input, "bold"), f"(layout {report.layout}, base {report.base or 'none'})", hang=2)
    for c in report.checks:
        mark, style = _MARK.get(c.status, ("?", "bold"))
        took = f"({c.seconds:.2f} s)" if c.seconds or c.status != "skipped" else ""
        w.para((mark, style), (c.status, style), (c.name, "bold"), took, indent=2, hang=4)
        if c.detail:
            w.para(c.detail, indent=4, hang=4)
    write_findings(w, report.findings, context=(report.input,))
    counts = {s: sum(c.status == s for c in report.checks) for s in _ORDER}
    parts = [f"{counts[s]} {_WORD[s]}" for s in _ORDER if counts[s]] or ["no round trips"]
    seconds = sum(c.seconds for c in report.checks)
    w.para((", ".join(parts), "bold red" if counts["fail"] else "bold green"), f"in {seconds:.1f} s")
    return w.getvalue()
