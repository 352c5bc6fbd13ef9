"""`adapterdoc inspect PATH [--weights] [--base BASE] [--plot FILE.png|FILE.html] [--json | --format FORMAT] [--output-file FILE]`."""

from __future__ import annotations

import os

import click

from adapterdoc.commands import options as opt


def _plot_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and os.path.splitext(value)[1].lower() not in (".png", ".html", ".htm"):
        raise click.BadParameter("must end in .png or .html", ctx=ctx, param=param)
    return value


@click.command("inspect", epilog=opt.INPUT_FORMS)
@opt.adapter_argument("path")
@click.option(
    "--weights",
    is_flag=True,
    help="Also read the LoRA tensors: each module's delta ‖scaling·B A‖, effective rank and inert modules.",
)
@click.option(
    "--plot",
    "plot",
    metavar="FILE.png|FILE.html",
    callback=_plot_path,
    help="Draw the delta norms as a layer × module heat map (implies --weights; needs the plot extra).",
)
@opt.base_option(
    "A quantized base folder: measure per module whether the adapter's update survives merging into it and "
    "quantizing again (implies --weights; the table `merge --dry-run` prints).",
    required=False,
)
@opt.output_options(output_file=True)
@opt.handle_errors
def command(path: str, weights: bool, plot: str | None, base: str | None, output: opt.Output) -> None:
    """Describe an adapter, checkpoint or cached repo from its headers alone (with --weights, its LoRA tensors)."""
    from adapterdoc.inspection import inspect

    output.check(path)
    opt.finish(inspect(path, weights=weights, plot=plot, base=base), output)
