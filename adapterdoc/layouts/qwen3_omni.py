"""Qwen3-Omni: the full wrapper (forward through its thinker), the thinker alone, and Qwen3-MoE, the
thinker's text-only stand-in."""

from __future__ import annotations

from typing import Any

from adapterdoc.layouts.common import (
    ATTN,
    DECODER,
    FUSED_EXPERTS,
    HIDDEN,
    LINEAR_ATTN,
    QWEN_MOE_EXPERTS,
    TEXT_LM,
    VL_LM,
)
from adapterdoc.layouts.registry import ADD_LANGUAGE_MODEL, STRIP_LANGUAGE_MODEL, Layout, Rule, Tiny

# ------------------------------------------------------------------------------------- tiny configs


def _omni_text() -> dict[str, Any]:
    return {
        **DECODER,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    }


def _omni_thinker() -> dict[str, Any]:
    return dict(
        # Released Omni configs carry this; the thinker's 3-D position code reads it whenever an attention mask is given.
        vision_start_token_id=151652,
        text_config=_omni_text(),
        audio_config=dict(
            d_model=32,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=64,
            num_mel_bins=16,
            output_dim=HIDDEN,
            n_window=4,
            downsample_hidden_size=16,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=HIDDEN,
            deepstack_visual_indexes=[0],
        ),
    )


ENTRIES: tuple[Layout, ...] = (
    Layout(
        name="qwen3_omni",
        family="qwen3_omni",
        model_class="Qwen3OmniMoeForConditionalGeneration",
        model_module="transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",
        counterpart_config="thinker_config",
        model_type="qwen3_omni_moe",
        description="Qwen3-Omni full wrapper (thinker.model.language_model.*; talker must never get LoRA)",
        requires=(r"^thinker\.model\.language_model\.layers\.\d+\.",),
        signals=((FUSED_EXPERTS, "fused-expert LoRA (target_parameters)"),),
        lora_leaves=ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
        experts=QWEN_MOE_EXPERTS,
        towers=("audio_tower", "visual", "talker", "code2wav"),
        remaps={"qwen3_omni_thinker": (Rule(r"^thinker\.", ""),)},
        text_counterpart="qwen3_omni_thinker",
        hint=r"omni",
        tiny=Tiny(
            "Qwen3OmniMoeConfig", lambda: dict(thinker_config=_omni_thinker(), enable_audio_output=False)
        ),
        forward_via="thinker",
        move_words={"qwen3_omni_thinker": "Omni full-wrapper adapter on the thinker"},
    ),
    Layout(
        name="qwen3_omni_thinker",
        family="qwen3_omni",
        model_class="Qwen3OmniMoeThinkerForConditionalGeneration",
        model_module="transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",
        counterpart_config="text_config",
        model_type="qwen3_omni_moe_thinker",
        description="Qwen3-Omni thinker alone (model.language_model.*, audio and vision towers)",
        requires=(VL_LM, FUSED_EXPERTS),
        forbids=(LINEAR_ATTN, r"\.shared_expert\."),
        signals=(
            (r"^model\.language_model\.layers\.\d+\.self_attn\.", "full attention only (no Gated DeltaNet)"),
        ),
        lora_leaves=ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
        experts=QWEN_MOE_EXPERTS,
        towers=("audio_tower", "visual"),
        remaps={
            "qwen3_omni": (Rule(r"^(?!thinker\.)", "thinker."),),
            "qwen3_moe_text": (STRIP_LANGUAGE_MODEL,),
        },
        text_counterpart="qwen3_moe_text",
        hint=r"omni",
        tiny=Tiny("Qwen3OmniMoeThinkerConfig", _omni_thinker),
        move_words={"qwen3_omni": "thinker adapter on the Omni full wrapper"},
    ),
    Layout(
        name="qwen3_moe_text",
        family="qwen3_omni",
        model_class="Qwen3MoeForCausalLM",
        model_module="transformers.models.qwen3_moe.modeling_qwen3_moe",
        model_type="qwen3_moe",
        description="Qwen3-MoE text class, the text stand-in for the Omni thinker (model.layers.*)",
        requires=(TEXT_LM, FUSED_EXPERTS),
        forbids=(LINEAR_ATTN, r"\.shared_expert\."),
        lora_leaves=ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
        experts=QWEN_MOE_EXPERTS,
        remaps={"qwen3_omni_thinker": (ADD_LANGUAGE_MODEL,)},
        hint=r"omni",
        tiny=Tiny("Qwen3MoeConfig", lambda: {**_omni_text(), "num_local_experts": 4}),
    ),
)

SMOKE: tuple[str, ...] = ("qwen3_omni_thinker", "qwen3_omni")
"""This family's layouts in ``train-smoke --layout all``, in run order."""
