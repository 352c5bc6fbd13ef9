"""EmbeddingGemma 2: the multimodal embedding model and its text tower."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from adapterdoc.layouts.common import ATTN, MLP, PLAIN_ACTIVATIONS, tiny_decoder
from adapterdoc.layouts.registry import STRIP_LANGUAGE_MODEL, Layout, Rule, Tiny
from adapterdoc.layouts.trees import Fields, Tree, Unmodeled, attention, mlp, sub_config

# ------------------------------------------------------------------------------------- module trees

_TEXT = {
    "vocab_size": 262_144,
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_bias": False,
    "layer_types": None,
    "hidden_size_per_layer_input": 512,
    "embedding_dim": 768,
    "per_layer_config": None,
    "global_head_dim": 512,
    "num_global_key_value_heads": 1,
    "sliding_window_pattern": 6,
    "rope_parameters": None,
}
"""``EmbeddingGemma2TextConfig``'s fields (and ``__post_init__`` keywords) that shape the module tree, with their
defaults (transformers 5.24, ``models/embedding_gemma2/configuration_embedding_gemma2.py``)."""


_TEXT_INERT = frozenset({"max_position_embeddings", "rms_norm_eps", "attention_dropout", "sliding_window"})


_TOP = {"text_config": None, "vision_config": None, "audio_config": None}


_TOP_INERT = frozenset(
    {
        "boi_token_id",
        "eoi_token_id",
        "image_token_id",
        "video_token_id",
        "boa_token_id",
        "eoa_token_index",
        "audio_token_id",
    }
)


_TYPES = ("sliding_attention", "full_attention")


def _per_layer(f: Fields, n: int) -> list[tuple[int, int]]:
    """Each layer's (head_dim, num_key_value_heads): the global values, overridden by ``per_layer_config`` (the
    heterogeneous config: ``{"<layer>": {field: value}}``), which ``__post_init__`` fills in for full-attention
    layers from ``global_head_dim`` / ``num_global_key_value_heads`` when the config has none."""
    types = f["layer_types"]
    if types is None:
        pattern = f.int("sliding_window_pattern")
        types = [_TYPES[(i + 1) % pattern == 0] for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(x not in _TYPES for x in types):
        raise Unmodeled(f"{f.where} `layer_types` does not list one modelled type per layer ({n})")
    types = list(types)
    if types:
        types[-1] = "full_attention"  # __post_init__ forces the last layer to full attention
    rope = f["rope_parameters"]
    if rope is not None and (not isinstance(rope, dict) or not set(types) <= set(rope)):
        raise Unmodeled(f"{f.where} `rope_parameters` does not name every layer type")
    hd, nkv = f.int("head_dim"), f.int("num_key_value_heads")
    plc = f["per_layer_config"]
    if plc is None:
        ghd, gkv = f.int("global_head_dim"), f.int("num_global_key_value_heads")
        plc = {
            str(i): {"head_dim": ghd, "num_key_value_heads": gkv}
            for i, x in enumerate(types)
            if x == _TYPES[1]
        }
    if not isinstance(plc, dict):
        raise Unmodeled(f"{f.where} `per_layer_config` is not an object")
    out = [(hd, nkv)] * n
    for key, over in plc.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < n) or not isinstance(over, dict):
            raise Unmodeled(f"{f.where} `per_layer_config` entry {key!r} is not modelled")
        if set(over) - {"head_dim", "num_key_value_heads"}:
            raise Unmodeled(f"{f.where} `per_layer_config` overrides a field the registry does not model")
        vals = (over.get("head_dim", hd), over.get("num_key_value_heads", nkv))
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in vals):
            raise Unmodeled(f"{f.where} `per_layer_config` entry {key!r} is not modelled")
        out[int(key)] = vals
    for kind in set(types):  # the rotary embedding reads one config per layer type
        if len({out[i] for i, x in enumerate(types) if x == kind}) > 1:
            raise Unmodeled(f"{f.where} `per_layer_config` differs between {kind} layers")
    return out


def _text_model(t: Tree, f: Fields, p: str) -> None:
    """``EmbeddingGemma2TextModel`` under the prefix ``p`` (``""`` or ``language_model.``)."""
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers", 0)
    heads, inter, ple = (
        f.int("num_attention_heads"),
        f.int("intermediate_size"),
        f.int("hidden_size_per_layer_input"),
    )
    if f["hidden_activation"] not in PLAIN_ACTIVATIONS:
        raise Unmodeled(f"{f.where} `hidden_activation` {f['hidden_activation']!r} is not modelled")
    bias = f.flag("attention_bias")
    per_layer = _per_layer(f, n)
    t.embedding(p + "embed_tokens", v, h, inputs=True)
    for q, (hd, nkv) in zip(t.layers(p + "layers", n), per_layer):
        attention(t, q + ".self_attn", h, heads, nkv, hd, bias, norms=("q_norm", "k_norm", "v_norm"))
        mlp(t, q + ".mlp", h, inter)
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            t.add(f"{q}.{norm}_layernorm")
        b = q + ".ple_block"
        t.add(b)
        t.add(b + ".act_fn")
        t.linear(b + ".per_layer_input_gate", h, ple)
        t.linear(b + ".per_layer_projection", ple, h)
        t.add(b + ".post_per_layer_input_norm")
    t.add(p + "norm")
    t.add(p + "rotary_emb")
    t.add(p + "ple")
    t.linear(p + "ple.per_layer_model_projection", h, n * ple)
    t.add(p + "ple.per_layer_projection_norm")
    t.linear(p + "embedding_projection", h, f.int("embedding_dim"))


def _embeddinggemma2_text(raw: Mapping[str, object]) -> Tree:
    """``EmbeddingGemma2TextModel`` (transformers 5.24, ``models/embedding_gemma2/modeling_embedding_gemma2.py``):
    no output embedding, nothing tied."""
    t = Tree("embeddinggemma2_text", "EmbeddingGemma2TextModel", "embedding_gemma2_text")
    _text_model(t, Fields(raw, "embedding_gemma2_text", _TEXT, _TEXT_INERT), "")
    return t


def _embeddinggemma2(raw: Mapping[str, object]) -> Tree:
    """``EmbeddingGemma2Model``: the text model as ``language_model``; the Gemma 4 vision and audio towers (built
    through ``AutoModel`` when their configs are set) are not modelled."""
    top = Fields(raw, "embedding_gemma2", _TOP, _TOP_INERT)
    for tower in ("vision_config", "audio_config"):
        if top[tower] is not None:
            raise Unmodeled(f"embedding_gemma2 `{tower}`: the registry does not model the Gemma 4 towers")
    text = sub_config(raw, "text_config", "embedding_gemma2_text", "embedding_gemma2")
    t = Tree("embeddinggemma2", "EmbeddingGemma2Model", "embedding_gemma2")
    t.add("language_model")
    _text_model(t, Fields(text, "embedding_gemma2_text", _TEXT, _TEXT_INERT), "language_model.")
    return t


# ------------------------------------------------------------------------------------- tiny configs


_TINY_ATTENTION = dict(sliding_window=16, global_head_dim=16, num_global_key_value_heads=2)
"""The sliding window, and the full-attention layer's own head size and key/value heads."""


