"""Hypothesis strategies for the encoder and Qwen2.5-VL layouts' base configs and LoRA configs (transformers 5.24).

``tests/verify/test_expected_keys.py`` dispatches ``base_configs`` here for ``modernbert``, ``modernbert_mlm``,
``embeddinggemma2``, ``embeddinggemma2_text`` and ``qwen_vl``; ``tests/verify/test_expected_encoders.py`` runs the
same differential check with :func:`encoder_lora_configs`, whose targets are the encoders' own leaves (ModernBERT's
``Wqkv`` / ``Wo`` / ``Wi``, the MLM head, EmbeddingGemma 2's per-layer-embedding projections). Every drawn config is
one the registry models (``build_tree`` never declines it): what it refuses is tested by name.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

ENCODER_LAYOUTS = (
    "modernbert",
    "modernbert_mlm",
    "embeddinggemma2",
    "embeddinggemma2_text",
    "qwen_vl",
    "qwen_vl:flat",
)
"""``qwen_vl:flat``: Qwen2.5-VL's flat (pre-transformers-5 hub) ``config.json``, text fields at the top."""


class RawConfig:
    """A ``config.json`` dict written as is, where a transformers config's ``save_pretrained`` would rewrite it."""

    def __init__(self, raw: dict[str, Any]):
        self.raw = raw

    def save_pretrained(self, folder: str) -> None:
        import json
        from pathlib import Path

        (Path(folder) / "config.json").write_text(json.dumps(self.raw))


def flat_qwen_vl(d: st.DrawFn) -> RawConfig:
    """A hub-style flat Qwen2.5-VL config: text fields at the top (rope as ``rope_scaling`` ``mrope`` +
    ``rope_theta`` or ``rope_parameters``), ``tie_word_embeddings`` at the top, the old vision ``model_type``, the
    vision config's ``in_chans`` / ``spatial_patch_size`` and the top's ``vision_token_id`` / ``head_dim`` extras;
    a text field left out now and then (``Qwen2_5_VLTextConfig``'s default applies)."""
    kw = qwen_vl_kwargs(d)
    text = kw["text_config"]
    raw: dict[str, Any] = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        **{k: v for k, v in text.items() if k != "tie_word_embeddings"},
        "tie_word_embeddings": kw["tie_word_embeddings"],
        "vision_config": dict(kw["vision_config"]),
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": d(st.sampled_from([1, 28])),
        "image_token_id": 151655,
    }
    if d(st.booleans()):
        raw["rope_scaling"] = {"type": "mrope", "mrope_section": [1, 1, 2]}
        raw["rope_theta"] = 1000000.0
    else:
        raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]}
    if d(st.booleans()):
        raw["vision_config"].update(model_type="qwen2_5_vl", in_chans=3, spatial_patch_size=14)
        raw["vision_token_id"] = 151654
    if d(st.booleans()):
        raw["head_dim"] = 4
    for key in d(
        st.lists(st.sampled_from(["intermediate_size", "hidden_act", "num_key_value_heads"]), max_size=2)
    ):
        raw.pop(key, None)
    if raw.get("num_key_value_heads") is None and d(st.booleans()):
        raw["num_key_value_heads"] = None
    return RawConfig(raw)


_TYPES = ["sliding_attention", "full_attention"]


def modernbert_kwargs(d: st.DrawFn) -> dict[str, Any]:
    n = d(st.integers(1, 4))  # ModernBertConfig refuses no layers (an empty rope_parameters)
    cfg: dict[str, Any] = {
        "hidden_size": d(st.sampled_from([16, 32, 48])),
        "num_attention_heads": d(st.sampled_from([1, 2, 4])),
        "intermediate_size": d(st.sampled_from([8, 24])),
        "num_hidden_layers": n,
        "vocab_size": d(st.sampled_from([64, 100])),
        "max_position_embeddings": 128,
        "local_attention": d(st.sampled_from([16, 32])),
        "attention_bias": d(st.booleans()),
        "mlp_bias": d(st.booleans()),
        "decoder_bias": d(st.booleans()),
        "classifier_bias": d(st.booleans()),
        "tie_word_embeddings": d(st.booleans()),
        "hidden_activation": d(st.sampled_from(["gelu", "silu", "gelu_new"])),
        "classifier_activation": d(st.sampled_from(["gelu", "relu"])),
        "attention_dropout": d(st.sampled_from([0.0, 0.1])),
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "cls_token_id": 1,
        "sep_token_id": 2,
    }
    if d(st.booleans()):
        cfg["layer_types"] = d(st.lists(st.sampled_from(_TYPES), min_size=n, max_size=n))
    else:
        cfg["global_attn_every_n_layers"] = d(st.sampled_from([1, 2, 3]))
    return cfg


