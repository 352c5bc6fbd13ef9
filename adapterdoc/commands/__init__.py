"""One module per CLI command; each defines a click command and imports its library lazily. :data:`MODULES` is\nthe catalogue: every name in it must import."""

from __future__ import annotations

import importlib

import click

MODULES = (
    "inspect_cmd",
    "remap_cmd",
    "verify_cmd",
    "merge_cmd",
    "roundtrip_cmd",
    "train_cmd",
    "fit_cmd",
    "eval_cmd",
    "explain_cmd",
    "convert_cmd",
)


def _load() -> list[click.Command]:
    """Every listed command; a listed module that is missing is an ImportError here, never skipped."""
    return [importlib.import_module(f"adapterdoc.commands.{name}").command for name in MODULES]


COMMANDS = _load()
