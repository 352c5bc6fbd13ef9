"""Crash safety (issue 8): SIGKILL `remap` on its copy path and `merge` at random moments, 50+ times each.

After every kill the target is either the old file or the complete new one (never corrupt), the base and the
input are untouched, and a rerun of the same command finishes the job (temp leftovers are ignored).
``ADAPTERDOC_SLOW_WRITES`` (seconds slept at each write checkpoint) widens the windows in which kills land.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.st.atomic import TEMP_PREFIX
from adapterdoc.st.header import read_header

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

KILLS = int(os.environ.get("ADAPTERDOC_CRASH_KILLS", "50"))


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _sha(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def text_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Ministral3 text adapter: moving it to the VL layout grows the header, so remap takes the copy path."""
    from adapterdoc.ml.tiny import build_tiny
    from adapterdoc.train.lora import lora_config

    torch.manual_seed(0)
    cfg = lora_config("ministral3_text")
    cfg.init_lora_weights = False
    model = peft.get_peft_model(build_tiny("ministral3_text"), cfg)
    folder = tmp_path_factory.mktemp("crash") / "adapter"
    model.save_pretrained(folder)
    return folder


def test_killed_remap_copy_path(text_adapter: Path, tmp_path: Path) -> None:
    from adapterdoc.remap import remap

    expected = tmp_path / "expected"
    shutil.copytree(text_adapter, expected)
    report = remap(expected, to="mistral3_vl", source="ministral3_text")
    assert report.strategy == "copy"
    old, new = _tree(text_adapter), _tree(expected)
    rng = random.Random(0)
    env = {**os.environ, "ADAPTERDOC_SLOW_WRITES": "0.02"}
    outcomes = {"old": 0, "new": 0, "config-first": 0}
    for i in range(KILLS):
        work = tmp_path / f"run{i}"
        shutil.copytree(text_adapter, work)
        cmd = [
            sys.executable,
            "-m",
            "adapterdoc",
            "remap",
            str(work),
            "--to",
            "mistral3_vl",
            "--from",
            "ministral3_text",
        ]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # where each kill lands is set by the child's own progress, not by the clock, so the outcome classes below
        # come up however loaded the machine is: a third at once (before any write), a third while a temp file of
        # the write is on disk, a third once the weights are replaced (or the child is done)
        phase = i % 3
        if phase == 1:
            _wait_for(proc, lambda w=work: any(n.startswith(TEMP_PREFIX) for n in os.listdir(w)))
            time.sleep(rng.uniform(0.0, 0.1))
        elif phase == 2:
            weights_file = work / "adapter_model.safetensors"
            _wait_for(proc, lambda f=weights_file: f.exists() and _sha(f) == new["adapter_model.safetensors"])
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = {k: v for k, v in _tree(work).items() if not k.startswith(TEMP_PREFIX)}
        weights, config = state["adapter_model.safetensors"], state["adapter_config.json"]
        assert weights in (old["adapter_model.safetensors"], new["adapter_model.safetensors"]), (
            f"kill {i}: corrupt"
        )
        assert config in (old["adapter_config.json"], new["adapter_config.json"]), f"kill {i}: corrupt config"
        read_header(work / "adapter_model.safetensors")  # always a valid file
        if weights == new["adapter_model.safetensors"]:
            outcomes["new"] += 1
        elif config == new["adapter_config.json"]:
            outcomes["config-first"] += 1  # config is written first; the rerun below finishes the weights
        else:
            outcomes["old"] += 1
        rerun = subprocess.run(cmd, capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        final = {k: v for k, v in _tree(work).items() if not k.startswith(TEMP_PREFIX)}
        assert final == new, f"kill {i}: the rerun did not finish the job"
        shutil.rmtree(work)
    assert outcomes["old"] and outcomes["new"], outcomes  # the kills really landed before and after the write


def _wait_for(proc: subprocess.Popen[bytes], done: Any, guard: float = 1800.0) -> None:
    """Poll until ``done()`` or the child has exited; ``guard`` only stops a hung child, it sets no outcome."""
    deadline = time.monotonic() + guard
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if done():
                return
        time.sleep(0.002)


def _child_merge(adapter: Path, base: Path, out: Path) -> None:
    pid = os.fork()
    if pid == 0:  # the child: torch and adapterdoc are already imported, so it starts writing at once
        code = 0
        try:
            from adapterdoc.merge import merge

            merge(str(adapter), base=str(base), out=str(out))
        except BaseException:
            code = 1
        os._exit(code)
    return pid  # type: ignore[return-value]


def test_killed_merge(text_adapter: Path, tmp_path: Path) -> None:
    from adapterdoc.merge import merge
    from adapterdoc.ml.tiny import build_tiny

    base = tmp_path / "base"
    build_tiny("ministral3_text").save_pretrained(base, max_shard_size="100KB")  # several shards
    assert len(list(base.glob("*.safetensors"))) > 1
    base_state = _tree(base)
    reference = tmp_path / "reference"
    merge(str(text_adapter), base=str(base), out=str(reference))
    want = _tree(reference)
    os.environ["ADAPTERDOC_SLOW_WRITES"] = "0.01"
    rng = random.Random(1)
    landed = {"absent": 0, "complete": 0}
    try:
        for i in range(KILLS):
            out = tmp_path / f"merged{i}"
            pid: Any = _child_merge(text_adapter, base, out)
            time.sleep(rng.uniform(0.0, 0.25))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            if out.exists():
                assert _tree(out) == want, f"kill {i}: a partial merge became visible"
                landed["complete"] += 1
            else:
                landed["absent"] += 1
            leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]
            if not out.exists():  # the rerun ignores leftovers and finishes
                merge(str(text_adapter), base=str(base), out=str(out))
                assert _tree(out) == want
            for name in leftovers:
                shutil.rmtree(tmp_path / name, ignore_errors=True)
            shutil.rmtree(out)
            assert _tree(base) == base_state, "merge touched the base"
    finally:
        os.environ.pop("ADAPTERDOC_SLOW_WRITES", None)
    assert landed["absent"], landed
