"""The registry's module trees: each layout's modules, kinds and weight shapes from ``config.json`` alone.

Torch-free and transformers-free. Each builder reproduces ``named_modules()`` of the transformers class a
layout describes (read from that class's modeling file in transformers 5.24), with the shapes of the weights a
LoRA layer's shape depends on (Linear, Embedding, fused-expert Parameters). A config the registry cannot describe
exactly (an unknown ``model_type`` or class, a field not listed for its config type, a value outside what the
builder models) raises :class:`Unmodeled`; callers then build the model on the meta device instead.

``tests/test_expected_keys.py`` proves these trees equal transformers' (names, kinds and shapes) and that the
expected LoRA keys built on them equal PEFT's, over generated configs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

LINEAR, EMBEDDING, CONV, EXPERTS, OTHER = "linear", "embedding", "conv", "experts", "other"


class Unmodeled(Exception):
    """The registry cannot describe this config (or adapter config) exactly; the reason is the message."""


@dataclass(frozen=True)
class Node:
    """One module of the tree, as ``named_modules()`` names it."""

    name: str
    kind: str = OTHER
    """``linear``, ``embedding``, ``conv``, ``experts`` (fused 3-D expert Parameters) or ``other``."""
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """The module's own Parameters (``recurse=False``), for linear, embedding and experts modules (and a conv
    whose weight is 3-D, which the meta path's leaf census counts like fused experts)."""


@dataclass
class Tree:
    """A base model's module tree, built from its config."""

    layout: str
    model_class: str
    model_type: str
    nodes: list[Node] = field(default_factory=list)
    output_embedding: str | None = None
    """The module ``get_output_embeddings()`` returns (``lm_head``): PEFT's ``all-linear`` leaves it out."""
    input_embedding: str | None = None
    tied: bool = False
    """Whether the output layer shares the input embedding's weight (``tie_word_embeddings``)."""
    load_conversion: bool = False
    """Whether transformers registers load-time renames for this model type, which PEFT's loader also applies to
    adapter keys (``convert_peft_adapter_state_dict_for_transformers``): keys that do not match exactly may then
    be renamed into place, so only the meta device can judge them."""

    def add(self, name: str, kind: str = OTHER, params: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> None:
        self.nodes.append(Node(name, kind, params))

    def linear(self, name: str, fan_in: int, fan_out: int, bias: bool = False) -> None:
        params: tuple[tuple[str, tuple[int, ...]], ...] = (("weight", (fan_out, fan_in)),)
        if bias:
            params += (("bias", (fan_out,)),)
        self.add(name, LINEAR, params)

    def embedding(self, name: str, num: int, dim: int) -> None:
        self.add(name, EMBEDDING, (("weight", (num, dim)),))

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


# --------------------------------------------------------------------------------------------- config fields

_GENERIC = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "id2label",
        "label2id",
        "problem_type",
        "initializer_range",
        "use_cache",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "tokenizer_class",
    }
)
"""Fields every transformers config carries; none changes a module tree."""


class _Fields:
    """A config dict read against the fields the registry models: defaults filled in, unknown fields refused."""

    def __init__(
        self, raw: Mapping[str, Any], where: str, defaults: Mapping[str, Any], inert: frozenset[str]
    ):
        unknown = sorted(k for k in raw if k not in defaults and k not in inert and k not in _GENERIC)
        if unknown:
            raise Unmodeled(f"{where} field(s) the registry does not model: {', '.join(unknown)}")
        self.raw, self.where, self.defaults = raw, where, defaults

    def __getitem__(self, key: str) -> Any:
        v = self.raw.get(key, self.defaults.get(key))
        return self.defaults.get(key) if v is None and key in self.defaults else v

    def int(self, key: str, minimum: int = 1) -> int:
        v = self[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise Unmodeled(f"{self.where} `{key}` is {v!r}, not an integer >= {minimum}")
        return v

    def flag(self, key: str) -> bool:
        v = self[key]
        if not isinstance(v, bool):
            raise Unmodeled(f"{self.where} `{key}` is {v!r}, not a boolean")
        return v


_QWEN35_TEXT = {
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "attention_bias": False,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_conv_kernel_dim": 4,
    "layer_types": None,
    "full_attention_interval": 4,
    "tie_word_embeddings": False,
}
_QWEN35_MOE_TEXT = {
    **{k: v for k, v in _QWEN35_TEXT.items() if k != "intermediate_size"},
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts": 256,
    "num_experts_per_tok": 8,
}
_QWEN35_TEXT_INERT = frozenset(
    {
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_parameters",
        "attention_dropout",
        "output_router_logits",
        "router_aux_loss_coef",
        "num_experts_per_tok",
    }
)
_QWEN35_MOE_TEXT_INERT = _QWEN35_TEXT_INERT | {"intermediate_size"}
"""``Qwen3_5MoeTextModel`` reads no ``intermediate_size`` (its MLPs use the MoE and shared-expert sizes)."""
_QWEN35_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
}
_QWEN35_VISION_INERT = frozenset({"hidden_act", "rope_parameters"})
_QWEN35_VL = {"tie_word_embeddings": False, "text_config": None, "vision_config": None}
_QWEN35_VL_INERT = frozenset(
    {"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"}
)

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