def gemma2_text_kwargs(d: st.DrawFn) -> dict[str, Any]:
    n = d(st.integers(0, 4))
    cfg: dict[str, Any] = {
        "hidden_size": d(st.sampled_from([16, 32])),
        "num_attention_heads": d(st.sampled_from([1, 2, 4])),
        "num_key_value_heads": d(st.sampled_from([1, 2])),
        "head_dim": d(st.sampled_from([4, 8])),
        "intermediate_size": d(st.sampled_from([8, 24])),
        "num_hidden_layers": n,
        "vocab_size": d(st.sampled_from([64, 100])),
        "max_position_embeddings": 128,
        "hidden_size_per_layer_input": d(st.sampled_from([4, 8])),
        "embedding_dim": d(st.sampled_from([8, 16])),
        "attention_bias": d(st.booleans()),
        "sliding_window": 8,
        "hidden_activation": d(st.sampled_from(["gelu_pytorch_tanh", "silu"])),
    }
    how = d(st.sampled_from(["types", "pattern", "default"]))
    if how == "types":
        cfg["layer_types"] = d(st.lists(st.sampled_from(_TYPES), min_size=n, max_size=n))
    elif how == "pattern":
        cfg["sliding_window_pattern"] = d(st.integers(1, 3))
    if d(st.booleans()):
        cfg["global_head_dim"] = d(st.sampled_from([4, 8, 16]))
        cfg["num_global_key_value_heads"] = d(st.sampled_from([1, 2]))
    return cfg