def _gemma2_text() -> dict[str, object]:
    return tiny_decoder(
        drop=("tie_word_embeddings",),
        num_hidden_layers=2,
        hidden_size_per_layer_input=16,
        embedding_dim=32,
        **_TINY_ATTENTION,
        layer_types=["sliding_attention", "full_attention"],
    )


_GEMMA_LAYOUT = partial(
    Layout,
    family="embeddinggemma2",
    model_module="transformers.models.embedding_gemma2.modeling_embedding_gemma2",
    signals=((r"\.ple_block\.", "per-layer-embedding blocks"),),
    lora_leaves=ATTN + MLP,
    is_encoder=True,
    hint=r"embedding-?gemma",
)

ENTRIES: tuple[Layout, ...] = (
    _GEMMA_LAYOUT(
        name="embeddinggemma2",
        model_class="EmbeddingGemma2Model",
        counterpart_config="text_config",
        model_type="embedding_gemma2",
        description="EmbeddingGemma 2 multimodal embedding model (language_model.layers.*, no model. prefix)",
        requires=(r"^language_model\.layers\.\d+\.",),
        towers=("vision_tower", "audio_tower", "embed_vision", "embed_audio"),
        remaps={"embeddinggemma2_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="embeddinggemma2_text",
        tiny=Tiny("EmbeddingGemma2Config", lambda: dict(text_config=_gemma2_text())),
        tree=_embeddinggemma2,
    ),
    _GEMMA_LAYOUT(
        name="embeddinggemma2_text",
        model_class="EmbeddingGemma2TextModel",
        model_type="embedding_gemma2_text",
        description="EmbeddingGemma 2 text tower alone (layers.*)",
        requires=(r"^layers\.\d+\.(self_attn|mlp)\.",),
        forbids=(r"\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        remaps={"embeddinggemma2": (Rule(r"^(?!language_model\.)", "language_model."),)},
        tiny=Tiny("EmbeddingGemma2TextConfig", _gemma2_text),
        tree=_embeddinggemma2_text,
    ),
)

SMOKE: tuple[str, ...] = ("embeddinggemma2",)
"""This family's layouts in ``train-smoke --layout all``, in run order."""
