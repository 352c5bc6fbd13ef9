"""The layout registry against real PEFT adapters on every tiny reference model."""

from __future__ import annotations

import re
from typing import Any

import pytest

from adapterdoc.adapter import parse_key
from adapterdoc.layouts import LAYOUTS, STRIP_LANGUAGE_MODEL, detect_layout, exclusion_regex, remap_path

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from adapterdoc.ml.tiny import TINY_LAYOUTS  # noqa: E402


def lora_config(layout: str, **kw: Any) -> Any:
    from adapterdoc.train.lora import lora_config as registry_config

    return registry_config(layout, r=2, **kw)


def adapter_modules(model: Any, layout: str) -> set[str]:
    pm = peft.get_peft_model(model, lora_config(layout))
    keys = peft.get_peft_model_state_dict(pm)
    return {parse_key(k).module for k in keys if parse_key(k).is_lora}


@pytest.mark.parametrize("layout", TINY_LAYOUTS)
def test_detects_every_layout_from_real_peft_keys(layout: str, tiny_model: Any) -> None:
    modules = adapter_modules(tiny_model(layout), layout)
    assert modules
    detection = detect_layout(modules)
    if layout in ("mistral3_vl", "qwen_vl", "ministral3_text"):
        # attention/MLP LoRA on a plain decoder (towers excluded): the keys alone cannot tell Mistral3 from
        # Qwen2.5-VL (or a Qwen3.5 adapter that skipped the Gated-DeltaNet projections), and detection says so
        assert detection.name == "ambiguous" and layout in detection.candidates
        # PEFT's auto_mapping names the class the adapter was trained on: that breaks the tie
        assert detect_layout(modules, hint=[LAYOUTS[layout].model_class]).name == layout
        detection = detect_layout(modules, hint=f"tiny:{layout}")
    assert detection.name == layout, detection
    assert detection.evidence


@pytest.mark.parametrize("layout", [n for n in TINY_LAYOUTS if LAYOUTS[n].towers])
def test_exclusion_keeps_lora_off_towers(layout: str, tiny_model: Any) -> None:
    model = tiny_model(layout)
    pm = peft.get_peft_model(model, lora_config(layout))
    towers = LAYOUTS[layout].towers
    lora_names = [n for n, _ in pm.named_parameters() if "lora_" in n]
    assert lora_names
    assert not [n for n in lora_names if any(f".{t}." in f".{n}" for t in towers)]
    # and the regex really is needed: without it, the towers that hold Linear leaves get LoRA
    bare = peft.get_peft_model(tiny_model(layout), lora_config(layout, exclude=False))
    leaked = [
        n for n, _ in bare.named_parameters() if "lora_" in n and any(f".{t}." in f".{n}" for t in towers)
    ]
    if layout == "mistral3_vl":  # Pixtral uses q_proj..down_proj; Qwen towers name theirs qkv/linear_fc1
        assert leaked


def test_strip_rule_is_the_first_segment_only() -> None:
    assert STRIP_LANGUAGE_MODEL.apply("model.language_model.layers.0.q") == "model.layers.0.q"
    assert STRIP_LANGUAGE_MODEL.apply("language_model.layers.0.q") == "layers.0.q"
    assert STRIP_LANGUAGE_MODEL.apply("a.language_model.b.language_model.c") == "a.b.language_model.c"
    assert STRIP_LANGUAGE_MODEL.apply("model.layers.0.q") == "model.layers.0.q"
    assert STRIP_LANGUAGE_MODEL.apply("model.my_language_model.x") == "model.my_language_model.x"


def test_every_move_has_a_way_back() -> None:
    for name, layout in LAYOUTS.items():
        for target in layout.remaps:
            assert target in LAYOUTS, (name, target)
            assert remap_path(target, name) is not None, f"no way back from {target} to {name}"


def test_remap_path_chains_moves() -> None:
    steps = remap_path("qwen3_omni", "qwen3_moe_text")
    assert steps is not None and [s[0] for s in steps] == ["qwen3_omni_thinker", "qwen3_moe_text"]
    assert remap_path("modernbert", "qwen3_5_vl") is None


def test_exclusion_regex_is_a_peft_fullmatch() -> None:
    rx = exclusion_regex(("visual", "talker"))
    assert re.fullmatch(rx, "model.visual.blocks.0.attn.qkv")
    assert re.fullmatch(rx, "talker.model.layers.0.q_proj")
    assert not re.fullmatch(rx, "model.language_model.layers.0.self_attn.q_proj")
    assert not re.fullmatch(rx, "model.visualizer.q_proj")


def test_qwen3_5_adapter_without_deltanet_targets_is_not_called_ministral() -> None:
    """QA found `target_modules=["q_proj", "v_proj"]` on Qwen3.5 detected as ministral3_text, breaking remap --to."""
    modules = [f"model.layers.{i}.self_attn.{p}" for i in (3,) for p in ("q_proj", "v_proj")]
    d = detect_layout(modules)
    assert d.name == "ambiguous" and {"qwen3_5_text", "ministral3_text"} <= set(d.candidates)
    assert detect_layout(modules, hint=["Qwen3_5ForCausalLM", "whatever"]).name == "qwen3_5_text"
    vl = detect_layout([f"model.language_model.{m.removeprefix('model.')}" for m in modules])
    assert vl.name == "ambiguous" and {"qwen3_5_vl", "mistral3_vl", "qwen_vl"} <= set(vl.candidates)


def test_unknown_and_ambiguous_are_honest() -> None:
    assert detect_layout(["transformer.h.0.attn.c_attn"]).name == "unknown"
    assert detect_layout([]).name == "unknown"
    # attention-only adapters on model.language_model.* could be several VL families: no guess
    d = detect_layout(["model.language_model.layers.0.self_attn.q_proj"])
    assert d.name == "mistral3_vl" or d.name == "ambiguous"
    hinted = detect_layout(
        ["model.language_model.layers.0.self_attn.q_proj"], hint="mistralai/Ministral-3-8B"
    )
    assert hinted.name == "mistral3_vl"
