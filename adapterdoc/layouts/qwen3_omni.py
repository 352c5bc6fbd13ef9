"""Qwen3-Omni: the full wrapper (forward through its thinker), the thinker alone, and Qwen3-MoE, the
thinker's text-only stand-in."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from adapterdoc.layouts.common import (
    ATTN,
    BERT_LEAF,
    DECODER,
    EXPERT_SIGNALS,
    FUSED_EXPERTS,
    HIDDEN,
    LINEAR_ATTN,
    OMNI_EXPERTS,
    QWEN_MOE_EXPERTS,
    QWEN_VISION_DEFAULTS,
    QWEN_VISION_TINY,
    TEXT_LM,
    VL_LM,
)
from adapterdoc.layouts.qwen3_omni_talker import MOE_TEXT_INERT, code2wav, talker
from adapterdoc.layouts.registry import (
    ADD_LANGUAGE_MODEL,
    QWEN2_MOE_CONVERSION,
    STRIP_LANGUAGE_MODEL,
    Layout,
    Rule,
    Tiny,
)
from adapterdoc.layouts.trees import CONV, EXPERTS, Fields, Tree, Unmodeled, attention, mlp, sub_config
from adapterdoc.layouts.vision import patch_merger, vision_blocks, vision_sizes

# ------------------------------------------------------------------------------------- module trees
# Read from transformers 5.24's qwen3_moe/modeling_qwen3_moe.py (Qwen3MoeForCausalLM: fused 3-D experts,
# Qwen3MoeExperts.gate_up_proj [E, 2I, H] and down_proj [E, H, I]; no per-expert nn.Linear in transformers 5) and
# qwen3_omni_moe/modeling_qwen3_omni_moe.py (Qwen3OmniMoeThinkerForConditionalGeneration: audio_tower, visual,
# language_model; Qwen3OmniMoeForConditionalGeneration: thinker, plus talker and code2wav only when
# ``enable_audio_output``: adapterdoc.layouts.qwen3_omni_talker).

_MOE_TEXT = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": None,
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "mlp_only_layers": None,
    "tie_word_embeddings": False,
}
"""Qwen3MoeConfig's tree fields and defaults (``head_dim`` ``None``: ``hidden_size // num_attention_heads``, as
the attention's ``getattr(config, "head_dim", ...)`` reads it when the config has none)."""

_OMNI_TEXT = {
    **_MOE_TEXT,
    "vocab_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
}
"""Qwen3OmniMoeTextConfig (the thinker's ``text_config``); the same module tree as Qwen3-MoE."""

_MOE_TEXT_INERT = MOE_TEXT_INERT | {"layer_types", "use_qk_norm", "shared_expert_intermediate_size"}
"""``use_qk_norm`` and ``shared_expert_intermediate_size`` (``0``) are in the released Omni thinker's text config,
read by no thinker module (only the talker's MoE block reads its own ``shared_expert_intermediate_size``)."""

_AUDIO = {
    "num_mel_bins": 128,
    "encoder_layers": 32,
    "encoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "d_model": 1280,
    "output_dim": 3584,
    "downsample_hidden_size": 480,
}
_AUDIO_INERT = frozenset(
    {
        "dropout",
        "attention_dropout",
        "activation_function",
        "activation_dropout",
        "scale_embedding",
        "max_source_positions",
        "n_window",
        "n_window_infer",
        "conv_chunksize",
        "tie_word_embeddings",
    }
)
"""``tie_word_embeddings`` of a tower's config ties nothing: the tower classes have no ``_tied_weights_keys``."""
_VISION = {**QWEN_VISION_DEFAULTS, "deepstack_visual_indexes": [8, 16, 24]}
_VISION_INERT = frozenset(
    {
        "hidden_act",
        "rope_parameters",
        "tie_word_embeddings",
        "apply_vit_abs_pos_embed",
        "image_size",
        "in_chans",
        "spatial_patch_size",
        "tokens_per_second",
    }
)
"""The released config's ``apply_vit_abs_pos_embed`` ... ``tokens_per_second`` are read by no module."""
_THINKER = {"tie_word_embeddings": False, "text_config": None, "audio_config": None, "vision_config": None}
_THINKER_INERT = frozenset(
    {
        "position_id_per_seconds",
        "audio_start_token_id",
        "audio_token_id",
        "image_token_id",
        "video_token_id",
        "user_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "audio_end_token_id",
        "enable_audio_output",
        "seconds_per_chunk",
    }
)
"""``enable_audio_output`` is the wrapper's field; a thinker config saved from a wrapper may carry it (unread)."""
_OMNI = {"thinker_config": None, "enable_audio_output": True}
_OMNI_INERT = frozenset(
    {
        "talker_config",
        "code2wav_config",
        "im_start_token_id",
        "im_end_token_id",
        "tts_pad_token_id",
        "tts_bos_token_id",
        "tts_eos_token_id",
        "system_token_id",
        "user_token_id",
        "assistant_token_id",
    }
)
"""``talker_config`` / ``code2wav_config`` build nothing unless ``enable_audio_output`` (then read by
:func:`adapterdoc.layouts.qwen3_omni_talker.talker` / ``code2wav``)."""


