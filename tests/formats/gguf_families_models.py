"""Tiny real Hugging Face models of the decoder families ``convert --to gguf`` writes through llama.cpp's name map
(``adapterdoc.layouts.gguf.ARCHES``): one small seeded config per ``architectures[0]``."""

from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

FAMILIES: dict[str, dict[str, Any]] = {
    "GraniteForCausalLM": {
        "attention_multiplier": 0.25,
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "logits_scaling": 2.0,
    },
    "OlmoForCausalLM": {"num_key_value_heads": 4},
    "Olmo2ForCausalLM": {},
    "Olmo3ForCausalLM": {"sliding_window": 64},
    "StableLmForCausalLM": {"partial_rotary_factor": 0.25},
    "Phi3ForCausalLM": {},
    "Starcoder2ForCausalLM": {},
    "CohereForCausalLM": {"logit_scale": 0.5, "tie_word_embeddings": True},
    "GemmaForCausalLM": {"head_dim": 16, "tie_word_embeddings": True},
    "Gemma2ForCausalLM": {"head_dim": 16, "query_pre_attn_scalar": 16, "tie_word_embeddings": True},
    "Gemma3ForCausalLM": {"head_dim": 16, "query_pre_attn_scalar": 16, "tie_word_embeddings": True},
    "SmolLM3ForCausalLM": {},
    "SeedOssForCausalLM": {"head_dim": 16},
    "Exaone4ForCausalLM": {},
    "NemotronForCausalLM": {},
    "HunYuanDenseV1ForCausalLM": {"head_dim": 16},
    "ArceeForCausalLM": {},
    "MistralForCausalLM": {"head_dim": 16},
    "Cohere2ForCausalLM": {"sliding_window": 64, "tie_word_embeddings": True, "rotary_pct": 1.0},
    "Ernie4_5ForCausalLM": {"head_dim": 16},
    "GlmForCausalLM": {"head_dim": 16, "rms_norm_eps": 1e-5},
    "PhiForCausalLM": {"num_key_value_heads": 4, "intermediate_size": 256},
    "Jais2ForCausalLM": {},
    "ApertusForCausalLM": {},
    "Qwen2MoeForCausalLM": {},
}
"""``architectures[0]`` → the config's overrides of :data:`COMMON`. Where llama.cpp's converter or runtime reads a
config as the real checkpoints have it, the tiny model has it too, so llama.cpp's base is transformers' base:
Gemma 1-3, Command-R and Command-R7B tie the head (their converters drop ``lm_head.weight`` or cannot map it);
Gemma 2/3 ``query_pre_attn_scalar == head_dim`` (llama.cpp scales attention by ``1/sqrt(head_dim)``); Command-R7B's
``rotary_pct`` (its converter reads it); GLM's ``rms_norm_eps`` 1e-5 (the converter writes ``layernorm_epsilon`` or
1e-5); Phi-2 ``intermediate_size = 4 * hidden_size`` (the converter writes that ffn length)."""


def family_config(cls: str) -> Any:
    import transformers

    model_cls = getattr(transformers, cls)
    return model_cls.config_class(**{**COMMON, **FAMILIES[cls]})


def family_model(cls: str, seed: int = 0) -> Any:
    """A tiny ``cls`` with random weights (seed), eval mode, ``architectures`` set as save_pretrained writes it."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls)(family_config(cls)).eval()
    model.config.architectures = [cls]
    return model


def linear_targets(model: Any) -> list[str]:
    """The leaf names of every ``nn.Linear`` inside the decoder layers (what ``target_modules="all-linear"`` picks
    there), sorted."""
    import torch

    leaves = set()
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            leaves.add(name.rsplit(".", 1)[-1])
    return sorted(leaves)
