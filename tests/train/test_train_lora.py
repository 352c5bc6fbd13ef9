"""LoRA targeting per layout from the registry, the tower-leak check, and adapter-state extraction."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from adapterdoc.layouts import get_layout  # noqa: E402
from adapterdoc.train import lora as L  # noqa: E402
from adapterdoc.train.models import build_base  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from adapterdoc.train.runtime import torch_threads

    with torch_threads(1):
        yield


def _lora_modules(model) -> list[str]:
    return sorted({n.split(".lora_A.")[0] for n, _ in model.named_parameters() if ".lora_A." in n})


def test_config_follows_the_registry() -> None:
    cfg = L.lora_config("qwen3_5_moe_vl", r=4)
    assert cfg.lora_alpha == 8 and cfg.lora_dropout == 0.0
    assert set(cfg.target_modules) == set(get_layout("qwen3_5_moe_vl").lora_leaves)
    assert set(cfg.target_parameters) == {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}
    assert cfg.exclude_modules == get_layout("qwen3_5_moe_vl").exclude_regex
    assert L.lora_config("mistral3_vl", r=4, alpha=3).lora_alpha == 3
    assert L.lora_config("mistral3_vl", dropout=0.1).lora_dropout == 0.1
    with pytest.raises(L.AdapterdocError, match="refuses dropout"):
        L.lora_config("qwen3_omni_thinker", dropout=0.05)


def test_qwen3_5_targets_deltanet_projections_but_not_the_narrow_gates(tiny_model) -> None:
    model = L.inject(tiny_model("qwen3_5_vl"), "qwen3_5_vl", r=2)
    mods = _lora_modules(model)
    leaves = {m.rsplit(".", 1)[1] for m in mods}
    assert {"in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "gate_proj"} <= leaves
    assert not leaves & {"in_proj_a", "in_proj_b"}
    assert all(".language_model." in m for m in mods)


def test_fused_experts_get_lora_through_target_parameters(tiny_model) -> None:
    model = L.inject(tiny_model("qwen3_5_moe_vl"), "qwen3_5_moe_vl", r=2)
    mods = _lora_modules(model)
    experts = [m for m in mods if re.search(r"\.mlp\.experts(\.base_layer)?$", m)]
    assert len(experts) == 2 * 4  # gate_up (inner wrapper) and down (outer) in each of 4 layers
    shared = [m for m in mods if ".shared_expert." in m]
    assert shared, "the shared expert's Linear layers are targeted by name"
    a = dict(model.named_parameters())[experts[0] + ".lora_A.default.weight"]
    assert a.shape[0] == 2 * 4  # r x experts


def test_modernbert_targets_its_own_leaf_names(tiny_model) -> None:
    model = L.inject(tiny_model("modernbert_mlm"), "modernbert_mlm", r=2)
    leaves = {m.rsplit(".", 1)[1] for m in _lora_modules(model)}
    assert leaves == {"Wqkv", "Wo", "Wi"}


@pytest.mark.parametrize("layout", ["mistral3_vl", "qwen3_omni_thinker", "qwen3_5_vl"])
def test_towers_are_excluded_and_a_missing_exclusion_fails_loudly(tiny_model, layout: str) -> None:
    model = L.inject(tiny_model(layout), layout, r=2)
    assert not L.trainable_tower_parameters(model, layout)
    assert all(L.tower_segments(get_layout(layout)).isdisjoint(m.split(".")) for m in _lora_modules(model))
    leaky = L.lora_config(layout, r=2, exclude=False)
    leaky.target_modules = {*leaky.target_modules, "qkv", "proj", "linear_fc1"}  # tower leaf names too
    with pytest.raises(L.TowerLeakError, match="tower parameter"):
        L.inject(tiny_model(layout), layout, config=leaky)


def test_adapter_state_strips_wrappers_and_keeps_only_lora() -> None:
    t = torch.ones(2, 2)
    state = {
        "module.base_model.model.thinker.model.layers.0.q_proj.lora_A.default.weight": t,
        "module.base_model.model.thinker.model.layers.0.q_proj.base_layer.weight": t,
        "module.module.base_model.model.thinker.lm_head.weight": t,
    }
    out = L.adapter_state(state, unwrap_forward=True)
    assert list(out) == ["base_model.model.model.layers.0.q_proj.lora_A.default.weight"]
    assert out[next(iter(out))] is not t  # a CPU copy, not the live parameter
    kept = L.adapter_state({"thinker.model.x.lora_B.default.weight": t}, unwrap_forward=True)
    assert list(kept) == ["model.x.lora_B.default.weight"]
    assert list(L.adapter_state({"_orig_mod.a.lora_A.default.weight": t})) == ["a.lora_A.default.weight"]


def test_adapter_state_refuses_empty_tensors_and_empty_states() -> None:
    with pytest.raises(L.EmptyAdapterStateError, match="empty"):
        L.adapter_state({"base_model.model.a.lora_A.default.weight": torch.empty(0)})
    with pytest.raises(L.EmptyAdapterStateError, match="none of the 1 state entries"):
        L.adapter_state({"base_model.model.a.weight": torch.ones(1)})


def test_thinker_adapter_saved_from_the_omni_wrapper_loads_on_the_thinker(tmp_path) -> None:
    from peft import PeftModel

    wrapper = L.inject(build_base("qwen3_omni"), "qwen3_omni", r=2, seed=1)
    with torch.no_grad():
        for n, p in wrapper.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.05)
    state = L.adapter_state(L.trainable_state(wrapper))
    renamed = L.adapter_state(state, unwrap_forward=True)
    assert all(k.startswith("base_model.model.model.language_model.") for k in renamed)
    # PEFT keeps only names of the model's own LoRA layers: a renamed state would save as an empty adapter
    with pytest.raises(L.EmptyAdapterStateError, match="only 0 of"):
        L.save_adapter(wrapper, renamed, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    saved = L.save_adapter(wrapper, state, tmp_path, base_name="tiny:qwen3_omni", unwrap_forward=True)
    assert len(saved) == len(state) and all(".default." not in k for k in saved)
    assert all(k.startswith("base_model.model.model.language_model.") for k in saved)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "tiny:qwen3_omni" and cfg["inference_mode"] is True

    ids = torch.tensor([[1, 20, 30, 40, 50, 60]])
    with torch.no_grad():
        want = wrapper(input_ids=ids).logits
        thinker = PeftModel.from_pretrained(build_base("qwen3_omni").thinker, tmp_path).eval()
        got = thinker(input_ids=ids).logits
    assert torch.equal(want, got)
