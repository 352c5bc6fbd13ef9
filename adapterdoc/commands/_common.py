"""Shared CLI plumbing: one-line errors (exit 3 for inputs, 4 for bugs), output, quiet mode, shared help text."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from adapterdoc.errors import AdapterdocError

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


def fail(message: str, code: int = 3) -> None:
    """Print ``adapterdoc: error: <message>`` on one line of stderr and exit."""
    one_line = " ".join(message.split())
    click.echo(f"adapterdoc: error: {one_line}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Map adapterdoc's errors to one line on stderr and exit code 3, "cannot write here" OS errors to exit 3, and
    anything unexpected (a bug) to one line and exit code 4; ``--debug`` prints the traceback first."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json") or kwargs.get("fmt") == "json")
        try:
            return func(*args, **kwargs)
        except AdapterdocError as e:
            _refuse(e, as_json)
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
            _refuse(known, as_json)
        except Exception as e:
            _bug(e)

    return wrapper  # type: ignore[return-value]


def _traceback() -> None:
    if debug_enabled():  # the traceback, then the same output and exit code as without --debug
        import traceback

        traceback.print_exc()


def _refuse(e: AdapterdocError, as_json: bool) -> None:
    _traceback()
    if as_json:
        _emit_json_error(e)
    fail(str(e), e.exit_code)


def _bug(e: BaseException) -> None:
    _traceback()
    where = "" if debug_enabled() else " with the output of --debug"
    fail(
        f"internal error (a bug in adapterdoc, not in your input): {type(e).__name__}: {e}; "
        f"please report it{where}",
        BUG_EXIT,
    )


def _emit_json_error(e: AdapterdocError) -> None:
    """With --json, exit 3 still prints one JSON object (``ok`` false) so a CI parser always has one."""
    import json

    finding = {"code": "AD100", "severity": "error", "message": e.reason}
    if e.what:
        finding["path"] = e.what
    if e.key:
        finding["key"] = e.key
    # stdout itself may be what failed (a full disk, /dev/full): then the stderr line alone says why
    with contextlib.suppress(OSError):
        click.echo(json.dumps({"ok": False, "findings": [finding], "error": str(e)}, ensure_ascii=False))


def emit(text: str) -> None:
    """Write rendered output to stdout (one write, newline-terminated); a stdout that cannot take it (a full disk,
    ``> /dev/full``) is one exit-3 line naming stdout."""
    from adapterdoc.st.atomic import writing

    with writing("stdout"):
        click.echo(text.rstrip("\n"))


def is_quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    return bool(root and root.obj and root.obj.get("quiet"))
