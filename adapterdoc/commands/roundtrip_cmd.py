"""`adapterdoc roundtrip ADAPTER [--base BASE] [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands.options import (
    INPUT_FORMS,
    Output,
    adapter_argument,
    base_option,
    finish,
    handle_errors,
    output_options,
)


@click.command("roundtrip", epilog=INPUT_FORMS)
@adapter_argument()
@base_option("Base with weights (model folder or tiny:LAYOUT) for the model-level trips.")
@click.option("--keep", type=click.Path(), default=None, help="Keep the work files in this folder.")
@output_options()
@click.pass_context
@handle_errors
def command(ctx: click.Context, adapter: str, base: str | None, keep: str | None, output: Output) -> None:
    """Run every move (remaps there and back, .bin ↔ .safetensors, load/save, merge, counterpart) on copies
    of ADAPTER and check that nothing changed. The input is never modified. Exit 1 if any round trip fails."""
    from adapterdoc.roundtrip import roundtrip

    finish(roundtrip(adapter, base, keep=keep), output)
