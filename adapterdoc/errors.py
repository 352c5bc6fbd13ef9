"""The error types adapterdoc raises for inputs it cannot use; the CLI maps them to exit code 3."""

from __future__ import annotations

import os


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
    """The operation needs the ML extra (torch, transformers, peft) which is not installed."""

    def __init__(self, what: str | None, package: str) -> None:
        super().__init__(
            what,
            f"this needs `{package}`, which is not installed; install the ML extra: "
            "pip install torch==2.13.0 'adapterdoc[ml]'",
        )
