"""Qwen3-Omni's speech half: the talker and code2wav module trees, which the full wrapper
(Qwen3OmniMoeForConditionalGeneration) builds when ``enable_audio_output`` is true (transformers 5.24's default,
and what the released Instruct checkpoints carry).

Read from transformers 5.24 ``qwen3_omni_moe/modeling_qwen3_omni_moe.py``: Qwen3OmniMoeTalkerForConditionalGeneration
(``model`` with MoE decoder layers whose ``mlp`` is always Qwen3OmniMoeTalkerTextSparseMoeBlock: router ``gate``,
fused ``experts``, ``shared_expert`` MLP and ``shared_expert_gate``; ``text_projection`` / ``hidden_projection``
Qwen3OmniMoeTalkerResizeMLP; ``codec_head``; ``code_predictor`` with ``num_code_groups - 1`` codec embeddings and
heads) and Qwen3OmniMoeCode2Wav (``pre_transformer``, ``code_embedding``, ``upsample`` ConvTranspose1d + ConvNeXt
blocks, ``decoder`` convolutions with SnakeBeta activations). Config fields from
``configuration_qwen3_omni_moe.py``: the talker and code2wav configs have no ``model_type`` of their own (they
save ``""``), the talker text config has no ``shared_expert_intermediate_size`` / ``head_dim`` fields (the modeling
code reads them as extra attributes: without ``shared_expert_intermediate_size`` the wrapper does not build), and
the talker reads ``spatial_merge_size``, which its config class does not define either.

Not a family module of its own: :mod:`adapterdoc.layouts.qwen3_omni` calls :func:`talker` and :func:`code2wav`.
"""

from __future__ import annotations

from collections.abc import Mapping

from adapterdoc.layouts.trees import CONV, EXPERTS, Fields, Tree, Unmodeled, attention, mlp, sub_config

_TALKER_TEXT = {
    "vocab_size": 3072,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": None,
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 384,
    "num_experts": 128,
    "mlp_only_layers": None,
    "shared_expert_intermediate_size": None,
    "tie_word_embeddings": False,
}
"""Qwen3OmniMoeTalkerTextConfig (``head_dim`` and ``shared_expert_intermediate_size`` are extra attributes)."""
MOE_TEXT_INERT = frozenset(
    {
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "attention_dropout",
        "output_router_logits",
        "router_aux_loss_coef",
        "num_experts_per_tok",
        "norm_topk_prob",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
    }
)
"""Fields of the Qwen3-MoE-style text configs (the talker's, its code predictor's, and the thinker's and Qwen3-MoE's
with a few more in :mod:`adapterdoc.layouts.qwen3_omni`) that no module's shape depends on."""
_PREDICTOR = {
    "vocab_size": 2048,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_bias": False,
    "num_code_groups": 32,
    "tie_word_embeddings": False,
    "layer_types": None,
}
"""Qwen3OmniMoeTalkerCodePredictorConfig."""
_TALKER = {
    "text_config": None,
    "code_predictor_config": None,
    "thinker_hidden_size": 2048,
    "spatial_merge_size": None,
    "tie_word_embeddings": False,
}
_TALKER_INERT = frozenset(
    {
        "num_code_groups",
        "codec_eos_token_id",
        "accept_hidden_layer",
        "codec_nothink_id",
        "codec_think_bos_id",
        "codec_think_eos_id",
        "codec_pad_id",
        "codec_bos_id",
        "audio_token_id",
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "position_id_per_seconds",
        "audio_start_token_id",
        "audio_end_token_id",
        "seconds_per_chunk",
        "speaker_id",
        "output_router_logits",
    }
)
"""The talker's own ``num_code_groups`` is unread by its modules (the code predictor reads its own)."""
_CODE2WAV = {
    "codebook_size": 2048,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": None,
    "attention_bias": False,
    "intermediate_size": 3072,
    "num_hidden_layers": 8,
    "num_quantizers": 16,
    "upsample_rates": None,
    "upsampling_ratios": None,
    "decoder_dim": 1536,
}
"""Qwen3OmniMoeCode2WavConfig (``head_dim`` an extra attribute; ``upsample_rates`` / ``upsampling_ratios`` must be
saved: a tuple default added to a saved list does not build)."""
_CODE2WAV_INERT = frozenset(
    {
        "max_position_embeddings",
        "rope_parameters",
        "rope_theta",
        "sliding_window",
        "hidden_act",
        "layer_scale_initial_scale",
        "rms_norm_eps",
        "attention_dropout",
        "codebook_dim",
        "num_semantic_quantizers",
        "semantic_codebook_size",
        "vector_quantization_hidden_dimension",
    }
)
"""``codebook_dim`` ... ``vector_quantization_hidden_dimension``: in the released Instruct config, read by no module."""


