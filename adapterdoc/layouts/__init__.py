"""THE registry of model layouts: detection evidence, remap rules, exclusions and LoRA leaves, as data.

Every naming rule adapterdoc knows lives here. Module paths below are PEFT module paths *without* the
``base_model.model.`` wrapper (``model.language_model.layers.0.self_attn.q_proj``). Nothing in this module
imports torch; the tiny reference configs are built by :mod:`adapterdoc.ml.tiny` from the names here, and each
layout's module tree (from ``config.json``, torch-free) lives in :mod:`adapterdoc.layouts.trees`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.adapter import WRAPPER, parse_key

TOWER_SEGMENTS = (
    "visual",
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "talker",
    "code2wav",
    "mtp",
)
"""Module-path segments that must never carry LoRA when a multimodal model is trained or served as text."""

MODALITY_SEGMENTS = (
    "visual",
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "embed_vision",
    "embed_audio",
)
"""Tower segments that make a model multimodal (:attr:`Layout.is_vl`); MTP and the Omni talker do not."""


def exclusion_regex(segments: Iterable[str] = TOWER_SEGMENTS) -> str:
    """A PEFT ``exclude_modules`` regex (fullmatch semantics) excluding every module under ``segments``."""
    return r"(^|.*\.)(" + "|".join(segments) + r")(\..*|$)"


@dataclass(frozen=True)
class Rule:
    """One rename on a module path: ``re.sub(pattern, replacement, path, count=1)``."""

    pattern: str
    replacement: str

    def apply(self, path: str) -> str:
        return re.sub(self.pattern, self.replacement, path, count=1)


STRIP_LANGUAGE_MODEL = Rule(r"^((?:[^.]+\.)*?)language_model\.", r"\1")
"""Remove the first ``language_model`` segment: ``model.language_model.layers`` → ``model.layers``."""


def strip_language_model(path: str) -> str:
    """The one "strip ``language_model``" (``remap --vl`` and the move verify suggests): remove the first
    ``language_model`` segment of a module path or full key, keeping the dots around it."""
    return STRIP_LANGUAGE_MODEL.apply(path)


ADD_LANGUAGE_MODEL = Rule(r"^model\.(?!language_model\.)", "model.language_model.")
"""``model.layers`` → ``model.language_model.layers`` (a text adapter onto a VL class)."""


@dataclass(frozen=True)
class Layout:
    """One model layout: how its adapters' module paths look and how to move them to neighbours."""

    name: str
    family: str
    model_class: str
    """The transformers class whose module tree this layout describes."""
    model_type: str
    """``config.model_type`` of the config this class is built from."""
    description: str
    requires: tuple[str, ...]
    """Regexes (``re.search`` on module paths); each must match at least one module for a detection."""
    forbids: tuple[str, ...] = ()
    """Regexes that must match no module."""
    signals: tuple[tuple[str, str], ...] = ()
    """Extra (regex, evidence text) pairs that raise confidence when they match a module."""
    lora_leaves: tuple[str, ...] = ()
    """Leaf module names LoRA targets by default (attention and MLP linears)."""
    target_parameters: tuple[str, ...] = ()
    """Fused-expert parameters targeted through PEFT's ``target_parameters``."""
    towers: tuple[str, ...] = ()
    """Module-path segments of towers/projectors/talker in this layout (never LoRA targets)."""
    remaps: dict[str, tuple[Rule, ...]] = field(default_factory=dict)
    """Direct moves to neighbouring layouts: target layout name → rules applied in order."""
    text_counterpart: str | None = None
    """The layout a text-only trainer or server uses for this one (``remap --vl`` / train-smoke)."""
    is_encoder: bool = False
    model_module: str = ""
    """The transformers module that defines ``model_class``: what PEFT writes as ``auto_mapping.parent_library``."""
    counterpart_config: str | None = None
    """The attribute of this layout's config that holds the config ``text_counterpart`` is built from (``None``: the
    same config), so that a base of this layout can also be loaded as its counterpart's class."""
    hint: str | None = None
    """A regex (``re.search``, any case) on a model name or path that names this layout's family; it breaks ties
    between layouts the keys fit equally."""
    forward_via: str | None = None
    """The attribute whose ``forward`` runs this model (the Omni wrapper has none of its own: ``thinker``); that
    submodule is a model of layout ``text_counterpart``."""
    counterpart_module: str | None = None
    """The attribute of this model that *is* its ``text_counterpart`` model (ModernBERT-MLM's ``model``): outputs
    of the two compare at that submodule."""
    move_words: dict[str, str] = field(default_factory=dict)
    """How a move from this layout to the named one reads in a finding (default: the VL/text wording)."""
    tiny: Tiny | None = None
    """The tiny reference config (``None``: no tiny model, e.g. a layout that exists only as adapter keys)."""

    @property
    def exclude_regex(self) -> str | None:
        return exclusion_regex(self.towers) if self.towers else None

    @property
    def is_vl(self) -> bool:
        """Whether the model carries a vision/audio tower or projector (served with its multimodal class)."""
        return any(t in MODALITY_SEGMENTS for t in self.towers)


