"""`adapterdoc merge ADAPTER --base BASE_DIR --out OUT_DIR [--dtype ...] [--force] [--json]`."""

from __future__ import annotations

import sys
from typing import Any

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
)


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
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> Any:
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task("merging", total=None)

        def update(done: int, total: int) -> None:
            self.bar.update(self.task, completed=done, total=total)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
