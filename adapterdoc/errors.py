"""The error types adapterdoc raises for inputs it cannot use; the CLI maps them to exit code 3."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


class AdapterdocError(Exception):
    """An input cannot be used, or an operation was refused to protect data.

    Carries the offending path (or repo id) and a one-line reason; ``str(err)`` is
    ``"<what>: <why>"``, ready for ``adapterdoc: error: ...``.
    """

    exit_code = 3

    def __init__(self, what: str | os.PathLike[str] | None, reason: str, *, key: str | None = None) -> None:
        self.what = os.fspath(what) if what is not None else None
        self.reason = " ".join(str(reason).split())  # always one line
        self.key = key
        super().__init__(str(self))

    def __str__(self) -> str:
        reason = self.reason if self.key is None else f"`{self.key}`: {self.reason}"
        return f"{self.what}: {reason}" if self.what else reason


class HeaderError(AdapterdocError, ValueError):
    """A safetensors file violates the format (bounded reads, JSON, offsets, dtypes, shapes)."""


class InputNotFoundError(AdapterdocError, FileNotFoundError):
    """A path, file inside a directory, or cached repo does not exist."""


class UnsupportedInputError(AdapterdocError, ValueError):
    """The input exists but is not something adapterdoc can read (or needs an extra not installed)."""


class ConfigError(AdapterdocError, ValueError):
    """adapter_config.json, config.json or a shard index is malformed."""


class RefusedError(AdapterdocError):
    """An operation was refused to protect data (collision, would overwrite, double infix, ...)."""


class MissingExtraError(UnsupportedInputError):
    """The operation needs an extra which is not installed: by default the ML extra (torch, transformers, peft);
    ``extra`` names another (``gguf``: gguf-py and numpy; ``weights``: numpy)."""

    def __init__(self, what: str | None, package: str, extra: str = "ml") -> None:
        install = (
            "install the ML extra: pip install torch==2.13.0 'adapterdoc[ml]'"
            if extra == "ml"
            else f"install the {extra} extra: pip install 'adapterdoc[{extra}]'"
        )
        super().__init__(what, f"this needs `{package}`, which is not installed; {install}")


EXTRA_OF = {
    "torch": "ml",
    "transformers": "ml",
    "peft": "ml",
    "accelerate": "ml",
    "tokenizers": "ml",
    "numpy": "weights",
    "gguf": "gguf",
    "matplotlib": "plot",
}
"""The packages of the optional extras (pyproject's ``[project.optional-dependencies]``) → the extra to install."""


def missing_extra(e: ModuleNotFoundError, what: str | None) -> MissingExtraError | None:
    """The :class:`MissingExtraError` for an import of an optional extra's package that failed (the light install
    running a command that needs it), else None (a missing module of no extra is a bug)."""
    package = (e.name or "").partition(".")[0]
    extra = EXTRA_OF.get(package)
    return MissingExtraError(what, package, extra) if extra else None


# ------------------------------------------------------------------------------------------------ Ctrl-C

_interrupted = False


def _on_sigint(signum: int, frame: object) -> None:
    """Python's own SIGINT behaviour (raise KeyboardInterrupt), remembered: a KeyboardInterrupt raised while a
    finaliser or weakref callback runs is printed as "Exception ignored" (a traceback) and lost, and a long run then
    went on as if Ctrl-C had never been pressed. :func:`raise_if_interrupted` raises it again at the next safe point,
    and :func:`remembered_interrupts` keeps that lost one from printing a traceback."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def remembered_interrupts() -> Iterator[None]:
    """For a command's run: SIGINT as Python raises it, and remembered for :func:`raise_if_interrupted` (only in the
    main thread, and only where SIGINT has Python's default handler: a caller's own handler is left alone)."""
    global _interrupted
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _interrupted = False
    hook = sys.unraisablehook

    def unraisable(u: sys.UnraisableHookArgs) -> None:
        if not isinstance(
            u.exc_value, KeyboardInterrupt
        ):  # ours: raised again at the next step, no traceback
            hook(u)

    signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = hook
        _interrupted = False


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed during this command, even where Python swallowed it (long
    loops call this between their steps)."""
    if _interrupted:
        raise KeyboardInterrupt
