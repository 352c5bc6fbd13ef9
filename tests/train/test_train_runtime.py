"""The process around a run: its process group is destroyed, and its threads joined, before the interpreter's
own teardown (issue 29)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]

# atexit runs its handlers last-registered first: the probe is registered before the accelerator, so it sees what
# the run's own handler left behind. The group is a real gloo group (world 1, a file rendezvous).
PROBE = """
import atexit, os, sys
import torch, torch.distributed as dist
threads = lambda: len(os.listdir("/proc/self/task"))
atexit.register(lambda: print("at exit:", dist.is_initialized(), threads() - before, flush=True))
from adapterdoc.train.runtime import accelerator_for
from adapterdoc.train.settings import TrainSettings
accelerator_for(TrainSettings(cpu=True, grad_accum=1))
torch.ones(1).add_(1)
before = threads()
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t)
print("with the group:", threads() - before, flush=True)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc (Linux)")
def test_the_group_is_destroyed_and_its_threads_joined_before_teardown(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "rendezvous")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    started = int(lines[0].split()[-1])
    assert started >= 1  # gloo's worker threads and its TCP loop: alive while the group is
    assert lines[-1] == "at exit: False 0"  # destroyed by the run's handler, every gloo thread joined
