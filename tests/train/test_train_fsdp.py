"""`adapterdoc train` under ``accelerate launch --use_fsdp --fsdp_version 2`` on two CPU processes (gloo): the loop
shards with ``fully_shard`` itself (accelerate runs CPU processes data-parallel whatever the config says), and the
adapter, a checkpoint and a resumed run equal one process's within 1e-5."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from safetensors.torch import load_file  # noqa: E402

from adapterdoc.fit import session as S  # noqa: E402
from adapterdoc.train import runtime  # noqa: E402
from adapterdoc.train.settings import TrainSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "fixtures" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _fsdp(*args: str) -> subprocess.CompletedProcess[str]:
    """Two processes under accelerate's FSDP2 settings; the launcher is the running interpreter's accelerate."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--fsdp_version", "2"]
    launcher += [
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    return subprocess.run(
        [*launcher, "-m", "adapterdoc", "train", *args], capture_output=True, text=True, env=env, timeout=900
    )


def _close(a: Path, b: Path) -> None:
    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys() and x
    for k in x:
        assert torch.allclose(x[k], y[k], atol=1e-5, rtol=0), (k, float((x[k] - y[k]).abs().max()))


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_equals_one_process_and_resumes(tmp_path) -> None:
    root = tmp_path / "fx"
    base = str(_load("make_families").make(root, ["llama"])["llama"])
    data = str(_load("make_models").write_data(root / "data")["prompt_completion"])
    common = [
        "--base",
        base,
        "--data",
        data,
        "--lr",
        "5e-3",
        "--save-steps",
        "2",
        "--batch-size",
        "2",
        "--json",
    ]
    two = tmp_path / "two"
    proc = _fsdp(*common, "--steps", "2", "--out", str(two))
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)
    assert d["num_processes"] == 2 and d["verify"]["ok"]
    events = [json.loads(x) for x in (two / "progress.jsonl").read_text().splitlines()]
    assert events[0]["sharding"] == "fully_shard" and [e["event"] for e in events].count("save_done") == 1
    sums = json.loads((two / "training_metadata.json").read_text())["replica_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]
    proc = _fsdp(
        *common, "--steps", "4", "--out", str(two), "--resume"
    )  # the sharded optimizer state comes back
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [
        e["step"]
        for e in map(json.loads, (two / "progress.jsonl").read_text().splitlines())
        if e["event"] == "resume"
    ] == [2]

    with runtime.torch_threads(1):
        s = TrainSettings(steps=4, batch_size=4, lr=5e-3, save_steps=2, cpu=True)
        one = S.train_on_base(base, data, str(tmp_path / "one"), s)
    assert one.num_processes == 1
    _close(tmp_path / "one" / "checkpoints" / "step-000002" / "trainable.safetensors",
           two / "checkpoints" / "step-000002" / "trainable.safetensors")  # fmt: skip
    _close(
        tmp_path / "one" / "adapter" / "adapter_model.safetensors",
        two / "adapter" / "adapter_model.safetensors",
    )
