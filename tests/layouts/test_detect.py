"""Detection over the class of real adapters: every tiny layout's modules under several target choices
(attention only, attention + routed experts fused or per expert, all linears with and without the towers), built
torch-free from the layout's own module tree, and through real PEFT for the MoE families.

QA found the Qwen3.5-MoE VL adapter (attention + fused experts, no Gated DeltaNet / shared expert targeted)
detected as ``qwen3_omni_thinker``: the MoE layouts required their decisive marks, so the Omni thinker, which only
required expert LoRA, was the one layout left and no hint could break a tie that was never there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.layouts import LAYOUTS, detect_layout, tiny_layouts, tower_segment
from adapterdoc.layouts.trees import EXPERTS, LINEAR

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_PROJ = ("gate_proj", "up_proj", "down_proj")


def _variants(name: str) -> dict[str, list[str]]:
    """Module paths (no ``base_model.model.``) a PEFT adapter on the layout's tiny model has, per target choice."""
    lay = LAYOUTS[name]
    assert lay.tiny is not None and lay.tree is not None
    tree = lay.tree(lay.tiny.kwargs())
    linears = [n.name for n in tree.nodes if n.kind == LINEAR and n.name != tree.output_embedding]
    fused = [n.name for n in tree.nodes if n.kind == EXPERTS]
    text = [n for n in linears if tower_segment(n) is None]
    attn = [n for n in text if n.rpartition(".")[2] in _ATTN]
    wrapped = [*fused, *(f"{e}.base_layer" for e in fused)]  # two target_parameters: PEFT nests a wrapper
    per_expert = [f"{e}.{i}.{p}" for e in fused for i in range(4) for p in _PROJ]
    out = {
        "registry": [n for n in text if n.rpartition(".")[2] in lay.lora_leaves] + wrapped,
        "attention": attn,
        "attention+fused": attn + wrapped,
        "attention+per-expert": attn + per_expert,
        "all-linear": text + wrapped,
        "all-linear+towers": linears + wrapped,
    }
    return {k: v for k, v in out.items() if v}


_CASES = [(name, v) for name in tiny_layouts() for v in _variants(name)]


@pytest.mark.parametrize(("layout", "variant"), _CASES, ids=[f"{n}-{v}" for n, v in _CASES])
def test_every_layout_is_detected_as_itself_or_honestly_ambiguous(layout: str, variant: str) -> None:
    modules = _variants(layout)[variant]
    d = detect_layout(modules)
    assert d.evidence
    if d.name != layout:  # never another layout with confidence: only a tie that names this one
        assert d.name == "ambiguous" and layout in d.candidates, (variant, d)
    # PEFT's auto_mapping (the class trained on) and a tiny base's name settle every tie
    for hint in (LAYOUTS[layout].model_class, f"tiny:{layout}"):
        hinted = detect_layout(modules, hint=[hint])
        assert hinted.name == layout, (variant, hint, hinted)
        assert hinted.evidence


def test_qwen3_5_moe_attention_and_experts_is_not_the_omni_thinker() -> None:
    """The reported adapter's shape: attention (on Qwen3.5's full-attention layers only) and fused experts."""
    for layout, other in (("qwen3_5_moe_vl", "qwen3_omni_thinker"), ("qwen3_5_moe_text", "qwen3_moe_text")):
        d = detect_layout(_variants(layout)["attention+fused"])
        assert d.name == layout and other in d.candidates, d
        assert any("no self-attention LoRA" in e for e in d.evidence), d.evidence
        assert any("routed-expert LoRA" in e for e in d.evidence), d.evidence
        # and the other way round: full attention on every expert layer is the thinker / Qwen3-MoE
        back = detect_layout(_variants(other)["attention+fused"])
        assert back.name == other and layout in back.candidates, back
        assert any("full attention" in e for e in back.evidence), back.evidence