@dataclass(frozen=True)
class Tiny:
    """A tiny reference config: the transformers config class and its keyword arguments, as plain data."""

    config_class: str
    kwargs: Callable[[], dict[str, Any]]
    """Returns fresh keyword arguments for ``transformers.<config_class>(**kwargs)``."""


_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_DELTANET = ("in_proj_qkv", "in_proj_z", "out_proj")
_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_LINEAR_ATTN = r"\.linear_attn\."
_FUSED_EXPERTS = r"\.mlp\.experts(\.base_layer)?$"
_MOE = r"\.mlp\.(experts|shared_expert)(\.|$)"
_VL_LM = r"^model\.language_model\.layers\.\d+\."
_TEXT_LM = r"^model\.layers\.\d+\."
_QWEN35_MARK = r"\.(linear_attn|mlp\.shared_expert)\."
"""Gated DeltaNet or a shared expert: what tells Qwen3.5-MoE from the Omni thinker / Qwen3-MoE."""
_VL_DECODER = r"^model\.language_model\.layers\.\d+\.(self_attn|mlp)\.[^.]+$"
_TEXT_DECODER = r"^model\.layers\.\d+\.(self_attn|mlp)\.[^.]+$"
_BERT_LEAF = r"\.(Wqkv|Wi|Wo)$"
_VL_DECODER_OR_DELTANET = r"^model\.language_model\.layers\.\d+\.(self_attn|mlp|linear_attn)\.[^.]+$"
_TEXT_DECODER_OR_DELTANET = r"^model\.layers\.\d+\.(self_attn|mlp|linear_attn)\.[^.]+$"
"""Qwen3.5 adapters that skip the Gated-DeltaNet projections look like any decoder's: then only a hint tells."""

# tiny reference configs (plain dicts; ml/tiny builds the torch models)

HIDDEN = 64
VOCAB = 1000
LAYERS = 4

_DECODER = dict(
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
_QWEN35_LINEAR = dict(
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16
)
_QWEN35_MOE = dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
)
_QWEN_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN)


def _qwen3_5_text() -> dict[str, Any]:
    return {**_DECODER, **_QWEN35_LINEAR}


def _qwen3_5_moe_text() -> dict[str, Any]:
    return {**_DECODER, **_QWEN35_LINEAR, **_QWEN35_MOE}


def _omni_text() -> dict[str, Any]:
    return {
        **_DECODER,
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


def _qwen2_5_vl() -> dict[str, Any]:
    text = {**_DECODER, "num_hidden_layers": 2}
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


def _ministral_text() -> dict[str, Any]:
    return {
        **_DECODER,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "factor": 16.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale_all_dim": 1.0,
            "mscale": 1.0,
            "llama_4_scaling_beta": 0.1,
        },
    }


def _pixtral() -> dict[str, Any]:
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=16,
        image_size=32,
        patch_size=8,
    )


def _modernbert() -> dict[str, Any]:
    return dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        global_attn_every_n_layers=2,
        local_attention=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    )


def _gemma2_text() -> dict[str, Any]:
    return dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        hidden_size_per_layer_input=16,
        embedding_dim=32,
        sliding_window=16,
        global_head_dim=16,
        num_global_key_value_heads=2,
        layer_types=["sliding_attention", "full_attention"],
    )


LAYOUTS: dict[str, Layout] = {}


def _register(*layouts: Layout) -> None:
    for layout in layouts:
        LAYOUTS[layout.name] = layout


