"""The registry's torch-free ModernBERT trees equal PEFT's on the meta device, with LoRA configs over the encoders'
own leaves (``Wqkv`` / ``Wo`` / ``Wi``, the MLM head); and the encoder and Qwen2.5-VL specifics, by name.

EmbeddingGemma 2 and Qwen2.5-VL run in ``test_expected_keys.py``'s shared differential test (REGISTRY_LAYOUTS). The
ModernBERT layouts run here: that file's tiny-reference test targets decoder leaves (``q_proj`` ...), which
ModernBERT has none of, so PEFT finds no target there and the registry (rightly) declines."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapterdoc.adapter import AdapterConfig
from adapterdoc.layouts.trees import Unmodeled, build_tree
from adapterdoc.verify.expected import registry_adapter
from tests.verify.encoder_configs import encoder_base_configs, encoder_lora_configs
from tests.verify.test_expected_keys import FAST, SLOW, _write_base, check_equal

LAYOUTS = ["modernbert", "modernbert_mlm"]


@st.composite
def cases(d: st.DrawFn, layout: str) -> tuple[Any, dict[str, Any], int]:
    cfg = d(encoder_base_configs(layout))
    _spec, raw = _write_base(cfg)
    return cfg, d(encoder_lora_configs(build_tree(raw).names)), d(st.integers(0, 10_000))


def _run(layout: str, how: Any) -> None:
    outcomes: list[str] = []

    @how
    @given(cases(layout))
    def run(case: tuple[Any, dict[str, Any], int]) -> None:
        outcomes.append(check_equal(*case))

    run()
    assert outcomes.count("declined") <= 0.7 * len(outcomes), outcomes
    assert "keys-declined" not in outcomes  # no load-time conversion for these model types


@pytest.mark.parametrize("layout", LAYOUTS)
def test_encoder_registry_equals_meta_device(layout: str) -> None:
    _run(layout, FAST)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_encoder_registry_equals_meta_device_slow(layout: str) -> None:
    _run(layout, SLOW)


def _tiny(layout: str) -> Any:
    from adapterdoc.ml.tiny import model_class, tiny_config

    cfg = tiny_config(layout)
    cfg.architectures = [model_class(layout).__name__]
    return cfg


@pytest.mark.parametrize("layout", ["modernbert", "modernbert_mlm"])
def test_modernbert_tiny_configs_are_the_registrys(layout: str) -> None:
    """Wqkv / Wo / Wi, all-linear (the MLM's tied ``decoder`` left out, ``head.dense`` in) and a rank pattern."""
    cfg = _tiny(layout)
    for lora in (
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["Wqkv", "Wo", "Wi"]},
        {"peft_type": "LORA", "r": 2, "target_modules": "all-linear", "task_type": "FEATURE_EXTRACTION"},
        {"peft_type": "LORA", "r": 2, "target_modules": ["Wqkv"], "rank_pattern": {"layers.1.attn.Wqkv": 3}},
    ):
        assert check_equal(cfg, lora) == "decided"
    _, raw = _write_base(cfg)
    reg = registry_adapter(
        build_tree(raw), AdapterConfig({"peft_type": "LORA", "target_modules": "all-linear"})
    )
    heads = [m for m in reg.injected_modules if not m.startswith(("model.", "layers."))]
    assert heads == (["head.dense"] if layout == "modernbert_mlm" else [])


def test_qwen_vl_legacy_keys_are_unexpected_not_renamed() -> None:
    """transformers 5.24 has no load-time conversion for qwen2_5_vl: pre-4.52 keys are unexpected, all of them,
    and the registry says so itself (the meta device agrees: ``check_equal`` on the renamed keys)."""
    from adapterdoc.ml import meta as M

    cfg = _tiny("qwen_vl")
    lora = {"peft_type": "LORA", "r": 2, "target_modules": ["q_proj", "qkv"]}
    spec, raw = _write_base(cfg)
    tree = build_tree(raw)
    assert not tree.load_conversion
    reg = registry_adapter(tree, AdapterConfig(lora))
    legacy = {
        k.replace("model.language_model.", "model.").replace("model.visual.", "visual."): s
        for k, s in reg.expected.items()
    }
    meta = M.build_meta_adapter(spec, M.lora_config_from_raw(lora), config=M.load_config(spec))
    got = registry_adapter(tree, AdapterConfig(lora), legacy).match(legacy)
    assert got == meta.match(legacy)
    assert got.loaded == 0 and sorted(got.unexpected) == sorted(legacy)


@pytest.mark.parametrize(
    ("layout", "change", "why"),
    [
        ("modernbert", {"hidden_activation": "xielu"}, "not modelled"),
        ("modernbert_mlm", {"some_new_field": 1}, "does not model"),
        ("modernbert", {"num_attention_heads": 3}, "not a multiple"),
        ("embeddinggemma2_text", {"per_layer_config": {"0": {"intermediate_size": 8}}}, "does not model"),
        (
            "embeddinggemma2_text",
            {"per_layer_config": {"0": {"head_dim": 8}, "1": {"head_dim": 4}}},
            "differs",
        ),
        ("embeddinggemma2", {"vision_config": {"model_type": "gemma4_vision"}}, "Gemma 4 towers"),
        # a flat config is modelled (its text fields are moved into text_config); an unread top field is not
        ("qwen_vl", {"text_config": None, "some_future_field": 1}, "does not model"),
        (
            "qwen_vl",
            {"text_config": None, "num_hidden_layers": 2, "layer_types": ["chunked"] * 2},
            "layer_types",
        ),
        ("qwen_vl", {"architectures": ["Qwen2_5_VLModel"]}, "no module tree"),
    ],
)
def test_the_registry_declines_what_it_does_not_model(layout: str, change: dict[str, Any], why: str) -> None:
    _, raw = _write_base(_tiny(layout))
    raw.update(change)
    if layout == "embeddinggemma2_text" and "per_layer_config" in change:
        raw["layer_types"] = ["full_attention", "full_attention"]
    with pytest.raises(Unmodeled, match=why):
        build_tree(raw)
