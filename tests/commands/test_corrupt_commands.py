"""Issue 8: every command on every corrupt input: exit 3, one line on stderr, no traceback, nothing changed.

`inspect` has its own, finer test (test_corrupt.py, with the reference verdicts); this one runs remap, verify,
merge (corrupt adapter, and corrupt base) and roundtrip on each input that must be refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from adapterdoc.cli import main
from tests.checkpoint.test_corrupt import GEN, assert_one_line_error, snapshot

pytest.importorskip("peft")

REJECTS = [n for n in GEN.case_names() if n != "fifo.safetensors"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from adapterdoc.ml.tiny import build_tiny

    folder = tmp_path_factory.mktemp("corrupt-all")
    cases = {c.name: c for c in GEN.generate(folder) if c.expect == GEN.REJECT}
    base = tmp_path_factory.mktemp("base") / "qwen3_5_text"
    build_tiny("qwen3_5_text").save_pretrained(base)
    return {"folder": folder, "cases": cases, "base": base, "out": tmp_path_factory.mktemp("outs")}


def commands(path: str, base: Path, out: Path) -> list[list[str]]:
    return [
        ["remap", path, "--vl"],
        ["remap", path, "--to", "qwen3_5_text", "--from", "qwen3_5_vl"],
        ["remap", path, "--rule", "^(.*)$=>\\1", "--out", str(out / "remapped")],
        ["verify", path, "--base", "tiny:qwen3_5_text"],
        ["merge", path, "--base", str(base), "--out", str(out / "merged")],
        ["roundtrip", path],
    ]


def run(args: list[str]) -> Any:
    return CliRunner().invoke(main, args, env={"ADAPTERDOC_DEBUG": None, "NO_COLOR": "1"})


@pytest.mark.parametrize("name", REJECTS)
def test_every_command_refuses(world: dict[str, Any], name: str) -> None:
    case = world["cases"].get(name)
    if case is None:
        pytest.skip("a valid control input")
    before = snapshot(world["folder"] / name)
    base_before = snapshot(world["base"])
    for args in commands(case.path, world["base"], world["out"]):
        res = run(args)
        assert res.exit_code == 3, (args, res.exit_code, res.stdout[-400:], res.stderr)
        assert_one_line_error(res.stderr, case)
        assert snapshot(world["folder"] / name) == before, f"{args[0]} changed its input"
    assert snapshot(world["base"]) == base_before
    assert not os.listdir(world["out"]), "a refused command left output behind"


@pytest.mark.parametrize("name", [n for n in REJECTS if n.endswith(".safetensors")][:25])
def test_merge_refuses_a_corrupt_base(world: dict[str, Any], name: str, tmp_path: Path) -> None:
    """The corrupt file as the base's only weights file, beside a valid config.json."""
    import shutil

    case = world["cases"].get(name)
    if case is None or not os.path.isfile(case.path) or os.path.islink(case.path):
        pytest.skip("not a plain corrupt file")
    base = tmp_path / "base"
    base.mkdir()
    shutil.copyfile(world["base"] / "config.json", base / "config.json")
    shutil.copyfile(case.path, base / "model.safetensors")
    adapter = tmp_path / "adapter"
    _tiny_adapter(adapter)
    before = snapshot(tmp_path)
    res = run(["merge", str(adapter), "--base", str(base), "--out", str(tmp_path / "merged")])
    assert res.exit_code == 3, (res.stdout[-300:], res.stderr)
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("adapterdoc: error: ")
    assert snapshot(tmp_path) == before


def _tiny_adapter(folder: Path) -> None:
    import peft

    from adapterdoc.ml.tiny import build_tiny

    model = peft.get_peft_model(build_tiny("qwen3_5_text"), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    model.save_pretrained(folder)
