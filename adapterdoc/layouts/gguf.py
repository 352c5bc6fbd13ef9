"""llama.cpp's GGUF architectures for the families whose LoRA adapters ``convert --to gguf`` writes, as data.

Read from llama.cpp's own converter (``convert_hf_to_gguf.py`` and its ``conversion/`` package, vendored in
llama-cpp-python 0.3.36), which ``convert_lora_to_gguf.py`` reuses for adapters: which GGUF architecture a
``config.json`` becomes, and which tensor rewrites its ``modify_tensors`` applies to LoRA factors (they are row or
column permutations, so exact both ways). The tensor *names* are not here: they come from the ``gguf`` package's own
``TensorNameMap`` (``adapterdoc.formats.gguf.names``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufArch:
    """How llama.cpp converts one Hugging Face model class."""

    arch: str
    """The ``gguf.MODEL_ARCH`` member (its ``MODEL_ARCH_NAMES`` value is ``general.architecture``)."""
    rope_unpermute: bool = False
    """``LlamaModel.undo_permute``: the rows of ``q_proj`` (``num_attention_heads``) and ``k_proj``
    (``num_key_value_heads``) are permuted from the Hugging Face rotary layout to llama.cpp's (LoRA: ``lora_B``)."""
    v_head_tiling: bool = False
    """``_LinearAttentionVReorderBase``: where ``linear_num_key_heads != linear_num_value_heads`` the linear-attention
    V heads go from grouped to tiled order (LoRA: rows of ``lora_B`` of ``in_proj_qkv`` (V part), ``in_proj_z``,
    ``in_proj_a``, ``in_proj_b``; columns of ``lora_A`` of ``out_proj``)."""
    layer_modules: tuple[str, ...] = ()
    """The family's own module paths inside ``model.layers.N`` where they differ from :data:`LAYER_MODULES` (the
    reverse map, GGUF → PEFT: Phi-3's fused ``qkv_proj``/``gate_up_proj`` and Starcoder2's ``c_fc``/``c_proj`` have
    the GGUF names ``attn_qkv``/``ffn_up``/``ffn_down`` that ``up_proj``/``down_proj`` have elsewhere)."""


_LLAMA = GgufArch("LLAMA", rope_unpermute=True)
_QWEN35 = GgufArch("QWEN35", v_head_tiling=True)
_QWEN35MOE = GgufArch("QWEN35MOE", v_head_tiling=True)
_MISTRAL3 = GgufArch("MISTRAL3", rope_unpermute=True)
_OLMO2 = GgufArch("OLMO2")
_PHI3 = GgufArch(
    "PHI3",
    layer_modules=("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"),
)
_STABLELM = GgufArch("STABLELM")

ARCHES: dict[str, GgufArch] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": GgufArch("QWEN2"),
    "Qwen3ForCausalLM": GgufArch("QWEN3"),
    "Qwen3MoeForCausalLM": GgufArch("QWEN3MOE"),
    "Qwen3_5ForCausalLM": _QWEN35,
    "Qwen3_5ForConditionalGeneration": _QWEN35,
    "Qwen3_5MoeForCausalLM": _QWEN35MOE,
    "Qwen3_5MoeForConditionalGeneration": _QWEN35MOE,
    "Ministral3ForCausalLM": _MISTRAL3,
    "Mistral3ForConditionalGeneration": _MISTRAL3,
    # dense decoders whose converter class leaves the LoRA-targeted linear weights as they are (its
    # ``modify_tensors`` touches norms, biases or nothing) or applies LlamaModel's q/k permutation
    # (``undo_permute = True`` on a LlamaModel subclass, or OlmoModel's own copy of it)
    "GraniteForCausalLM": GgufArch("GRANITE", rope_unpermute=True),
    "SmolLM3ForCausalLM": GgufArch("SMOLLM3", rope_unpermute=True),
    "ArceeForCausalLM": GgufArch("ARCEE", rope_unpermute=True),
    "OlmoForCausalLM": GgufArch("OLMO", rope_unpermute=True),
    "OLMoForCausalLM": GgufArch("OLMO", rope_unpermute=True),
    "Olmo2ForCausalLM": _OLMO2,
    "Olmo3ForCausalLM": _OLMO2,
    "StableLmForCausalLM": _STABLELM,
    "StableLMEpochForCausalLM": _STABLELM,
    "Phi3ForCausalLM": _PHI3,
    "Starcoder2ForCausalLM": GgufArch(
        "STARCODER2",
        layer_modules=(
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.c_fc",
            "mlp.c_proj",
        ),
    ),
    "CohereForCausalLM": GgufArch("COMMAND_R"),
    "GemmaForCausalLM": GgufArch("GEMMA"),
    "Gemma2ForCausalLM": GgufArch("GEMMA2"),
    "Gemma3ForCausalLM": GgufArch("GEMMA3"),
    "SeedOssForCausalLM": GgufArch("SEED_OSS"),
    "Exaone4ForCausalLM": GgufArch("EXAONE4"),
    "NemotronForCausalLM": GgufArch("NEMOTRON"),
    "HunYuanDenseV1ForCausalLM": GgufArch("HUNYUAN_DENSE"),
    "Cohere2ForCausalLM": GgufArch("COHERE2"),
    "Ernie4_5ForCausalLM": GgufArch("ERNIE4_5"),
    "Ernie4_5_ForCausalLM": GgufArch("ERNIE4_5"),
    "Jais2ForCausalLM": GgufArch("JAIS2"),
    "ApertusForCausalLM": GgufArch("APERTUS"),
    "Qwen2MoeForCausalLM": GgufArch("QWEN2MOE"),
    "GlmForCausalLM": GgufArch(
        "CHATGLM",
        layer_modules=(
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_up_proj",
            "mlp.down_proj",
        ),
    ),
    "PhiForCausalLM": GgufArch(
        "PHI2",
        layer_modules=(
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.dense",
            "mlp.fc1",
            "mlp.fc2",
        ),
    ),
}
"""``config.json`` ``architectures[0]`` → llama.cpp's text architecture (``get_model_architecture(hparams,
ModelType.TEXT)``: a VL wrapper's text part; the vision tower goes to a separate mmproj file without LoRA).
Each entry is llama.cpp's ``TEXT_MODEL_MAP`` class with its ``model_arch`` (tests/formats/test_gguf_families_oracle.py
checks both against llama.cpp's own package) and is proven by llama.cpp's loader on a tiny model of the family."""

