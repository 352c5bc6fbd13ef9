"""EmbeddingGemma 2: the multimodal embedding model and its text tower."""

from __future__ import annotations

from typing import Any

from adapterdoc.layouts.common import ATTN, HIDDEN, MLP, VOCAB
from adapterdoc.layouts.registry import STRIP_LANGUAGE_MODEL, Layout, Rule, Tiny

# ------------------------------------------------------------------------------------- tiny configs


def _gemma2_text() -> dict[str, Any]:
    return dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        hidden_size_per_layer_input=16,
        embedding_dim=32,
        sliding_window=16,
        global_head_dim=16,
        num_global_key_value_heads=2,
        layer_types=["sliding_attention", "full_attention"],
    )


ENTRIES: tuple[Layout, ...] = (
    Layout(
        name="embeddinggemma2",
        family="embeddinggemma2",
        model_class="EmbeddingGemma2Model",
        model_module="transformers.models.embedding_gemma2.modeling_embedding_gemma2",
        counterpart_config="text_config",
        model_type="embedding_gemma2",
        description="EmbeddingGemma 2 multimodal embedding model (language_model.layers.*, no model. prefix)",
        requires=(r"^language_model\.layers\.\d+\.",),
        signals=((r"\.ple_block\.", "per-layer-embedding blocks"),),
        lora_leaves=ATTN + MLP,
        towers=("vision_tower", "audio_tower", "embed_vision", "embed_audio"),
        remaps={"embeddinggemma2_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="embeddinggemma2_text",
        is_encoder=True,
        hint=r"embedding-?gemma",
        tiny=Tiny("EmbeddingGemma2Config", lambda: dict(text_config=_gemma2_text())),
    ),
    Layout(
        name="embeddinggemma2_text",
        family="embeddinggemma2",
        model_class="EmbeddingGemma2TextModel",
        model_module="transformers.models.embedding_gemma2.modeling_embedding_gemma2",
        model_type="embedding_gemma2_text",
        description="EmbeddingGemma 2 text tower alone (layers.*)",
        requires=(r"^layers\.\d+\.(self_attn|mlp)\.",),
        forbids=(r"\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        signals=((r"\.ple_block\.", "per-layer-embedding blocks"),),
        lora_leaves=ATTN + MLP,
        remaps={"embeddinggemma2": (Rule(r"^(?!language_model\.)", "language_model."),)},
        is_encoder=True,
        hint=r"embedding-?gemma",
        tiny=Tiny("EmbeddingGemma2TextConfig", _gemma2_text),
    ),
)

SMOKE: tuple[str, ...] = ("embeddinggemma2",)
"""This family's layouts in ``train-smoke --layout all``, in run order."""
