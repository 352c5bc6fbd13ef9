"""The command line: parse, call one library function, render. No logic, no torch import at module level."""

from __future__ import annotations

from collections.abc import Callable

import click

from adapterdoc import __version__
from adapterdoc.commands import COMMANDS, load
from adapterdoc.commands.options import EXIT_CODES


class LazyGroup(click.Group):
    """A group that imports a command's module only when the command is looked up to run (or for its own help);
    the top-level help lists :data:`~adapterdoc.commands.COMMANDS` from its one-line helps, importing nothing."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(_with_shared_options(load(cmd_name)))
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, self.commands.get(name) or click.Command(name, help=COMMANDS[name][1]))
            for name in self.list_commands(ctx)
        ]
        rows = [(name, cmd) for name, cmd in rows if not cmd.hidden]
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog=EXIT_CODES,
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


def _with_shared_options(cmd: click.Command) -> click.Command:
    taken = {opt for p in cmd.params for opt in getattr(p, "opts", [])}
    cmd.params.extend(o for o in _shared_options() if not taken & set(o.opts))
    return cmd


def run() -> None:
    """The program (the ``adapterdoc`` script, ``python -m adapterdoc``): :data:`main` run by :func:`as_program`."""
    as_program(main)


def as_program(command: Callable[[], object]) -> None:
    """Run ``command`` as the whole program, then exit without the interpreter's last full collection.

    When the command is done (returned or raised, ``SystemExit`` included), every object it made moves to the
    cyclic collector's permanent generation (:func:`gc.freeze`): the exit still runs the atexit hooks, flushes the
    streams and frees each object by its reference count, but no longer walks them all once more looking for
    cycles first (11 of 105 ms of an ``inspect --json`` of 4,096 tensors; ``tests/commands/test_cli_start.py``).
    ``gc.disable()`` would not do it: the exit collects regardless. The price: a cycle the command left behind is
    not finalized at the exit, which nothing here relies on (temp files and folders go in ``finally`` blocks).
    In-process callers (tests, library users) call :data:`main` itself and keep their collector as it was."""
    import gc

    try:
        command()
    finally:
        gc.freeze()
