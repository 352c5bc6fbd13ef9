"""The CLI's shared parts, defined once: the options and arguments several commands take (``ADAPTER``, ``--base``,
``--out``, ``--dtype``, ``--data``, ``--steps``, ``--seed``, ``--batch-size``, ``--force``, ``--max-length`` and the
output options ``--format``, ``--json``, ``--output-file``), one-line errors (exit 3 for inputs, 4 for bugs) and
:func:`finish` (render through the format registry, pick the exit code), quiet mode, shared help text.

A command module declares an option here when a second command takes it; each decorator fixes the option's name,
type, metavar and behaviour, and takes the help line of the command where what the value means differs (merge's
``--base`` must hold weights, convert's needs only a config)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import wraps
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from adapterdoc.errors import AdapterdocError, missing_extra, remembered_interrupts

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from typing_extensions import Self

    from adapterdoc.report.base import Envelope

F = TypeVar("F", bound=Callable[..., Any])

BUG_EXIT = 4
"""Exit code of an internal error (a bug in adapterdoc, not in the input); CLI.md."""

INPUT_FORMS = """\b
Inputs (ADAPTER / PATH) may be:
  FILE.safetensors     one safetensors (or PEFT .bin) file
  DIR                  a PEFT adapter folder: adapter_config.json and
                       adapter_model.safetensors (or .bin)
  DIR                  a sharded checkpoint folder (*.safetensors.index.json)
  org/name[@revision]  a Hugging Face repo in the local cache (no network)
  hf://org/name[@rev]  a repo on the Hugging Face Hub, headers read over the
                       network (read-only commands)"""
"""The input forms, shown in the help of every command that takes an input (CLI.md). Kept within 78 columns:
click does not wrap a ``\\b`` block, and help must fit an 80-column terminal."""

EXIT_CODES = """\b
Exit codes:
  0    done; no finding of severity error
  1    the check failed: at least one error finding
  2    usage error
  3    an input cannot be used, or an operation was refused to protect data
  4    an internal error (a bug in adapterdoc): please report it with the
       --debug output
  130  interrupted (Ctrl-C); nothing half-written is left behind"""
"""The exit codes, shown in the top-level help (CLI.md's table)."""


def debug_enabled() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    flag = bool(root and root.obj and root.obj.get("debug"))
    return flag or os.environ.get("ADAPTERDOC_DEBUG", "") not in ("", "0")


def fail(message: str, code: int = 3) -> NoReturn:
    """Print ``adapterdoc: error: <message>`` on one line of stderr and exit."""
    one_line = " ".join(message.split())
    click.echo(f"adapterdoc: error: {one_line}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Map adapterdoc's errors to one line on stderr and exit code 3, "cannot write here" OS errors to exit 3, and
    anything unexpected (a bug) to one line and exit code 4; ``--debug`` prints the traceback first."""

    @wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        output = kwargs.get("output")
        if not isinstance(output, Output):
            output = Output("json" if kwargs.get("as_json") else str(kwargs.get("fmt") or "text"))
        as_json = output.json
        try:
            with remembered_interrupts():
                return func(*args, **kwargs)
        except AdapterdocError as e:
            _refuse(e, output)
        except KeyboardInterrupt:
            interrupted = AdapterdocError(click.get_current_context().info_name, "interrupted by the user")
            if as_json:
                _emit_json_error(interrupted)
            fail(str(interrupted), 130)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except MemoryError:
            _traceback()
            fail("out of memory")
        except OSError as e:
            from adapterdoc.st.atomic import is_write_refusal, os_refusal

            if not is_write_refusal(e):
                _bug(e)
            known = os_refusal(e)
            known.__cause__ = e  # as `raise ... from e` would
            _refuse(known, output)
        except ModuleNotFoundError as e:
            # an optional extra's package, imported by a command the light install runs: exit 3, naming the extra
            extra = missing_extra(e, click.get_current_context().info_name)
            if extra is None:
                _bug(e)
            _refuse(extra, output)
        except Exception as e:
            _bug(e)

    return wrapper  # type: ignore[return-value]


def _traceback() -> None:
    if debug_enabled():  # the traceback, then the same output and exit code as without --debug
        import traceback

        traceback.print_exc()


def _refuse(e: AdapterdocError, output: Output) -> NoReturn:
    _traceback()
    if output.json:
        _emit_json_error(e)
    elif output.fmt != "text":
        _emit_error_report(e, output)
    fail(str(e), e.exit_code)


def _bug(e: BaseException) -> NoReturn:
    _traceback()
    where = "" if debug_enabled() else " with the output of --debug"
    fail(
        f"internal error (a bug in adapterdoc, not in your input): {type(e).__name__}: {e}; "
        f"please report it{where}",
        BUG_EXIT,
    )


def _emit_json_error(e: AdapterdocError) -> None:
    """With --json, exit 3 still prints one JSON object (``ok`` false, finding AD100) so a CI parser always has
    one."""
    import json

    from adapterdoc.report.base import envelope, unusable_finding

    finding = unusable_finding(e.reason, path=e.what, key=e.key)
    # stdout itself may be what failed (a full disk, /dev/full): then the stderr line alone says why
    with contextlib.suppress(OSError):
        body = {"error": str(e), **getattr(e, "details", {})}  # e.g. verify's expected_keys_note
        click.echo(json.dumps(envelope(False, [finding], body), ensure_ascii=False))


def _emit_error_report(e: AdapterdocError, output: Output) -> None:
    """``--format junit|sarif|github`` on exit 3: the format's document holding the error (an ``<error>`` test
    case, an AD100 result, an ``::error`` annotation), on stdout or in ``--output-file``, so that a CI step that
    reads the report finds one. Where that file or stdout is what failed, the stderr line alone says why."""
    from adapterdoc.report.base import Unusable
    from adapterdoc.report.formats import render

    ctx = click.get_current_context(silent=True)
    command = (ctx.info_name if ctx else None) or "adapterdoc"
    body = render(Unusable(command=command, error=str(e), path=e.what or None), output.fmt)
    with contextlib.suppress(OSError, AdapterdocError):
        if output.file:
            # only a file this run cleared (not an input, a writable place): a refused --output-file, or one the
            # command never got to check, is never written, so no input is ever changed after a failure
            if output.file_is_safe:
                write_report(output.file, body)
        else:
            click.echo(body.rstrip("\n"))


def emit(text: str) -> None:
    """Write rendered output to stdout (one write, newline-terminated); a stdout that cannot take it (a full disk,
    ``> /dev/full``) is one exit-3 line naming stdout."""
    try:
        click.echo(text.rstrip("\n"))
    except OSError as e:  # st.paths.writing("stdout"), its module imported only when it is needed
        from adapterdoc.st.paths import is_write_refusal, not_writable

        if not is_write_refusal(e):
            raise
        raise not_writable("stdout", e) from e


def is_quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    return bool(root and root.obj and root.obj.get("quiet"))


# --------------------------------------------------------------------------------------------- inputs

DTYPES = ("auto", "bfloat16", "float16", "float32")
"""``--dtype`` choices: ``auto`` (each tensor keeps the checkpoint's) or one of the three float types."""


def adapter_argument(name: str = "adapter", *, many: bool = False) -> Callable[[F], F]:
    """The input argument (``ADAPTER``, ``PATH``, ``ADAPTERS...``): any form of :data:`INPUT_FORMS`, passed on as
    given (the library opens it; a missing or unusable input is exit 3 there, never click's exit 2)."""
    if many:
        return click.argument(name, nargs=-1, required=True)
    return click.argument(name)


def base_option(help: str, *, required: bool = False) -> Callable[[F], F]:
    """``--base BASE``: a model folder, config.json, cached repo id or tiny:LAYOUT (what each command needs of it
    is in its ``help``); resolved by the library (:mod:`adapterdoc.bases`)."""
    return click.option("--base", "base", required=required, default=None, metavar="BASE", help=help)


TRAIN_BASE_HELP = "A model folder (weights + tokenizer), a cached repo id or tiny:LAYOUT."
"""train's and eval's ``--base``: the model is loaded, so it needs weights and a tokenizer."""


def out_option(help: str, *, required: bool = False, metavar: str = "DIR") -> Callable[[F], F]:
    """``--out``: where a command writes. click checks nothing (``readable=False``): a file, a link, a non-empty or
    read-only folder is refused with exit 3 by the library's output rules (:mod:`adapterdoc.st.paths`)."""
    return click.option(
        "--out",
        "out",
        type=click.Path(readable=False),
        required=required,
        default=None,
        metavar=metavar,
        help=help,
    )


def dtype_option(help: str | None = None, *, default: str = "float32") -> Callable[[F], F]:
    """``--dtype`` (one of :data:`DTYPES`)."""
    return click.option("--dtype", type=click.Choice(DTYPES), default=default, show_default=True, help=help)


def data_option(
    help: str, *, required: bool = True, dir_okay: bool = False, metavar: str | None = None
) -> Callable[[F], F]:
    """``--data``: the training or evaluation rows (JSONL)."""
    return click.option(
        "--data",
        required=required,
        default=None,
        type=click.Path(dir_okay=dir_okay),
        metavar=metavar,
        help=help,
    )


def steps_option(help: str) -> Callable[[F], F]:
    """``--steps N``: optimizer steps (the default is the command's: it says it in ``help``)."""
    return click.option("--steps", type=click.IntRange(min=1), default=None, help=help)


def rank_choice_options(rank_help: str) -> Callable[[F], F]:
    """``--rank R`` (``rank_help``), ``--energy F``, ``--max-error E``: how resize and extract choose each module's
    rank (the commands ask for exactly one)."""

    def decorate(func: F) -> F:
        for option in reversed(
            [
                click.option("--rank", type=click.IntRange(min=1), help=rank_help),
                click.option(
                    "--energy",
                    type=click.FloatRange(0, 1, min_open=True),
                    help="Per module, the smallest rank keeping this share of ‖ΔW‖² (written as rank_pattern).",
                ),
                click.option(
                    "--max-error",
                    type=click.FloatRange(min=0),
                    help="Per module, the smallest rank whose relative error ‖ΔW − ΔŴ‖/‖ΔW‖ is at most this.",
                ),
            ]
        ):
            func = option(func)
        return func

    return decorate


def seed_option(help: str | None = None) -> Callable[[F], F]:
    return click.option("--seed", type=int, default=0, show_default=True, help=help)


def batch_size_option(default: int, help: str | None = None) -> Callable[[F], F]:
    return click.option(
        "--batch-size", type=click.IntRange(min=1), default=default, show_default=True, help=help
    )


def max_length_option() -> Callable[[F], F]:
    return click.option(
        "--max-length", type=click.IntRange(min=2), default=None, help="Truncate rows to this many tokens."
    )


def force_option(help: str) -> Callable[[F], F]:
    """``--force``: replace an earlier output of this command (``help`` says which; never any other folder)."""
    return click.option("--force", is_flag=True, help=help)


# --------------------------------------------------------------------------------------------- output

ALL_FORMATS = ("text", "json", "junit", "github", "sarif")
"""``--format`` choices (the format registry's names: :data:`adapterdoc.report.formats.FORMATS`, kept here as
data so that building the CLI imports no renderer; a test keeps the two equal)."""


@dataclass(frozen=True)
class Output:
    """Where and how a command's report goes: the format, and ``--output-file`` (instead of stdout)."""

    fmt: str = "text"
    file: str | None = None
    _checked: list[bool] = field(default_factory=list, compare=False, repr=False)
    """Set by :meth:`check` once ``file`` is known not to be one of the command's inputs."""

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    @property
    def file_is_safe(self) -> bool:
        """Whether ``--output-file`` passed :meth:`check` in this run (an error report may then be written there)."""
        return bool(self.file) and bool(self._checked)

    def check(self, *inputs: str | None) -> None:
        """Refuse an ``--output-file`` that would overwrite one of ``inputs`` (before any work is done)."""
        if self.file:
            check_output_file(self.file, [i for i in inputs if i])
            self._checked.append(True)


JSON_HELP = "One JSON object on stdout (same as --format json)."


def output_options(
    formats: Sequence[str] = ALL_FORMATS,
    *,
    output_file: bool = False,
) -> Callable[[F], F]:
    """``--format`` (one of ``formats``), ``--json`` (the same as ``--format json``; CLI.md) and, with
    ``output_file``, ``--output-file FILE``; the command receives them as one ``output: Output`` argument."""

    def decorate(func: F) -> F:
        @wraps(func)
        def wrapper(*args: object, **kwargs: object) -> object:
            fmt, as_json = kwargs.pop("fmt", None), kwargs.pop("as_json", False)
            if as_json and fmt not in (None, "json"):
                raise click.BadParameter("--json conflicts with --format " + str(fmt), param_hint="--json")
            file = kwargs.pop("output_file", None)
            out = Output("json" if as_json else str(fmt or "text"), file if isinstance(file, str) else None)
            return func(*args, output=out, **kwargs)

        options = [
            click.option(
                "--format", "fmt", type=click.Choice(list(formats)), help="Output format (default text)."
            ),
            click.option("--json", "as_json", is_flag=True, help=JSON_HELP),
        ]
        if output_file:
            options.append(
                click.option(
                    "--output-file",
                    type=click.Path(dir_okay=False),
                    metavar="FILE",
                    help="Write the report (in --format) to FILE instead of stdout; stdout stays empty.",
                )
            )
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate


def junit_file_option() -> Callable[[F], F]:
    """``--junit-file FILE``: also a JUnit XML report, whatever ``--format`` prints (verify, probe)."""
    return click.option(
        "--junit-file",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help="Also write a JUnit XML report to FILE, whatever --format prints (e.g. --format github annotations "
        "on stdout and a JUnit file for the test dashboard, in one run).",
    )


def check_report_files(output: Output, junit_file: str | None, inputs: Sequence[str]) -> None:
    """Refuse ``--output-file`` / ``--junit-file`` paths that would overwrite an input, or that name one file."""
    for option, path in (("--output-file", output.file), ("--junit-file", junit_file)):
        if path:
            check_output_file(path, list(inputs), option)
    if output.file and junit_file and os.path.realpath(output.file) == os.path.realpath(junit_file):
        raise click.BadParameter(
            "--junit-file and --output-file name the same file", param_hint="--junit-file"
        )


def finish(
    report: Envelope,
    output: Output,
    *,
    text: Callable[[], str] | None = None,
    text_options: Mapping[str, object] | None = None,
    quiet: bool | None = None,
    per_group: bool = False,
) -> NoReturn:
    """Render ``report`` in ``output.fmt`` through the format registry, write it (stdout or ``--output-file``) and
    exit with the report's exit code (0 ok, 1 error findings; a report may say otherwise: ``exit_code``).

    ``text`` replaces the registered text renderer; ``quiet`` (default: ``--quiet``) silences human output only.
    ``per_group``: under ``--quiet``, print each error finding as ``NAME: CODE message`` on stderr, and always name
    each unusable input of the report's view on stderr (verify's several adapters).
    """
    quiet = is_quiet() if quiet is None else quiet
    silent = output.fmt == "text" and quiet and not output.file
    if not silent:
        if output.fmt == "text" and text is not None:
            body = text()
        else:
            from adapterdoc.report.formats import render

            body = render(report, output.fmt, **(text_options or {}))
        if output.file:
            write_report(output.file, body)
        else:
            emit(body)
    if per_group:
        from adapterdoc.report.registry import view_of

        groups = view_of(report).groups
        if silent:  # --quiet: nothing but errors, one line each
            for g in groups:
                for f in g.findings:
                    if f.severity == "error":
                        click.echo(f"{g.name}: {f.code} {f.message}", err=True)
        for g in groups:
            if g.error:
                click.echo(f"adapterdoc: error: {g.error}", err=True)
    code = getattr(report, "exit_code", None)
    click.get_current_context().exit(code if isinstance(code, int) else (0 if report.ok else 1))
    raise AssertionError("unreachable")  # pragma: no cover  (Context.exit raises)


def write_report(path: str, text: str) -> None:
    """One report file (``--output-file`` / ``--junit-file``), through the atomic writer (CLI.md's output rules)."""
    from adapterdoc.st.atomic import atomic_write_bytes

    atomic_write_bytes(path, text.encode("utf-8"))


def check_output_file(path: str, inputs: list[str], option: str = "--output-file") -> None:
    """Refuse a report file that would overwrite an input (an adapter's or the base's files), has no folder, or
    may not be written (CLI.md's output-path rules: :func:`adapterdoc.st.atomic.resolve_output`)."""
    from adapterdoc.errors import InputNotFoundError, RefusedError
    from adapterdoc.st.atomic import resolve_output

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputNotFoundError(path, f"the folder for {option} does not exist")
    if resolve_output(path).direct:
        return  # a device, pipe or descriptor: written through, never an input
    target = os.path.realpath(path)
    for spec in inputs:
        if not spec or not os.path.lexists(spec):
            continue
        real = os.path.realpath(spec)
        if target == real or target.startswith(real.rstrip(os.sep) + os.sep):
            raise RefusedError(
                path, f"{option} would overwrite or sit inside the input {spec}; choose another path"
            )


# --------------------------------------------------------------------------------------------- progress

BAR_COLUMNS = ("spinner", "bar", "bytes", "speed", "elapsed", "remaining")
"""The rich columns :func:`stderr_bar` knows by name; any other string is a text column (a rich format)."""


class LiveBar:
    """A context manager around :func:`stderr_bar`: the bar runs between enter and exit when ``live``, else nothing
    is drawn; :meth:`update` and :meth:`advance` are no-ops without a bar. The commands' progress displays (merge,
    train, train-smoke) subclass it with their own ``on_event``."""

    def __init__(
        self, columns: Sequence[str], description: str, total: float | None = None, *, live: bool
    ) -> None:
        self.columns, self.description, self.total, self.live = columns, description, total, live
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self) -> Self:
        if self.live:
            self.progress, self.task = stderr_bar(self.columns, self.description, self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, **fields: Any) -> None:  # rich's own keywords (completed, total, description)
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, **fields)

    def advance(self) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.advance(self.task)


