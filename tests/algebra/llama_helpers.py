"""A plain tiny Llama (not a registry family: the project's external checks use a plain Llama too), for the algebra
tests of DoRA on embeddings, PEFT's defects and verify on every output."""

from __future__ import annotations

from typing import Any


def tiny_llama(dtype: Any = None, *, bias: bool = False, seed: int = 0) -> Any:
    """A two-layer ``LlamaForCausalLM`` (vocabulary 256, hidden 32, untied head) in eval mode; ``bias``: biases on
    the attention projections (``lora_bias`` needs a base bias to merge into)."""
    import torch
    import transformers as tf

    cfg = tf.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=bias,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = tf.LlamaForCausalLM(cfg).to(dtype or torch.float32)
    return model.eval()
