"""Pin the adapter-name → on-disk-name mapping that merge derives from transformers and PEFT.

transformers' conversion mapping moves between releases; these tests fail loudly when it does. The strongest
check rebuilds every in-memory parameter from the on-disk tensors through the computed pieces and compares it
with what ``from_pretrained`` loads.
"""

# ruff: noqa: F811  (pytest fixtures imported from test_merge_helpers are shadowed by parameters)

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open

from adapterdoc.adapter import AdapterConfig
from adapterdoc.bases import folder_base
from adapterdoc.ml import build, names
from adapterdoc.ml.inject import inventory
from adapterdoc.ml.tiny import TINY_LAYOUTS, model_class
from tests.merge.test_merge_helpers import load, saved_base  # noqa: F401


def _disk(folder: str) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as g:
                out.update({k: g.get_tensor(k) for k in g.keys()})  # noqa: SIM118
    return out


def _name_map(folder: str) -> tuple[names.NameMap, object]:
    base = folder_base(folder, "the name map needs it")
    model = build.build_meta_model(base, build.folder_config(folder, "the name map needs it"))
    shapes = {k: tuple(v.shape) for k, v in _disk(folder).items()}
    return names.build_name_map(model, shapes), model


@pytest.mark.parametrize("layout", TINY_LAYOUTS)
def test_pieces_rebuild_what_from_pretrained_loads(saved_base, layout):
    folder = saved_base(layout)
    nm, model = _name_map(folder)
    assert type(model).__name__ == model_class(layout).__name__
    assert nm.unmapped == [] and nm.unsupported == {}
    disk = _disk(folder)
    assert set(nm.by_disk) == set(disk)
    loaded = load(model_class(layout), folder).state_dict()
    for param, want in loaded.items():
        resolved = nm.resolve(param)
        assert resolved is not None, f"{param} has no on-disk source"
        _, pieces = resolved
        rebuilt = torch.full(tuple(want.shape), float("nan"))
        for p in pieces:
            p.take(rebuilt).copy_(disk[p.disk])
        assert torch.equal(rebuilt, want), param


def test_renamed_layouts(saved_base):
    nm, _ = _name_map(saved_base("mistral3_vl"))
    p = nm.by_disk["language_model.model.layers.0.self_attn.q_proj.weight"]
    assert (p.param, p.whole) == ("model.language_model.layers.0.self_attn.q_proj.weight", True)
    assert nm.resolve("lm_head.weight") == (
        "model.language_model.embed_tokens.weight",
        [names.Piece("language_model.model.embed_tokens.weight", "model.language_model.embed_tokens.weight")],
    )
    nm, _ = _name_map(saved_base("qwen3_omni_thinker"))
    assert nm.by_disk["model.layers.1.self_attn.o_proj.weight"].param == (
        "model.language_model.layers.1.self_attn.o_proj.weight"
    )
    assert nm.by_disk["audio_tower.conv2d1.weight"].param == "model.audio_tower.conv2d1.weight"
    nm, _ = _name_map(saved_base("qwen3_omni"))
    assert nm.by_disk["thinker.model.layers.0.self_attn.q_proj.weight"].param == (
        "thinker.model.language_model.layers.0.self_attn.q_proj.weight"
    )


@pytest.mark.parametrize("layout", ["qwen3_5_moe_vl", "qwen3_5_moe_text", "qwen3_moe_text", "qwen3_omni"])
def test_unfused_experts_on_disk_are_slices_of_the_fused_parameter(saved_base, layout):
    nm, _ = _name_map(saved_base(layout))
    gate = next(d for d in nm.by_disk if d.endswith("layers.0.mlp.experts.2.gate_proj.weight"))
    up = gate.replace("gate_proj", "up_proj")
    down = gate.replace("gate_proj", "down_proj")
    stem = gate.split("experts.2.")[0]
    fused = nm.by_disk[gate].param
    assert fused.endswith("layers.0.mlp.experts.gate_up_proj")
    inter = nm.param_shapes[fused][1] // 2
    assert nm.by_disk[gate] == names.Piece(gate, fused, expert=2, narrow=(0, 0, inter))
    assert nm.by_disk[up] == names.Piece(up, fused, expert=2, narrow=(0, inter, inter))
    assert nm.by_disk[down] == names.Piece(down, fused.replace("gate_up_proj", "down_proj"), expert=2)
    assert len(nm.by_param[fused]) == 2 * nm.param_shapes[fused][0]
    assert stem + "experts.gate_up_proj" not in nm.by_disk


def test_peft_inventory_names_the_fused_parameter_of_each_wrapper(saved_base):
    folder = saved_base("qwen3_5_moe_text")
    nm, model = _name_map(folder)
    cfg = AdapterConfig(
        {
            "peft_type": "LORA",
            "r": 2,
            "lora_alpha": 8,
            "target_modules": ["q_proj"],
            "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        }
    )
    inv = inventory(model, cfg)
    outer = inv.targets["model.layers.0.mlp.experts"]
    inner = inv.targets["model.layers.0.mlp.experts.base_layer"]
    e, _two_i, hidden = nm.param_shapes["model.layers.0.mlp.experts.gate_up_proj"]
    assert (outer.kind, outer.param, outer.num_experts) == (
        "experts",
        "model.layers.0.mlp.experts.down_proj",
        e,
    )
    assert (inner.kind, inner.param) == ("experts", "model.layers.0.mlp.experts.gate_up_proj")
    assert inner.a_shape == (2 * e, hidden) and inner.experts_out_in
    assert inner.scaling == 4.0
    q = inv.targets["model.layers.3.self_attn.q_proj"]
    assert (q.kind, q.param, q.rank) == ("linear", "model.layers.3.self_attn.q_proj.weight", 2)


def test_peft_inventory_rslora_and_patterns(saved_base):
    _, model = _name_map(saved_base("qwen3_5_text"))
    cfg = AdapterConfig(
        {
            "peft_type": "LORA",
            "r": 4,
            "lora_alpha": 8,
            "use_rslora": True,
            "target_modules": ["q_proj", "v_proj"],
            "rank_pattern": {"v_proj": 16},
            "alpha_pattern": {"q_proj": 2},
        }
    )
    inv = inventory(model, cfg)
    assert inv.targets["model.layers.3.self_attn.v_proj"].scaling == pytest.approx(8 / 4)  # 8 / sqrt(16)
    assert inv.targets["model.layers.3.self_attn.q_proj"].scaling == pytest.approx(2 / 2)  # 2 / sqrt(4)


def test_peft_inventory_of_a_config_that_matches_nothing(saved_base):
    _, model = _name_map(saved_base("modernbert"))
    inv = inventory(model, AdapterConfig({"peft_type": "LORA", "target_modules": ["q_proj"]}))
    assert inv.targets == {} and inv.note


@pytest.mark.parametrize(
    ("module", "param", "expected"),
    [
        ("model.embed_tokens.base_layer", "weight", "model.embed_tokens.weight"),
        ("lm_head.modules_to_save.default", "weight", "lm_head.weight"),
        ("lm_head", "weight", "lm_head.weight"),
        ("score.original_module", "bias", "score.bias"),
    ],
)
def test_saved_weight_param(module, param, expected):
    assert names.saved_weight_param(module, param) == expected
