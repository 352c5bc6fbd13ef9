"""A plain tiny Llama (not a registry family: the project's external checks use a plain Llama too), for the algebra
tests of DoRA on embeddings, PEFT's defects and verify on every output."""

from __future__ import annotations

from typing import Any


def tiny_llama(
    dtype: Any = None,
    *,
    bias: bool = False,
    seed: int = 0,
    hidden: int = 32,
    vocab: int = 256,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 64,
) -> Any:
    """A ``LlamaForCausalLM`` (by default two layers, vocabulary 256, hidden 32; untied head) in eval mode; ``bias``:
    biases on the attention projections (``lora_bias`` needs a base bias to merge into)."""
    import torch
    import transformers as tf

    cfg = tf.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        attention_bias=bias,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = tf.LlamaForCausalLM(cfg).to(dtype or torch.float32)
    return model.eval()
