"""`adapterdoc train-smoke [--layout NAME|all] [--steps N] [--data FILE] [--out DIR] [--json]`."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from adapterdoc.commands.options import (
    Output,
    data_option,
    finish,
    handle_errors,
    is_quiet,
    out_option,
    output_options,
    stderr_bar,
    steps_option,
)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


@click.command("train-smoke")
@click.option(
    "--layout",
    "layout",
    default="all",
    show_default=True,
    metavar="NAME|all",
    help="A layout with a tiny reference model, a comma-separated list, or all (every VL/wrapper layout and encoder).",
)
@steps_option("Optimizer steps per layout [default: 24].")
@data_option(
    "Training rows (JSONL: prompt, answer object, split train|val) [default: the reference rows bundled "
    "with adapterdoc].",
    required=False,
    dir_okay=True,
    metavar="FILE.jsonl",
)
@out_option(
    "Keep the runs in DIR/<layout>/ (adapter, head, progress.jsonl, training_metadata.json, RUN_REPORT.md)."
)
@output_options()
@click.option("--verbose", "-v", is_flag=True, help="Print every check's measurement and implementation.")
@click.pass_context
@handle_errors
def command(
    ctx: click.Context,
    layout: str,
    steps: int | None,
    data: str | None,
    out: str | None,
    output: Output,
    verbose: bool,
) -> None:
    """Train a reference LoRA on a tiny model per layout, then run the doctor on it.

    Per layout: build, inject LoRA, train, evaluate, save; then check that inspect detects the layout, a fresh base
    reloads the adapter with identical outputs, every lora_B is non-zero, the remap to the text-only counterpart
    loads there with identical outputs, and merging changes nothing. Exit 1 if any check fails.
    """
    from adapterdoc.smoke import resolve_layouts, run_smoke

    try:
        layouts = resolve_layouts(layout)
    except KeyError as e:
        raise click.BadParameter(str(e.args[0]), param_hint="--layout") from None
    quiet = is_quiet()
    with _Progress(len(layouts), enabled=not quiet) as progress:
        report = run_smoke(layouts, steps=steps, out=out, on_event=progress.on_event, data=data)
    finish(report, output, text_options={"verbose": verbose})


class _Progress:
    """Live progress on stderr: a rich bar on a terminal, one line per finished layout otherwise."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.live = enabled and sys.stderr.isatty()
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self) -> _Progress:
        if self.live:
            self.progress, self.task = stderr_bar(
                ("spinner", "{task.description}", "bar", "{task.completed}/{task.total} layouts", "elapsed"),
                "importing torch, transformers, peft",
                self.total,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def on_event(self, event: Mapping[str, object]) -> None:
        if not self.enabled:
            return
        if event.get("event") == "layout_done":
            if self.progress is not None:
                self.progress.advance(self.task)
            else:
                state = "ok" if event.get("ok") else "FAILED"
                click.echo(f"train-smoke: {event['layout']}: {state} ({event['seconds']:.1f} s)", err=True)
            return
        if self.progress is not None:
            from adapterdoc.report.train_text import progress_line

            line = progress_line(event)
            if line:
                self.progress.update(self.task, description=line)
