"""`adapterdoc train-smoke [--layout NAME|all] [--steps N] [--data FILE] [--out DIR] [--json]`."""

from __future__ import annotations

import sys
from collections.abc import Mapping

import click

from adapterdoc.commands import options as opt


@click.command("train-smoke")
@click.option(
    "--layout",
    "layout",
    default="all",
    show_default=True,
    metavar="NAME|all",
    help="A layout with a tiny reference model, a comma-separated list, or all (every VL/wrapper layout and encoder).",
)
@opt.steps_option("Optimizer steps per layout [default: 24].")
@opt.data_option(
    "Training rows (JSONL: prompt, answer object, split train|val) [default: the reference rows bundled "
    "with adapterdoc].",
    required=False,
    dir_okay=True,
    metavar="FILE.jsonl",
)
@opt.out_option(
    "Keep the runs in DIR/<layout>/ (adapter, head, progress.jsonl, training_metadata.json, RUN_REPORT.md)."
)
@opt.output_options()
@click.option("--verbose", "-v", is_flag=True, help="Print every check's measurement and implementation.")
@opt.handle_errors
def command(
    layout: str,
    steps: int | None,
    data: str | None,
    out: str | None,
    output: opt.Output,
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
    quiet = opt.is_quiet()
    with _Progress(len(layouts), enabled=not quiet) as progress:
        report = run_smoke(layouts, steps=steps, out=out, on_event=progress.on_event, data=data)
    opt.finish(report, output, text_options={"verbose": verbose})


class _Progress(opt.LiveBar):
    """Live progress on stderr: a rich bar on a terminal, one line per finished layout otherwise."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        columns = ("spinner", "{task.description}", "bar", "{task.completed}/{task.total} layouts", "elapsed")
        super().__init__(
            columns, "importing torch, transformers, peft", total, live=enabled and sys.stderr.isatty()
        )
        self.enabled = enabled

    def on_event(self, event: Mapping[str, object]) -> None:
        if not self.enabled:
            return
        if event.get("event") == "layout_done":
            if self.progress is not None:
                self.advance()
            else:
                state = "ok" if event.get("ok") else "FAILED"
                click.echo(f"train-smoke: {event['layout']}: {state} ({event['seconds']:.1f} s)", err=True)
            return
        if self.progress is not None:
            from adapterdoc.report.train_text import progress_line

            line = progress_line(event)
            if line:
                self.update(description=line)
