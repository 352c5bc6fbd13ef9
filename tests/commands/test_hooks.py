"""The pre-commit hook: installed into a fresh virtual environment and run the way pre-commit runs it
(`entry` + `args` + the changed file names), on a good adapter and on one that must fail the gate."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from adapterdoc.precommit import adapter_dirs

ROOT = Path(__file__).resolve().parents[2]
peft = pytest.importorskip("peft")


def test_adapter_dirs_from_changed_files(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "adapter_config.json").write_text("{}")
    (a / "README.md").write_text("")
    (tmp_path / "other.txt").write_text("")
    files = [str(a / "adapter_config.json"), str(a / "README.md"), str(tmp_path / "other.txt")]
    assert adapter_dirs(files) == [str(a)]


def _adapter(folder: Path, layout: str) -> Path:
    from adapterdoc.ml.tiny import build_tiny
    from adapterdoc.train.lora import lora_config

    cfg = lora_config(layout)
    cfg.init_lora_weights = False  # non-zero lora_B: a zero adapter would (rightly) fail the gate
    peft.get_peft_model(build_tiny(layout), cfg).save_pretrained(folder)
    return folder


def _hook() -> dict[str, Any]:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (hook,) = [h for h in hooks if h["id"] == "adapterdoc-verify"]
    return hook


def test_hook_definition_matches_adapter_files() -> None:
    hook = _hook()
    rx = re.compile(hook["files"])
    assert rx.search("adapters/a/adapter_config.json") and rx.search("adapter_model.safetensors")
    assert not rx.search("model.safetensors") and not rx.search("adapter_config.json.bak")
    assert hook["pass_filenames"] is True and hook["language"] == "python"


def test_hook_runs_from_a_fresh_venv(wheel_venv: Any, tmp_path: Path) -> None:
    """The wheel installed in a fresh venv (the way pre-commit builds its hook environment), run without the
    source tree on the path: passes from a global install and from inside a virtualenv alike."""
    hook = _hook()
    entry = wheel_venv.bin / hook["entry"]
    assert entry.exists(), "the console script the hook names is not installed"
    env = wheel_venv.env
    good = _adapter(tmp_path / "good", "qwen3_5_text")
    bad = _adapter(tmp_path / "bad", "qwen3_5_vl")  # a VL adapter on a text base: must fail, with the fix
    args = ["--base", "tiny:qwen3_5_text"]
    files = [str(good / "adapter_config.json"), str(good / "adapter_model.safetensors")]
    ok = subprocess.run([str(entry), *args, *files], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    files.append(str(bad / "adapter_model.safetensors"))
    fail = subprocess.run([str(entry), *args, *files], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert fail.returncode == 1, fail.stdout + fail.stderr
    assert "adapterdoc remap" in fail.stdout and "--vl" in fail.stdout
    nothing = subprocess.run(
        [str(entry), *args, str(tmp_path / "unrelated.txt")], capture_output=True, cwd=tmp_path, env=env
    )
    assert nothing.returncode == 0


def test_an_option_value_that_is_a_path_stays_an_option(tmp_path: Path) -> None:
    """`args: [--base, ./configs/base]` names an existing folder: it must reach verify as --base's value."""
    from adapterdoc.ml.tiny import build_tiny
    from adapterdoc.precommit import precommit_main

    base = tmp_path / "base"
    build_tiny("qwen3_5_text").config.save_pretrained(base)
    adapter = _adapter(tmp_path / "a", "qwen3_5_text")
    with pytest.raises(SystemExit) as exit_:
        precommit_main(["--base", str(base), str(adapter / "adapter_config.json")])
    assert exit_.value.code == 0


def test_the_cpu_torch_route_for_pre_commit_is_documented_where_the_hook_is() -> None:
    """pre-commit takes no pip options; the CI page's recipe and the hook file name the same environment route."""
    route = "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu pre-commit install-hooks"
    page = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    section = page[page.index("## In pre-commit") : page.index("## In GitHub Actions")]
    assert route in section
    assert route in (ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # the gate itself: the base package and the gguf extra (a GGUF adapter's tensors), no torch
    assert _hook()["additional_dependencies"] == extras["gguf"]
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (ml,) = [h for h in hooks if h["id"] == "adapterdoc-verify-ml"]
    assert ml["additional_dependencies"] == extras["ml"] + extras["gguf"]
    assert {
        k: v for k, v in ml.items() if k not in ("id", "name", "description", "additional_dependencies")
    } == {
        k: v for k, v in _hook().items() if k not in ("id", "name", "description", "additional_dependencies")
    }
