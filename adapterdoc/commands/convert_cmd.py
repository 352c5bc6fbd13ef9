"""`adapterdoc convert ADAPTER --to peft|mlx|gguf [--base BASE] [--out PATH] [--outtype f32|f16|bf16] [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt


@click.command("convert", epilog=opt.INPUT_FORMS)
@opt.adapter_argument()
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Choice(["peft", "mlx", "gguf"]),
    help="The target format: a PEFT adapter folder, an mlx-lm adapter folder, or one llama.cpp GGUF LoRA file.",
)
@opt.base_option(
    "The base model (folder, config.json, cached repo id or tiny:LAYOUT): its class, layer and expert "
    "counts (MLX's num_layers, GGUF's architecture). No weights are read."
)
@opt.out_option(
    "Write here: a new or empty folder (PEFT, MLX) or a file (GGUF); default beside the input "
    "(<input>-<format>, <input>.gguf). The input is never changed.",
    metavar="PATH",
)
@click.option(
    "--outtype",
    type=click.Choice(["f32", "f16", "bf16"]),
    help="Re-cast the tensors (default: each keeps its dtype). Rounding, if any, is reported.",
)
@opt.output_options()
@opt.handle_errors
def command(
    adapter: str,
    to: str,
    base: str | None,
    out: str | None,
    outtype: str | None,
    output: opt.Output,
) -> None:
    """The same adapter in another runtime's format, exactly: PEFT ⇄ MLX (mlx-lm) ⇄ GGUF (llama.cpp), through
    PEFT. What the target cannot hold is refused with exit 3 before anything is written."""
    from adapterdoc.formats.convert import convert

    opt.finish(convert(adapter, to, base=base, out=out, outtype=outtype), output)
