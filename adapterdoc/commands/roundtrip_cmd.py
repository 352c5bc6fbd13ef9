"""`adapterdoc roundtrip ADAPTER [--base BASE] [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt


@click.command("roundtrip", epilog=opt.INPUT_FORMS)
@opt.adapter_argument()
@opt.base_option("Base with weights (model folder or tiny:LAYOUT) for the model-level trips.")
@click.option("--keep", type=click.Path(), default=None, help="Keep the work files in this folder.")
@opt.output_options()
@opt.handle_errors
def command(adapter: str, base: str | None, keep: str | None, output: opt.Output) -> None:
    """Run every move (remaps there and back, .bin ↔ .safetensors, load/save, merge, counterpart) on copies
    of ADAPTER and check that nothing changed. The input is never modified. Exit 1 if any round trip fails."""
    from adapterdoc.roundtrip import roundtrip

    opt.finish(roundtrip(adapter, base, keep=keep), output)
