"""The command line: parse, call one library function, render. No logic, no torch import at module level."""

from __future__ import annotations

import click

from adapterdoc import __version__
from adapterdoc.commands._common import EXIT_CODES


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110}, epilog=EXIT_CODES
)
@click.version_option(__version__, "--version", prog_name="adapterdoc")
@click.option("--debug", is_flag=True, help="Show tracebacks (also ADAPTERDOC_DEBUG=1).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors in human output.")
@click.pass_context
def main(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """adapterdoc: inspect, remap, verify, merge and round-trip LoRA adapter checkpoints.

    --quiet/-q and --debug may also be given after the command (adapterdoc inspect X -q).
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    ctx.obj["quiet"] = quiet


def _set_on_root(name: str):  # type: ignore[no-untyped-def]
    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:  # only switch on: `-q` before the command is not undone by its absence after it
            root = ctx.find_root()
            root.ensure_object(dict)
            root.obj[name] = True

    return callback


def _shared_options() -> list[click.Option]:
    """``--quiet/-q`` and ``--debug`` on every command too, so they work after the command name."""
    return [
        click.Option(
            ["--quiet", "-q"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_set_on_root("quiet"),
            help="Print nothing but errors in human output.",
        ),
        click.Option(
            ["--debug"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_set_on_root("debug"),
            help="Show tracebacks (also ADAPTERDOC_DEBUG=1).",
        ),
    ]


def _register() -> None:
    from adapterdoc.commands import COMMANDS

    for cmd in COMMANDS:
        taken = {opt for p in cmd.params for opt in getattr(p, "opts", [])}
        cmd.params.extend(o for o in _shared_options() if not taken & set(o.opts))
        main.add_command(cmd)


_register()
