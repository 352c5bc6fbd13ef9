"""Human rendering of a :class:`~adapterdoc.merge.MergeReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.findings import Finding, sort_findings
from adapterdoc.report.render import capture_console, findings_table, human_bytes

if TYPE_CHECKING:
    from adapterdoc.merge import MergeReport

_SAMPLE = 8
_UNUSED_ROWS = 3


def render_merge(report: MergeReport) -> str:
    console, buf = capture_console()
    console.print(
        f"[bold]merge[/] {report.adapter} → {report.base}"
        + (f" ({report.model_class})" if report.model_class else "")
    )
    if report.out:
        console.print(
            f"wrote [bold]{report.out}[/]: {report.tensors:,} tensors ({report.merged_tensors:,} merged), "
            f"{human_bytes(report.bytes_written)}, dtype {report.dtype}, {report.seconds:.1f} s"
        )
    else:
        console.print("[bold red]nothing written[/]")
    console.print(f"applied: {len(report.applied)} module(s)")
    for name in report.applied[:_SAMPLE]:
        console.print(f"  • {name}")
    if len(report.applied) > _SAMPLE:
        console.print(f"  … and {len(report.applied) - _SAMPLE} more")
    if report.unused:
        console.print(f"[bold red]unused: {len(report.unused)} module(s)[/]")
        for name in report.unused[:_SAMPLE]:
            console.print(f"  • {name}")
        if len(report.unused) > _SAMPLE:
            console.print(f"  … and {len(report.unused) - _SAMPLE} more")
    if report.findings:
        console.print(findings_table(_collapse(sort_findings(report.findings))))
    else:
        console.print("no findings")
    return buf.getvalue()


def _collapse(findings: list[Finding]) -> list[Finding]:
    """At most a few AD501 rows (one per unused module in JSON), the shared hint once, then a count."""
    unused = [f for f in findings if f.code == "AD501"]
    if len(unused) <= _UNUSED_ROWS:
        return findings
    out: list[Finding] = []
    shown = 0
    for f in findings:
        if f.code != "AD501":
            out.append(f)
            continue
        if shown < _UNUSED_ROWS:
            out.append(f if shown == 0 else Finding(f.code, f.severity, f.message, key=f.key, path=f.path))
        elif shown == _UNUSED_ROWS:
            out.append(
                Finding(
                    f.code,
                    f.severity,
                    f"… and {len(unused) - _UNUSED_ROWS} more unused module(s) (--json lists all)",
                )
            )
        shown += 1
    return out