def _moe_layers(f: Fields, n: int) -> list[bool]:
    """Which decoder layers hold a sparse MoE block: ``layer not in mlp_only_layers and num_experts > 0 and
    (layer + 1) % decoder_sparse_step == 0`` (Qwen3MoeDecoderLayer.__init__)."""
    step, experts = f.int("decoder_sparse_step"), f.int("num_experts", 0)
    only = f["mlp_only_layers"]
    only = [] if only is None else only
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise Unmodeled(f"{f.where} `mlp_only_layers` is not a list of layer indices")
    return [i not in only and experts > 0 and (i + 1) % step == 0 for i in range(n)]


def _moe_text(t: Tree, f: Fields, p: str) -> tuple[int, int]:
    """Qwen3MoeModel / Qwen3OmniMoeThinkerTextModel under the prefix ``p``."""
    h, v, n = f.int("hidden_size"), f.int("vocab_size"), f.int("num_hidden_layers", 0)
    nh, nkv = f.int("num_attention_heads"), f.int("num_key_value_heads")
    hd = h // nh if f["head_dim"] is None else f.int("head_dim")
    bias = f.flag("attention_bias")
    inter = f.int("intermediate_size")
    sparse = _moe_layers(f, n)
    if any(sparse):
        e, mi = f.int("num_experts"), f.int("moe_intermediate_size")
    t.embedding(p + "embed_tokens", v, h, inputs=True)
    for q, is_sparse in zip(t.layers(p + "layers", n), sparse):
        attention(t, q + ".self_attn", h, nh, nkv, hd, bias, norms=("q_norm", "k_norm"))
        m = q + ".mlp"
        if is_sparse:
            t.add(m)
            t.add(m + ".experts", EXPERTS, (("gate_up_proj", (e, 2 * mi, h)), ("down_proj", (e, h, mi))))
            t.add(m + ".experts.act_fn")
            t.norm(m + ".gate")
            t.other_params[m + ".gate"] = (("weight", (e, h)),)
        else:
            mlp(t, m, h, inter)
        t.norm(q + ".input_layernorm")
        t.norm(q + ".post_attention_layernorm")
    t.norm(p + "norm")
    t.add(p + "rotary_emb")
    return h, v


def _moe_fields(raw: Mapping[str, object], where: str, defaults: Mapping[str, object]) -> Fields:
    if "num_local_experts" in raw:  # Qwen3MoeConfig maps num_experts to num_local_experts (what it saves)
        if "num_experts" in raw and raw["num_experts"] != raw["num_local_experts"]:
            raise Unmodeled(f"{where} `num_experts` and `num_local_experts` differ")
        raw = {k: v for k, v in raw.items() if k != "num_local_experts"} | {
            "num_experts": raw["num_local_experts"]
        }
    return Fields(raw, where, defaults, _MOE_TEXT_INERT)


def _qwen3_moe(raw: Mapping[str, object]) -> Tree:
    f = _moe_fields(raw, "qwen3_moe", _MOE_TEXT)
    t = Tree("qwen3_moe_text", "Qwen3MoeForCausalLM", "qwen3_moe", own={})
    t.add("model")
    h, v = _moe_text(t, f, "model.")
    return t.lm_head(h, v, f)


