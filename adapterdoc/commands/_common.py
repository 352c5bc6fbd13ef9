"""Shared CLI plumbing: one-line errors with exit code 3, output, quiet mode."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from adapterdoc.errors import AdapterdocError

F = TypeVar("F", bound=Callable[..., Any])


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
    """Map adapterdoc's errors (and any unexpected one) to one line on stderr and exit code 3."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AdapterdocError as e:
            if debug_enabled():  # the traceback, then the same output and exit code as without --debug
                import traceback

                traceback.print_exc()
            if kwargs.get("as_json") or kwargs.get("fmt") == "json":
                _emit_json_error(e)
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            interrupted = AdapterdocError(click.get_current_context().info_name, "interrupted by the user")
            if kwargs.get("as_json") or kwargs.get("fmt") == "json":
                _emit_json_error(interrupted)
            fail(str(interrupted), 130)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except MemoryError:
            fail("out of memory")
        except Exception as e:
            if debug_enabled():
                raise
            fail(f"internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)")

    return wrapper  # type: ignore[return-value]


def _emit_json_error(e: AdapterdocError) -> None:
    """With --json, exit 3 still prints one JSON object (``ok`` false) so a CI parser always has one."""
    import json

    finding = {"code": "AD100", "severity": "error", "message": e.reason}
    if e.what:
        finding["path"] = e.what
    if e.key:
        finding["key"] = e.key
    click.echo(json.dumps({"ok": False, "findings": [finding], "error": str(e)}, ensure_ascii=False))


def emit(text: str) -> None:
    """Write rendered output to stdout (one write, newline-terminated)."""
    click.echo(text.rstrip("\n"))


def is_quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    return bool(root and root.obj and root.obj.get("quiet"))
