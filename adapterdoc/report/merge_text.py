"""Human rendering of a :class:`~adapterdoc.merge.MergeReport`: what was written, counts of applied and unused
modules with one example each, findings grouped by code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.registry import one_group, register
from adapterdoc.report.render import (
    KEEP,
    MORE,
    Writer,
    count_line,
    human_bytes,
    plural,
    write_findings,
)
from adapterdoc.report.survival_text import write_survival

if TYPE_CHECKING:
    from adapterdoc.report.merge_report import MergeReport


@register("MergeReport", view=one_group("merge", "adapter"))
def render_merge(report: MergeReport, *, width: int | None = None) -> str:
    w = Writer(width)
    cls = f"({report.model_class})" if report.model_class else ""
    w.para(("merge", "bold"), report.adapter, "→", report.base, cls, hang=2)
    if report.quantization:
        how = "re-encoded in its format" if report.requantize else "decoded exactly"
        w.para("base quantized:", (report.quantization, "bold"), f"({how})", indent=2, hang=4)
    if report.dry_run:
        w.para(("dry run: nothing written", "bold"), indent=2)
    elif report.out:
        w.para(
            "wrote",
            (f"{report.out}:", "bold"),
            f"{report.tensors:,} tensors ({report.merged_tensors:,} merged), "
            f"{human_bytes(report.bytes_written)}, dtype {report.dtype}, {report.seconds:.1f} s",
            indent=2,
        )
    else:
        w.para(("nothing written", "bold red"), indent=2)
    _modules(w, "applied", report.applied)
    if report.unused:  # each one is also an AD501 finding, listed below with an example
        w.para((f"unused: {plural(len(report.unused), 'module')}", "bold red"), indent=2)
    if report.survival:
        write_survival(w, report.survival)
    write_findings(w, report.findings, context=(report.adapter,))
    w.para(count_line(report.findings))
    return w.getvalue()


def _modules(w: Writer, label: str, names: list[str]) -> None:
    w.para(f"{label}: {plural(len(names), 'module')}", indent=2)
    if len(names) == 1:
        w.para((names[0], KEEP), indent=4)
    elif names:
        w.para((f"e.g. {names[0]}", KEEP), f"and {len(names) - 1:,} more;", (MORE, KEEP), indent=4, hang=4)
