"""`adapterdoc roundtrip` on real PEFT adapters of tiny models; it must say yes to good moves and no to bad ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.layouts import LAYOUTS, Rule

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def vl_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3.5 VL adapter with random (non-zero) lora_B, so output comparisons mean something."""
    from adapterdoc.ml.tiny import build_tiny

    lay = LAYOUTS["qwen3_5_vl"]
    torch.manual_seed(1)
    cfg = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=list(lay.lora_leaves),
        exclude_modules=lay.exclude_regex,
        init_lora_weights=False,
    )
    model = peft.get_peft_model(build_tiny("qwen3_5_vl"), cfg)
    folder = tmp_path_factory.mktemp("rt") / "vl"
    model.save_pretrained(folder)
    return folder


def test_roundtrip_passes_every_trip_and_leaves_the_input_alone(vl_adapter: Path, cli: Any) -> None:
    before = _digest(vl_adapter)
    res = cli("roundtrip", vl_adapter, "--base", "tiny:qwen3_5_vl", "--json")
    assert res.exit_code == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    names = {c["name"].split(":")[0]: c for c in out["checks"]}
    assert {"remap", "format", "reload", "merge", "counterpart"} <= set(names)
    assert all(c["status"] == "pass" for c in out["checks"]), out["checks"]
    assert out["ok"] and out["failed"] == 0
    assert not [f for f in out["findings"] if f["code"] == "AD706"]  # trained-like adapter: comparisons count
    assert _digest(vl_adapter) == before


def test_without_base_only_byte_trips_run(vl_adapter: Path, cli: Any) -> None:
    res = cli("roundtrip", vl_adapter, "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    skipped = [c for c in out["checks"] if c["status"] == "skipped"]
    assert skipped and "no --base" in skipped[0]["detail"]
    assert any(c["name"].startswith("remap:") and c["status"] == "pass" for c in out["checks"])


def test_a_broken_remap_rule_makes_roundtrip_say_no(
    vl_adapter: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the way back now adds one segment too many: the there-and-back bytes cannot match
    monkeypatch.setitem(
        LAYOUTS["qwen3_5_text"].remaps, "qwen3_5_vl", (Rule(r"^model\.", "model.language_model.x."),)
    )
    before = _digest(vl_adapter)
    res = cli("roundtrip", vl_adapter, "--json")
    assert res.exit_code == 1, res.stdout
    out = json.loads(res.stdout)
    assert not out["ok"]
    failed = [c for c in out["checks"] if c["status"] == "fail"]
    assert failed and failed[0]["name"] == "remap:qwen3_5_vl→qwen3_5_text→qwen3_5_vl"
    assert "AD701" in {f["code"] for f in out["findings"]}
    assert _digest(vl_adapter) == before


def test_identity_adapter_is_flagged(tmp_path: Path, cli: Any) -> None:
    from adapterdoc.ml.tiny import build_tiny

    model = peft.get_peft_model(build_tiny("modernbert_mlm"), peft.LoraConfig(r=2, target_modules=["Wqkv"]))
    model.save_pretrained(tmp_path / "zero")
    res = cli("roundtrip", tmp_path / "zero", "--json")
    assert res.exit_code == 0
    assert "AD706" in {f["code"] for f in json.loads(res.stdout)["findings"]}


def test_not_an_adapter_is_exit_3(tmp_path: Path, cli: Any) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, tmp_path / "plain.safetensors")
    res = cli("roundtrip", tmp_path / "plain.safetensors")
    assert res.exit_code == 3 and res.stderr.startswith("adapterdoc: error: ")