_register(
    Layout(
        name="qwen3_5_vl",
        family="qwen3_5",
        model_class="Qwen3_5ForConditionalGeneration",
        model_module="transformers.models.qwen3_5.modeling_qwen3_5",
        counterpart_config="text_config",
        model_type="qwen3_5",
        description="Qwen3.5 / Qwen3.6 dense vision-language (model.language_model.*, model.visual)",
        requires=(_VL_DECODER_OR_DELTANET,),
        forbids=(_MOE, r"^thinker\."),
        signals=((r"\.linear_attn\.in_proj_qkv$", "Gated-DeltaNet in_proj_qkv (Qwen3.5 linear attention)"),),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        towers=("visual", "mtp"),
        remaps={"qwen3_5_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="qwen3_5_text",
        hint=r"qwen3[._-]?[56]",
        tiny=Tiny(
            "Qwen3_5Config", lambda: dict(text_config=_qwen3_5_text(), vision_config=dict(_QWEN_VISION))
        ),
    ),
    Layout(
        name="qwen3_5_text",
        family="qwen3_5",
        model_class="Qwen3_5ForCausalLM",
        model_module="transformers.models.qwen3_5.modeling_qwen3_5",
        model_type="qwen3_5_text",
        description="Qwen3.5 dense, text-only class (model.layers.*)",
        requires=(_TEXT_DECODER_OR_DELTANET,),
        forbids=(_MOE, _BERT_LEAF),
        signals=((_LINEAR_ATTN, "Gated-DeltaNet linear-attention modules (Qwen3.5)"),),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        towers=("mtp",),
        remaps={"qwen3_5_vl": (ADD_LANGUAGE_MODEL,)},
        hint=r"qwen3[._-]?[56]",
        tiny=Tiny("Qwen3_5TextConfig", _qwen3_5_text),
    ),
    Layout(
        name="qwen3_5_moe_vl",
        family="qwen3_5_moe",
        model_class="Qwen3_5MoeForConditionalGeneration",
        model_module="transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        counterpart_config="text_config",
        model_type="qwen3_5_moe",
        description="Qwen3.5 / Qwen3.6 MoE vision-language, fused experts (model.language_model.*)",
        requires=(_VL_LM, _MOE, _QWEN35_MARK),
        forbids=(r"^thinker\.",),
        signals=(
            (_LINEAR_ATTN, "Gated-DeltaNet linear-attention modules"),
            (r"\.mlp\.shared_expert\.", "shared-expert MLP (Qwen3.5-MoE)"),
            (_FUSED_EXPERTS, "fused-expert LoRA (target_parameters)"),
        ),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        target_parameters=_EXPERTS,
        towers=("visual", "mtp"),
        remaps={"qwen3_5_moe_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="qwen3_5_moe_text",
        hint=r"qwen3[._-]?[56].*(a\d+b|moe)",
        tiny=Tiny(
            "Qwen3_5MoeConfig",
            lambda: dict(text_config=_qwen3_5_moe_text(), vision_config=dict(_QWEN_VISION)),
        ),
    ),
    Layout(
        name="qwen3_5_moe_text",
        family="qwen3_5_moe",
        model_class="Qwen3_5MoeForCausalLM",
        model_module="transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        model_type="qwen3_5_moe_text",
        description="Qwen3.5 MoE, text-only class (model.layers.*)",
        requires=(_TEXT_LM, _MOE, _QWEN35_MARK),
        signals=(
            (_LINEAR_ATTN, "Gated-DeltaNet linear-attention modules"),
            (r"\.mlp\.shared_expert\.", "shared-expert MLP (Qwen3.5-MoE)"),
        ),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        target_parameters=_EXPERTS,
        towers=("mtp",),
        remaps={"qwen3_5_moe_vl": (ADD_LANGUAGE_MODEL,)},
        hint=r"qwen3[._-]?[56].*(a\d+b|moe)",
        tiny=Tiny("Qwen3_5MoeTextConfig", _qwen3_5_moe_text),
    ),
    Layout(
        name="qwen3_omni",
        family="qwen3_omni",
        model_class="Qwen3OmniMoeForConditionalGeneration",
        model_module="transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",
        counterpart_config="thinker_config",
        model_type="qwen3_omni_moe",
        description="Qwen3-Omni full wrapper (thinker.model.language_model.*; talker must never get LoRA)",
        requires=(r"^thinker\.model\.language_model\.layers\.\d+\.",),
        signals=((_FUSED_EXPERTS, "fused-expert LoRA (target_parameters)"),),
        lora_leaves=_ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
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
        requires=(_VL_LM, _FUSED_EXPERTS),
        forbids=(_LINEAR_ATTN, r"\.shared_expert\."),
        signals=(
            (r"^model\.language_model\.layers\.\d+\.self_attn\.", "full attention only (no Gated DeltaNet)"),
        ),
        lora_leaves=_ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
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
        requires=(_TEXT_LM, _FUSED_EXPERTS),
        forbids=(_LINEAR_ATTN, r"\.shared_expert\."),
        lora_leaves=_ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
        remaps={"qwen3_omni_thinker": (ADD_LANGUAGE_MODEL,)},
        hint=r"omni",
        tiny=Tiny("Qwen3MoeConfig", lambda: {**_omni_text(), "num_local_experts": 4}),
    ),
    Layout(
        name="mistral3_vl",
        family="mistral3",
        model_class="Mistral3ForConditionalGeneration",
        model_module="transformers.models.mistral3.modeling_mistral3",
        counterpart_config="text_config",
        model_type="mistral3",
        description="Ministral 3 vision-language (Mistral3 + Pixtral tower, model.language_model.*)",
        requires=(_VL_DECODER,),
        forbids=(_LINEAR_ATTN, _MOE, r"^thinker\."),
        signals=(
            (r"^model\.vision_tower\.", "Pixtral vision_tower modules"),
            (r"^model\.multi_modal_projector\.", "multi_modal_projector modules"),
        ),
        lora_leaves=_ATTN + _MLP,
        towers=("vision_tower", "multi_modal_projector"),
        remaps={"ministral3_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="ministral3_text",
        hint=r"(mi|mini)stral",
        tiny=Tiny(
            "Mistral3Config",
            lambda: dict(
                text_config={"model_type": "ministral3", **_ministral_text()},
                vision_config={"model_type": "pixtral", **_pixtral()},
            ),
        ),
    ),
    Layout(
        name="ministral3_text",
        family="mistral3",
        model_class="Ministral3ForCausalLM",
        model_module="transformers.models.ministral3.modeling_ministral3",
        model_type="ministral3",
        description="Ministral 3 text-only class (model.layers.*); a generic decoder layout",
        requires=(_TEXT_DECODER,),
        forbids=(_LINEAR_ATTN, _MOE, r"^visual\.", _BERT_LEAF),
        lora_leaves=_ATTN + _MLP,
        remaps={"mistral3_vl": (ADD_LANGUAGE_MODEL,)},
        hint=r"(mi|mini)stral",
        tiny=Tiny("Ministral3Config", _ministral_text),
    ),
    Layout(
        name="qwen_vl_legacy",
        family="qwen_vl",
        model_class="Qwen2_5_VLForConditionalGeneration",
        model_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        model_type="qwen2_5_vl",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers < 4.52 (model.layers.*, top-level visual)",
        requires=(_TEXT_LM, r"^visual\."),
        lora_leaves=_ATTN + _MLP,
        towers=("visual",),
        remaps={
            "qwen_vl": (
                Rule(r"^model\.(?!language_model\.)", "model.language_model."),
                Rule(r"^visual\.", "model.visual."),
            )
        },
        hint=r"qwen[23](\.5)?-?vl",
        move_words={"qwen_vl": "pre-4.52 VL naming on a current VL base"},
    ),
    Layout(
        name="qwen_vl",
        family="qwen_vl",
        model_class="Qwen2_5_VLForConditionalGeneration",
        model_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        model_type="qwen2_5_vl",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers >= 4.52 (model.language_model.*, model.visual)",
        requires=(_VL_DECODER,),
        forbids=(_LINEAR_ATTN, _MOE, r"^thinker\.", r"^model\.(vision_tower|multi_modal_projector)\."),
        signals=((r"^model\.visual\.", "Qwen-VL vision tower `model.visual` modules"),),
        lora_leaves=_ATTN + _MLP,
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
    Layout(
        name="modernbert_mlm",
        family="modernbert",
        model_class="ModernBertForMaskedLM",
        model_module="transformers.models.modernbert.modeling_modernbert",
        model_type="modernbert",
        description="ModernBERT with the masked-LM head (model.layers.*.attn.Wqkv)",
        requires=(r"^model\.layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        signals=((r"^(head\.dense|decoder)$", "masked-LM head modules"),),
        lora_leaves=("Wqkv", "Wo", "Wi"),
        remaps={"modernbert": (Rule(r"^model\.", ""),)},
        text_counterpart="modernbert",
        is_encoder=True,
        hint=r"modernbert",
        tiny=Tiny("ModernBertConfig", _modernbert),
        counterpart_module="model",
        move_words={"modernbert": "MLM adapter on the bare encoder"},
    ),
    Layout(
        name="modernbert",
        family="modernbert",
        model_class="ModernBertModel",
        model_module="transformers.models.modernbert.modeling_modernbert",
        model_type="modernbert",
        description="ModernBERT encoder without a head (layers.*.attn.Wqkv)",
        requires=(r"^layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        lora_leaves=("Wqkv", "Wo", "Wi"),
        remaps={"modernbert_mlm": (Rule(r"^(?=(?:layers|embeddings|final_norm)\.)", "model."),)},
        is_encoder=True,
        hint=r"modernbert",
        tiny=Tiny("ModernBertConfig", _modernbert),
        move_words={"modernbert_mlm": "bare-encoder adapter on the MLM model"},
    ),
    Layout(
        name="embeddinggemma2",
        family="embeddinggemma2",
        model_class="EmbeddingGemma2Model",
        model_module="transformers.models.embedding_gemma2.modeling_embedding_gemma2",
        counterpart_config="text_config",
        model_type="embedding_gemma2",
        description="EmbeddingGemma 2 multimodal embedding model (language_model.layers.*, no model. prefix)",
        requires=(r"^language_model\.layers\.\d+\.",),
        signals=((r"\.ple_block\.", "per-layer-embedding blocks"),),
        lora_leaves=_ATTN + _MLP,
        towers=("vision_tower", "audio_tower", "embed_vision", "embed_audio"),
        remaps={"embeddinggemma2_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="embeddinggemma2_text",
        is_encoder=True,
        hint=r"embedding-?gemma",
        tiny=Tiny("EmbeddingGemma2Config", lambda: dict(text_config=_gemma2_text())),
    ),
    Layout(
        name="embeddinggemma2_text",
        family="embeddinggemma2",
        model_class="EmbeddingGemma2TextModel",
        model_module="transformers.models.embedding_gemma2.modeling_embedding_gemma2",
        model_type="embedding_gemma2_text",
        description="EmbeddingGemma 2 text tower alone (layers.*)",
        requires=(r"^layers\.\d+\.(self_attn|mlp)\.",),
        forbids=(r"\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        signals=((r"\.ple_block\.", "per-layer-embedding blocks"),),
        lora_leaves=_ATTN + _MLP,
        remaps={"embeddinggemma2": (Rule(r"^(?!language_model\.)", "language_model."),)},
        is_encoder=True,
        hint=r"embedding-?gemma",
        tiny=Tiny("EmbeddingGemma2TextConfig", _gemma2_text),
    ),
)


def get_layout(name: str) -> Layout:
    """The layout called ``name``; raises ``KeyError`` with the known names."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise KeyError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}") from None


def loadable_as(name: str) -> list[tuple[str, tuple[str, ...]]]:
    """The layouts whose class a base of layout ``name`` can be built as, itself first, each with the chain of
    config attributes that leads from the base's config to the config that class is built from (the
    ``text_counterpart`` chain: ``qwen3_omni`` → ``qwen3_omni_thinker`` via ``thinker_config`` → ...)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    here: str | None = name
    attrs: tuple[str, ...] = ()
    while here in LAYOUTS and all(here != n for n, _ in out):
        out.append((here, attrs))
        lay = LAYOUTS[here]
        if lay.counterpart_config:
            attrs = (*attrs, lay.counterpart_config)
        here = lay.text_counterpart
    return out


def remap_path(source: str, target: str) -> list[tuple[str, tuple[Rule, ...]]] | None:
    """The shortest chain of registry moves from ``source`` to ``target`` as (layout reached, rules) steps."""
    if source == target:
        return []
    queue: deque[tuple[str, list[tuple[str, tuple[Rule, ...]]]]] = deque([(source, [])])
    seen = {source}
    while queue:
        here, steps = queue.popleft()
        for nxt, rules in LAYOUTS[here].remaps.items():
            if nxt in seen:
                continue
            path = [*steps, (nxt, rules)]
            if nxt == target:
                return path
            seen.add(nxt)
            queue.append((nxt, path))
    return None


@dataclass(frozen=True)
class Detection:
    """Which layout an adapter's module paths belong to, and why."""

    name: str
    """A layout name, or ``"unknown"``; ``"ambiguous"`` when several match equally well."""
    evidence: tuple[str, ...]
    candidates: tuple[str, ...] = ()


def detect_layout(module_paths: Iterable[str], hint: str | Iterable[str] | None = None) -> Detection:
    """Detect the layout from module paths (``base_model.model.`` already removed).

    ``hint`` is corroborating text, or several, most precise first (PEFT's ``auto_mapping.base_model_class``,
    ``base_model_name_or_path``); it only breaks ties between layouts that match the keys equally well.
    """
    paths = _shapes(module_paths)
    if not paths:
        return Detection("unknown", ("no LoRA modules",))
    scored: list[tuple[int, str, list[str]]] = []
    for layout in LAYOUTS.values():
        evidence: list[str] = []
        ok = True
        for rx in layout.requires:
            n = _count(rx, paths)
            if not n:
                ok = False
                break
            evidence.append(f"{n} module(s) match /{rx}/")
        if not ok or any(_count(rx, paths) for rx in layout.forbids):
            continue
        score = 10 * len(layout.requires)
        for rx, text in layout.signals:
            n = _count(rx, paths)
            if n:
                score += 1
                evidence.append(f"{text}: {n} module(s)")
        scored.append((score, layout.name, evidence))
    if not scored:
        total = sum(p.count for p in paths)
        return Detection("unknown", (f"{total} module(s); no registry layout matches, e.g. {paths[0]}",))
    scored.sort(key=lambda s: -s[0])
    best = [s for s in scored if s[0] == scored[0][0]]
    hints = [hint] if isinstance(hint, str) else list(hint or [])
    for h in hints if len(best) > 1 else []:
        by_hint = [s for s in best if _hint_matches(LAYOUTS[s[1]], h)]
        if len(by_hint) == 1:
            s = by_hint[0]
            why = f"the adapter config names {h!r}, which breaks the tie with {', '.join(b[1] for b in best if b is not s)}"
            return Detection(s[1], (*s[2], why), tuple(b[1] for b in best if b is not s))
    if len(best) > 1:
        names = tuple(s[1] for s in best)
        return Detection("ambiguous", tuple(best[0][2]), names)
    return Detection(best[0][1], tuple(best[0][2]), tuple(s[1] for s in scored[1:]))


def _hint_matches(layout: Layout, hint: str) -> bool:
    if hint.startswith("tiny:"):  # adapters trained on adapterdoc's tiny reference models name their layout
        return hint[len("tiny:") :] == layout.name
    if re.fullmatch(r"[A-Za-z0-9_]+For[A-Za-z]+|[A-Za-z0-9_]+Model", hint):  # a class name (auto_mapping)
        return hint == layout.model_class
    return bool(layout.hint and re.search(layout.hint, hint, re.IGNORECASE))


class _Shape(str):
    """A module path with layer/expert indices replaced by ``0``, standing for ``count`` real paths."""

    count: int


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _shapes(module_paths: Iterable[str]) -> list[_Shape]:
    """Collapse module paths that differ only in numeric indices: detection cost stays O(distinct shapes)."""
    counts: dict[str, int] = {}
    for p in set(module_paths):
        key = _INDEX.sub("0", p)
        counts[key] = counts.get(key, 0) + 1
    out = []
    for key in sorted(counts):
        shape = _Shape(key)
        shape.count = counts[key]
        out.append(shape)
    return out


def _count(rx: str, paths: list[_Shape]) -> int:
    pattern = re.compile(rx)
    return sum(p.count for p in paths if pattern.search(p))


def all_tower_segments() -> frozenset[str]:
    """Every segment that must never carry LoRA: :data:`TOWER_SEGMENTS` and every layout's towers."""
    return frozenset((*TOWER_SEGMENTS, *(t for lay in LAYOUTS.values() for t in lay.towers)))


def tower_segment(module_path: str) -> str | None:
    """The tower/projector/talker segment a module path runs through, if any."""
    towers = all_tower_segments()
    for seg in module_path.split("."):
        if seg in towers:
            return seg
    return None


def tower_probes(segment: str) -> tuple[str, ...]:
    """Module paths a tower ``segment`` sits at in the registry's layouts (bare, under ``model.``, under a
    forward-routing wrapper's ``<attr>.model.``): an ``exclude_modules`` regex that matches them all already
    excludes that tower."""
    prefixes = ["", "model."]
    for lay in LAYOUTS.values():
        if lay.forward_via and f"{lay.forward_via}.model." not in prefixes:
            prefixes.append(f"{lay.forward_via}.model.")
    return tuple(f"{p}{segment}.x" for p in prefixes)


# ------------------------------------------------------------------------------------------------ moves on keys


def rename(rules: Sequence[Rule], path: str) -> str:
    """``path`` (a module path or a whole state-dict name) through ``rules`` in order."""
    for rule in rules:
        path = rule.apply(path)
    return path


def apply_move(rules: Sequence[Rule], key: str) -> str:
    """The one rename of an adapter tensor key by a chain of rules: the ``base_model.model.`` wrapper and the LoRA
    suffix (``.lora_A.weight``, ...) stay, the module path goes through :func:`rename`."""
    k = parse_key(key)
    prefix = WRAPPER if k.wrapped else ""
    rest = key[len(prefix) :]
    if not rest.startswith(k.module):
        return prefix + rename(rules, rest)
    return prefix + rename(rules, k.module) + rest[len(k.module) :]


VL_RULES: tuple[Rule, ...] = (STRIP_LANGUAGE_MODEL,)
"""The rules of ``remap --vl``: :func:`apply_move` with these is :func:`strip_language_model` on the module path."""


def move_rules(source: str, target: str) -> tuple[Rule, ...] | None:
    """The rules of the shortest registry move from ``source`` to ``target`` in order (``None``: no move)."""
    steps = remap_path(source, target)
    return None if steps is None else tuple(r for _, rs in steps for r in rs)


def move_words(source: str, target: str) -> str:
    """How the move from ``source`` to ``target`` reads in a finding."""
    src, dst = LAYOUTS.get(source), LAYOUTS.get(target)
    if src and target in src.move_words:
        return src.move_words[target]
    if src and src.text_counterpart == target:
        return "VL adapter on a text-only base"
    if dst and dst.text_counterpart == source:
        return "text-only adapter on a VL base"
    return "layout move"


# ------------------------------------------------------------------------------------------- forward routing


def forward_layout(name: str) -> str:
    """The layout of the module that runs ``name``'s forward (the Omni wrapper's: its thinker's), else ``name``."""
    lay = LAYOUTS[name]
    return lay.text_counterpart if lay.forward_via and lay.text_counterpart else name


def forward_module(model: Any) -> Any:
    """The module whose forward runs ``model`` (its ``thinker`` for the Omni wrapper), else ``model`` itself."""
    for attr in dict.fromkeys(lay.forward_via for lay in LAYOUTS.values() if lay.forward_via):
        inner = getattr(model, attr, None)
        if inner is not None:
            return inner
    return model


# ----------------------------------------------------------------------------------------------- tiny models


def tiny_layouts() -> tuple[str, ...]:
    """The layouts with a tiny reference config, in registry order."""
    return tuple(name for name, lay in LAYOUTS.items() if lay.tiny is not None)


SMOKE_ORDER: list[str] = []
"""``train-smoke --layout all``: every VL/wrapper layout and both encoders, in the order the families list them."""


def smoke_layouts() -> tuple[str, ...]:
    """The layouts ``train-smoke --layout all`` runs."""
    return tuple(SMOKE_ORDER)


SMOKE_ORDER.extend(
    (
        "qwen3_5_vl",
        "qwen3_5_moe_vl",
        "qwen3_omni_thinker",
        "qwen3_omni",
        "mistral3_vl",
        "modernbert_mlm",
        "embeddinggemma2",
    )
)
