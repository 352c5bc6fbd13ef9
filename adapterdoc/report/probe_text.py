"""Human rendering of a :class:`~adapterdoc.report.probe_report.ProbeReport`: the verdict, the request it judged,
the numbers behind it, then the findings (the verdict's and the convention warnings)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.registry import one_group, register
from adapterdoc.report.render import Writer, write_findings

if TYPE_CHECKING:
    from adapterdoc.report.probe_report import CanariesReport, ProbeReport

VERDICTS = {
    "applied": "the adapter is applied as PEFT applies it",
    "base": "the server answers with the base model (the adapter is ignored)",
    "scale": "the adapter is applied at another scale",
    "differs": "the served output differs from both the base and the adapter",
}


@register("ProbeReport", view=one_group("probe", "url"))
def render_probe(report: ProbeReport, *, width: int | None = None) -> str:
    w = Writer(width)
    how = "detected" if report.engine_detected else "given"
    read = f"; read at {report.alignment}" if report.alignment else ""
    w.para(
        ("probe", "bold"), report.url, f"({report.engine}, {how}; request: {report.request}{read})", hang=2
    )
    verdict = VERDICTS.get(report.verdict, report.verdict)
    if report.verdict == "scale" and report.factor is not None:
        verdict += f": {report.factor:.3g}× PEFT's scaling"
    w.para(
        ("✓" if report.ok else "✗", "green" if report.ok else "bold red"), (verdict, "bold"), indent=2, hang=4
    )
    w.para(
        f"{report.observations} served logprobs against {report.canaries or 'the canaries'};",
        f"tolerance of {report.dtype};",
        f"adapter-vs-base separation {report.separation:.1f}, best fit {report.best:.2f} (in tolerances);",
        f"{len(report.requests)} requests",
        indent=4,
        hang=4,
    )
    write_findings(w, report.findings, indent=2, context=(report.url,))
    return w.getvalue()


@register("CanariesReport", view=one_group("probe", "out"))
def render_canaries(report: CanariesReport, *, width: int | None = None) -> str:
    w = Writer(width)
    w.para(("canaries", "bold"), report.adapter, "on", report.base, "→", (report.out, "bold"), hang=2)
    scales = ", ".join(f"{s:.3g}" for s in report.scales)
    w.para(
        f"{report.prompts} prompts, {report.positions} positions, {report.candidates} next-token candidates;",
        f"scales {scales}; the adapter moves a logprob by up to {report.largest_move:.3g}",
        indent=2,
        hang=4,
    )
    write_findings(w, report.findings, indent=2)
    return w.getvalue()