def _head_dim(f: Fields, h: int, nh: int) -> int:
    """``getattr(config, "head_dim", hidden_size // num_attention_heads)``: an explicit ``null`` is read as is."""
    if "head_dim" in f.raw and f.raw["head_dim"] is None:
        raise Unmodeled(f"{f.where} `head_dim` is null (the attention reads it as is)")
    return h // nh if f["head_dim"] is None else f.int("head_dim")


def _attention(t: Tree, a: str, h: int, nh: int, nkv: int, hd: int, bias: bool, norms: bool) -> None:
    attention(t, a, h, nh, nkv, hd, bias, norms=("q_norm", "k_norm") if norms else ())
    if not norms:  # nn.Identity
        t.add(a + ".q_norm")
        t.add(a + ".k_norm")


def _dense_layer(
    t: Tree, q: str, h: int, nh: int, nkv: int, hd: int, bias: bool, inter: int, norms: bool
) -> None:
    """A dense decoder layer under ``q`` (the code predictor's, code2wav's pre-transformer's): attention, a gated
    MLP, the input and post-attention norms."""
    _attention(t, q + ".self_attn", h, nh, nkv, hd, bias, norms)
    mlp(t, q + ".mlp", h, inter)
    t.norm(q + ".input_layernorm")
    t.norm(q + ".post_attention_layernorm")


def _sizes(f: Fields) -> tuple[int, int, int, int, bool]:
    h, nh = f.int("hidden_size"), f.int("num_attention_heads")
    if "num_key_value_heads" in f.raw and f.raw["num_key_value_heads"] is None:
        raise Unmodeled(f"{f.where} `num_key_value_heads` is null")
    nkv = f.int("num_key_value_heads")
    return h, nh, nkv, _head_dim(f, h, nh), f.flag("attention_bias")


def _untied(f: Fields) -> None:
    if f.flag("tie_word_embeddings"):
        raise Unmodeled(f"{f.where} `tie_word_embeddings` is true (tied talker weights are not modelled)")


def _talker_text(t: Tree, f: Fields, p: str) -> tuple[int, int, int]:
    """Qwen3OmniMoeTalkerModel under ``p``: (hidden, vocab, intermediate)."""
    h, nh, nkv, hd, bias = _sizes(f)
    v, n, inter = f.int("vocab_size"), f.int("num_hidden_layers", 0), f.int("intermediate_size")
    step, e, mi = f.int("decoder_sparse_step"), f.int("num_experts"), f.int("moe_intermediate_size")
    only = f["mlp_only_layers"]
    if only is not None and (
        not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only)
    ):
        raise Unmodeled(f"{f.where} `mlp_only_layers` is not a list of layer indices")
    del step  # read only to pick the module each layer builds first and then replaces
    if f["shared_expert_intermediate_size"] is None:
        raise Unmodeled(
            f"{f.where} has no `shared_expert_intermediate_size` (transformers cannot build the talker without it)"
        )
    si = f.int("shared_expert_intermediate_size")
    _untied(f)
    t.add(p)
    for q in t.layers(p + ".layers", n):
        _attention(t, q + ".self_attn", h, nh, nkv, hd, bias, norms=True)
        m = q + ".mlp"
        t.add(m)
        t.norm(m + ".gate")
        t.other_params[m + ".gate"] = (("weight", (e, h)),)
        t.add(m + ".experts", EXPERTS, (("gate_up_proj", (e, 2 * mi, h)), ("down_proj", (e, h, mi))))
        t.add(m + ".experts.act_fn")
        mlp(t, m + ".shared_expert", h, si)
        t.linear(m + ".shared_expert_gate", h, 1)
        t.norm(q + ".input_layernorm")
        t.norm(q + ".post_attention_layernorm")
    t.norm(p + ".norm")
    t.add(p + ".rotary_emb")
    t.embedding(p + ".codec_embedding", v, h)
    return h, v, inter


