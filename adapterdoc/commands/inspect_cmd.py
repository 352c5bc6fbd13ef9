"""`adapterdoc inspect PATH [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands._common import INPUT_FORMS, emit, handle_errors, is_quiet


@click.command("inspect", epilog=INPUT_FORMS)
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, path: str, as_json: bool) -> None:
    """Describe an adapter, checkpoint or cached repo from its headers alone."""
    from adapterdoc.inspect import inspect
    from adapterdoc.report import render

    report = inspect(path)
    if as_json:
        emit(render.to_json(report.to_dict()))
    else:
        from adapterdoc.report.inspect_text import render_inspect

        if not is_quiet():
            emit(render_inspect(report))
    ctx.exit(0 if report.ok else 1)
