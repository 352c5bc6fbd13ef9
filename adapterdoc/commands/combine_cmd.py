"""`adapterdoc combine ADAPTER ADAPTER... [--weights W,W,...] --method cat|svd|ties|dare [--rank R] [--density D]
[--seed S] --out DIR [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt


def _weights(ctx: click.Context, param: click.Parameter, value: str | None) -> list[float] | None:
    if value is None:
        return None
    try:
        return [float(w) for w in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None


@click.command("combine", epilog=opt.INPUT_FORMS)
@opt.adapter_argument("adapters", many=True)
@click.option(
    "--weights",
    callback=_weights,
    metavar="W,W,...",
    help="One weight per adapter (negative subtracts); default 1 each.",
)
@click.option(
    "--method",
    type=click.Choice(["cat", "svd", "ties", "dare"]),
    required=True,
    help="cat: the exact weighted sum (rank: the sum of the ranks); svd: its best rank-R factorisation, "
    "the error reported per module; ties, dare: PEFT's ties / dare_linear of the full deltas, factorised as svd.",
)
@click.option(
    "--rank", type=click.IntRange(min=1), help="The rank of --method svd (default: the largest input rank)."
)
@click.option(
    "--density",
    type=click.FloatRange(0, 1, min_open=True),
    help="The share of each delta's entries ties and dare keep (needed by them, refused otherwise).",
)
@opt.seed_option("The seed of dare's random masks.")
@opt.base_option("Run `verify` against this base on the written adapter (else the weights checks only).")
@opt.out_option("Folder to write the combined adapter to: a new or empty folder.", required=True)
@opt.force_option(
    "Replace a non-empty --out that holds a previous adapterdoc output; never any other folder."
)
@opt.output_options()
@opt.handle_errors
def command(
    adapters: tuple[str, ...],
    weights: list[float] | None,
    method: str,
    rank: int | None,
    density: float | None,
    seed: int,
    base: str | None,
    out: str,
    force: bool,
    output: opt.Output,
) -> None:
    """Combine adapters of one base into one plain PEFT adapter: each module's weighted sum of deltas, exactly
    (cat) or at the best rank R (svd), with each module's kept energy and relative error."""
    from adapterdoc.algebra import combine
    from adapterdoc.report.algebra_text import render_algebra

    if rank is not None and method == "cat":
        raise click.UsageError("--rank goes with --method svd, ties or dare.")
    if (density is None) == (method in ("ties", "dare")):
        raise click.UsageError("--density goes with --method ties or dare, and they need it.")
    with opt.BytesBar("combining") as progress:
        report = combine(
            list(adapters),
            out,
            method=method,
            weights=weights,
            rank=rank,
            density=density,
            seed=seed,
            base=base,
            force=force,
            progress=progress,
        )
    opt.finish(report, output, text=lambda: render_algebra(report))
