"""Nothing runs that was not asked for: .bin files only through torch.load(weights_only=True)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


class _Payload:
    """Unpickling this calls os.system(...) — which must never happen."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _malicious_adapter(folder: Path, marker: Path) -> Path:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]})
    )
    with open(folder / "adapter_model.bin", "wb") as f:
        pickle.dump({"base_model.model.q_proj.lora_A.weight": _Payload(marker)}, f)
    return folder


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path, cli: Any) -> None:
    marker = tmp_path / "PWNED"
    adapter = _malicious_adapter(tmp_path / "evil", marker)
    before = (adapter / "adapter_model.bin").read_bytes()
    for args in (
        ["inspect", adapter],
        ["inspect", adapter / "adapter_model.bin"],
        ["remap", adapter, "--vl"],
    ):
        res = cli(*args)
        assert res.exit_code == 3, (args, res.stdout, res.stderr)
        assert res.stderr.startswith("adapterdoc: error: ") and res.stderr.count("\n") == 1
        assert "weights_only" in res.stderr
    assert not marker.exists()
    assert (adapter / "adapter_model.bin").read_bytes() == before


def test_malicious_pickle_in_a_subprocess(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    adapter = _malicious_adapter(tmp_path / "evil", marker)
    proc = subprocess.run(
        [sys.executable, "-m", "adapterdoc", "inspect", str(adapter)], capture_output=True, text=True
    )
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_plain_bin_adapter_is_read(tmp_path: Path, cli: Any) -> None:
    folder = tmp_path / "ok"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]})
    )
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    torch.save(
        {f"{key}.lora_A.weight": torch.ones(2, 8), f"{key}.lora_B.weight": torch.ones(8, 2)},
        folder / "adapter_model.bin",
    )
    res = cli("inspect", folder, "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["weights_format"] == "bin" and out["tensors"] == 2
    assert "AD103" in {f["code"] for f in out["findings"]}


def test_no_trust_remote_code_anywhere() -> None:
    root = Path(__file__).resolve().parents[2] / "adapterdoc"
    offenders = [p for p in root.rglob("*.py") if "trust_remote_code=True" in p.read_text()]
    assert not offenders
