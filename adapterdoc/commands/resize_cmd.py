"""`adapterdoc resize ADAPTER (--rank R | --energy F | --max-error E) [--to-lora --base BASE] --out DIR [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt


@click.command("resize", epilog=opt.INPUT_FORMS)
@opt.adapter_argument()
@opt.rank_choice_options("Every module's rank (exact where it is at least the module's effective rank).")
@click.option(
    "--to-lora",
    is_flag=True,
    help="Turn a DoRA adapter into plain LoRA: each module's effective delta on --base, factorised.",
)
@opt.base_option(
    "The base model folder: needed by --to-lora; `verify` runs against it on the written adapter (without it, the "
    "weights checks only)."
)
@opt.out_option("Folder to write the resized adapter to: a new or empty folder.", required=True)
@opt.force_option(
    "Replace a non-empty --out that holds a previous adapterdoc output; never any other folder."
)
@opt.output_options()
@opt.handle_errors
def command(
    adapter: str,
    rank: int | None,
    energy: float | None,
    max_error: float | None,
    to_lora: bool,
    base: str | None,
    out: str,
    force: bool,
    output: opt.Output,
) -> None:
    """Change a LoRA adapter's rank by the best factorisation of each module's delta, with each module's kept
    energy and relative error."""
    from adapterdoc.algebra import resize
    from adapterdoc.report.algebra_text import render_algebra

    if sum(x is not None for x in (rank, energy, max_error)) != 1:
        raise click.UsageError("Give exactly one of --rank, --energy, --max-error.")
    with opt.BytesBar("resizing") as progress:
        report = resize(
            adapter,
            out,
            rank=rank,
            energy=energy,
            max_error=max_error,
            base=base,
            to_lora=to_lora,
            force=force,
            progress=progress,
        )
    opt.finish(report, output, text=lambda: render_algebra(report))
