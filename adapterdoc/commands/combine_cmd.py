"""`adapterdoc combine ADAPTER ADAPTER... [--weights W,W,...] --method cat|svd [--rank R] --out DIR [--json]`."""

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
    type=click.Choice(["cat", "svd"]),
    required=True,
    help="cat: the exact weighted sum (rank: the sum of the ranks); svd: its best rank-R factorisation, "
    "the error reported per module.",
)
@click.option(
    "--rank", type=click.IntRange(min=1), help="The rank of --method svd (default: the largest input rank)."
)
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
    base: str | None,
    out: str,
    force: bool,
    output: opt.Output,
) -> None:
    """Combine adapters of one base into one plain PEFT adapter: each module's weighted sum of deltas, exactly
    (cat) or at the best rank R (svd), with each module's kept energy and relative error."""
    from adapterdoc.algebra import combine
    from adapterdoc.report.algebra_text import render_algebra

    if rank is not None and method != "svd":
        raise click.UsageError("--rank goes with --method svd.")
    report = combine(list(adapters), out, method=method, weights=weights, rank=rank, base=base, force=force)
    opt.finish(report, output, text=lambda: render_algebra(report))
