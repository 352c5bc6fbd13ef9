"""`adapterdoc merge ADAPTER --base BASE_DIR --out OUT_DIR [--dtype ...] [--dry-run] [--requantize] [--force] [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt


@click.command("merge", epilog=opt.INPUT_FORMS)
@opt.adapter_argument()
@opt.base_option("The base model folder (config.json + safetensors shards).", required=True)
@opt.out_option(
    "Folder to write the merged checkpoint to: a new or empty folder (a file, device or symlink is refused); "
    "not needed with --dry-run."
)
@opt.dtype_option(
    "dtype of floating-point weights in the output (auto keeps each base tensor's).", default="auto"
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Plan the merge and write nothing; on a quantized base, measure per module whether the update "
    "survives quantizing the merged weight again.",
)
@click.option(
    "--requantize",
    is_flag=True,
    help="On a quantized base, write the merged weights in the base's own format (as its library quantizes), "
    "refused where the update would not survive; without it a quantized base is decoded and written as bf16/f16.",
)
@opt.force_option(
    "Replace a non-empty --out that holds a previous adapterdoc merge output (its .adapterdoc-output.json); "
    "never any other folder."
)
@opt.output_options()
@opt.handle_errors
def command(
    adapter: str,
    base: str,
    out: str | None,
    dtype: str,
    dry_run: bool,
    requantize: bool,
    force: bool,
    output: opt.Output,
) -> None:
    """Merge a LoRA adapter into its base checkpoint, streaming one tensor at a time."""
    from adapterdoc.merge import merge

    if out is None and not dry_run:
        raise click.UsageError("Missing option '--out' (needed unless --dry-run).")
    with opt.BytesBar("merging", enabled=not dry_run) as progress:
        report = merge(
            adapter,
            base,
            out,
            dtype=dtype,
            force=force,
            progress=progress,
            dry_run=dry_run,
            requantize=requantize,
        )
    opt.finish(report, output)
