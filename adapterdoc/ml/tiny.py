"""Tiny random reference models for every layout in the registry, deterministic per seed.

The same (layout, seed) always gives the same base weights, so a base rebuilt later (``verify --base tiny:LAYOUT``)
is identical to the one an adapter was trained on. Each builds in well under a second on CPU.
"""

from __future__ import annotations

from typing import Any

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


def tiny_config(layout: str) -> Any:
    """The tiny transformers config of ``layout`` (a name from :data:`adapterdoc.layouts.LAYOUTS`)."""
    import transformers as tf

    builders = {
        "qwen3_5_vl": lambda: tf.Qwen3_5Config(text_config=_qwen3_5_text(), vision_config=_QWEN_VISION),
        "qwen3_5_text": lambda: tf.Qwen3_5TextConfig(**_qwen3_5_text()),
        "qwen3_5_moe_vl": lambda: tf.Qwen3_5MoeConfig(
            text_config=_qwen3_5_moe_text(), vision_config=_QWEN_VISION
        ),
        "qwen3_5_moe_text": lambda: tf.Qwen3_5MoeTextConfig(**_qwen3_5_moe_text()),
        "qwen3_omni": lambda: tf.Qwen3OmniMoeConfig(
            thinker_config=_omni_thinker(), enable_audio_output=False
        ),
        "qwen3_omni_thinker": lambda: tf.Qwen3OmniMoeThinkerConfig(**_omni_thinker()),
        "qwen3_moe_text": lambda: tf.Qwen3MoeConfig(**_omni_text(), num_local_experts=4),
        "mistral3_vl": lambda: tf.Mistral3Config(
            text_config={"model_type": "ministral3", **_ministral_text()},
            vision_config={"model_type": "pixtral", **_pixtral()},
        ),
        "ministral3_text": lambda: tf.Ministral3Config(**_ministral_text()),
        "qwen_vl": lambda: tf.Qwen2_5_VLConfig(**_qwen2_5_vl()),
        "modernbert_mlm": lambda: tf.ModernBertConfig(**_modernbert()),
        "modernbert": lambda: tf.ModernBertConfig(**_modernbert()),
        "embeddinggemma2": lambda: tf.EmbeddingGemma2Config(text_config=_gemma2_text()),
        "embeddinggemma2_text": lambda: tf.EmbeddingGemma2TextConfig(**_gemma2_text()),
    }
    if layout not in builders:
        raise KeyError(f"no tiny reference config for layout {layout!r}; have: {', '.join(builders)}")
    return builders[layout]()


TINY_LAYOUTS = (
    "qwen3_5_vl",
    "qwen3_5_text",
    "qwen3_5_moe_vl",
    "qwen3_5_moe_text",
    "qwen3_omni",
    "qwen3_omni_thinker",
    "qwen3_moe_text",
    "mistral3_vl",
    "ministral3_text",
    "qwen_vl",
    "modernbert_mlm",
    "modernbert",
    "embeddinggemma2",
    "embeddinggemma2_text",
)
"""Layouts with a tiny reference model (the pre-4.52 VL layout exists only as adapter keys)."""


def model_class(layout: str) -> Any:
    import transformers as tf

    from adapterdoc.layouts import get_layout

    return getattr(tf, get_layout(layout).model_class)


def build_tiny(layout: str, seed: int = 0, *, dtype: Any = None) -> Any:
    """A tiny random model of ``layout`` in eval mode; identical weights for identical (layout, seed)."""
    import torch

    cfg = tiny_config(layout)
    cls = model_class(layout)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls._from_config(cfg, dtype=dtype or torch.float32)
    return model.eval()


def counterpart_state(src_model: Any, src_layout: str, dst_layout: str) -> dict[str, Any]:
    """``src_model``'s weights renamed into ``dst_layout``'s module names with the registry's remap rules."""
    from adapterdoc.layouts import remap_path

    steps = remap_path(src_layout, dst_layout)
    if steps is None:
        raise KeyError(f"the registry has no move from {src_layout} to {dst_layout}")
    out = {}
    for name, tensor in src_model.state_dict().items():
        for _, rules in steps:
            for rule in rules:
                name = rule.apply(name)
        out[name] = tensor
    return out


def build_counterpart(src_model: Any, src_layout: str, dst_layout: str, dst: Any = None) -> Any:
    """A ``dst_layout`` model holding ``src_model``'s base weights (towers dropped); every dst weight is filled.
    ``dst``: the (empty) model to fill, for a base that is not a tiny one; default the tiny ``dst_layout``."""
    dst = dst if dst is not None else build_tiny(dst_layout, seed=12345)
    state = counterpart_state(src_model, src_layout, dst_layout)
    own = dst.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    missing = [k for k in own if k not in usable]
    tied = getattr(dst.config, "tie_word_embeddings", False) or getattr(
        getattr(dst.config, "get_text_config", lambda: dst.config)(), "tie_word_embeddings", False
    )
    missing = [k for k in missing if not (tied and k.endswith("lm_head.weight"))]
    if missing:
        raise RuntimeError(f"{dst_layout} weights not provided by {src_layout}: {missing[:5]}")
    dst.load_state_dict(usable, strict=False)
    return dst.eval()