def _layer_types(f: Fields, n: int) -> None:
    lt = f["layer_types"]
    if lt is not None and (
        not isinstance(lt, list)
        or len(lt) != n
        or not all(x in ("full_attention", "sliding_attention") for x in lt)
    ):
        raise Unmodeled(f"{f.where} `layer_types` is not one attention type per layer")


def _code_predictor(t: Tree, f: Fields, p: str) -> None:
    """Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration under ``p``."""
    h, nh, nkv, hd, bias = _sizes(f)
    v, n, inter = f.int("vocab_size"), f.int("num_hidden_layers", 0), f.int("intermediate_size")
    groups = f.int("num_code_groups")
    _layer_types(f, n)
    _untied(f)
    t.add(p)
    t.add(p + ".model")
    for q in t.layers(p + ".model.layers", n):
        _dense_layer(t, q, h, nh, nkv, hd, bias, inter, norms=True)
    t.norm(p + ".model.norm")
    t.add(p + ".model.rotary_emb")
    t.add(p + ".model.codec_embedding")
    for j in range(groups - 1):
        t.embedding(f"{p}.model.codec_embedding.{j}", v, h)
    t.add(p + ".lm_head")
    for j in range(groups - 1):
        t.linear(f"{p}.lm_head.{j}", h, v)


def talker(t: Tree, raw: Mapping[str, object]) -> None:
    """The wrapper's ``talker`` (Qwen3OmniMoeTalkerForConditionalGeneration)."""
    where = "qwen3_omni_moe talker_config"
    sub = sub_config(raw, "talker_config", "", "qwen3_omni_moe")
    f = Fields(sub, where, _TALKER, _TALKER_INERT)
    if f["spatial_merge_size"] is None:
        raise Unmodeled(
            f"{where} has no `spatial_merge_size` (transformers cannot build the talker without it)"
        )
    f.int("spatial_merge_size")
    _untied(f)
    text = sub_config(sub, "text_config", "qwen3_omni_moe_talker_text", where)
    if "num_local_experts" in text:  # attribute_map: num_experts is saved as num_local_experts
        if "num_experts" in text and text["num_experts"] != text["num_local_experts"]:
            raise Unmodeled(f"{where} text_config `num_experts` and `num_local_experts` differ")
        text = {k: v for k, v in text.items() if k != "num_local_experts"} | {
            "num_experts": text["num_local_experts"]
        }
    tf = Fields(text, "qwen3_omni_moe_talker_text", _TALKER_TEXT, MOE_TEXT_INERT | {"layer_types"})
    cf = Fields(
        sub_config(sub, "code_predictor_config", "qwen3_omni_moe_talker_code_predictor", where),
        "qwen3_omni_moe_talker_code_predictor",
        _PREDICTOR,
        MOE_TEXT_INERT,
    )
    t.add("talker")
    h, v, inter = _talker_text(t, tf, "talker.model")
    think = f.int("thinker_hidden_size")
    for proj in ("text_projection", "hidden_projection"):
        t.add(f"talker.{proj}")
        t.linear(f"talker.{proj}.linear_fc1", think, inter, True)
        t.linear(f"talker.{proj}.linear_fc2", inter, h, True)
        t.add(f"talker.{proj}.act_fn")
    t.linear("talker.codec_head", h, v)
    _code_predictor(t, cf, "talker.code_predictor")


