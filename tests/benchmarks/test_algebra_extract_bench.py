"""benchmarks/algebra_extract.py --quick: every row in the table, adapterdoc's extract and the torch anchor ran, the
ratios printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "algebra_extract.py"

pytestmark = [pytest.mark.slow, pytest.mark.ml]


def test_quick_run_prints_every_row_and_the_ratios(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = [
        line.split(" | ")[0].strip("| ").strip() for line in r.stdout.splitlines() if line.startswith("| ")
    ]
    assert rows == [
        "run",
        "read both (anchor)",
        "adapterdoc extract",
        "adapterdoc extract --energy 0.9",
        "its imports + meta model",
        "torch full SVD (anchor)",
    ], r.stdout
    assert "× wall" in r.stdout and "× RSS" in r.stdout and "read both)" in r.stdout
    assert "extract: 44 modules at rank 16" in r.stdout, r.stdout
