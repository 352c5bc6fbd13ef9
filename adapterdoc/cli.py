"""The command line: parse, call one library function, render. No logic, no torch import at module level."""

from __future__ import annotations

import click

from adapterdoc import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "--version", prog_name="adapterdoc")
@click.option("--debug", is_flag=True, help="Show tracebacks (also ADAPTERDOC_DEBUG=1).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors in human output.")
@click.pass_context
def main(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """adapterdoc: inspect, remap, verify, merge and round-trip LoRA adapter checkpoints."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    ctx.obj["quiet"] = quiet


def _register() -> None:
    from adapterdoc.commands import COMMANDS

    for cmd in COMMANDS:
        main.add_command(cmd)


_register()
