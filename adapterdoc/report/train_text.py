"""Human rendering of a train-smoke :class:`~adapterdoc.report.smoke_report.SmokeReport` (a borderless table with
one row per layout, the checks as counts, the failures below it), and the short summaries of `adapterdoc train`
(:func:`render_train`) and `adapterdoc eval` (:func:`render_eval`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from adapterdoc.report.registry import register
from adapterdoc.report.render import Span, Writer, columns, plural, write_findings
from adapterdoc.report.smoke_report import CHECK_NAMES, LayoutRun, SmokeReport
from adapterdoc.report.train_report import EvalReport, TrainReport

_MARK = {True: ("✓", "green"), False: ("✗", "bold red"), None: ("–", "dim")}


def _loss(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "–"
    return f"{before:.3f} → {after:.3f}"


def check_names(report: SmokeReport) -> list[str]:
    seen = [c.name for r in report.runs for c in r.checks]
    return [n for n in CHECK_NAMES if n in seen] + sorted({n for n in seen if n not in CHECK_NAMES})


def smoke_table(report: SmokeReport) -> list[list[Span]]:
    """One row per layout: losses, accuracy, the checks as counts of ✓ ✗ – (passed, failed, skipped), seconds."""
    names = check_names(report)
    rows: list[list[Span]] = [["layout", "train loss", "val loss", "val acc", "checks", "s"]]
    for run in report.runs:
        rows.append(_row(run, names))
    return columns(rows, right=(1, 2, 3, 5))


def _row(run: LayoutRun, names: list[str]) -> list[Span]:
    layout: Span = run.layout if run.ok else (run.layout, "bold red")
    acc = "–" if run.accuracy_after is None else f"{run.accuracy_after:.2f}"
    return [
        layout,
        _loss(run.train_loss_before, run.train_loss_after),
        _loss(run.val_loss_before, run.val_loss_after),
        acc,
        _checks(run, names),
        f"{run.seconds:.1f}",
    ]


def _checks(run: LayoutRun, names: list[str]) -> Span:
    """``✓8``, or ``✓6 ✗1 –1``; a layout whose training failed has every check ✗."""
    states = []
    for n in names:
        c = run.check(n)
        states.append(c.ok if c else (None if run.error is None else False))
    counts = {state: states.count(state) for state in (True, False, None)}
    text = " ".join(f"{_MARK[state][0]}{counts[state]}" for state in (True, False, None) if counts[state])
    return (text or "–", "bold red" if counts[False] else "green")


def _failures(report: SmokeReport) -> list[tuple[str, str]]:
    lines = []
    for run in report.runs:
        if run.error:
            lines.append((run.layout, f"training failed: {run.error}"))
        for c in run.checks:
            if c.ok is False:
                lines.append((run.layout, f"{c.name}: {c.detail}"))
    return lines


@register("SmokeReport")
def render_smoke(report: SmokeReport, *, verbose: bool = False, width: int | None = None) -> str:
    w = Writer(width)
    names = check_names(report)
    w.para(
        ("train-smoke:", "bold"),
        f"{plural(report.steps, 'step')} per layout; checks:",
        ", ".join(names) if names else "none",
        hang=2,
    )
    for row in smoke_table(report):
        w.line(*row)
    failed = [r.layout for r in report.runs if not r.ok]
    passed = len(report.runs) - len(failed)
    where = (
        f"outputs in {report.out}" if report.out else "outputs were temporary (use --out DIR to keep them)"
    )
    verdict = "layout passed" if len(report.runs) == 1 else "layouts passed"
    w.para(
        (f"{passed}/{len(report.runs)} {verdict}", "bold red" if failed else "bold green"),
        f"in {report.seconds:.1f} s (imports {report.import_seconds:.1f} s);",
        where,
        hang=2,
    )
    if verbose:
        for run in report.runs:
            for c in run.checks:
                mark, style = _MARK[c.ok]
                w.para(
                    (mark, style),
                    f"{run.layout} {c.name}: {c.detail}",
                    (f"({c.implementation})", "dim"),
                    indent=2,
                )
    for layout, line in _failures(report):
        w.para(("✗", "bold red"), (layout, "bold"), line, hang=4)
    write_findings(w, report.findings)
    return w.getvalue()


def progress_line(event: Mapping[str, object]) -> str | None:
    """A one-line description of a progress event (for the live display), or None to ignore it."""
    line = _PROGRESS.get(str(event.get("event")))
    return f"{event.get('layout', '')}: {line(event)}" if line else None


_PROGRESS: dict[str, Callable[[Mapping[str, object]], str]] = {
    "layout_start": lambda e: "building",
    "setup": lambda e: f"{e.get('objective')} objective, {e.get('train_rows')} training rows",
    "eval": lambda e: f"evaluating ({e.get('when')})",
    "step": lambda e: f"step {e.get('step')} loss {e.get('loss', 0):.3f}",
    "save_start": lambda e: "saving",
    "check_start": lambda e: f"check {e.get('check')}",
}
"""The progress events train-smoke's live display describes, each after its layout's name."""


@register("TrainReport")
def render_train(r: TrainReport) -> str:
    """`adapterdoc train`'s summary: losses, the adapter, the doctor's verdict, the report, the findings."""

    def pair(d: Mapping[str, float | None] | None) -> str:
        return "–" if not d else f"{d['before']:.4f} → {d['after']:.4f}"

    v = r.verify
    lora_b = v.get("lora_b", {})
    b_counts: Mapping[str, object] = lora_b if isinstance(lora_b, Mapping) else {}
    lines = [
        f"train: {r.base} ({r.layout or 'outside the registry'}), {r.steps} steps on {r.num_processes} process(es)",
        f"  train loss {pair(r.train_loss)}; val loss {pair(r.val_loss)}",
        f"  adapter {r.adapter}",
        f"  doctor: verify {'passed' if v.get('ok') else 'FAILED'}, lora_B non-zero "
        f"{b_counts.get('nonzero', 0)}/{b_counts.get('total', 0)}, tower LoRA {v.get('tower_lora', 0)}",
        f"  report {os.path.join(r.out, 'RUN_REPORT.md')}",
    ]
    if r.canaries:
        lines.append(f"  canaries {r.canaries} (for adapterdoc probe)")
    lines += [f"  {f.code} {f.severity}: {f.message}" for f in r.findings]
    return "\n".join(lines)


@register("EvalReport")
def render_eval(report: EvalReport) -> str:
    """`adapterdoc eval`'s summary: loss and accuracy of the base and of base + adapter, the improvement."""
    lines = [f"eval: {report.adapter} on {report.base_spec} ({report.rows} rows)"]
    for name, m in (("base", report.base), ("base + adapter", report.adapted)):
        lines.append(
            f"  {name:<15} loss {m['loss']:.4f}  accuracy {m['accuracy']:.3f}  ({m['tokens']:g} tokens)"
        )
    lines.append(f"  improvement {report.improvement:+.4f}")
    lines += [f"  {f.code} {f.severity}: {f.message}" for f in report.findings]
    return "\n".join(lines)
