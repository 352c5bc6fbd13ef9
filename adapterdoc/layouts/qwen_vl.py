"""Qwen2.5-VL / Qwen3-VL: current (transformers >= 4.52) naming and the pre-4.52 legacy naming."""

from __future__ import annotations

from typing import Any

from adapterdoc.layouts.common import ATTN, DECODER, HIDDEN, LINEAR_ATTN, MLP, MOE, TEXT_LM, VL_DECODER
from adapterdoc.layouts.registry import Layout, Rule, Tiny

# ------------------------------------------------------------------------------------- tiny configs


def _qwen2_5_vl() -> dict[str, Any]:
    text = {**DECODER, "num_hidden_layers": 2}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=HIDDEN,
        fullatt_block_indexes=[0],
    )
    return dict(text_config=text, vision_config=vision)


ENTRIES: tuple[Layout, ...] = (
    Layout(
        name="qwen_vl_legacy",
        family="qwen_vl",
        model_class="Qwen2_5_VLForConditionalGeneration",
        model_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        model_type="qwen2_5_vl",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers < 4.52 (model.layers.*, top-level visual)",
        requires=(TEXT_LM, r"^visual\."),
        lora_leaves=ATTN + MLP,
        towers=("visual",),
        remaps={
            "qwen_vl": (
                Rule(r"^model\.(?!language_model\.)", "model.language_model."),
                Rule(r"^visual\.", "model.visual."),
            )
        },
        hint=r"qwen[23](\.5)?-?vl",
        move_words={"qwen_vl": "pre-4.52 VL naming on a current VL base"},
        no_tiny=(
            "no model class: this layout exists only as adapter keys written with transformers < 4.52, which "
            "transformers 5 cannot build; the qwen_vl row's remap and roundtrip cells move adapters to it and back"
        ),
    ),
    Layout(
        name="qwen_vl",
        family="qwen_vl",
        model_class="Qwen2_5_VLForConditionalGeneration",
        model_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        model_type="qwen2_5_vl",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers >= 4.52 (model.language_model.*, model.visual)",
        requires=(VL_DECODER,),
        forbids=(LINEAR_ATTN, MOE, r"^thinker\.", r"^model\.(vision_tower|multi_modal_projector)\."),
        signals=((r"^model\.visual\.", "Qwen-VL vision tower `model.visual` modules"),),
        lora_leaves=ATTN + MLP,
        towers=("visual",),
        remaps={
            "qwen_vl_legacy": (
                Rule(r"^model\.language_model\.", "model."),
                Rule(r"^model\.visual\.", "visual."),
            )
        },
        hint=r"qwen[23](\.5)?-?vl",
        tiny=Tiny("Qwen2_5_VLConfig", _qwen2_5_vl),
        move_words={"qwen_vl_legacy": "current VL naming on a pre-4.52 VL base"},
    ),
)

SMOKE: tuple[str, ...] = ()
"""This family's layouts in ``train-smoke --layout all``, in run order."""
