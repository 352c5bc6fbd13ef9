"""One output-folder rule (:func:`adapterdoc.st.atomic.check_output_folder`) for every command that takes an output
folder: ``train --out``, ``remap --out``, ``merge --out``, ``convert --out`` and ``train-smoke --out`` answer the
same path the same way, exit 3 with the one function's own line, and leave what is there as it was.

Before, train had its own copy of the rule with other messages and another walk: a broken symlink above ``--out``
was refused by train and passed by merge (which then failed making the folder), and ``train-smoke --out`` wrote
through a symlink to a folder and crashed (exit 4) below a file."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from small_adapters import BASE, write_small_adapter

from adapterdoc.errors import AdapterdocError
from adapterdoc.st.atomic import check_output_folder

HAS_ML = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "peft", "accelerate"))

COMMANDS: dict[str, tuple[str, ...]] = {
    "train": ("train", "--base", BASE, "--data", "{rows}", "--steps", "1", "--out"),
    "remap": ("remap", "{adapter}", "--rule", "q_proj=>k_proj", "--out"),
    "merge": ("merge", "{adapter}", "--base", "{base}", "--out"),
    "convert": ("convert", "{adapter}", "--to", "mlx", "--out"),
    "train-smoke": ("train-smoke", "--layout", "ministral3_text", "--steps", "1", "--out"),
}
"""Each command with an output folder, its ``--out`` last."""
NO_FORCE = {"remap", "train-smoke"}
"""Commands without ``--force`` (the non-empty folder's hint cannot name it)."""
WRITES_INTO = {"train-smoke"}
"""``train-smoke --out`` holds one folder per layout: a non-empty one is written into, each layout folder by the
rule (replaced only when an earlier train-smoke wrote it)."""


def _case(root: Path, case: str) -> Path:
    """Make what ``case`` names under ``root`` and return the path given as ``--out``."""
    root.mkdir()
    if case == "non-empty":
        (root / "out").mkdir()
        (root / "out" / "notes.txt").write_text("mine\n")
        return root / "out"
    if case == "file":
        (root / "out").write_text("mine\n")
        return root / "out"
    if case == "dangling-symlink":
        (root / "out").symlink_to(root / "nowhere")
        return root / "out"
    if case == "symlink-to-folder":
        (root / "real").mkdir()
        (root / "out").symlink_to(root / "real")
        return root / "out"
    if case == "parent-is-a-file":
        (root / "parent").write_text("mine\n")
        return root / "parent" / "out"
    assert case == "dangling-symlink-parent"
    (root / "parent").symlink_to(root / "nowhere")
    return root / "parent" / "out"


CASES = (
    "non-empty",
    "file",
    "dangling-symlink",
    "symlink-to-folder",
    "parent-is-a-file",
    "dangling-symlink-parent",
)


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a link's target, a file's text, or ``dir``."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = str(p.relative_to(root))
            out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_text()
    return out


def _the_rule_says(path: Path, command: str) -> str:
    """The line the one function answers for ``path`` as ``command`` calls it (``--force`` off)."""
    with pytest.raises(AdapterdocError) as e:
        check_output_folder(path, force=None if command in NO_FORCE else False)
    assert e.value.exit_code == 3
    return f"adapterdoc: error: {e.value}"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small adapter, a torch-free base folder for merge (the --out rule is checked before any weight is read)
    and a few rows for train."""
    root = tmp_path_factory.mktemp("inputs")
    adapter = write_small_adapter(root / "adapter")
    base = root / "base"
    base.mkdir()
    save_file(
        {"model.layers.0.self_attn.q_proj.weight": np.zeros((64, 64), np.float32)}, base / "model.safetensors"
    )
    (base / "config.json").write_text(
        json.dumps(
            {"model_type": "ministral3", "architectures": ["Ministral3ForCausalLM"], "hidden_size": 64}
        )
    )
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(8)))
    return {"adapter": adapter, "base": base, "rows": rows}


def _run(cli: Any, inputs: dict[str, Path], command: str, out: Path) -> Any:
    args = [a.format(**inputs) for a in COMMANDS[command]]
    return cli(*args, out)


@pytest.mark.parametrize("case", CASES)
def test_every_command_answers_an_output_folder_the_same_way(
    cli: Any, inputs: dict[str, Path], tmp_path: Path, case: str
) -> None:
    lines: dict[str, str] = {}
    for command in COMMANDS:
        if command == "train" and not HAS_ML:
            continue
        if case == "non-empty" and command in WRITES_INTO:
            continue
        root = tmp_path / command
        out = _case(root, case)
        before = _snapshot(root)
        res = _run(cli, inputs, command, out)
        got = res.stderr.strip().splitlines()
        assert res.exit_code == 3 and len(got) == 1, (command, res.exit_code, res.stderr)
        assert got[0] == _the_rule_says(out, command), command
        assert _snapshot(root) == before, command  # nothing written, nothing replaced
        lines[command] = got[0].replace(str(root), "ROOT")
    with_force = {line for c, line in lines.items() if c not in NO_FORCE}
    assert len(with_force) == 1, lines
    if case != "non-empty":
        assert set(lines.values()) == with_force, lines  # --force or not, the same line
    else:  # only the hint differs: a command without --force cannot offer it
        assert lines["remap"] == with_force.pop().replace(
            "pass --force to replace a previous adapterdoc output", "choose a new or empty folder"
        )


def test_the_lines_say_what_is_there(tmp_path: Path) -> None:
    """The wording of the one function, case by case (``--force`` on offer)."""
    said = {}
    for case in CASES:
        out = _case(tmp_path / case, case)
        with pytest.raises(AdapterdocError) as e:
            check_output_folder(out, force=False)
        said[case] = str(e.value).replace(str(tmp_path / case), "R")
    assert said == {
        "non-empty": "R/out: is not empty; refusing to overwrite it (pass --force to replace a previous adapterdoc "
        "output)",
        "file": "R/out: is a regular file, not a folder; give a new or empty folder for --out",
        "dangling-symlink": "R/out: is a broken symlink (to R/nowhere); adapterdoc neither writes an output folder "
        "through a link nor replaces the link: give the real folder or a new path",
        "symlink-to-folder": "R/out: is a symlink (to R/real); adapterdoc neither writes an output folder through "
        "a link nor replaces the link: give the real folder or a new path",
        "parent-is-a-file": "R/parent/out: R/parent is a regular file, not a folder; choose another --out",
        "dangling-symlink-parent": "R/parent/out: R/parent is a broken symlink (to R/nowhere), not a folder; "
        "choose another --out",
    }
