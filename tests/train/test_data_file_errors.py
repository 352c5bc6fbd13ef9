"""`--data` that is not a readable JSONL file says what is wrong (issue 39, item 9): a FIFO was "training data
file not found", and is now "is a FIFO (named pipe), not a regular file" (never opened: a run reads its data file
more than once, and opening a pipe with no writer would hang); a folder, a missing file and a file that cannot be
read are each named. Both readers: `train`/`eval`'s (:func:`adapterdoc.train.rows.read_rows`) and
`train-smoke`'s (:func:`adapterdoc.train.data.load_rows`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.errors import AdapterdocError
from adapterdoc.train.data import load_rows
from adapterdoc.train.rows import read_rows

READERS: dict[str, Callable[[str], Any]] = {"read_rows": read_rows, "load_rows": load_rows}
ROW = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'


@pytest.mark.parametrize("reader", list(READERS))
def test_a_fifo_is_not_a_regular_file(tmp_path: Path, reader: str) -> None:
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(AdapterdocError) as e:
        READERS[reader](str(fifo))  # returns at once: the pipe is never opened
    assert str(e.value) == f"{fifo}: is a FIFO (named pipe), not a regular file"


@pytest.mark.parametrize("reader", list(READERS))
def test_missing_folder_and_broken_link_are_named(tmp_path: Path, reader: str) -> None:
    with pytest.raises(AdapterdocError, match="training data file not found"):
        READERS[reader](str(tmp_path / "missing.jsonl"))
    with pytest.raises(AdapterdocError, match="is a folder, not a JSONL file"):
        READERS[reader](str(tmp_path))
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(AdapterdocError, match="is a broken symlink"):
        READERS[reader](str(link))


def test_a_regular_file_still_reads(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(ROW)
    assert len(read_rows(str(rows))) == 1


def test_permission_denied_is_said(tmp_path: Path) -> None:
    """As root (a CI container) the capabilities that bypass file modes are dropped (setpriv) for the reader."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(ROW)
    rows.chmod(0)
    code = "import sys\nfrom adapterdoc.train.rows import read_rows\ntry:\n    read_rows(sys.argv[1])\nexcept Exception as e:\n    print(e)\n"
    cmd = [sys.executable, "-c", code, str(rows)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: no way to make a file unreadable")
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *cmd]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if "Operation not permitted" in res.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {res.stderr.strip()}")
    assert res.stdout == f"{rows}: cannot read: Permission denied\n", res.stdout + res.stderr
