"""The pre-commit hook finds GGUF adapter files and MLX adapter folders (issue 39, item 5): its `files` pattern
lets `*.gguf` and `adapters.safetensors` through, a model GGUF is skipped (a model is not an adapter), an option's
value that names a GGUF file (`--base model.gguf`) stays the option's, and pre-commit itself runs the hook on
them (it said "(no files to check) Skipped"). Real files: GGUF written by llama.cpp's gguf-py, an MLX folder written
by `adapterdoc convert`, PEFT adapters written with safetensors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapterdoc.precommit import adapter_dirs, adapter_targets, precommit_main, split_args
from tests.formats.test_mlx import dense, peft_folder

pytest.importorskip("gguf")
from tests.formats.gguf_helpers import base_tensors, lora_tensors, write_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path: Path, cli: Any) -> Path:
    """adapters/{lora.gguf, model.gguf, junk.gguf, mlx/, peft/} and notes.txt, relative paths as pre-commit gives."""
    a = tmp_path / "adapters"
    a.mkdir()
    write_gguf(a / "lora.gguf", "llama", lora_tensors())
    write_gguf(a / "model.gguf", "llama", base_tensors(), adapter=False)
    (a / "junk.gguf").write_bytes(b"not a GGUF file at all")
    peft_folder(a / "peft", dense())
    assert cli("convert", a / "peft", "--to", "mlx", "--out", a / "mlx").exit_code == 0
    (a / "mlx" / "README.md").write_text("notes")
    (tmp_path / "notes.txt").write_text("")
    return tmp_path


def test_files_pattern_lets_gguf_and_mlx_weights_through() -> None:
    for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text()):
        rx = re.compile(hook["files"])
        for path in ("adapters/x.gguf", "x.gguf", "a/mlx/adapters.safetensors", "adapters.safetensors"):
            assert rx.search(path), (hook["id"], path)
        for path in ("a/adapter_config.json", "adapter_model.safetensors", "a/adapter_model.bin"):
            assert rx.search(path), (hook["id"], path)
        for path in (
            "model.safetensors",
            "x.gguf.bak",
            "0000100_adapters.safetensors",
            "adapter_config.json.bak",
        ):
            assert not rx.search(path), (hook["id"], path)


def test_targets_from_changed_files(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    changed = [
        "adapters/lora.gguf",
        "adapters/model.gguf",  # a model: skipped
        "adapters/junk.gguf",  # not readable GGUF: verified (and fails there), never skipped
        "adapters/mlx/adapters.safetensors",
        "adapters/mlx/adapter_config.json",
        "adapters/mlx/README.md",
        "adapters/peft/adapter_model.safetensors",
        "notes.txt",
    ]
    assert adapter_targets(changed) == [
        "adapters/lora.gguf",
        "adapters/junk.gguf",
        "adapters/mlx",
        "adapters/peft",
    ]
    assert adapter_dirs(changed) == ["adapters/mlx", "adapters/peft"]
    assert adapter_targets(["adapters/mlx/README.md"]) == ["adapters/mlx"]  # any file of an MLX folder
    assert adapter_targets(["adapters/model.gguf", "notes.txt"]) == []


def test_a_gguf_option_value_stays_an_option(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`args: [--base, models/base.gguf]`: the model GGUF is --base's value, not a changed file (and would be
    skipped as one anyway); the files go to verify after `--`."""
    monkeypatch.chdir(repo)
    calls: list[list[str]] = []
    monkeypatch.setattr("adapterdoc.cli.main", lambda args, prog_name: calls.append(args))
    argv = [
        "--base",
        "adapters/model.gguf",
        "--scan",
        "lora_b",
        "--load",
        "adapters/lora.gguf",
        "adapters/model.gguf",
    ]
    assert split_args(argv) == (argv[:5], argv[5:])
    precommit_main([*argv, "adapters/mlx/adapters.safetensors"])
    assert calls == [
        [
            "verify",
            "--base",
            "adapters/model.gguf",
            "--scan",
            "lora_b",
            "--load",
            "--",
            "adapters/lora.gguf",
            "adapters/mlx",
        ]
    ]
    calls.clear()
    precommit_main(["--base", "adapters/model.gguf", "adapters/model.gguf", "notes.txt"])
    assert calls == []  # nothing to verify: verify is not run


@pytest.mark.slow
def test_pre_commit_runs_the_hook_on_gguf_and_mlx_files(repo: Path, tmp_path: Path) -> None:
    """`pre-commit try-repo` (the real pre-commit, which builds the hook's environment from this tree with pip):
    the hook runs on a GGUF file and an MLX folder's weights. What verify then says is verify's business."""
    exe = shutil.which("pre-commit") or str(Path(sys.executable).parent / "pre-commit")
    if not os.path.exists(exe):
        pytest.skip("pre-commit is not installed")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "adapters"], cwd=repo, check=True)
    files = ["adapters/lora.gguf", "adapters/model.gguf", "adapters/mlx/adapters.safetensors"]
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    res = subprocess.run(
        [exe, "try-repo", str(ROOT), "adapterdoc-verify", "--verbose", "--files", *files],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = res.stdout + res.stderr
    assert "adapterdoc verify (LoRA adapter gate)" in out, out
    assert "(no files to check)" not in out and "Skipped" not in out, out
    assert "- hook id: adapterdoc-verify" in out, out
    assert not re.search(r"[✓✗] adapters/model\.gguf", out), out  # the model is never verified as an adapter


def test_the_ci_page_states_the_pattern_the_hooks_use() -> None:
    page = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    section = page[page.index("## In pre-commit") : page.index("## In GitHub Actions")]
    for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text()):
        assert f"`{hook['files']}`" in section, hook["id"]
    assert "model GGUF" in section and "adapters.safetensors" in section
