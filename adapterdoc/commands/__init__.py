"""One module per CLI command; each defines a click ``command`` and imports its library lazily. :data:`COMMANDS`
is the catalogue the CLI's lazy group reads: a command's module is imported only when that command runs (or its
own help is asked for); the top-level ``--help`` lists every command from the table's one-line helps alone.

Adding a command is one line here: its name, its module, and the first paragraph of its help (``tests/commands/
test_cli_lazy.py`` checks each line against the real command, and that every ``*_cmd.py`` module is listed)."""

from __future__ import annotations

import importlib

import click

COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": (
        "inspect_cmd",
        "Describe an adapter, checkpoint or cached repo from its headers alone (with --weights, its LoRA tensors).",
    ),
    "remap": (
        "remap_cmd",
        "Rename an adapter's keys to another model layout and keep adapter_config.json consistent.",
    ),
    "verify": (
        "verify_cmd",
        "Check adapters against a base before they are deployed: keys, shapes, weights, serving rules.",
    ),
    "merge": ("merge_cmd", "Merge a LoRA adapter into its base checkpoint, streaming one tensor at a time."),
    "roundtrip": (
        "roundtrip_cmd",
        "Run every move (remaps there and back, .bin ↔ .safetensors, load/save, merge, counterpart) on copies of "
        "ADAPTER and check that nothing changed. The input is never modified. Exit 1 if any round trip fails.",
    ),
    "train-smoke": (
        "smoke_cmd",
        "Train a reference LoRA on a tiny model per layout, then run the doctor on it.",
    ),
    "train": (
        "train_cmd",
        "Train a LoRA adapter on your own model and data, then run the doctor on what was written.",
    ),
    "eval": ("eval_cmd", "Loss and token accuracy of the base and of base + adapter on the same rows."),
    "explain": (
        "explain_cmd",
        "Explain a finding code (AD301) or name (lora-b-all-zero); without CODE, list every code.",
    ),
    "convert": (
        "convert_cmd",
        "The same adapter in another runtime's format, exactly: PEFT ⇄ MLX (mlx-lm) ⇄ GGUF (llama.cpp), through "
        "PEFT. What the target cannot hold is refused with exit 3 before anything is written.",
    ),
    "probe": (
        "probe_cmd",
        "Ask a running server whether it applies the adapter as PEFT does (exit 0), or serves the base, another "
        "scale or something else (exit 1); exit 3 when it cannot be probed.",
    ),
    "combine": (
        "combine_cmd",
        "Combine adapters of one base into one plain PEFT adapter: each module's weighted sum of deltas, exactly "
        "(cat) or at the best rank R (svd), with each module's kept energy and relative error.",
    ),
    "resize": (
        "resize_cmd",
        "Change a LoRA adapter's rank by the best factorisation of each module's delta, with each module's kept "
        "energy and relative error.",
    ),
    "extract": (
        "extract_cmd",
        "Extract a LoRA adapter from a full fine-tune: each changed Linear/Embedding weight's delta at its best "
        "rank, read one tensor pair at a time, with each module's kept energy and relative error.",
    ),
}
"""command name → (module in this package, the first paragraph of its help: the top-level ``--help`` line)."""

MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))
"""Every command module (each must import)."""


def load(name: str) -> click.Command:
    """The click command ``name`` from its module (an unknown name is a KeyError, a missing module an
    ImportError: never skipped)."""
    command: click.Command = importlib.import_module(f"adapterdoc.commands.{COMMANDS[name][0]}").command
    return command


def load_all() -> list[click.Command]:
    """Every listed command, imported."""
    return [load(name) for name in COMMANDS]