def _conv(t: Tree, name: str, cin: int, cout: int, k: int, groups: int = 1) -> None:
    """Qwen3OmniMoeCausalConvNet: a Conv1d under ``name.conv`` (its 3-D weight is listed, as the meta census
    reads it)."""
    t.add(name)
    t.add(name + ".conv", CONV, (("weight", (cout, cin // groups, k)), ("bias", (cout,))), ("weight", "bias"))


def _trans_conv(t: Tree, name: str, cin: int, cout: int, k: int) -> None:
    """Qwen3OmniMoeCausalTransConvNet: a ConvTranspose1d (weight ``[in, out, k]``) under ``name.conv``."""
    t.add(name)
    t.add(name + ".conv", CONV, (("weight", (cin, cout, k)), ("bias", (cout,))), ("weight", "bias"))


def _snake(t: Tree, name: str) -> None:
    t.norm(name, ("alpha", "beta"))


def _rates(f: Fields, key: str) -> list[int]:
    v = f.raw.get(key)
    if not isinstance(v, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v
    ):
        raise Unmodeled(f"{f.where} `{key}` is {v!r}, not a saved list of positive integers")
    return v


def code2wav(t: Tree, raw: Mapping[str, object]) -> None:
    """The wrapper's ``code2wav`` (Qwen3OmniMoeCode2Wav)."""
    f = Fields(
        sub_config(raw, "code2wav_config", "", "qwen3_omni_moe"),
        "qwen3_omni_moe code2wav_config",
        _CODE2WAV,
        _CODE2WAV_INERT,
    )
    h, nh, nkv, hd, bias = _sizes(f)
    n, inter, dd = f.int("num_hidden_layers", 0), f.int("intermediate_size"), f.int("decoder_dim")
    books, quant = f.int("codebook_size"), f.int("num_quantizers")
    rates, ratios = _rates(f, "upsample_rates"), _rates(f, "upsampling_ratios")
    if dd >> len(rates) < 1:
        raise Unmodeled(f"{f.where} `decoder_dim` halves to 0 channels over `upsample_rates`")
    p = "code2wav"
    t.add(p)
    t.add(p + ".pre_transformer")
    for q in t.layers(p + ".pre_transformer.layers", n):
        _dense_layer(t, q, h, nh, nkv, hd, bias, inter, norms=False)
        t.norm(q + ".self_attn_layer_scale", ("scale",))
        t.norm(q + ".mlp_layer_scale", ("scale",))
    t.norm(p + ".pre_transformer.norm")
    t.add(p + ".pre_transformer.rotary_emb")
    t.embedding(p + ".code_embedding", books * quant, h)
    t.add(p + ".upsample")
    for i, factor in enumerate(ratios):
        u = f"{p}.upsample.{i}"
        t.add(u)
        _trans_conv(t, u + ".0", h, h, factor)
        t.norm(u + ".1", ("gamma",))  # Qwen3OmniMoeConvNeXtBlock
        _conv(t, u + ".1.dwconv", h, h, 7, groups=h)
        t.norm(u + ".1.norm", ("weight", "bias"))
        t.linear(u + ".1.pwconv1", h, 4 * h, True)
        t.add(u + ".1.act")
        t.linear(u + ".1.pwconv2", 4 * h, h, True)
    t.add(p + ".decoder")
    _conv(t, p + ".decoder.0", h, dd, 7)
    for i, rate in enumerate(rates):
        b = f"{p}.decoder.{i + 1}"
        cin, cout = dd >> i, dd >> (i + 1)
        t.add(b)
        t.add(b + ".block")
        _snake(t, b + ".block.0")
        _trans_conv(t, b + ".block.1", cin, cout, 2 * rate)
        for j in range(3):  # residual units, dilation 1, 3, 9
            r = f"{b}.block.{j + 2}"
            t.add(r)
            _snake(t, r + ".act1")
            _conv(t, r + ".conv1", cout, cout, 7)
            _snake(t, r + ".act2")
            _conv(t, r + ".conv2", cout, cout, 1)
    out = dd >> len(rates)
    _snake(t, f"{p}.decoder.{len(rates) + 1}")
    _conv(t, f"{p}.decoder.{len(rates) + 2}", out, 1, 7)


__all__ = ["code2wav", "talker"]