# --------------------------------------------------------------------------------------------- Qwen3.5


def _layer_types(f: _Fields, n: int) -> list[str]:
    types = f["layer_types"]
    if types is None:
        interval = f.int("full_attention_interval")
        return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n:
        raise Unmodeled(f"{f.where} `layer_types` does not list one type per layer ({n})")
    for t in types:
        if t not in ("linear_attention", "full_attention"):
            raise Unmodeled(f"{f.where} layer type {t!r} is not modelled")
    return types


def _qwen35_text(t: Tree, f: _Fields, p: str, moe: bool) -> tuple[int, int]:
    """``Qwen3_5(Moe)TextModel`` under the prefix ``p`` (``model.`` or ``model.language_model.``)."""
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers", 0)
    nh, nkv, hd = f.int("num_attention_heads"), f.int("num_key_value_heads"), f.int("head_dim")
    bias = f.flag("attention_bias")
    kd = f.int("linear_key_head_dim") * f.int("linear_num_key_heads")
    nv = f.int("linear_num_value_heads")
    vd = f.int("linear_value_head_dim") * nv
    types = _layer_types(f, n)
    t.embedding(p + "embed_tokens", v, h)
    t.input_embedding = p + "embed_tokens"
    t.add(p + "layers")
    for i, kind in enumerate(types):
        q = f"{p}layers.{i}"
        t.add(q)
        if kind == "linear_attention":
            a = q + ".linear_attn"
            t.add(a)
            t.add(a + ".conv1d", CONV, (("weight", (2 * kd + vd, 1, f.int("linear_conv_kernel_dim"))),))
            t.add(a + ".norm")
            t.linear(a + ".out_proj", vd, h)
            t.linear(a + ".in_proj_qkv", h, 2 * kd + vd)
            t.linear(a + ".in_proj_z", h, vd)
            t.linear(a + ".in_proj_b", h, nv)
            t.linear(a + ".in_proj_a", h, nv)
        else:
            a = q + ".self_attn"
            t.add(a)
            t.linear(a + ".q_proj", h, nh * hd * 2, bias)
            t.linear(a + ".k_proj", h, nkv * hd, bias)
            t.linear(a + ".v_proj", h, nkv * hd, bias)
            t.linear(a + ".o_proj", nh * hd, h, bias)
            t.add(a + ".q_norm")
            t.add(a + ".k_norm")
        m = q + ".mlp"
        t.add(m)
        if moe:
            e, mi, si = (
                f.int("num_experts"),
                f.int("moe_intermediate_size"),
                f.int("shared_expert_intermediate_size"),
            )
            t.add(m + ".gate")
            t.add(m + ".experts", EXPERTS, (("gate_up_proj", (e, 2 * mi, h)), ("down_proj", (e, h, mi))))
            t.add(m + ".experts.act_fn")
            _mlp(t, m + ".shared_expert", h, si)
            t.linear(m + ".shared_expert_gate", h, 1)
        else:
            _mlp(t, m, h, f.int("intermediate_size"), own=False)
        t.add(q + ".input_layernorm")
        t.add(q + ".post_attention_layernorm")
    t.add(p + "norm")
    t.add(p + "rotary_emb")
    return h, v


def _mlp(t: Tree, m: str, h: int, inter: int, own: bool = True, act: str = "act_fn") -> None:
    if own:
        t.add(m)
    t.linear(m + ".gate_proj", h, inter)
    t.linear(m + ".up_proj", h, inter)
    t.linear(m + ".down_proj", inter, h)
    t.add(f"{m}.{act}")


