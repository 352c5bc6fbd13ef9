"""Qwen3.5 / Qwen3.6, dense and MoE: the VL classes and their text-only classes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypedDict

from adapterdoc.layouts.common import (
    ATTN,
    BERT_LEAF,
    DECODER,
    DENSE_MLP,
    EXPERT_SIGNALS,
    LINEAR_ATTN,
    MLP,
    MOE,
    QWEN35_MOE_EXPERTS,
    QWEN35_MOE_TEXT_EXPERTS,
    QWEN_VISION_DEFAULTS,
    QWEN_VISION_TINY,
    TEXT_LM,
    VL_LM,
)
from adapterdoc.layouts.registry import ADD_LANGUAGE_MODEL, STRIP_LANGUAGE_MODEL, Layout, Tiny
from adapterdoc.layouts.trees import CONV, EXPERTS, Fields, Tree, Unmodeled, attention, mlp, sub_config
from adapterdoc.layouts.vision import vision_blocks, vision_sizes

_DELTANET = ("in_proj_qkv", "in_proj_z", "out_proj")
_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_OMNI_THINKER_ONLY = (r"(^|\.)audio_tower\.", r"\.visual\.merger_list\.")
"""Modules only the Omni thinker has (its audio tower, its vision tower's deepstack mergers): a Qwen3.5-MoE VL
adapter never carries them. What tells Qwen3.5-MoE from the thinker / Qwen3-MoE otherwise: Gated-DeltaNet or
shared-expert LoRA, or LoRA on layers without self-attention LoRA (:attr:`Layout.attention_layers`); an adapter
with none of these (attention only, or attention on the full-attention layers only) fits both, and only a hint
tells."""
_VL_DECODER_OR_DELTANET = r"^model\.language_model\.layers\.\d+\.(self_attn|mlp|linear_attn)\.[^.]+$"
_TEXT_DECODER_OR_DELTANET = r"^model\.layers\.\d+\.(self_attn|mlp|linear_attn)\.[^.]+$"
"""Qwen3.5 adapters that skip the Gated-DeltaNet projections look like any decoder's: then only a hint tells."""

# ------------------------------------------------------------------------------------- module trees

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


_QWEN35_VISION = QWEN_VISION_DEFAULTS


_QWEN35_VISION_INERT = frozenset({"hidden_act", "rope_parameters"})


_QWEN35_VL = {"tie_word_embeddings": False, "text_config": None, "vision_config": None}


_QWEN35_VL_INERT = frozenset(
    {"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"}
)


def _layer_types(f: Fields, n: int) -> list[str]:
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


def _qwen35_text(t: Tree, f: Fields, p: str, moe: bool) -> tuple[int, int]:
    """``Qwen3_5(Moe)TextModel`` under the prefix ``p`` (``model.`` or ``model.language_model.``)."""
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers", 0)
    nh, nkv, hd = f.int("num_attention_heads"), f.int("num_key_value_heads"), f.int("head_dim")
    bias = f.flag("attention_bias")
    kd = f.int("linear_key_head_dim") * f.int("linear_num_key_heads")
    nv = f.int("linear_num_value_heads")
    vd = f.int("linear_value_head_dim") * nv
    types = _layer_types(f, n)
    t.embedding(p + "embed_tokens", v, h, inputs=True)
    for q, kind in zip(t.layers(p + "layers", n), types):
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
            attention(t, q + ".self_attn", h, nh, nkv, hd, bias, q_factor=2, norms=("q_norm", "k_norm"))
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
            mlp(t, m + ".shared_expert", h, si)
            t.linear(m + ".shared_expert_gate", h, 1)
        else:
            mlp(t, m, h, f.int("intermediate_size"), own=False)
        t.add(q + ".input_layernorm")
        t.add(q + ".post_attention_layernorm")
    t.add(p + "norm")
    t.add(p + "rotary_emb")
    return h, v


def _qwen35_vision(t: Tree, f: Fields, p: str) -> None:
    d, inter, depth, s, out, npos = vision_sizes(f)
    t.add(p)
    vision_blocks(t, p, d, inter, depth, npos)
    m = p + ".merger"
    t.add(m)
    t.add(m + ".norm")
    t.linear(m + ".linear_fc1", d * s * s, d * s * s, True)
    t.add(m + ".act_fn")
    t.linear(m + ".linear_fc2", d * s * s, out, True)


def _qwen35_causal(layout: str, cls: str, mt: str, moe: bool) -> Callable[[Mapping[str, object]], Tree]:
    def build(raw: Mapping[str, object]) -> Tree:
        f = Fields(
            raw,
            mt,
            *((_QWEN35_MOE_TEXT, _QWEN35_MOE_TEXT_INERT) if moe else (_QWEN35_TEXT, _QWEN35_TEXT_INERT)),
        )
        t = Tree(layout, cls, mt)
        t.add("model")
        h, v = _qwen35_text(t, f, "model.", moe)
        return t.lm_head(h, v, f)

    return build


def _qwen35_vl(layout: str, cls: str, mt: str, moe: bool) -> Callable[[Mapping[str, object]], Tree]:
    text_mt, vision_mt = (f"{mt}_text", f"{mt}_vision")

    def build(raw: Mapping[str, object]) -> Tree:
        top = Fields(raw, mt, _QWEN35_VL, _QWEN35_VL_INERT)
        tf = Fields(
            sub_config(raw, "text_config", text_mt, mt),
            text_mt,
            *((_QWEN35_MOE_TEXT, _QWEN35_MOE_TEXT_INERT) if moe else (_QWEN35_TEXT, _QWEN35_TEXT_INERT)),
        )
        vf = Fields(
            sub_config(raw, "vision_config", vision_mt, mt), vision_mt, _QWEN35_VISION, _QWEN35_VISION_INERT
        )
        t = Tree(layout, cls, mt)
        t.add("model")
        _qwen35_vision(t, vf, "model.visual")
        t.add("model.language_model")
        h, v = _qwen35_text(t, tf, "model.language_model.", moe)
        return t.lm_head(h, v, top, tf)

    return build


# ------------------------------------------------------------------------------------- tiny configs

_QWEN35_LINEAR = dict(
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16
)


_QWEN35_MOE = dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
)


