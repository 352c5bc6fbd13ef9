"""One module per CLI command; each defines a click command and imports its library lazily."""

from __future__ import annotations

import importlib

import click

_MODULES = (
    "inspect_cmd",
    "remap_cmd",
    "verify_cmd",
    "merge_cmd",
    "roundtrip_cmd",
    "train_cmd",
    "fit_cmd",
    "eval_cmd",
    "explain_cmd",
)


def _load() -> list[click.Command]:
    cmds: list[click.Command] = []
    for name in _MODULES:
        try:
            mod = importlib.import_module(f"adapterdoc.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"adapterdoc.commands.{name}":
                raise
            continue
        cmds.append(mod.command)
    return cmds


COMMANDS = _load()