def _qwen35_vision(t: Tree, f: _Fields, p: str) -> None:
    d, inter, depth = f.int("hidden_size"), f.int("intermediate_size"), f.int("depth", 0)
    f.int("num_heads")
    f.int("in_channels")
    f.int("patch_size")
    f.int("temporal_patch_size")
    s, out, npos = f.int("spatial_merge_size"), f.int("out_hidden_size"), f.int("num_position_embeddings")
    t.add(p)
    t.add(p + ".patch_embed")
    t.add(p + ".patch_embed.proj", CONV)
    t.embedding(p + ".pos_embed", npos, d)
    t.add(p + ".rotary_pos_emb")
    t.add(p + ".blocks")
    for i in range(depth):
        b = f"{p}.blocks.{i}"
        t.add(b)
        t.add(b + ".norm1")
        t.add(b + ".norm2")
        t.add(b + ".attn")
        t.linear(b + ".attn.qkv", d, 3 * d, True)
        t.linear(b + ".attn.proj", d, d, True)
        t.add(b + ".mlp")
        t.linear(b + ".mlp.linear_fc1", d, inter, True)
        t.linear(b + ".mlp.linear_fc2", inter, d, True)
        t.add(b + ".mlp.act_fn")
    m = p + ".merger"
    t.add(m)
    t.add(m + ".norm")
    t.linear(m + ".linear_fc1", d * s * s, d * s * s, True)
    t.add(m + ".act_fn")
    t.linear(m + ".linear_fc2", d * s * s, out, True)


def _qwen35_causal(layout: str, cls: str, mt: str, moe: bool) -> Callable[[Mapping[str, Any]], Tree]:
    def build(raw: Mapping[str, Any]) -> Tree:
        f = _Fields(
            raw,
            mt,
            *((_QWEN35_MOE_TEXT, _QWEN35_MOE_TEXT_INERT) if moe else (_QWEN35_TEXT, _QWEN35_TEXT_INERT)),
        )
        t = Tree(layout, cls, mt)
        t.add("model")
        h, v = _qwen35_text(t, f, "model.", moe)
        t.linear("lm_head", h, v)
        t.output_embedding = "lm_head"
        t.tied = f.flag("tie_word_embeddings")
        return t

    return build


def _sub(raw: Mapping[str, Any], key: str, model_type: str, where: str) -> Mapping[str, Any]:
    sub = raw.get(key)
    if sub is None:
        raise Unmodeled(f"{where} has no `{key}` (the registry does not fill in a default sub-config)")
    if not isinstance(sub, dict):
        raise Unmodeled(f"{where} `{key}` is not an object")
    if sub.get("model_type", model_type) != model_type:
        raise Unmodeled(f"{where} `{key}.model_type` is {sub.get('model_type')!r}, not {model_type!r}")
    return sub


def _qwen35_vl(layout: str, cls: str, mt: str, moe: bool) -> Callable[[Mapping[str, Any]], Tree]:
    text_mt, vision_mt = (f"{mt}_text", f"{mt}_vision")

    def build(raw: Mapping[str, Any]) -> Tree:
        top = _Fields(raw, mt, _QWEN35_VL, _QWEN35_VL_INERT)
        tf = _Fields(
            _sub(raw, "text_config", text_mt, mt),
            text_mt,
            *((_QWEN35_MOE_TEXT, _QWEN35_MOE_TEXT_INERT) if moe else (_QWEN35_TEXT, _QWEN35_TEXT_INERT)),
        )
        vf = _Fields(
            _sub(raw, "vision_config", vision_mt, mt), vision_mt, _QWEN35_VISION, _QWEN35_VISION_INERT
        )
        t = Tree(layout, cls, mt)
        t.add("model")
        _qwen35_vision(t, vf, "model.visual")
        t.add("model.language_model")
        h, v = _qwen35_text(t, tf, "model.language_model.", moe)
        t.linear("lm_head", h, v)
        t.output_embedding = "lm_head"
        t.tied = top.flag("tie_word_embeddings") or tf.flag("tie_word_embeddings")
        return t

    return build


# --------------------------------------------------------------------------------------------- Ministral 3


def _ministral3_text(t: Tree, f: _Fields, p: str) -> tuple[int, int]:
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers", 0)
    nh, nkv, inter = f.int("num_attention_heads"), f.int("num_key_value_heads"), f.int("intermediate_size")
    hd = f["head_dim"] or h // nh
    if not isinstance(hd, int) or hd < 1:
        raise Unmodeled(f"{f.where} `head_dim` is {hd!r}")
    t.embedding(p + "embed_tokens", v, h)
    t.input_embedding = p + "embed_tokens"
    t.add(p + "layers")
    for i in range(n):
        q = f"{p}layers.{i}"
        t.add(q)
        t.add(q + ".self_attn")
        t.linear(q + ".self_attn.q_proj", h, nh * hd)
        t.linear(q + ".self_attn.k_proj", h, nkv * hd)
        t.linear(q + ".self_attn.v_proj", h, nkv * hd)
        t.linear(q + ".self_attn.o_proj", nh * hd, h)
        _mlp(t, q + ".mlp", h, inter)
        t.add(q + ".input_layernorm")
        t.add(q + ".post_attention_layernorm")
    t.add(p + "norm")
    t.add(p + "rotary_emb")
    return h, v


