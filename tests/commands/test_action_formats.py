"""The Action's verify step with GGUF and MLX adapters (issue 39, item 5): a glob's matches reach verify with the
GGUF adapter files and MLX folders in them, a model GGUF among the matches is left out (said on stderr), and a
model GGUF named as such still goes to verify (which says what it is)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.commands.test_action import _calls, _env, _run_step, _step
from tests.formats.test_mlx import dense, peft_folder

pytest.importorskip("gguf")
from tests.formats.gguf_helpers import base_tensors, lora_tensors, write_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def work(tmp_path: Path, cli: Any) -> Path:
    a = tmp_path / "work" / "adapters"
    a.mkdir(parents=True)
    write_gguf(a / "lora.gguf", "llama", lora_tensors())
    write_gguf(a / "model.gguf", "llama", base_tensors(), adapter=False)
    peft_folder(a / "peft", dense())
    assert cli("convert", a / "peft", "--to", "mlx", "--out", a / "mlx").exit_code == 0
    return tmp_path / "work"


def _step_calls(work: Path, tmp_path: Path, adapters: str) -> tuple[Any, list[str]]:
    """Run the verify step with a `python` that runs `-c` snippets for real and records verify's argv."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.log"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "python"
    exe.write_text(
        f'#!/usr/bin/env bash\nif [ "$1" = "-c" ]; then exec "{sys.executable}" "$@"; fi\n'
        f'printf "%s\\0" "$@" >> "{log}"\necho >> "{log}"\n'
    )
    exe.chmod(0o755)
    env = _env(_step("Verify"), ROOT, adapters=adapters)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    res = _run_step(_step("Verify"), env, work)
    assert res.returncode == 0, res.stderr
    (call,) = _calls(log)
    return res, call[call.index("--") + 1 :]


def test_a_glob_reaches_verify_with_gguf_and_mlx_adapters_and_without_the_model(
    work: Path, tmp_path: Path
) -> None:
    res, got = _step_calls(work, tmp_path, "adapters/*")
    assert got == ["adapters/lora.gguf", "adapters/mlx", "adapters/peft"]
    assert "adapters/model.gguf is a model GGUF, not an adapter" in res.stderr


def test_a_model_gguf_named_as_such_goes_to_verify(work: Path, tmp_path: Path) -> None:
    _, got = _step_calls(work, tmp_path, "adapters/model.gguf adapters/*.gguf")
    assert got == ["adapters/model.gguf", "adapters/lora.gguf"]