REFUSED: dict[str, str] = {
    "Qwen3OmniMoeForConditionalGeneration": "llama.cpp converts the Omni thinker, but its LoRA path is not checked "
    "against llama.cpp here",
    "Qwen3OmniMoeThinkerForConditionalGeneration": "no llama.cpp converter registers the bare thinker class",
    "ModernBertForMaskedLM": "llama.cpp has no LoRA path for encoder models",
    "ModernBertModel": "llama.cpp has no LoRA path for encoder models",
    "GPTNeoXForCausalLM": "llama.cpp reorders query_key_value's rows from per-head [q, k, v] to [Q, K, V] "
    "(GPTNeoXModel.modify_tensors), a rewrite adapterdoc does not write",
    "BaichuanForCausalLM": "llama.cpp splits and permutes the fused W_pack (BaichuanModel.modify_tensors), a rewrite "
    "adapterdoc does not write",
    "BaiChuanForCausalLM": "llama.cpp splits and permutes the fused W_pack (BaichuanModel.modify_tensors), a rewrite "
    "adapterdoc does not write",
    "GraniteMoeForCausalLM": "llama.cpp splits the experts' fused input_linear into gate and up "
    "(GraniteMoeModel.modify_tensors), an expert layout adapterdoc does not write",
    "GraniteMoeSharedForCausalLM": "llama.cpp splits the experts' fused input_linear into gate and up "
    "(GraniteMoeModel.modify_tensors), an expert layout adapterdoc does not write",
    "BitnetForCausalLM": "llama.cpp quantizes the projections to ternary values (BitnetModel.modify_tensors): a "
    "LoRA delta has no such form",
    "BitNetForCausalLM": "llama.cpp quantizes the projections to ternary values (BitnetModel.modify_tensors): a "
    "LoRA delta has no such form",
    "TalkieForCausalLM": "llama.cpp multiplies the query/key rows by ±1 per head (TalkieModel.modify_tensors), a "
    "rewrite adapterdoc does not write",
}
"""Classes that ``convert --to gguf`` refuses, and why (a class in neither table is refused as not yet checked:
llama.cpp's converter class for it may rewrite the tensors a LoRA targets)."""

TEXT_MODEL_TYPES: dict[str, str] = {"mistral4": "MISTRAL4 (a DeepSeek-V2-style model) is not checked here"}
"""A wrapper's ``text_config.model_type`` that changes the answer (``Mistral3Model`` switches class on it)."""

LAYER_MODULES: tuple[str, ...] = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "linear_attn.in_proj_qkv",
    "linear_attn.in_proj_z",
    "linear_attn.in_proj_a",
    "linear_attn.in_proj_b",
    "linear_attn.out_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "mlp.gate",
    "mlp.shared_expert.gate_proj",
    "mlp.shared_expert.up_proj",
    "mlp.shared_expert.down_proj",
    "mlp.shared_expert_gate",
    "mlp.experts.gate_proj",
    "mlp.experts.up_proj",
    "mlp.experts.down_proj",
)
"""The Hugging Face module paths inside ``model.layers.N`` that LoRA targets and llama.cpp names (the reverse map,
GGUF → PEFT, is built by sending these through llama.cpp's forward map; expert entries are the stacked tensors)."""

TOP_MODULES: tuple[str, ...] = ("model.embed_tokens", "lm_head")
"""The module paths outside the layers (``token_embd``, ``output``)."""

EXPERT_SEGMENT = "mlp.experts"
"""Where per-expert modules ``mlp.experts.E.{gate,up,down}_proj`` sit (stacked ``[E, ...]`` in GGUF)."""

TEXT_PREFIX = "model."
WRAPPED_TEXT_PREFIX = "model.language_model."
"""The text model's module prefix in a plain causal LM and inside a VL wrapper (llama.cpp's ``filter_tensors``
drops ``language_model.``; GGUF → PEFT puts it back when the base is a wrapper)."""