def qwen_vl_kwargs(d: st.DrawFn) -> dict[str, Any]:
    heads = d(st.sampled_from([1, 2, 4]))
    text: dict[str, Any] = {
        "hidden_size": d(st.sampled_from([16, 32, 48])),
        "num_attention_heads": heads,
        "num_key_value_heads": d(st.sampled_from([None, *(k for k in (1, 2, 4) if heads % k == 0)])),
        "intermediate_size": d(st.sampled_from([24, 64])),
        "num_hidden_layers": d(st.integers(1, 4)),
        "vocab_size": d(st.sampled_from([64, 100])),
        "max_position_embeddings": 128,
        "tie_word_embeddings": d(st.booleans()),
        "hidden_act": d(st.sampled_from(["silu", "gelu"])),
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    vision = {
        "depth": d(st.integers(0, 2)),
        "hidden_size": d(st.sampled_from([16, 32])),
        "intermediate_size": d(st.sampled_from([24, 64])),
        "num_heads": d(st.sampled_from([1, 2])),
        "spatial_merge_size": d(st.sampled_from([1, 2])),
        "out_hidden_size": d(st.sampled_from([16, text["hidden_size"]])),
        "fullatt_block_indexes": [0],
    }
    return {"text_config": text, "vision_config": vision, "tie_word_embeddings": text["tie_word_embeddings"]}


@st.composite
def encoder_base_configs(d: st.DrawFn, layout: str) -> Any:
    """A transformers config object of ``layout``'s class, ``architectures`` set."""
    import transformers as tf

    if layout in ("modernbert", "modernbert_mlm"):
        cfg = tf.ModernBertConfig(**modernbert_kwargs(d))
        cls = "ModernBertForMaskedLM" if layout == "modernbert_mlm" else "ModernBertModel"
    elif layout == "embeddinggemma2_text":
        cfg = tf.EmbeddingGemma2TextConfig(**gemma2_text_kwargs(d))
        cls = "EmbeddingGemma2TextModel"
    elif layout == "embeddinggemma2":
        cfg = tf.EmbeddingGemma2Config(text_config=gemma2_text_kwargs(d))
        cls = "EmbeddingGemma2Model"
    elif layout == "qwen_vl:flat":
        return flat_qwen_vl(d)
    elif layout == "qwen_vl":
        cfg = tf.Qwen2_5_VLConfig(**qwen_vl_kwargs(d))
        cls = "Qwen2_5_VLForConditionalGeneration"
    else:  # pragma: no cover - a dispatch error in the caller
        raise ValueError(layout)
    cfg.architectures = [cls]
    return cfg


_LEAVES = [
    "Wqkv",
    "Wo",
    "Wi",
    "dense",
    "decoder",
    "tok_embeddings",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "per_layer_input_gate",
    "per_layer_projection",
    "per_layer_model_projection",
    "embedding_projection",
    "embed_tokens",
    "no_such_module",
]
_REGEXES = [
    r".*\.attn\.(Wqkv|Wo)",
    r".*mlp\.W[io]",
    r"(model\.)?layers\.[01]\..*",
    r".*\.ple_block\.per_layer_[a-z_]+",
    r"(language_model\.)?layers\.\d+\.self_attn\.[qv]_proj",
    r"head\.dense|decoder",
]
_EXCLUDES = [
    r"(^|.*\.)(vision_tower|audio_tower|embed_vision|embed_audio)(\..*|$)",
    r".*\.ple_block\..*",
    r".*head.*",
]
_PATTERN_KEYS = [
    "Wqkv",
    "Wi",
    r"layers\.0\..*",
    "q_proj",
    "per_layer_input_gate",
    "embed_tokens",
    "tok_embeddings",
]


@st.composite
def encoder_lora_configs(d: st.DrawFn, module_names: list[str]) -> dict[str, Any]:
    """A LoRA config over the encoders' own leaves (every field the registry models)."""
    leaves = sorted({n.rpartition(".")[2] for n in module_names} & set(_LEAVES)) or ["no_such_module"]
    kind = d(st.sampled_from(["list", "list", "regex", "all-linear", "names"]))
    raw: dict[str, Any] = {
        "peft_type": "LORA",
        "r": d(st.integers(1, 6)),
        "lora_alpha": d(st.sampled_from([1, 8, 16])),
    }
    if kind == "list":
        pool = st.sampled_from(leaves if d(st.booleans()) else _LEAVES)
        raw["target_modules"] = d(st.lists(pool, min_size=1, max_size=6, unique=True))
    elif kind == "regex":
        raw["target_modules"] = d(st.sampled_from(_REGEXES))
    elif kind == "all-linear":
        raw["target_modules"] = "all-linear"
    else:
        named = [n for n in module_names if n.rpartition(".")[2] in _LEAVES] or ["no_such_module"]
        raw["target_modules"] = d(st.lists(st.sampled_from(named), min_size=1, max_size=30, unique=True))
    if d(st.booleans()):
        raw["exclude_modules"] = d(
            st.one_of(
                st.sampled_from(_EXCLUDES),
                st.lists(st.sampled_from(_LEAVES), min_size=1, max_size=3, unique=True),
            )
        )
    if kind in ("list", "names") and d(st.integers(0, 2)) == 0:
        raw["layers_to_transform"] = d(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 4), max_size=3)))
        raw["layers_pattern"] = d(st.sampled_from([None, "layers", ["layers"], "blocks"]))
    if d(st.booleans()):
        raw["rank_pattern"] = d(
            st.dictionaries(st.sampled_from(_PATTERN_KEYS), st.integers(1, 5), max_size=3)
        )
    if d(st.booleans()):
        raw["alpha_pattern"] = d(
            st.dictionaries(st.sampled_from(_PATTERN_KEYS), st.sampled_from([2, 32]), max_size=2)
        )
    if d(st.integers(0, 3)) == 0:
        raw["modules_to_save"] = d(
            st.sampled_from(
                [
                    ["decoder"],
                    ["dense"],
                    ["embedding_projection"],
                    ["tok_embeddings"],
                    ["embed_tokens"],
                    ["final_norm"],
                ]
            )
        )
    if d(st.integers(0, 4)) == 0:
        raw["lora_dropout"] = 0.1
    if d(st.integers(0, 4)) == 0:
        raw["use_rslora"] = True
    raw["task_type"] = d(st.sampled_from([None, "FEATURE_EXTRACTION"]))
    return raw


__all__ = ["ENCODER_LAYOUTS", "encoder_base_configs", "encoder_lora_configs"]
