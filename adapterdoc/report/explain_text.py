"""Human rendering of an :class:`~adapterdoc.report.explain_report.ExplainReport`: a code's four sections
(what it means, why it matters, an example, what to do instead), or one line per code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.codes import area_of
from adapterdoc.report.registry import register
from adapterdoc.report.render import Writer

if TYPE_CHECKING:
    from adapterdoc.codes import Code
    from adapterdoc.report.explain_report import ExplainReport


@register("ExplainReport")
def render_explain(report: ExplainReport, *, width: int | None = None) -> str:
    if not report.listing:
        return render_code(report.codes[0], width)
    name_width = max(len(c.name) for c in report.codes)
    return (
        "\n".join(f"{c.code}  {c.name:<{name_width}}  {c.severity:<7}  {c.summary}" for c in report.codes)
        + "\n"
    )


def render_code(info: Code, width: int | None = None) -> str:
    """The code's explanation at the output width (wrapped at spaces, names in backticks kept whole)."""
    w = Writer(width)
    w.line(f"{info.code} {info.name} ({info.severity}, area {area_of(info.code)}, since {info.since})")
    for title, text in (
        ("What it means", info.summary),
        ("Why it matters", info.why),
        ("Example", info.example),
        ("What to do instead", info.instead),
    ):
        w.blank()
        w.line(title)
        w.para(text, indent=2, hang=2)
    return w.getvalue()
