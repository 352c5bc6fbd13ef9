"""Entry point for the pre-commit hook: changed files → the adapters they belong to → ``adapterdoc verify``.

What a changed file selects (the hook's ``files`` pattern in ``.pre-commit-hooks.yaml`` lets these through):

- a file in an adapter folder (``adapter_config.json``, ``adapter_model.safetensors`` / ``.bin``, mlx-lm's
  ``adapters.safetensors``, or any file of a folder that holds ``adapter_config.json`` or ``adapters.safetensors``):
  that folder, a PEFT or an MLX adapter;
- a ``*.gguf`` file: the file itself, unless its header reads as a model GGUF (GGUF magic, a readable header, no
  ``general.type = adapter`` and no ``.lora_a`` / ``.lora_b`` tensors), which is skipped: a model is not an adapter.
  A ``.gguf`` file that is not readable GGUF is verified (and fails there): the gate never passes it silently.
"""

from __future__ import annotations

import os
import sys

_FOLDER_FILES = (
    "adapter_config.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "adapters.safetensors",
)
"""The files that make their folder an adapter folder to verify (PEFT's and mlx-lm's)."""
_MARKS = ("adapter_config.json", "adapters.safetensors")
"""A folder holding one of these is an adapter folder (PEFT, or mlx-lm's): any changed file in it selects it."""
GGUF_SUFFIX = ".gguf"


def adapter_targets(paths: list[str]) -> list[str]:
    """The unique adapters among ``paths`` (folders, files inside an adapter folder, GGUF adapter files), in
    order: what ``verify`` is run on."""
    out: list[str] = []
    for p in paths:
        target = _target(p)
        if target is not None and target not in out:
            out.append(target)
    return out


def adapter_dirs(paths: list[str]) -> list[str]:
    """The unique adapter folders among ``paths`` (:func:`adapter_targets` less the GGUF files)."""
    return [t for t in adapter_targets(paths) if not _is_gguf_name(t)]


def _target(p: str) -> str | None:
    if _is_gguf_name(p):
        return None if is_model_gguf(p) else p
    d = p if os.path.isdir(p) else os.path.dirname(p) or "."
    if os.path.basename(p) in _FOLDER_FILES or any(os.path.isfile(os.path.join(d, m)) for m in _MARKS):
        return d
    return None


def _is_gguf_name(p: str) -> bool:
    return p.endswith(GGUF_SUFFIX) and not os.path.isdir(p)


def is_model_gguf(path: str) -> bool:
    """A GGUF file whose header reads and says it is not a LoRA adapter (a model): header only, standard library
    (:func:`adapterdoc.formats.gguf.is_model_file`; an unreadable header is not a model, so it is verified)."""
    from adapterdoc.formats.gguf import is_model_file

    return is_model_file(path)


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(verify's options with their values, the file names) of ``entry args FILES...``: an option that takes a
    value (verify's own table) keeps the next argument, whatever it names (``--base model.gguf``)."""
    values = _value_options()
    options: list[str] = []
    paths: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            paths += args[i + 1 :]
            break
        if a.startswith("-") and a != "-":
            options.append(a)
            if a in values and i + 1 < len(args):
                i += 1
                options.append(args[i])
        else:
            paths.append(a)
        i += 1
    return options, paths


def _value_options() -> set[str]:
    """verify's options that take a value (``--base``, ``--profile``, ...), from click's own table."""
    import click

    from adapterdoc.commands.verify_cmd import command

    return {
        name
        for p in command.params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for name in p.opts
    }


def precommit_script() -> None:
    """The ``adapterdoc-pre-commit`` script: :func:`precommit_main` as the whole program
    (:func:`adapterdoc.cli.as_program`: no last full collection at its exit)."""
    from adapterdoc.cli import as_program

    as_program(precommit_main)


def precommit_main(argv: list[str] | None = None) -> None:
    """``adapterdoc-pre-commit [VERIFY OPTIONS] FILES...`` (pre-commit appends the changed files last)."""
    args = list(sys.argv[1:] if argv is None else argv)
    options, paths = split_args(args)
    targets = adapter_targets(paths)
    if not targets:
        return
    from adapterdoc.cli import main

    main(["verify", *options, "--", *targets], prog_name="adapterdoc")
