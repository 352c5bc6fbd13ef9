"""Qwen2.5-VL / Qwen3-VL: current (transformers >= 4.52) naming and the pre-4.52 legacy naming."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from adapterdoc.layouts.common import (
    ATTN,
    DECODER,
    LINEAR_ATTN,
    MLP,
    MOE,
    PLAIN_ACTIVATIONS,
    QWEN_VISION_TINY,
    TEXT_LM,
    VL_DECODER,
)
from adapterdoc.layouts.registry import Layout, Rule, Tiny
from adapterdoc.layouts.trees import Fields, Tree, Unmodeled, decoder_stack, sub_config
from adapterdoc.layouts.vision import patch_merger, vision_blocks

# ------------------------------------------------------------------------------------- module trees

_TEXT = {
    "vocab_size": 152064,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "layer_types": None,
    "tie_word_embeddings": False,
}
"""``Qwen2_5_VLTextConfig``'s fields that shape the module tree, with their defaults (transformers 5.24,
``models/qwen2_5_vl/configuration_qwen2_5_vl.py``); ``num_key_value_heads: null`` means one per attention head."""


_TEXT_INERT = frozenset(
    {
        "max_position_embeddings",
        "rms_norm_eps",
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "attention_dropout",
        "rope_parameters",
        "head_dim",
    }
)
"""``head_dim`` is read by no module: the attention derives ``hidden_size // num_attention_heads``."""


_VISION = {
    "depth": 32,
    "hidden_size": 3584,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
}


_VISION_INERT = frozenset(
    {
        "tokens_per_second",
        "window_size",
        "fullatt_block_indexes",
        "rope_parameters",
        "in_chans",
        "spatial_patch_size",
    }
)
"""``in_chans`` / ``spatial_patch_size``: in hub (pre-5) vision configs, read by no module (``in_channels`` and
``patch_size`` are)."""


_TOP = {"tie_word_embeddings": False, "text_config": None, "vision_config": None}


_TOP_INERT = frozenset({"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"})


_FLAT_TEXT = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "use_cache",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "layer_types",
    "attention_dropout",
    "rope_parameters",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "rope_scaling",
    "rope_theta",
)
"""The keys ``Qwen2_5_VLConfig.__post_init__`` moves from a flat (pre-5 hub) config into ``text_config`` when it
has none: ``Qwen2_5_VLTextConfig.__init__``'s parameters that are not ``Qwen2_5_VLConfig`` fields of its own,
plus ``rope_parameters`` / ``rope_scaling`` / ``rope_theta`` (transformers 5.24). Everything else stays at the
top: ``tie_word_embeddings`` (a top-level field, which v5's tying reads) and extras such as ``head_dim`` or
``vision_token_id``, which no module reads."""
_FLAT_INERT = frozenset({"vision_token_id", "head_dim"})