def test_a_real_sized_qwen3_5_moe_adapter_is_told_from_the_thinker_by_its_layers() -> None:
    """40 layers, full attention every 4th (Qwen3.5-35B-A3B): attention + per-expert LoRA as vLLM reads it."""
    n, experts = 40, 8
    vl = [f"model.language_model.layers.{i}.self_attn.{p}" for i in range(3, n, 4) for p in _ATTN]
    vl += [
        f"model.language_model.layers.{i}.mlp.experts.{e}.{p}"
        for i in range(n)
        for e in range(experts)
        for p in _PROJ
    ]
    d = detect_layout(vl)
    assert d.name == "qwen3_5_moe_vl", d
    assert any(e.startswith("30 of 40 decoder layers") for e in d.evidence), d.evidence
    # the thinker (48 layers, attention everywhere) with the same targets
    th = [f"model.language_model.layers.{i}.self_attn.{p}" for i in range(48) for p in _ATTN]
    th += [
        f"model.language_model.layers.{i}.mlp.experts.{e}.{p}"
        for i in range(48)
        for e in range(experts)
        for p in _PROJ
    ]
    assert detect_layout(th).name == "qwen3_omni_thinker"
    # attention alone cannot tell the two (nor a dense VL decoder): ambiguous, and the class name settles it
    only = [m for m in vl if ".self_attn." in m]
    amb = detect_layout(only)
    assert amb.name == "ambiguous" and {"qwen3_5_moe_vl", "qwen3_omni_thinker"} <= set(amb.candidates)
    assert detect_layout(only, hint=["Qwen3_5MoeForConditionalGeneration"]).name == "qwen3_5_moe_vl"
    assert detect_layout(only, hint="Qwen/Qwen3.5-35B-A3B").name == "qwen3_5_moe_vl"
    # towers only the thinker has rule Qwen3.5-MoE out
    towers = [*th[:8], "model.audio_tower.layers.0.fc1", "model.visual.merger_list.0.linear_fc1"]
    assert detect_layout(towers).name == "qwen3_omni_thinker"


def _write_adapter(path: Path, modules: list[str], base_class: str) -> Path:
    """A header-true adapter (1×1 tensors: detection reads names only) with PEFT's config fields."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    tensors = {
        f"base_model.model.{m}.lora_{ab}.weight": np.zeros((1, 1), np.float32) for m in modules for ab in "AB"
    }
    save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "r": 1,
        "lora_alpha": 1,
        "target_modules": list(_ATTN),
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        "auto_mapping": {"base_model_class": base_class, "parent_library": "transformers"},
        "base_model_name_or_path": "some/finetune",
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("layout", ["qwen3_5_moe_vl", "qwen3_omni_thinker"])
def test_inspect_shows_the_layout_and_its_evidence(layout: str, tmp_path: Path, cli: Any) -> None:
    path = _write_adapter(tmp_path / "a", _variants(layout)["attention+fused"], LAYOUTS[layout].model_class)
    r = cli("inspect", path, "--json")
    report = json.loads(r.stdout)
    assert report["layout"]["name"] == layout, report["layout"]
    assert report["layout"]["evidence"]
    text = cli("inspect", path).stdout
    assert re.search(rf"^layout {layout}\b", text, re.M) and "routed-expert LoRA" in text, text


@pytest.mark.parametrize(
    "layout", ["qwen3_5_moe_vl", "qwen3_5_moe_text", "qwen3_omni_thinker", "qwen3_moe_text"]
)
def test_real_peft_attention_and_expert_adapters_are_detected(layout: str, tiny_model: Any) -> None:
    """Real PEFT keys (transformers 5's fused experts through ``target_parameters``), Gated DeltaNet and the
    shared expert left out: the keys the reported adapter had."""
    peft = pytest.importorskip("peft")
    from adapterdoc.adapter import parse_key

    config = peft.LoraConfig(
        r=2,
        target_modules=list(_ATTN),
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        exclude_modules=LAYOUTS[layout].exclude_regex,
    )
    pm = peft.get_peft_model(tiny_model(layout), config)
    modules = {parse_key(k).module for k in peft.get_peft_model_state_dict(pm) if parse_key(k).is_lora}
    assert any(".mlp.experts" in m for m in modules)
    d = detect_layout(modules)
    assert d.name == layout, d
