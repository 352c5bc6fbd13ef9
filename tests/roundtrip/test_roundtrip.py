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
    assert names["experts"]["status"] == "skipped"  # a dense adapter: no expert moves
    assert all(c["status"] == "pass" for c in out["checks"] if c["name"] != "experts"), out["checks"]
    assert out["ok"] and out["failed"] == 0
    assert not [f for f in out["findings"] if f["code"] == "AD706"]  # trained-like adapter: comparisons count
    assert _digest(vl_adapter) == before


def test_without_base_only_byte_trips_run(vl_adapter: Path, cli: Any) -> None:
    res = cli("roundtrip", vl_adapter, "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    skipped = [c for c in out["checks"] if c["status"] == "skipped"]
    assert skipped and "no --base" in skipped[-1]["detail"]
    experts = next(c for c in out["checks"] if c["name"] == "experts")  # a dense adapter: nothing to move
    assert experts["status"] == "skipped" and "no routed expert carries LoRA" in experts["detail"]
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


OLD_STACK = Path(__file__).resolve().parents[2] / "fixtures" / "old_stack"


def test_a_per_expert_adapter_of_the_old_stack_goes_fused_and_back(cli: Any) -> None:
    """transformers 4.57 + peft 0.17 wrote it per expert; PEFT 0.21 loads it fused and saves it fused, tensor for
    tensor as ``remap --experts fused``; both spellings give the original's logits on the saved base."""
    ad, base = OLD_STACK / "qwen3_moe" / "adapter_experts", OLD_STACK / "qwen3_moe" / "base"
    before = _digest(ad)
    res = cli("roundtrip", ad, "--base", base, "--json")
    assert res.exit_code == 0, res.stdout + res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    trip = checks["experts:per-expert→fused→per-expert"]
    assert trip["status"] == "pass" and "64 names identical, 32 tensors byte-identical" in trip["detail"]
    assert "32 gate/up tensors come back with twice the rank" in trip["detail"]
    outs = checks["experts:outputs per-expert→fused→per-expert"]
    assert outs["status"] == "pass" and "as fused max |Δ| 0" in outs["detail"], outs
    assert "as remap --experts fused" in checks["reload:load→save→load"]["detail"]
    assert _digest(ad) == before


def test_a_broken_expert_move_makes_roundtrip_say_no(
    tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The way back to per-expert scales one expert's down_proj lora_B: the names and shapes still match, the
    bytes of a tensor the move keeps exactly do not (AD707)."""
    from safetensors.torch import load_file, save_file

    import adapterdoc.remap as remap_pkg

    real = remap_pkg.remap

    def scaled_back(spec: Any, **kw: Any) -> Any:
        rep = real(spec, **kw)
        if kw.get("experts") == "per-expert":
            path = Path(kw["out"]) / "adapter_model.safetensors"
            t = load_file(path)
            k = next(k for k in t if ".experts.1.down_proj.lora_B" in k)
            t[k] = t[k] * 2
            save_file(t, path, metadata={"format": "pt"})
        return rep

    monkeypatch.setattr(remap_pkg, "remap", scaled_back)
    res = cli("roundtrip", OLD_STACK / "qwen3_moe" / "adapter_experts", "--json")
    assert res.exit_code == 1, res.stdout
    out = json.loads(res.stdout)
    (bad,) = [c for c in out["checks"] if c["status"] == "fail"]
    assert bad["name"] == "experts" and "experts.1.down_proj.lora_B" in bad["detail"], bad
    assert "AD707" in {f["code"] for f in out["findings"]}
