"""`adapterdoc extract --base BASE --tuned TUNED (--rank R | --energy F | --max-error E) --out DIR [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt


@click.command("extract", epilog=opt.INPUT_FORMS)
@opt.base_option(
    "The base model the fine-tune started from (a folder of config.json + safetensors).", required=True
)
@click.option(
    "--tuned", required=True, metavar="TUNED", help="The fully fine-tuned model (same layout as --base)."
)
@opt.rank_choice_options("Every module's rank.")
@opt.out_option("Folder to write the extracted adapter to: a new or empty folder.", required=True)
@opt.force_option(
    "Replace a non-empty --out that holds a previous adapterdoc output; never any other folder."
)
@opt.output_options()
@opt.handle_errors
def command(
    base: str,
    tuned: str,
    rank: int | None,
    energy: float | None,
    max_error: float | None,
    out: str,
    force: bool,
    output: opt.Output,
) -> None:
    """Extract a LoRA adapter from a full fine-tune: each changed Linear/Embedding weight's delta at its best
    rank, read one tensor pair at a time, with each module's kept energy and relative error."""
    from adapterdoc.ml.build import require_ml

    if sum(x is not None for x in (rank, energy, max_error)) != 1:
        raise click.UsageError("Give exactly one of --rank, --energy, --max-error.")
    require_ml("extract (the base's Linear and Embedding modules)", load=False)  # imported after the reads
    from adapterdoc.algebra.extract import extract
    from adapterdoc.report.algebra_text import render_algebra

    with opt.BytesBar("extracting") as progress:
        report = extract(
            base, tuned, out, rank=rank, energy=energy, max_error=max_error, force=force, progress=progress
        )
    opt.finish(report, output, text=lambda: render_algebra(report))