def _split_flat(raw: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """A flat config's (top, text_config) as transformers 5.24 splits it."""
    top = {k: v for k, v in raw.items() if k not in _FLAT_TEXT and k != "text_config"}
    return top, {k: raw[k] for k in _FLAT_TEXT if k in raw}


def _act(f: Fields) -> None:
    if f["hidden_act"] not in PLAIN_ACTIVATIONS:
        raise Unmodeled(f"{f.where} `hidden_act` {f['hidden_act']!r} is not modelled")


def _vision(t: Tree, f: Fields, p: str) -> None:
    """``Qwen2_5_VisionTransformerPretrainedModel``: every Linear but the merger's has a bias as well."""
    d, inter, depth = f.int("hidden_size"), f.int("intermediate_size"), f.int("depth", 0)
    heads, s, out = f.int("num_heads"), f.int("spatial_merge_size"), f.int("out_hidden_size")
    if d % heads:
        raise Unmodeled(f"{f.where} `hidden_size` {d} is not a multiple of `num_heads` {heads}")
    f.int("in_channels")
    for key in ("patch_size", "temporal_patch_size"):
        f.int(key)
    _act(f)
    t.add(p)
    vision_blocks(t, p, d, inter, depth, None, gated=True)
    patch_merger(t, p + ".merger", d * s * s, out)


def _text(t: Tree, f: Fields, p: str) -> tuple[int, int]:
    """``Qwen2_5_VLTextModel``: q/k/v with a bias, o_proj and the MLP without."""
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers")
    heads = f.int("num_attention_heads")
    nkv = heads if f.raw.get("num_key_value_heads", 0) is None else f.int("num_key_value_heads")
    if h % heads:
        raise Unmodeled(f"{f.where} `hidden_size` {h} is not a multiple of `num_attention_heads` {heads}")
    types = f["layer_types"]
    if types is not None and (
        not isinstance(types, list)
        or len(types) != n
        or any(x not in ("full_attention", "sliding_attention") for x in types)
    ):
        raise Unmodeled(f"{f.where} `layer_types` does not list one modelled type per layer ({n})")
    _act(f)
    hd, inter = h // heads, f.int("intermediate_size")
    return decoder_stack(t, p, n, h, v, heads, nkv, hd, inter, qkv_bias=True)


def _qwen2_5_vl_tree(raw: Mapping[str, object]) -> Tree:
    """``Qwen2_5_VLForConditionalGeneration`` (transformers 5.24, ``models/qwen2_5_vl/modeling_qwen2_5_vl.py``),
    the class of both layouts: ``qwen_vl`` names its modules, ``qwen_vl_legacy`` is the pre-4.52 naming of adapter
    keys. transformers 5.24 registers no load-time conversion for ``qwen2_5_vl`` (``conversion_mapping``) and the
    class has no ``_checkpoint_conversion_mapping``, so PEFT's loader renames no legacy key: such keys are
    unexpected, which the registry can say exactly. A flat config (text fields at the top, no ``text_config``: most
    hub checkpoints) is split the way ``Qwen2_5_VLConfig`` splits it (:func:`_split_flat`); the text model needs a
    layer for the meta path to name the layout."""
    vision = raw.get("vision_config")
    if isinstance(vision, dict) and vision.get("model_type") == "qwen2_5_vl":  # old checkpoints: overridden
        raw = {**raw, "vision_config": {**vision, "model_type": "qwen2_5_vl_vision"}}
    text: Mapping[str, object]
    if raw.get("text_config") is None:
        raw, text = _split_flat(raw)
        top = Fields(raw, "qwen2_5_vl", _TOP, _TOP_INERT | _FLAT_INERT)
    else:
        top = Fields(raw, "qwen2_5_vl", _TOP, _TOP_INERT)
        text = sub_config(raw, "text_config", "qwen2_5_vl_text", "qwen2_5_vl")
    tf = Fields(text, "qwen2_5_vl_text", _TEXT, _TEXT_INERT | {"rope_scaling", "rope_theta"})
    vf = Fields(
        sub_config(raw, "vision_config", "qwen2_5_vl_vision", "qwen2_5_vl"),
        "qwen2_5_vl_vision",
        _VISION,
        _VISION_INERT,
    )
    t = Tree("qwen_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl")
    t.add("model")
    _vision(t, vf, "model.visual")
    t.add("model.language_model")
    h, v = _text(t, tf, "model.language_model.")
    return t.lm_head(h, v, top, tf)


# ------------------------------------------------------------------------------------- tiny configs


def _qwen2_5_vl() -> dict[str, object]:
    text: dict[str, object] = {**DECODER, "num_hidden_layers": 2}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
    vision = dict(QWEN_VISION_TINY, fullatt_block_indexes=[0])
    return dict(text_config=text, vision_config=vision)


_QWEN_VL_LAYOUT = partial(
    Layout,
    family="qwen_vl",
    model_class="Qwen2_5_VLForConditionalGeneration",
    model_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    model_type="qwen2_5_vl",
    lora_leaves=ATTN + MLP,
    towers=("visual",),
    hint=r"qwen[23](\.5)?-?vl",
    tree=_qwen2_5_vl_tree,
)
"""Both namings are one class, one module tree and one family: only the module paths differ."""

ENTRIES: tuple[Layout, ...] = (
    _QWEN_VL_LAYOUT(
        name="qwen_vl_legacy",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers < 4.52 (model.layers.*, top-level visual)",
        requires=(TEXT_LM, r"^visual\."),
        remaps={
            "qwen_vl": (
                Rule(r"^model\.(?!language_model\.)", "model.language_model."),
                Rule(r"^visual\.", "model.visual."),
            )
        },
        move_words={"qwen_vl": "pre-4.52 VL naming on a current VL base"},
        no_tiny=(
            "no model class: this layout exists only as adapter keys written with transformers < 4.52, which "
            "transformers 5 cannot build; the qwen_vl row's remap and roundtrip cells move adapters to it and back"
        ),
    ),
    _QWEN_VL_LAYOUT(
        name="qwen_vl",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers >= 4.52 (model.language_model.*, model.visual)",
        requires=(VL_DECODER,),
        forbids=(LINEAR_ATTN, MOE, r"^thinker\.", r"^model\.(vision_tower|multi_modal_projector)\."),
        signals=((r"^model\.visual\.", "Qwen-VL vision tower `model.visual` modules"),),
        remaps={
            "qwen_vl_legacy": (
                Rule(r"^model\.language_model\.", "model."),
                Rule(r"^model\.visual\.", "visual."),
            )
        },
        tiny=Tiny("Qwen2_5_VLConfig", _qwen2_5_vl),
        move_words={"qwen_vl_legacy": "current VL naming on a pre-4.52 VL base"},
    ),
)

SMOKE: tuple[str, ...] = ()
"""This family's layouts in ``train-smoke --layout all``, in run order."""
