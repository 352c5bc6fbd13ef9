"""Human rendering of an :class:`~adapterdoc.inspect.InspectReport`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from adapterdoc.report.render import capture_console, findings_table, human_bytes

if TYPE_CHECKING:
    from adapterdoc.inspect import InspectReport


def render_inspect(report: InspectReport) -> str:
    console, buf = capture_console()
    console.print(f"[bold]{report.spec}[/] ({report.kind}, {report.weights_format})")
    files = Table(title="Files")
    for col in ("path", "bytes", "header bytes", "tensors"):
        files.add_column(col, justify="right" if col != "path" else "left", overflow="fold")
    for f in report.files:
        files.add_row(f.path, human_bytes(f.bytes), f"{f.header_bytes:,}", f"{f.tensors:,}")
    console.print(files)
    dt = ", ".join(f"{d} × {n}" for d, n in report.dtypes.items()) or "none"
    console.print(f"tensors: {report.tensors:,}   parameters: {report.parameters:,}   dtypes: {dt}")
    if report.metadata is not None:
        console.print(f"__metadata__: {report.metadata}")
    lay = report.layout
    cands = f"  (also: {', '.join(lay.candidates)})" if lay.candidates else ""
    console.print(f"layout: [bold]{lay.name}[/]{cands}")
    for ev in lay.evidence:
        console.print(f"  • {ev}")
    if report.lora:
        _render_lora(console, report)
    if report.findings:
        console.print(findings_table(report.findings))
    else:
        console.print("no findings")
    return buf.getvalue()


def _render_lora(console, report: InspectReport) -> None:  # type: ignore[no-untyped-def]
    lo = report.lora
    assert lo is not None
    ranks = ", ".join(f"r={r} × {n}" for r, n in lo.ranks.items()) or "none"
    scaling = (
        "n/a"
        if lo.scaling is None
        else f"{lo.scaling:g}" + (" (rsLoRA: alpha/sqrt(r))" if lo.use_rslora else "")
    )
    console.print(
        f"LoRA: {lo.modules} module(s)   ranks: {ranks}   config r: {lo.config_r}   alpha: {lo.alpha}   "
        f"scaling: {scaling}   DoRA: {'yes' if lo.use_dora else 'no'}"
    )
    if lo.fused_expert_modules:
        console.print(f"fused-expert LoRA modules: {lo.fused_expert_modules} (rank dimension is r × experts)")
    for label, value in (
        ("target_modules", lo.target_modules),
        ("exclude_modules", lo.exclude_modules),
        ("target_parameters", lo.target_parameters),
        ("modules_to_save", lo.modules_to_save),
        ("rank_pattern", lo.rank_pattern),
        ("alpha_pattern", lo.alpha_pattern),
    ):
        if value:
            console.print(f"{label}: {value}")
    table = Table(title="LoRA modules per prefix and leaf")
    table.add_column("prefix", overflow="fold")
    table.add_column("modules", justify="right")
    table.add_column("leaf")
    table.add_column("modules", justify="right")
    prefixes = list(lo.per_prefix.items())
    leaves = list(lo.per_leaf.items())
    for i in range(max(len(prefixes), len(leaves))):
        p = prefixes[i] if i < len(prefixes) else ("", "")
        leaf = leaves[i] if i < len(leaves) else ("", "")
        table.add_row(p[0], str(p[1]), leaf[0], str(leaf[1]))
    console.print(table)
