"""`adapterdoc merge ADAPTER --base BASE_DIR --out OUT_DIR [--dtype ...] [--force] [--json]`."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from adapterdoc.commands import options as opt


@click.command("merge", epilog=opt.INPUT_FORMS)
@opt.adapter_argument()
@opt.base_option("The base model folder (config.json + safetensors shards).", required=True)
@opt.out_option(
    "Folder to write the merged checkpoint to: a new or empty folder (a file, device or symlink is refused).",
    required=True,
)
@opt.dtype_option(
    "dtype of floating-point weights in the output (auto keeps each base tensor's).", default="auto"
)
@opt.force_option(
    "Replace a non-empty --out that holds a previous adapterdoc merge output (its .adapterdoc-output.json); "
    "never any other folder."
)
@opt.output_options()
@opt.handle_errors
def command(adapter: str, base: str, out: str, dtype: str, force: bool, output: opt.Output) -> None:
    """Merge a LoRA adapter into its base checkpoint, streaming one tensor at a time."""
    from adapterdoc.merge import merge

    with _progress(enabled=not opt.is_quiet()) as progress:
        report = merge(adapter, base, out, dtype=dtype, force=force, progress=progress)
    opt.finish(report, output)


class _progress(opt.LiveBar):
    """A rich progress bar by bytes on stderr, only when stderr is a terminal; entering it gives the merge its
    ``progress(done, total)`` callback (None without a bar)."""

    def __init__(self, *, enabled: bool) -> None:
        columns = ("[progress.description]{task.description}", "bar", "bytes", "speed", "remaining")
        super().__init__(columns, "merging", live=enabled and sys.stderr.isatty())

    def __enter__(self) -> Callable[[int, int], None] | None:  # type: ignore[override]
        super().__enter__()
        if self.progress is None:
            return None

        def update(done: int, total: int) -> None:
            self.update(completed=done, total=total)

        return update