def _audio(t: Tree, f: Fields, p: str) -> None:
    d, n, ffn = f.int("d_model"), f.int("encoder_layers", 0), f.int("encoder_ffn_dim")
    if d % f.int("encoder_attention_heads"):
        raise Unmodeled(f"{f.where} `d_model` is not divisible by `encoder_attention_heads`")
    ds, mel, out = f.int("downsample_hidden_size"), f.int("num_mel_bins"), f.int("output_dim")
    t.add(p)
    t.add(p + ".positional_embedding")
    for b in t.layers(p + ".layers", n):
        t.add(b + ".self_attn")
        for leaf in ("k_proj", "v_proj", "q_proj", "out_proj"):
            t.linear(f"{b}.self_attn.{leaf}", d, d, True)
        t.norm(b + ".self_attn_layer_norm", ("weight", "bias"))
        t.add(b + ".activation_fn")
        t.linear(b + ".fc1", d, ffn, True)
        t.linear(b + ".fc2", ffn, d, True)
        t.norm(b + ".final_layer_norm", ("weight", "bias"))
    t.norm(p + ".ln_post", ("weight", "bias"))
    for c in ("conv2d1", "conv2d2", "conv2d3"):
        t.add(f"{p}.{c}", CONV, own=("weight", "bias"))
    t.linear(p + ".conv_out", ds * ((((mel + 1) // 2 + 1) // 2 + 1) // 2), d)
    t.linear(p + ".proj1", d, d, True)
    t.add(p + ".act")
    t.linear(p + ".proj2", d, out, True)


def _vision(t: Tree, f: Fields, p: str) -> None:
    d, inter, depth, s, out, npos = vision_sizes(f)
    deep = f["deepstack_visual_indexes"]
    if not isinstance(deep, list):
        raise Unmodeled(f"{f.where} `deepstack_visual_indexes` is not a list")
    t.add(p)
    t.add(p + ".merger_list")
    for i in range(len(deep)):
        patch_merger(t, f"{p}.merger_list.{i}", d * s * s, out)
    vision_blocks(t, p, d, inter, depth, npos)
    patch_merger(t, p + ".merger", d * s * s, out)


def _thinker(t: Tree, raw: Mapping[str, object], p: str, where: str) -> bool:
    """Qwen3OmniMoeThinkerForConditionalGeneration under ``p`` (``""`` or ``thinker.``); whether it ties."""
    top = Fields(raw, where, _THINKER, _THINKER_INERT)
    tf = _moe_fields(
        sub_config(raw, "text_config", "qwen3_omni_moe_text", where), "qwen3_omni_moe_text", _OMNI_TEXT
    )
    af = Fields(
        sub_config(raw, "audio_config", "qwen3_omni_moe_audio_encoder", where),
        "qwen3_omni_moe_audio_encoder",
        _AUDIO,
        _AUDIO_INERT,
    )
    vf = Fields(
        sub_config(raw, "vision_config", "qwen3_omni_moe_vision_encoder", where),
        "qwen3_omni_moe_vision_encoder",
        _VISION,
        _VISION_INERT,
    )
    t.add(p + "model")
    _audio(t, af, p + "model.audio_tower")
    _vision(t, vf, p + "model.visual")
    t.add(p + "model.language_model")
    h, v = _moe_text(t, tf, p + "model.language_model.")
    t.linear(p + "lm_head", h, v)
    return top.flag("tie_word_embeddings") or tf.flag("tie_word_embeddings")


def _qwen3_omni_thinker(raw: Mapping[str, object]) -> Tree:
    t = Tree(
        "qwen3_omni_thinker", "Qwen3OmniMoeThinkerForConditionalGeneration", "qwen3_omni_moe_thinker", own={}
    )
    t.tied = _thinker(t, raw, "", "qwen3_omni_moe_thinker")
    t.output_embedding = "lm_head"
    return t


def _qwen3_omni(raw: Mapping[str, object]) -> Tree:
    """The wrapper: its ``get_output_embeddings()`` is ``None``, so PEFT's ``all-linear`` keeps ``thinker.lm_head``."""
    f = Fields(raw, "qwen3_omni_moe", _OMNI, _OMNI_INERT)
    audio = f.flag("enable_audio_output")
    t = Tree("qwen3_omni", "Qwen3OmniMoeForConditionalGeneration", "qwen3_omni_moe", own={})
    t.add("thinker")
    thinker = sub_config(raw, "thinker_config", "qwen3_omni_moe_thinker", "qwen3_omni_moe")
    if _thinker(t, thinker, "thinker.", "qwen3_omni_moe_thinker"):
        raise Unmodeled("the Omni wrapper with tied thinker embeddings is not modelled")
    if audio:  # enable_talker(): the talker, then code2wav
        talker(t, raw)
        code2wav(t, raw)
    t.input_embedding = "thinker.model.language_model.embed_tokens"
    return t


# ------------------------------------------------------------------------------------- tiny configs


def _omni_text() -> dict[str, object]:
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


def _omni_thinker() -> dict[str, object]:
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
        vision_config=dict(QWEN_VISION_TINY, deepstack_visual_indexes=[0]),
    )


_OMNI_LAYOUT = partial(
    Layout,
    family="qwen3_omni",
    lora_leaves=ATTN,
    target_parameters=("gate_up_proj", "down_proj"),
    hint=r"omni",
    load_conversion=True,
    peft_moe=QWEN2_MOE_CONVERSION,
)
"""What the family's three layouts share: attention LoRA leaves, the fused experts, PEFT's Qwen2-MoE rewrite and
transformers' load-time renames."""
_OMNI_MODULE = "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe"

ENTRIES: tuple[Layout, ...] = (
    _OMNI_LAYOUT(
        name="qwen3_omni",
        model_class="Qwen3OmniMoeForConditionalGeneration",
        model_module=_OMNI_MODULE,
        counterpart_config="thinker_config",
        model_type="qwen3_omni_moe",
        description="Qwen3-Omni full wrapper (thinker.model.language_model.*; talker must never get LoRA)",
        requires=(r"^thinker\.model\.language_model\.layers\.\d+\.",),
        signals=((FUSED_EXPERTS, "fused-expert LoRA (target_parameters)"),),
        experts=OMNI_EXPERTS,
        towers=("audio_tower", "visual", "talker", "code2wav"),
        remaps={"qwen3_omni_thinker": (Rule(r"^thinker\.", ""),)},
        text_counterpart="qwen3_omni_thinker",
        tiny=Tiny(
            "Qwen3OmniMoeConfig", lambda: dict(thinker_config=_omni_thinker(), enable_audio_output=False)
        ),
        forward_via="thinker",
        move_words={"qwen3_omni_thinker": "Omni full-wrapper adapter on the thinker"},
        tree=_qwen3_omni,
    ),
    _OMNI_LAYOUT(
        name="qwen3_omni_thinker",
        model_class="Qwen3OmniMoeThinkerForConditionalGeneration",
        model_module=_OMNI_MODULE,
        counterpart_config="text_config",
        model_type="qwen3_omni_moe_thinker",
        description="Qwen3-Omni thinker alone (model.language_model.*, audio and vision towers)",
        requires=(VL_LM,),
        forbids=(LINEAR_ATTN, r"\.shared_expert\.", r"(^|\.)mtp\."),
        signals=(
            *EXPERT_SIGNALS,
            (r"^model\.audio_tower\.", "Omni audio_tower modules"),
            (r"^model\.visual\.merger_list\.", "deepstack merger_list modules (Omni vision tower)"),
        ),
        attention_layers="full",
        experts=OMNI_EXPERTS,
        towers=("audio_tower", "visual"),
        remaps={
            "qwen3_omni": (Rule(r"^(?!thinker\.)", "thinker."),),
            "qwen3_moe_text": (STRIP_LANGUAGE_MODEL,),
        },
        text_counterpart="qwen3_moe_text",
        tiny=Tiny("Qwen3OmniMoeThinkerConfig", _omni_thinker),
        move_words={"qwen3_omni": "thinker adapter on the Omni full wrapper"},
        tree=_qwen3_omni_thinker,
    ),
    _OMNI_LAYOUT(
        name="qwen3_moe_text",
        model_class="Qwen3MoeForCausalLM",
        model_module="transformers.models.qwen3_moe.modeling_qwen3_moe",
        model_type="qwen3_moe",
        description="Qwen3-MoE text class, the text stand-in for the Omni thinker (model.layers.*)",
        requires=(TEXT_LM,),
        forbids=(LINEAR_ATTN, r"\.shared_expert\.", r"(^|\.)mtp\.", BERT_LEAF, r"^visual\."),
        signals=EXPERT_SIGNALS,
        attention_layers="full",
        experts=QWEN_MOE_EXPERTS,
        remaps={"qwen3_omni_thinker": (ADD_LANGUAGE_MODEL,)},
        tiny=Tiny("Qwen3MoeConfig", lambda: {**_omni_text(), "num_local_experts": 4}),
        tree=_qwen3_moe,
    ),
)

SMOKE: tuple[str, ...] = ("qwen3_omni_thinker", "qwen3_omni")
"""This family's layouts in ``train-smoke --layout all``, in run order."""
