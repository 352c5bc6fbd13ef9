"""`adapterdoc roundtrip ADAPTER [--base BASE] [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands._common import INPUT_FORMS, emit, handle_errors, is_quiet


@click.command("roundtrip", epilog=INPUT_FORMS)
@click.argument("adapter")
@click.option(
    "--base", default=None, help="Base with weights (model folder or tiny:LAYOUT) for the model-level trips."
)
@click.option("--keep", type=click.Path(), default=None, help="Keep the work files in this folder.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, adapter: str, base: str | None, keep: str | None, as_json: bool) -> None:
    """Run every move (remaps there and back, .bin ↔ .safetensors, load/save, merge, counterpart) on copies
    of ADAPTER and check that nothing changed. The input is never modified. Exit 1 if any round trip fails."""
    from adapterdoc.report import render
    from adapterdoc.roundtrip import roundtrip

    report = roundtrip(adapter, base, keep=keep)
    if as_json:
        emit(render.to_json(report.to_dict()))
    elif not is_quiet():
        from adapterdoc.report.roundtrip_text import render_roundtrip

        emit(render_roundtrip(report))
    ctx.exit(0 if report.ok else 1)
