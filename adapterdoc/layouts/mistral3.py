"""Ministral 3: Mistral3 with the Pixtral tower, and the Ministral 3 text-only class."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from adapterdoc.layouts.common import (
    ATTN,
    BERT_LEAF,
    DECODER,
    LINEAR_ATTN,
    MLP,
    MOE,
    TEXT_DECODER,
    VL_DECODER,
)
from adapterdoc.layouts.registry import ADD_LANGUAGE_MODEL, STRIP_LANGUAGE_MODEL, Layout, Tiny
from adapterdoc.layouts.trees import CONV, Fields, Tree, Unmodeled, decoder_stack, mlp, sub_config

# ------------------------------------------------------------------------------------- module trees

_MINISTRAL3 = {
    "vocab_size": 131072,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 34,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": False,
}


_MINISTRAL3_INERT = frozenset(
    {
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_parameters",
        "sliding_window",
        "attention_dropout",
    }
)


_PIXTRAL = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_channels": 3,
    "patch_size": 16,
    "head_dim": 64,
}


_PIXTRAL_INERT = frozenset({"image_size", "hidden_act", "attention_dropout", "rope_parameters"})


_MISTRAL3 = {
    "tie_word_embeddings": True,
    "spatial_merge_size": 2,
    "vision_feature_layer": -1,
    "multimodal_projector_bias": False,
    "text_config": None,
    "vision_config": None,
}


_MISTRAL3_INERT = frozenset({"image_token_index", "projector_hidden_act"})


def _ministral3_text(t: Tree, f: Fields, p: str) -> tuple[int, int]:
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers", 0)
    nh, nkv, inter = f.int("num_attention_heads"), f.int("num_key_value_heads"), f.int("intermediate_size")
    hd = f["head_dim"] or h // nh
    if not isinstance(hd, int) or hd < 1:
        raise Unmodeled(f"{f.where} `head_dim` is {hd!r}")
    return decoder_stack(t, p, n, h, v, nh, nkv, hd, inter)


def _ministral3(raw: Mapping[str, object]) -> Tree:
    f = Fields(raw, "ministral3", _MINISTRAL3, _MINISTRAL3_INERT)
    t = Tree("ministral3_text", "Ministral3ForCausalLM", "ministral3")
    t.add("model")
    h, v = _ministral3_text(t, f, "model.")
    return t.lm_head(h, v, f)


def _pixtral(t: Tree, f: Fields, p: str) -> int:
    d, inter, n = f.int("hidden_size"), f.int("intermediate_size"), f.int("num_hidden_layers", 0)
    f.int("num_attention_heads")
    f.int("num_channels")
    f.int("patch_size")
    t.add(p)
    t.add(p + ".patch_conv", CONV)
    t.add(p + ".ln_pre")
    t.add(p + ".transformer")
    t.add(p + ".transformer.layers")
    for i in range(n):
        q = f"{p}.transformer.layers.{i}"
        t.add(q)
        t.add(q + ".attention_norm")
        mlp(t, q + ".feed_forward", d, inter)
        t.add(q + ".attention")
        for proj in ("k_proj", "v_proj", "q_proj", "o_proj"):
            t.linear(f"{q}.attention.{proj}", d, d)
        t.add(q + ".ffn_norm")
    t.add(p + ".patch_positional_embedding")
    return d


def _mistral3(raw: Mapping[str, object]) -> Tree:
    top = Fields(raw, "mistral3", _MISTRAL3, _MISTRAL3_INERT)
    text = sub_config(raw, "text_config", "ministral3", "mistral3")
    tf = Fields(text, "ministral3", _MINISTRAL3, _MINISTRAL3_INERT)
    vision = sub_config(raw, "vision_config", "pixtral", "mistral3")
    vf = Fields(vision, "pixtral", _PIXTRAL, _PIXTRAL_INERT)
    if "model_type" not in text or "model_type" not in vision:
        raise Unmodeled("mistral3 sub-configs without `model_type` default to other families")
    t = Tree("mistral3_vl", "Mistral3ForConditionalGeneration", "mistral3")
    t.add("model")
    d = _pixtral(t, vf, "model.vision_tower")
    s = top.int("spatial_merge_size")
    bias = top.flag("multimodal_projector_bias")
    layer = top["vision_feature_layer"]
    if isinstance(layer, int) and not isinstance(layer, bool):
        nfl = 1
    elif isinstance(layer, list) and layer:
        nfl = len(layer)
    else:
        raise Unmodeled(f"mistral3 `vision_feature_layer` is {layer!r}")
    h = tf.int("hidden_size")
    p = "model.multi_modal_projector"
    t.add(p)
    t.add(p + ".norm")
    t.add(p + ".patch_merger")
    t.linear(p + ".patch_merger.merging_layer", d * s * s, d)
    t.linear(p + ".linear_1", d * nfl, h, bias)
    t.add(p + ".act")
    t.linear(p + ".linear_2", h, h, bias)
    t.add("model.language_model")
    h, v = _ministral3_text(t, tf, "model.language_model.")
    return t.lm_head(h, v, top, tf)


# ------------------------------------------------------------------------------------- tiny configs


def _ministral_text() -> dict[str, object]:
    return {
        **DECODER,
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


def _tiny_pixtral() -> dict[str, object]:
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=16,
        image_size=32,
        patch_size=8,
    )


_MISTRAL3_LAYOUT = partial(Layout, family="mistral3", lora_leaves=ATTN + MLP, hint=r"(mi|mini)stral")

ENTRIES: tuple[Layout, ...] = (
    _MISTRAL3_LAYOUT(
        name="mistral3_vl",
        model_class="Mistral3ForConditionalGeneration",
        model_module="transformers.models.mistral3.modeling_mistral3",
        counterpart_config="text_config",
        model_type="mistral3",
        description="Ministral 3 vision-language (Mistral3 + Pixtral tower, model.language_model.*)",
        requires=(VL_DECODER,),
        forbids=(LINEAR_ATTN, MOE, r"^thinker\."),
        signals=(
            (r"^model\.vision_tower\.", "Pixtral vision_tower modules"),
            (r"^model\.multi_modal_projector\.", "multi_modal_projector modules"),
        ),
        towers=("vision_tower", "multi_modal_projector"),
        remaps={"ministral3_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="ministral3_text",
        tiny=Tiny(
            "Mistral3Config",
            lambda: dict(
                text_config={"model_type": "ministral3", **_ministral_text()},
                vision_config={"model_type": "pixtral", **_tiny_pixtral()},
            ),
        ),
        tree=_mistral3,
        load_conversion=True,
    ),
    _MISTRAL3_LAYOUT(
        name="ministral3_text",
        model_class="Ministral3ForCausalLM",
        model_module="transformers.models.ministral3.modeling_ministral3",
        model_type="ministral3",
        description="Ministral 3 text-only class (model.layers.*); a generic decoder layout",
        requires=(TEXT_DECODER,),
        forbids=(LINEAR_ATTN, MOE, r"^visual\.", BERT_LEAF),
        remaps={"mistral3_vl": (ADD_LANGUAGE_MODEL,)},
        tiny=Tiny("Ministral3Config", _ministral_text),
        tree=_ministral3,
    ),
)

SMOKE: tuple[str, ...] = ("mistral3_vl",)
"""This family's layouts in ``train-smoke --layout all``, in run order."""
