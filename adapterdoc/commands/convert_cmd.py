"""`adapterdoc convert ADAPTER --to peft|mlx|gguf [--base BASE] [--out PATH] [--outtype f32|f16|bf16] [--force]
[--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt

INPUTS = """\b
ADAPTER, in any of the three formats (detected from its files, not named):
  DIR                  a PEFT adapter folder: adapter_config.json and
                       adapter_model.safetensors (or .bin)
  FILE.safetensors     one safetensors file of PEFT LoRA keys
  DIR                  an mlx-lm adapter folder: adapters.safetensors and
                       adapter_config.json (fine_tune_type, num_layers, ...)
  FILE.gguf            a llama.cpp GGUF LoRA adapter (not a model GGUF)
  org/name[@revision]  a Hugging Face repo in the local cache (no network)

\b
--out: a new path, an empty folder, or a device or pipe (written through).
An existing file or non-empty folder is refused (exit 3); --force replaces
only a previous convert output. A symlink, an input, or a path inside the
input is refused, --force or not."""
"""convert's epilog: the three formats it reads and the output rules (within 78 columns, as
:data:`adapterdoc.commands.options.INPUT_FORMS`)."""


@click.command("convert", epilog=INPUTS)
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
    "counts (MLX's num_layers, GGUF's architecture). Its weights are read only to compare a whole weight PEFT "
    "saved beside an embedding or lm_head LoRA with the base's."
)
@opt.out_option(
    "Write here: a new or empty folder (PEFT, MLX) or a new file (GGUF); default beside the input "
    "(<input>-<format>, <input>.gguf). An existing file or non-empty folder is refused (exit 3) unless --force; "
    "a symlink is refused; a device or pipe (/dev/null, /dev/stdout) is written through. The inputs are never "
    "changed.",
    metavar="PATH",
)
@click.option(
    "--outtype",
    type=click.Choice(["f32", "f16", "bf16"]),
    help="Re-cast the tensors (default: each keeps its dtype). Rounding, if any, is reported.",
)
@opt.force_option(
    "Replace a previous convert output at --out: a folder holding its .adapterdoc-output.json, or a GGUF "
    "adapter file. Never any other file or folder, never an input (the adapter, the --base folder), never "
    "through a symlink."
)
@opt.output_options()
@opt.handle_errors
def command(
    adapter: str,
    to: str,
    base: str | None,
    out: str | None,
    outtype: str | None,
    force: bool,
    output: opt.Output,
) -> None:
    """The same adapter in another runtime's format, exactly: PEFT ⇄ MLX (mlx-lm) ⇄ GGUF (llama.cpp), through
    PEFT. What the target cannot hold is refused with exit 3 before anything is written."""
    from adapterdoc.formats.convert import convert

    opt.finish(convert(adapter, to, base=base, out=out, outtype=outtype, force=force), output)