class BytesBar(LiveBar):
    """A rich progress bar by bytes on stderr, drawn only when stderr is a terminal and the command is not
    ``--quiet`` (and ``enabled``); entering it gives the library its ``progress(done, total)`` callback (None
    without a bar)."""

    def __init__(self, description: str, *, enabled: bool = True) -> None:
        columns = ("[progress.description]{task.description}", "bar", "bytes", "speed", "remaining")
        super().__init__(columns, description, live=enabled and not is_quiet() and sys.stderr.isatty())

    def __enter__(self) -> Callable[[int, int], None] | None:  # type: ignore[override]
        super().__enter__()
        if self.progress is None:
            return None

        def update(done: int, total: int) -> None:
            self.update(completed=done, total=total)

        return update


def stderr_bar(
    columns: Sequence[str], description: str, total: float | None = None
) -> tuple[Progress, TaskID]:
    """A started, transient rich progress bar on stderr with one task (``description``, ``total``); ``columns``
    are names from :data:`BAR_COLUMNS` or text formats such as ``"{task.completed}/{task.total} steps"``. The
    caller stops it (``progress.stop()``)."""
    from rich import progress as rp
    from rich.console import Console

    made = {
        "spinner": rp.SpinnerColumn,
        "bar": rp.BarColumn,
        "bytes": rp.DownloadColumn,
        "speed": rp.TransferSpeedColumn,
        "elapsed": rp.TimeElapsedColumn,
        "remaining": rp.TimeRemainingColumn,
    }
    cols = [made[c]() if c in made else rp.TextColumn(c) for c in columns]
    bar = rp.Progress(*cols, console=Console(stderr=True), transient=True)
    bar.start()
    return bar, bar.add_task(description, total=total)
