"""Two remaps of one adapter at once: one wins, the other finds nothing to do (or refuses); the file stays valid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from adapterdoc.st.header import read_header


def _vl_adapter(folder: Path, modules: int = 64) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(modules):
        key = f"base_model.model.model.language_model.layers.{i}.self_attn.q_proj"
        tensors[f"{key}.lora_A.weight"] = rng.standard_normal((4, 64)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.standard_normal((64, 4)).astype(np.float32)
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})
    )
    return folder


def test_two_concurrent_remaps(tmp_path: Path) -> None:
    for round_ in range(3):
        adapter = _vl_adapter(tmp_path / f"a{round_}")
        data_before = (adapter / "adapter_model.safetensors").read_bytes()[-4096:]
        env = {**os.environ, "ADAPTERDOC_SLOW_WRITES": "0.3"}  # widen the window in which both are running
        cmd = [sys.executable, "-m", "adapterdoc", "remap", str(adapter), "--vl", "--json"]
        procs = [
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        results = [(p.wait(timeout=1800), p.stdout.read(), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
        codes = sorted(r[0] for r in results)
        assert codes in ([0, 0], [0, 3]), results
        strategies = sorted(json.loads(r[1])["strategy"] for r in results if r[0] == 0)
        if codes == [0, 0]:
            assert strategies == ["in-place", "none"], results  # the second saw the first's result
        header = read_header(adapter / "adapter_model.safetensors")
        assert len(header.tensors) == 128
        assert all(".language_model." not in k for k in header.tensors)
        assert (adapter / "adapter_model.safetensors").read_bytes()[-4096:] == data_before
