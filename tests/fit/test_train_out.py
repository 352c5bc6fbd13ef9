"""`adapterdoc train --out`: the output rules (files, symlinks, read-only folders, root included) and runs that
were interrupted or failed, which are always continued (``--resume``) or started again (``--force``, or on their
own when no complete checkpoint was left)."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from adapterdoc.fit import session as S  # noqa: E402
from adapterdoc.train import runtime  # noqa: E402
from adapterdoc.train.settings import TrainSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = "tiny:ministral3_text"
FAST = dict(batch_size=4, lr=5e-3, cpu=True, max_length=32)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "fixtures" / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["make_models"] = mod
    spec.loader.exec_module(mod)
    return mod.write_data(tmp_path_factory.mktemp("data"))["text"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with runtime.torch_threads(1):
        yield


def _train(cli, data, out, *extra: str):
    return cli(
        "train", "--base", BASE, "--data", data, "--out", out, "--steps", "2", "--max-length", "32", *extra
    )


def _one_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 3 and len(lines) == 1 and lines[0].startswith("adapterdoc: error: "), res.stderr
    return lines[0]


def _events(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]  # every line is JSON


# ------------------------------------------------------------------------------------------ the output rules


def test_out_inside_a_read_only_folder_is_refused_even_as_root(cli, data, tmp_path) -> None:
    """Before: root trained into the 0555 folder (merge and verify refuse it)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        line = _one_line(_train(cli, data, ro / "run"))
        assert f"{ro}: folder is not writable (mode 0555)" in line and "--out" in line
        assert list(ro.iterdir()) == []
        empty = tmp_path / "empty"
        empty.mkdir(mode=0o555)
        empty.chmod(0o555)
        assert f"{empty}: folder is read-only (mode 0555)" in _one_line(_train(cli, data, empty))
    finally:
        ro.chmod(0o755)


def test_out_that_is_a_file_is_the_usual_exit_3_line(cli, data, tmp_path) -> None:
    """Before: click's usage error (exit 2)."""
    f = tmp_path / "file"
    f.write_text("keep me")
    assert "is a regular file, not a folder" in _one_line(_train(cli, data, f))
    assert f.read_text() == "keep me"


def test_out_that_is_a_symlinked_folder_is_refused_naming_the_link(cli, data, tmp_path) -> None:
    """Before: `exists and is not a folder` about a link to a folder."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    line = _one_line(_train(cli, data, link))
    assert f"{link}: is a symlink (to {real})" in line and "give the real folder or a new path" in line
    assert list(real.iterdir()) == [] and link.is_symlink()


def test_a_folder_train_did_not_write_is_refused_even_with_force(cli, data, tmp_path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("x")
    assert "did not write" in _one_line(_train(cli, data, out, "--force"))
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


# ---------------------------------------------------------------------------- interrupted and failed runs


def _stop_at(step: int, exc: BaseException):
    def on_event(event: dict) -> None:
        if event.get("event") == "step" and event["step"] == step:
            raise exc

    return on_event


@pytest.mark.parametrize(
    ("exc", "last"),
    [(KeyboardInterrupt(), "interrupted"), (OSError(errno.ENOSPC, "No space left on device"), "failed")],
    ids=["ctrl-c", "disk-full"],
)
def test_a_run_stopped_before_its_first_checkpoint_starts_again(cli, data, tmp_path, exc, last) -> None:
    """Before: `train --out D` said "pass --resume", and `--resume` said "no complete checkpoint"."""
    out = tmp_path / "run"
    with pytest.raises(type(exc)):
        S.train_on_base(
            BASE, str(data), str(out), TrainSettings(steps=4, save_steps=3, **FAST), on_event=_stop_at(1, exc)
        )
    assert [e["event"] for e in _events(out)][-1] == last and not (out / "checkpoints").exists()
    with open(out / "progress.jsonl", "a") as f:
        f.write('{"event": "st')  # the disk filled up in the middle of a line
    again = _train(cli, data, out, "--json", "--no-canaries", *(["--resume"] if last == "failed" else []))
    assert again.exit_code == 0, again.stderr
    d = json.loads(again.stdout)
    assert [(f["code"], f["severity"]) for f in d["findings"]] == [("AD628", "warning")]
    assert "stopped before its first complete checkpoint" in d["findings"][0]["message"]
    events = _events(out)
    assert [e["event"] for e in events].count("setup") == 1 and events[-1]["event"] == "complete"
    assert json.loads((out / "training_metadata.json").read_text())["out_mode"] == "restart"


def test_resume_after_a_partial_log_line_continues_and_force_starts_afresh(cli, data, tmp_path) -> None:
    """A checkpoint at step 1, stopped at step 2 with half a line in progress.jsonl: without --resume the run is
    refused naming both ways on; --resume continues from step 1; a finished run is refused without --force; --force
    starts again from step 0 (the old run's files gone, a file of the user's kept)."""
    out = tmp_path / "run"
    s = TrainSettings(steps=2, save_steps=1, **FAST)
    with pytest.raises(KeyboardInterrupt):
        S.train_on_base(BASE, str(data), str(out), s, on_event=_stop_at(2, KeyboardInterrupt()))
    with open(out / "progress.jsonl", "a") as f:
        f.write('{"event": "step", "lo')
    line = _one_line(_train(cli, data, out))
    assert "interrupted run (last complete checkpoint: step 1); pass --resume" in line and "--force" in line
    res = _train(cli, data, out, "--resume", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["findings"] == []
    events = _events(out)
    assert [e["step"] for e in events if e["event"] == "resume"] == [1]
    # step 2 was logged before the Ctrl-C; the half line after it is gone; step 2 again from the checkpoint
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 2]
    assert "finished run; pass --force" in _one_line(_train(cli, data, out))
    (out / "mine.txt").write_text("keep")
    res = _train(cli, data, out, "--force", "--save-steps", "0", "--json")
    assert res.exit_code == 0, res.stderr
    assert [e["event"] for e in _events(out)].count("setup") == 1
    assert not (out / "checkpoints").exists() and (out / "mine.txt").read_text() == "keep"
    assert json.loads((out / "training_metadata.json").read_text())["out_mode"] == "fresh"
    assert not [p for p in out.rglob("*") if p.name.startswith(".adapterdoc-")]
    assert os.path.isfile(out / "adapter" / "adapter_model.safetensors")
