"""Which model types the text-key serving engines (TGI, LoRAX) can put LoRA on, and with which layer types: data
read from each engine's own source, kept here because they are model-family facts. The rules that use them are
the TGI and LoRAX verify profiles (:mod:`adapterdoc.engines.tgi`, :mod:`~adapterdoc.engines.lorax`);
the commits they were read from are those profiles' ``*_VERSION`` constants."""

from __future__ import annotations

TGI_LORA_MODEL_TYPES = frozenset(
    {
        "llama",
        "phi3",
        "granite",
        "mistral",
        "qwen2",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "starcoder2",
    }
)
"""``model_type``s TGI builds with its adapter-aware flash layers (``TensorParallelMultiAdapterLinear`` in
``flash_llama_modeling.py``, ``flash_mistral_modeling.py``, ``flash_qwen2_modeling.py`` (also the text model of
``qwen2_vl.py`` / ``qwen2_5_vl.py``), ``flash_gemma2_modeling.py``, ``flash_gemma3_modeling.py``,
``flash_starcoder2_modeling.py``; ``models/__init__.py`` routes ``phi3`` and ``granite`` to the llama class). Any
other type runs on a class whose layers have no ``self_attn.query_key_value``, which ``build_layer_weight_lookup``
reads for every layer: no adapter can be served on it."""

TGI_LORA_BROKEN = {
    "qwen2_vl": "Qwen2Model",
    "qwen2_5_vl": "Qwen2Model",
}
"""``model_type``s whose TGI class has adapter-aware layers but cannot load an adapter: ``build_layer_weight_lookup``
(``utils/adapter.py``) reads ``model.text_model.model``, and the VL classes' ``text_model`` is the named class
(``custom_modeling/qwen2_5_vl.py:843``, ``qwen2_vl.py:419``), which has no ``.model``: an AttributeError at start-up
(huggingface/text-generation-inference#3335, #2847, open)."""

TGI_ADAPTER_LAYERS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "c_proj",
    "c_fc",
)
"""The layer types ``get_model_with_lora_adapters`` loads, in its order (``models/__init__.py``); no ``lm_head``."""

_LLAMA_LIKE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

LORAX_ADAPTER_LAYERS: dict[str, tuple[str, ...]] = {
    "llama": (*_LLAMA_LIKE, "lm_head"),
    "mistral": (*_LLAMA_LIKE, "lm_head"),
    "qwen2": (*_LLAMA_LIKE, "lm_head"),
    "cohere": (*_LLAMA_LIKE, "lm_head"),
    "granite": (*_LLAMA_LIKE, "lm_head"),
    "gemma": _LLAMA_LIKE,
    "gemma2": _LLAMA_LIKE,
    "solar": _LLAMA_LIKE,
    "mixtral": ("q_proj", "k_proj", "v_proj", "o_proj"),
}
"""``ADAPTER_LAYERS`` of each LoRAX flash model whose adapter weight names are text-style
``model.layers.{i}.self_attn.*`` / ``mlp.*`` (``models/flash_<type>.py``), keyed by the ``model_type`` that
``models/__init__.py`` routes to it, in LoRAX's order (the order matters: see the rank-padding rule)."""

LORAX_OTHER_NAMING = frozenset(
    {"gpt2", "phi", "phi-msft", "phi3", "dbrx", "qwen", "bloom", "llava", "llava_next"}
)
"""``model_type``s LoRAX serves with LoRA under other weight names (``transformer.h.{i}.attn.c_attn``, fused
``qkv_proj``/``gate_up_proj``, a vision wrapper): the LoRAX profile does not model their keys."""
