"""The probe's vLLM and SGLang requests, validated by the engines' own request models in their oracle environments
(neither engine serves on this CPU): what each engine reads from the request is what the probe means to ask."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.probe.canaries import Canary, Position
from adapterdoc.probe.conventions import CONVENTIONS, Ask

pytestmark = pytest.mark.oracle
DRIVER = Path(__file__).with_name("request_models_driver.py")
CANARY = Canary("a b c", [1, 5, 6, 7], [Position(2, 6, [-1.0, -2.0])])


def _read(python: Path, *args: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = subprocess.run(
        [str(python), str(DRIVER), *args],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_vllm_reads_the_adapter_name_and_prompt_logprobs(oracle_env: Any) -> None:
    body = CONVENTIONS["vllm"].build(Ask("my-adapter", extra={"seed": 0}), CANARY)
    (read,) = _read(oracle_env("vllm"), "vllm", bodies=[body])
    assert read == {"model": "my-adapter", "prompt": [1, 5, 6, 7], "prompt_logprobs": 1}


def test_sglang_resolves_the_adapter_of_each_convention(oracle_env: Any) -> None:
    asks = [Ask("my-adapter", "base"), Ask("base:my-adapter"), Ask("my-adapter")]
    bodies = [CONVENTIONS["sglang"].build(a, CANARY) for a in asks]
    rows = _read(oracle_env("sglang"), "sglang", "base", bodies=bodies)
    assert [r["lora_path"] for r in rows] == ["my-adapter", "my-adapter", None]  # the last: the base (AD922)
    assert {r["logprob_start_len"] for r in rows} == {0}  # echo + logprobs: the prompt's logprobs
    assert rows[0]["prompt"] == [1, 5, 6, 7]


@pytest.mark.ml
def test_the_gpu_scripts_server_commands_parse_in_each_engine(oracle_env: Any, tmp_path: Path) -> None:
    """``scripts/gpu_probe.py --dry-run`` builds its base, adapters and canaries; the ``vllm serve`` and
    ``sglang.launch_server`` command lines it would run are read by each engine's own argument parser (and vLLM's
    serve-args validation) as meant: LoRA on, the rank, both adapters under the names the probe's cases send."""
    import sys

    from adapterdoc.probe.canaries import load

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, str(root / "scripts" / "gpu_probe.py"), "--work", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    dry = json.loads(r.stdout.splitlines()[-1])
    assert load(dry["files"]["canaries-rslora"]).rank == 8
    expected = {"tuned": dry["files"]["tuned"], "rslora": dry["files"]["rslora"]}
    driver = Path(__file__).with_name("gpu_script_driver.py")
    for engine, env in (("vllm", {"VLLM_TARGET_DEVICE": "cpu"}), ("sglang", {})):
        read = subprocess.run(
            [str(oracle_env(engine)), str(driver), engine],
            input=json.dumps(dry[engine]),
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **env},
        )
        assert read.returncode == 0, read.stderr[-3000:]
        got = json.loads(read.stdout.splitlines()[-1])
        assert got["model"] == dry["files"]["base"] and got["enable_lora"] is True, got
        assert got["max_lora_rank"] == 8 and got["loras"] == expected, got
