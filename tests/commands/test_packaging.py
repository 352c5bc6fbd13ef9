"""The wheel: it carries every runtime file of the package, and the main job runs from a non-editable install."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "adapterdoc"


def _source_files() -> set[str]:
    """Every file of the package in the source tree (``adapterdoc/...``), bytecode caches aside."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in PKG.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_wheel_holds_every_file_of_the_package(wheel_venv: Any) -> None:
    with zipfile.ZipFile(wheel_venv.wheel) as z:
        names = set(z.namelist())
        assert "adapterdoc/data/smoke.jsonl" in names and "adapterdoc/py.typed" in names
        missing = sorted(_source_files() - names)
        assert not missing, f"in the source tree but not in the wheel: {missing}"
        packaged = z.read("adapterdoc/data/smoke.jsonl")
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert packaged == (PKG / "data" / "smoke.jsonl").read_bytes()
    assert "adapterdoc = adapterdoc.cli:run" in entry_points
    assert "adapterdoc-pre-commit = adapterdoc.precommit:precommit_script" in entry_points
    assert not any(n.startswith(("tests/", "fixtures/", "scripts/", "benchmarks/")) for n in names)


def test_the_venv_imports_the_wheel_not_the_source_tree(wheel_venv: Any) -> None:
    where = wheel_venv.run_py("import adapterdoc, sys; print(adapterdoc.__file__)").strip()
    assert Path(where).resolve().is_relative_to(wheel_venv.purelib.resolve()), where
    torch_at = wheel_venv.run_py("import torch; print(torch.__file__)").strip()
    assert (
        not Path(torch_at).resolve().is_relative_to(wheel_venv.root.resolve())
    )  # the parent's torch, no install


@pytest.mark.ml
def test_train_smoke_runs_from_the_wheel_in_an_empty_folder(wheel_venv: Any, tmp_path: Path) -> None:
    """Issue 12 §2: from a non-editable install the bundled rows are found (was seven AD609 'not found')."""
    pytest.importorskip("peft")
    work = tmp_path / "empty"
    work.mkdir()
    cmd = [str(wheel_venv.bin / "adapterdoc"), "train-smoke", "--layout", "modernbert_mlm", "--steps", "2"]
    res = subprocess.run(
        [*cmd, "--out", "runs/smoke", "--json"], capture_output=True, text=True, cwd=work, env=wheel_venv.env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is True and [r["layout"] for r in doc["layouts"]] == ["modernbert_mlm"]
    meta = json.loads((work / "runs/smoke/modernbert_mlm/training_metadata.json").read_text())
    assert Path(meta["data"]).resolve().is_relative_to(wheel_venv.purelib.resolve())
    verify = subprocess.run(
        [str(wheel_venv.bin / "adapterdoc"), "verify", "runs/smoke/modernbert_mlm/adapter"],
        capture_output=True,
        text=True,
        cwd=work,
        env=wheel_venv.env,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
