"""Expert layout and coverage (adapterdoc.adapter.expert_picture, inspect's ``experts`` object, AD240-AD243, vLLM's AD418/AD419).

The first half reads the old-stack fixtures (real per-expert adapters written by transformers 4.57 + PEFT 0.17) and
needs no torch; the second half has real PEFT 0.21 write fused adapters on tiny transformers-5 MoE models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.adapter import AdapterConfig, parse_key
from adapterdoc.adapter.expert_picture import classify, expert_picture
from adapterdoc.inspection import inspect

ROOT = Path(__file__).resolve().parents[2]
OLD = ROOT / "fixtures" / "old_stack"
QWEN, MIXTRAL = OLD / "qwen3_moe", OLD / "mixtral"


def _shapes(folder: Path) -> dict[str, Any]:
    from adapterdoc.st.header import read_header

    return {k: t.shape for k, t in read_header(str(folder / "adapter_model.safetensors")).tensors.items()}


def _codes(report: Any) -> dict[str, str]:
    return {f.code: f.severity for f in report.findings}


# ------------------------------------------------------------------------------------- old-stack fixtures


def test_per_expert_adapters_from_the_old_stack() -> None:
    for folder, block in ((QWEN, "mlp"), (MIXTRAL, "block_sparse_moe")):
        pic = expert_picture(_shapes(folder / "adapter_experts"))
        assert (pic.layout, pic.experts, pic.experts_from) == ("per-expert", 4, "keys")
        assert [b.path for b in pic.blocks] == [f"model.layers.{i}.{block}.experts" for i in (0, 1)]
        assert {p: c["experts"] for p, c in pic.coverage().items()} == {"gate": 8, "up": 8, "down": 8}
        assert not pic.one_sided and not pic.partial and not pic.shared
    k = classify(
        parse_key("base_model.model.model.layers.1.block_sparse_moe.experts.3.w3.lora_B.weight"), (16, 2)
    )
    assert k is not None and (k.form, k.projection, k.expert, k.leaf) == ("per-expert", "up", 3, "w3")


def test_inspect_reports_the_expert_layout_and_its_findings() -> None:
    r = inspect(QWEN / "adapter_experts")
    body = r.to_dict()
    assert body["experts"]["layout"] == "per-expert" and body["experts"]["blocks"] == 2
    assert body["experts"]["coverage"]["gate"] == {"blocks": 2, "experts": 8, "of": 8}
    assert r.layout.name == "qwen3_moe_text"  # per-expert keys now detect the Qwen3-MoE layout
    assert not any(f.code.startswith("AD24") for f in r.findings)

    r = inspect(QWEN / "adapter_attention")  # the axolotl#3514 case: an MoE adapter with no expert LoRA
    assert _codes(r)["AD240"] == "warning"
    assert r.to_dict()["experts"]["layout"] is None

    r = inspect(QWEN / "adapter_one_sided")
    assert _codes(r)["AD241"] == "warning"
    f = next(f for f in r.findings if f.code == "AD241")
    assert "gate (gate_proj) without up" in f.message and "--experts fused" in (f.hint or "")
    assert r.to_dict()["experts"]["one_sided"][0] == {"block": "model.layers.0.mlp.experts", "only": "gate"}


def test_partial_coverage_and_non_moe_adapters(tmp_path: Path) -> None:
    shapes = {k: v for k, v in _shapes(QWEN / "adapter_experts").items() if ".experts.3.up_proj." not in k}
    pic = expert_picture(shapes, num_experts=4)
    assert [b.missing() for b in pic.partial] == [{"up": [3]}, {"up": [3]}]
    from adapterdoc.facts import expert_findings

    assert [f.code for f in expert_findings(pic, "x")] == ["AD242"]
    # a dense adapter has no experts object at all (the JSON of non-MoE inputs is unchanged)
    dense = expert_picture({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": (2, 8)})
    assert dense.layout is None and not dense.blocks


def test_names_parsed_once_give_the_same_picture() -> None:
    """``header_facts`` hands ``expert_picture`` the names it parsed; the picture is the one a fresh parse gives,
    and a name without ``.experts`` (no expert form lacks it) is rejected before any regex."""
    for folder in (QWEN / "adapter_experts", QWEN / "adapter_one_sided", MIXTRAL / "adapter_experts"):
        shapes = _shapes(folder)
        keys = [parse_key(k) for k in shapes]
        assert expert_picture(list(shapes.items()), keys=keys) == expert_picture(shapes)
    attn = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert classify(parse_key(attn), (2, 8)) is None


def test_experts_module_needs_no_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from adapterdoc.inspection import inspect\n"
        f"r = inspect({str(QWEN / 'adapter_one_sided')!r})\n"
        "print(r.to_dict()['experts']['layout'], sorted(f.code for f in r.findings))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split()[0] == "per-expert" and "AD241" in out.stdout


# ------------------------------------------------------------------------------- verify on the old stack


ML = pytest.mark.ml


def _verify(adapter: Path, base: str, profile: str = "peft") -> Any:
    pytest.importorskip("peft.utils.transformers_weight_conversion")
    from adapterdoc.verify import VerifyOptions, verify

    return verify([str(adapter)], base, VerifyOptions(profile=profile)).adapters[0]


@ML
def test_verify_per_expert_on_a_fused_base_passes_with_the_conversion_named() -> None:
    rep = _verify(QWEN / "adapter_experts", str(QWEN / "base"))
    assert rep.ok and not rep.missing and not rep.unexpected
    f = next(f for f in rep.findings if f.code == "AD243")
    assert f.severity == "info" and "convert_peft_adapter_state_dict_for_transformers" in f.message
    assert "24 per-expert LoRA module(s) in 2 MoE block(s)" in f.message


@ML
def test_verify_one_sided_fails_with_the_remap_fix() -> None:
    rep = _verify(QWEN / "adapter_one_sided", str(QWEN / "base"))
    assert not rep.ok
    errors = {f.code: f for f in rep.findings if f.severity == "error"}
    assert {"AD226", "AD241"} <= set(errors)
    assert f"adapterdoc remap {QWEN / 'adapter_one_sided'} --experts fused" in (errors["AD241"].hint or "")


@ML
def test_vllm_reads_per_expert_on_qwen3_moe() -> None:
    rep = _verify(QWEN / "adapter_experts", str(QWEN / "base"), "vllm")
    assert not {"AD418", "AD419"} & {f.code for f in rep.findings}


# ------------------------------------------------------------------------ PEFT-written fused adapters


def _fused_adapter(tiny_model: Any, layout: str, out: Path, targets: list[str]) -> Path:
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model

    model = tiny_model(layout)
    cfg = LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"], target_parameters=targets, lora_dropout=0.0
    )
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_()
    pm.save_pretrained(str(out))
    return out


@ML
@pytest.mark.parametrize("layout", ["qwen3_moe_text", "qwen3_5_moe_text"])
def test_peft_fused_adapter_is_read_as_fused(tiny_model: Any, layout: str, tmp_path: Path) -> None:
    from adapterdoc.layouts import get_layout

    folder = _fused_adapter(tiny_model, layout, tmp_path / "a", ["gate_up_proj", "down_proj"])
    r = inspect(folder)
    ex = r.to_dict()["experts"]
    assert json.loads((folder / "adapter_config.json").read_text())["target_parameters"]
    assert (ex["layout"], ex["experts"], ex["experts_from"], ex["blocks"]) == ("fused", 4, "rank", 4)
    assert set(ex["coverage"]) == {"gate_up", "down"}
    pic = expert_picture(_shapes(folder), config=AdapterConfig.load(folder / "adapter_config.json"))
    b = pic.blocks[0]
    assert b.fused_rank == {"gate_up": 2, "down": 2}
    assert {k.leaf: k.projection for k in b.keys} == {"base_layer": "gate_up", "experts": "down"}
    assert not {"AD240", "AD241", "AD242"} & set(_codes(r))

    # vLLM: Qwen3.5-MoE is a 3-D MoE LoRA class (reads fused), Qwen3-MoE is not (reads per-expert)
    base = f"tiny:{layout}"
    rep = _verify(folder, base, "vllm")
    codes = {f.code: f for f in rep.findings}
    if get_layout(layout).experts.served_fused:
        assert "AD418" not in codes
    else:
        assert codes["AD418"].severity == "error"
        assert "base_layer" in codes["AD418"].message
        assert codes["AD418"].hint == f"adapterdoc remap {folder} --experts per-expert --out DIR"
    assert _verify(folder, base).ok  # PEFT itself loads its own fused layout


@ML
def test_lone_fused_parameter(tiny_model: Any, tmp_path: Path) -> None:
    folder = _fused_adapter(tiny_model, "qwen3_5_moe_vl", tmp_path / "a", ["down_proj"])
    pic = expert_picture(_shapes(folder), config=AdapterConfig.load(folder / "adapter_config.json"))
    assert pic.layout == "fused" and {p for b in pic.routed for p in b.projections} == {"down"}
    rep = _verify(folder, "tiny:qwen3_5_moe_vl", "vllm")  # a 3-D MoE LoRA class: half a fused pair
    assert {f.code: f.severity for f in rep.findings}.get("AD419") == "error"
    # vLLM 0.33.0 serves the text class Qwen3_5MoeForCausalLM with the 2-D wrapper: fused LoRA is refused at load
    text = _fused_adapter(tiny_model, "qwen3_5_moe_text", tmp_path / "t", ["down_proj"])
    codes = {f.code: f.severity for f in _verify(text, "tiny:qwen3_5_moe_text", "vllm").findings}
    assert codes.get("AD418") == "error" and "AD419" not in codes


@ML
def test_per_expert_on_qwen3_5_moe_fails_and_no_conversion_is_claimed(
    tiny_model: Any, tmp_path: Path
) -> None:
    """PEFT 0.21 fuses per-expert keys at load on Qwen3.5-MoE's text class only when the config still names the fused
    ``target_parameters`` (it rewrites keys, not the config): ``remap --experts per-expert`` keeps them there, so its
    output verifies clean (PEFT's outputs: tests/remap/test_remap_for_vllm_moe.py); the same keys under a config
    without them match nothing and would be dropped (AD221, a failure)."""
    import json

    from adapterdoc.remap import remap

    fused = _fused_adapter(tiny_model, "qwen3_5_moe_text", tmp_path / "fused", ["gate_up_proj", "down_proj"])
    remap(str(fused), experts="per-expert", out=str(tmp_path / "per-expert"))
    assert _verify(tmp_path / "per-expert", "tiny:qwen3_5_moe_text").ok
    cfg_path = tmp_path / "per-expert" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg.get("target_parameters")
    cfg["target_parameters"] = None
    cfg["rank_pattern"], cfg["alpha_pattern"] = {}, {}
    cfg_path.write_text(json.dumps(cfg))
    rep = _verify(tmp_path / "per-expert", "tiny:qwen3_5_moe_text")
    codes = {f.code for f in rep.findings}
    assert not rep.ok and "AD221" in codes
    assert any(".mlp.experts." in k for k in rep.unexpected)
    # the same keys on Qwen3-MoE, which PEFT converts, pass with the conversion named
    fused = _fused_adapter(tiny_model, "qwen3_moe_text", tmp_path / "fused3", ["gate_up_proj", "down_proj"])
    remap(str(fused), experts="per-expert", out=str(tmp_path / "per-expert3"))
    rep = _verify(tmp_path / "per-expert3", "tiny:qwen3_moe_text")
    assert rep.ok and "AD243" in {f.code for f in rep.findings}, [f.message for f in rep.findings]
