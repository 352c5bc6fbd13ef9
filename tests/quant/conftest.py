"""The tiny real quantized bases the oracle tests read, made once per test process by the real libraries in the
``quant`` oracle environment (``fixtures/make_quantized.py``; about 40 s)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

MAKER = Path(__file__).resolve().parents[2] / "fixtures" / "make_quantized.py"


@pytest.fixture(scope="session")
def real_bases(oracle_env: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the quant environment's python, the folder holding one base per scheme)."""
    python = oracle_env("quant")
    root = tmp_path_factory.mktemp("quantized")
    r = subprocess.run([str(python), str(MAKER), str(root)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return python, root