_QWEN_VISION = QWEN_VISION_TINY


def _qwen3_5_text() -> dict[str, object]:
    return {**DECODER, **_QWEN35_LINEAR}


def _qwen3_5_moe_text() -> dict[str, object]:
    return {**DECODER, **_QWEN35_LINEAR, **_QWEN35_MOE}


class _Shared(TypedDict):
    """The :class:`Layout` fields the VL class and the text-only class of one pair share."""

    family: str
    model_module: str
    lora_leaves: tuple[str, ...]
    target_parameters: tuple[str, ...]
    hint: str


def _pair(moe: bool) -> tuple[Layout, Layout]:
    """The VL class and the text-only class of Qwen3.5 dense (``moe`` false) or MoE: one family each, the same
    LoRA leaves and the same moves between the two; the MoE pair adds the fused experts and the shared expert."""
    fam = "qwen3_5_moe" if moe else "qwen3_5"
    cls = "Qwen3_5Moe" if moe else "Qwen3_5"
    vl, text = f"{fam}_vl", f"{fam}_text"
    kind = "MoE" if moe else "dense"
    shared = _Shared(
        family=fam,
        model_module=f"transformers.models.{fam}.modeling_{fam}",
        lora_leaves=ATTN + MLP + _DELTANET,
        target_parameters=_EXPERTS if moe else (),
        hint=r"qwen3[._-]?[56].*(a\d+b|moe)" if moe else r"qwen3[._-]?[56](?!.*(a\d+b|moe))",
    )
    tiny_text = _qwen3_5_moe_text if moe else _qwen3_5_text
    deltanet = "Gated-DeltaNet linear-attention modules"
    shared_expert = (r"\.mlp\.shared_expert\.", "shared-expert MLP (Qwen3.5-MoE)")
    return (
        Layout(
            name=vl,
            model_class=f"{cls}ForConditionalGeneration",
            counterpart_config="text_config",
            model_type=fam,
            description=(
                "Qwen3.5 / Qwen3.6 MoE vision-language, fused experts (model.language_model.*)"
                if moe
                else "Qwen3.5 / Qwen3.6 dense vision-language (model.language_model.*, model.visual)"
            ),
            requires=(VL_LM,) if moe else (_VL_DECODER_OR_DELTANET,),
            forbids=(r"^thinker\.", DENSE_MLP, *_OMNI_THINKER_ONLY) if moe else (MOE, r"^thinker\."),
            signals=(
                ((LINEAR_ATTN, deltanet), shared_expert, *EXPERT_SIGNALS)
                if moe
                else (
                    (r"\.linear_attn\.in_proj_qkv$", "Gated-DeltaNet in_proj_qkv (Qwen3.5 linear attention)"),
                )
            ),
            experts=QWEN35_MOE_EXPERTS if moe else None,
            attention_layers="hybrid",
            towers=("visual", "mtp"),
            remaps={text: (STRIP_LANGUAGE_MODEL,)},
            text_counterpart=text,
            tiny=Tiny(
                f"{cls}Config", lambda: dict(text_config=tiny_text(), vision_config=dict(_QWEN_VISION))
            ),
            tree=_qwen35_vl(vl, f"{cls}ForConditionalGeneration", fam, moe=moe),
            **shared,
        ),
        Layout(
            name=text,
            model_class=f"{cls}ForCausalLM",
            model_type=text,
            description=f"Qwen3.5 {kind}, text-only class (model.layers.*)",
            requires=(TEXT_LM,) if moe else (_TEXT_DECODER_OR_DELTANET,),
            forbids=(DENSE_MLP, BERT_LEAF, r"^visual\.") if moe else (MOE, BERT_LEAF),
            signals=((LINEAR_ATTN, deltanet), shared_expert, *EXPERT_SIGNALS)
            if moe
            else ((LINEAR_ATTN, f"{deltanet} (Qwen3.5)"),),
            experts=QWEN35_MOE_TEXT_EXPERTS if moe else None,
            attention_layers="hybrid",
            towers=("mtp",),
            remaps={vl: (ADD_LANGUAGE_MODEL,)},
            tiny=Tiny(f"{cls}TextConfig", tiny_text),
            tree=_qwen35_causal(text, f"{cls}ForCausalLM", text, moe=moe),
            load_conversion=True,
            **shared,
        ),
    )


ENTRIES: tuple[Layout, ...] = (*_pair(moe=False), *_pair(moe=True))

SMOKE: tuple[str, ...] = ("qwen3_5_vl", "qwen3_5_moe_vl")
"""This family's layouts in ``train-smoke --layout all``, in run order."""
