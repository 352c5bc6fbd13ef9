"""Human rendering of a train-smoke :class:`~adapterdoc.train.smoke.SmokeReport`: one row per layout."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from rich.table import Table

from adapterdoc.report.render import capture_console, findings_table

if TYPE_CHECKING:
    from adapterdoc.train.smoke import LayoutRun, SmokeReport

_MARK = {True: "[green]✓[/]", False: "[bold red]✗[/]", None: "[dim]–[/]"}


def _loss(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "–"
    return f"{before:.3f} → {after:.3f}"


def check_names(report: SmokeReport) -> list[str]:
    from adapterdoc.train.smoke import CHECK_NAMES

    seen = [c.name for r in report.runs for c in r.checks]
    return [n for n in CHECK_NAMES if n in seen] + sorted({n for n in seen if n not in CHECK_NAMES})


def smoke_table(report: SmokeReport) -> Table:
    from rich import box

    names = check_names(report)
    table = Table(
        title=f"train-smoke ({report.steps} steps per layout)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )
    table.add_column("layout", no_wrap=True)
    table.add_column("train loss", justify="right", no_wrap=True)
    table.add_column("val loss", justify="right", no_wrap=True)
    table.add_column("val acc", justify="right", no_wrap=True)
    for n in names:
        table.add_column(n, justify="center", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    for run in report.runs:
        table.add_row(*_row(run, names))
    return table


def _row(run: LayoutRun, names: list[str]) -> list[str]:
    layout = run.layout if run.ok else f"[bold red]{run.layout}[/]"
    acc = "–" if run.accuracy_after is None else f"{run.accuracy_after:.2f}"
    cells = [
        layout,
        _loss(run.train_loss_before, run.train_loss_after),
        _loss(run.val_loss_before, run.val_loss_after),
        acc,
    ]
    for n in names:
        c = run.check(n)
        cells.append(_MARK[c.ok] if c else _MARK[None if run.error is None else False])
    cells.append(f"{run.seconds:.1f}")
    return cells


def _failures(report: SmokeReport) -> list[str]:
    lines = []
    for run in report.runs:
        if run.error:
            lines.append(f"{run.layout}: training failed: {run.error}")
        for c in run.checks:
            if c.ok is False:
                lines.append(f"{run.layout}: {c.name}: {c.detail}")
    return lines


def render_smoke(report: SmokeReport, *, verbose: bool = False) -> str:
    # a terminal gets its own width; a log file or pipe gets room for the whole table
    console, buf = capture_console(None if sys.stdout.isatty() else 150)
    console.print(smoke_table(report))
    failed = [r.layout for r in report.runs if not r.ok]
    passed = len(report.runs) - len(failed)
    where = (
        f"outputs in {report.out}" if report.out else "outputs were temporary (use --out DIR to keep them)"
    )
    console.print(
        f"{passed}/{len(report.runs)} layout(s) passed in {report.seconds:.1f} s "
        f"(imports {report.import_seconds:.1f} s); {where}"
    )
    if verbose:
        for run in report.runs:
            for c in run.checks:
                console.print(f"  {run.layout} {c.name}: {c.detail} [dim]({c.implementation})[/]")
    for line in _failures(report):
        console.print(f"[bold red]✗[/] {line}", markup=True)
    if report.findings:
        console.print(findings_table(report.findings))
    return buf.getvalue()


def progress_line(event: dict[str, Any]) -> str | None:
    """A one-line description of a progress event (for the live display), or None to ignore it."""
    kind = event.get("event")
    layout = event.get("layout", "")
    if kind == "layout_start":
        return f"{layout}: building"
    if kind == "setup":
        return f"{layout}: {event.get('objective')} objective, {event.get('train_rows')} training rows"
    if kind == "eval":
        return f"{layout}: evaluating ({event.get('when')})"
    if kind == "step":
        return f"{layout}: step {event.get('step')} loss {event.get('loss', 0):.3f}"
    if kind == "save_start":
        return f"{layout}: saving"
    if kind == "check_start":
        return f"{layout}: check {event.get('check')}"
    return None
