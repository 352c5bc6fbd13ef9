"""`adapterdoc merge ADAPTER --base BASE_DIR --out OUT_DIR [--dtype ...] [--force] [--json]`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from adapterdoc.commands.options import (
    INPUT_FORMS,
    Output,
    adapter_argument,
    base_option,
    dtype_option,
    finish,
    force_option,
    handle_errors,
    is_quiet,
    out_option,
    output_options,
    stderr_bar,
)

if TYPE_CHECKING:
    from rich.progress import Progress


@click.command("merge", epilog=INPUT_FORMS)
@adapter_argument()
@base_option("The base model folder (config.json + safetensors shards).", required=True)
@out_option(
    "Folder to write the merged checkpoint to: a new or empty folder (a file, device or symlink is refused).",
    required=True,
)
@dtype_option(
    "dtype of floating-point weights in the output (auto keeps each base tensor's).", default="auto"
)
@force_option(
    "Replace a non-empty --out that holds a previous adapterdoc merge output (its .adapterdoc-output.json); "
    "never any other folder."
)
@output_options()
@click.pass_context
@handle_errors
def command(
    ctx: click.Context, adapter: str, base: str, out: str, dtype: str, force: bool, output: Output
) -> None:
    """Merge a LoRA adapter into its base checkpoint, streaming one tensor at a time."""
    from adapterdoc.merge import merge

    with _progress(enabled=not is_quiet()) as progress:
        report = merge(adapter, base, out, dtype=dtype, force=force, progress=progress)
    finish(report, output)


class _progress:
    """A rich progress bar by bytes on stderr, only when stderr is a terminal."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.bar: Progress | None = None

    def __enter__(self) -> Callable[[int, int], None] | None:
        if not self.enabled:
            return None
        bar, task = stderr_bar(
            ("[progress.description]{task.description}", "bar", "bytes", "speed", "remaining"), "merging"
        )
        self.bar = bar

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
