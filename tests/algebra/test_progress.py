"""Progress of resize, combine and extract: the library reports the bytes read as each module (tensor) is done,
ending at the total it read; the CLI draws a bar on stderr only when stderr is a terminal (a real pty here) and
not under --quiet."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.peft_helpers import LAYOUT, make_adapter


@pytest.fixture(scope="module")
def base() -> Any:
    from adapterdoc.ml.tiny import build_tiny

    return build_tiny(LAYOUT)


def _factor_bytes(folder: Path) -> int:
    from adapterdoc.adapter import parse_key
    from adapterdoc.checkpoint import open_checkpoint

    ckpt = open_checkpoint(str(folder))
    return sum(t.nbytes for n, t in ckpt.tensors.items() if parse_key(n).is_lora)


def test_reported_counts_an_item_once_the_loop_is_done_with_it() -> None:
    from adapterdoc.algebra.progress import reported

    seen: list[tuple[int, int]] = []
    order: list[str] = []
    for x in reported(["a", "bb", "ccc"], len, lambda d, t: seen.append((d, t))):
        order.append(f"{x}:{len(seen)}")
        if x == "bb":
            continue  # a skipped item is done too
    assert order == ["a:0", "bb:1", "ccc:2"] and seen == [(1, 6), (3, 6), (6, 6)]
    assert list(reported([1, 2], lambda _: 1, None)) == [1, 2]


def test_resize_and_combine_report_every_module_up_to_the_bytes_read(base: Any, tmp_path: Path) -> None:
    from adapterdoc.algebra import combine, resize

    one = make_adapter(base, tmp_path / "one", 0, target_modules=["q_proj", "v_proj", "o_proj"])
    two = make_adapter(base, tmp_path / "two", 1)
    for energy in (None, 0.9):  # written as computed (--rank) and at the end (--energy)
        seen: list[tuple[int, int]] = []
        out = tmp_path / f"r{energy}"
        report = resize(
            one,
            str(out),
            rank=None if energy else 2,
            energy=energy,
            progress=lambda d, t, seen=seen: seen.append((d, t)),
        )
        assert len(seen) == len(report.modules) and seen[-1] == (_factor_bytes(one),) * 2
        assert [d for d, _ in seen] == sorted({d for d, _ in seen})
    seen = []
    report = combine([one, two], str(tmp_path / "c"), method="cat", progress=lambda d, t: seen.append((d, t)))
    assert len(seen) == len(report.modules) and seen[-1] == (_factor_bytes(one) + _factor_bytes(two),) * 2


def test_extract_reports_the_tuned_checkpoints_bytes(base: Any, tmp_path: Path) -> None:
    import copy

    import torch

    from adapterdoc.algebra.extract import extract
    from adapterdoc.checkpoint import open_checkpoint

    tuned = copy.deepcopy(base)
    with torch.no_grad():
        tuned.model.layers[0].self_attn.q_proj.weight += 0.01
    base.save_pretrained(tmp_path / "base")
    tuned.save_pretrained(tmp_path / "tuned")
    seen: list[tuple[int, int]] = []
    extract(
        str(tmp_path / "base"),
        str(tmp_path / "tuned"),
        str(tmp_path / "out"),
        rank=2,
        progress=lambda d, t: seen.append((d, t)),
    )
    total = sum(t.nbytes for t in open_checkpoint(str(tmp_path / "tuned")).tensors.values())
    assert len(seen) == len(open_checkpoint(str(tmp_path / "tuned")).tensors) and seen[-1] == (total, total)


def _on_a_terminal(args: list[str]) -> tuple[int, str]:
    """``python -m adapterdoc ARGS`` with stderr on a pseudo-terminal (stdout a pipe): exit code, what the
    terminal showed."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm"}
    p = subprocess.Popen(
        [sys.executable, "-m", "adapterdoc", *args], stdout=subprocess.PIPE, stderr=follower, env=env
    )
    os.close(follower)
    shown = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    p.communicate(timeout=120)
    os.close(leader)
    return p.returncode, shown.decode(errors="replace")


@pytest.mark.slow
def test_the_bar_is_drawn_on_a_terminal_and_not_under_quiet(base: Any, tmp_path: Path) -> None:
    ad = make_adapter(base, tmp_path / "a", 0)
    code, shown = _on_a_terminal(["resize", str(ad), "--rank", "2", "--out", str(tmp_path / "o1")])
    assert code == 0 and "resizing" in shown, shown
    code, shown = _on_a_terminal(["--quiet", "resize", str(ad), "--rank", "2", "--out", str(tmp_path / "o2")])
    assert code == 0 and "resizing" not in shown, shown
