"""The options `adapterdoc train` and `adapterdoc eval` share, defined once: the base and the rows, the length
cut and the base's dtype (each command keeps its own help line where the two differ)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

DTYPES = ("auto", "bfloat16", "float16", "float32")
"""The base's dtype: ``auto`` (the checkpoint's) or one of the three float types."""


def base_and_data(data_help: str) -> Callable[[F], F]:
    """``--base`` (a model folder, a cached repo id or tiny:LAYOUT) and ``--data`` (a JSONL file)."""

    def decorate(f: F) -> F:
        f = click.option("--data", required=True, type=click.Path(dir_okay=False), help=data_help)(f)
        return click.option(
            "--base",
            "base",
            required=True,
            help="A model folder (weights + tokenizer), a cached repo id or tiny:LAYOUT.",
        )(f)

    return decorate


def length_and_dtype(dtype_help: str | None = None) -> Callable[[F], F]:
    """``--max-length`` (truncate rows) and ``--dtype`` (the base's dtype, default float32)."""

    def decorate(f: F) -> F:
        f = click.option(
            "--dtype",
            type=click.Choice(DTYPES),
            default="float32",
            show_default=True,
            help=dtype_help,
        )(f)
        return click.option(
            "--max-length",
            type=click.IntRange(min=2),
            default=None,
            help="Truncate rows to this many tokens.",
        )(f)

    return decorate