def _ministral3(raw: Mapping[str, Any]) -> Tree:
    f = _Fields(raw, "ministral3", _MINISTRAL3, _MINISTRAL3_INERT)
    t = Tree("ministral3_text", "Ministral3ForCausalLM", "ministral3")
    t.add("model")
    h, v = _ministral3_text(t, f, "model.")
    t.linear("lm_head", h, v)
    t.output_embedding = "lm_head"
    t.tied = f.flag("tie_word_embeddings")
    return t


def _pixtral(t: Tree, f: _Fields, p: str) -> int:
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
        _mlp(t, q + ".feed_forward", d, inter)
        t.add(q + ".attention")
        for proj in ("k_proj", "v_proj", "q_proj", "o_proj"):
            t.linear(f"{q}.attention.{proj}", d, d)
        t.add(q + ".ffn_norm")
    t.add(p + ".patch_positional_embedding")
    return d


def _mistral3(raw: Mapping[str, Any]) -> Tree:
    top = _Fields(raw, "mistral3", _MISTRAL3, _MISTRAL3_INERT)
    tf = _Fields(
        _sub(raw, "text_config", "ministral3", "mistral3"), "ministral3", _MINISTRAL3, _MINISTRAL3_INERT
    )
    vf = _Fields(_sub(raw, "vision_config", "pixtral", "mistral3"), "pixtral", _PIXTRAL, _PIXTRAL_INERT)
    if "model_type" not in raw["text_config"] or "model_type" not in raw["vision_config"]:
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
    t.linear("lm_head", h, v)
    t.output_embedding = "lm_head"
    t.tied = top.flag("tie_word_embeddings") or tf.flag("tie_word_embeddings")
    return t


# --------------------------------------------------------------------------------------------- the table

TREES: dict[tuple[str, str], Callable[[Mapping[str, Any]], Tree]] = {
    ("qwen3_5", "Qwen3_5ForConditionalGeneration"): _qwen35_vl(
        "qwen3_5_vl", "Qwen3_5ForConditionalGeneration", "qwen3_5", moe=False
    ),
    ("qwen3_5_text", "Qwen3_5ForCausalLM"): _qwen35_causal(
        "qwen3_5_text", "Qwen3_5ForCausalLM", "qwen3_5_text", moe=False
    ),
    ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"): _qwen35_vl(
        "qwen3_5_moe_vl", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", moe=True
    ),
    ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"): _qwen35_causal(
        "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", moe=True
    ),
    ("ministral3", "Ministral3ForCausalLM"): _ministral3,
    ("mistral3", "Mistral3ForConditionalGeneration"): _mistral3,
}
"""(``config.model_type``, model class) → tree builder, for every layout the registry describes torch-free."""


def model_class_name(raw: Mapping[str, Any]) -> str:
    """The class the meta-device path builds for this config: ``architectures[0]``, else the registry's class for
    the ``model_type`` (the first layout that names it, as :func:`adapterdoc.ml.meta.model_class_for` picks)."""
    from adapterdoc.layouts import LAYOUTS

    archs = raw.get("architectures")
    if archs:
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise Unmodeled("`architectures` is not a list of class names")
        return archs[0]
    for layout in LAYOUTS.values():
        if layout.model_type == raw.get("model_type"):
            return layout.model_class
    raise Unmodeled(f"no registry layout has model_type {raw.get('model_type')!r}")


LOAD_CONVERSIONS = frozenset({"qwen3_5_text", "qwen3_5_moe_text", "mistral3"})
"""Model types among :data:`TREES` with a ``transformers.conversion_mapping`` entry (transformers 5.24; pinned by
``tests/test_expected_keys.py``)."""


def build_tree(raw: Mapping[str, Any]) -> Tree:
    """The module tree of the model a ``config.json`` dict describes; :class:`Unmodeled` when the registry cannot
    describe it exactly."""
    mt = raw.get("model_type")
    cls = model_class_name(raw)
    builder = TREES.get((str(mt), cls))
    if builder is None:
        raise Unmodeled(f"the registry has no module tree for {cls} with model_type {mt!r}")
    tree = builder(raw)
    tree.load_conversion = tree.model_type in LOAD_CONVERSIONS
    return tree
