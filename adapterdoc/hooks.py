"""Entry point for the pre-commit hook: changed files → the adapter folders they belong to → ``adapterdoc verify``."""

from __future__ import annotations

import os
import sys

_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def adapter_dirs(paths: list[str]) -> list[str]:
    """The unique adapter folders among ``paths`` (folders, or files inside an adapter folder), in order."""
    out: list[str] = []
    for p in paths:
        d = p if os.path.isdir(p) else os.path.dirname(p) or "."
        is_adapter = os.path.basename(p) in _ADAPTER_FILES or os.path.isfile(
            os.path.join(d, "adapter_config.json")
        )
        if is_adapter and d not in out:
            out.append(d)
    return out


def precommit_script() -> None:
    """The ``adapterdoc-pre-commit`` script: :func:`precommit_main` as the whole program
    (:func:`adapterdoc.cli.as_program`: no last full collection at its exit)."""
    from adapterdoc.cli import as_program

    as_program(precommit_main)


def precommit_main(argv: list[str] | None = None) -> None:
    """``adapterdoc-pre-commit [VERIFY OPTIONS] -- FILES...`` (pre-commit appends the changed files last)."""
    args = list(sys.argv[1:] if argv is None else argv)
    is_file = [os.path.basename(a) in _ADAPTER_FILES and os.path.isfile(a) for a in args]
    options = [a for a, f in zip(args, is_file) if not f]
    files = [a for a, f in zip(args, is_file) if f]
    dirs = adapter_dirs(files)
    if not dirs:
        return
    from adapterdoc.cli import main

    main(["verify", *options, *dirs], prog_name="adapterdoc")
