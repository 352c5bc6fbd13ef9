"""ModernBERT: the masked-LM model and the bare encoder."""

from __future__ import annotations

from typing import Any

from adapterdoc.layouts.common import HIDDEN, VOCAB
from adapterdoc.layouts.registry import Layout, Rule, Tiny

# ------------------------------------------------------------------------------------- tiny configs


def _modernbert() -> dict[str, Any]:
    return dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        global_attn_every_n_layers=2,
        local_attention=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    )


ENTRIES: tuple[Layout, ...] = (
    Layout(
        name="modernbert_mlm",
        family="modernbert",
        model_class="ModernBertForMaskedLM",
        model_module="transformers.models.modernbert.modeling_modernbert",
        model_type="modernbert",
        description="ModernBERT with the masked-LM head (model.layers.*.attn.Wqkv)",
        requires=(r"^model\.layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        signals=((r"^(head\.dense|decoder)$", "masked-LM head modules"),),
        lora_leaves=("Wqkv", "Wo", "Wi"),
        remaps={"modernbert": (Rule(r"^model\.", ""),)},
        text_counterpart="modernbert",
        is_encoder=True,
        hint=r"modernbert",
        tiny=Tiny("ModernBertConfig", _modernbert),
        counterpart_module="model",
        move_words={"modernbert": "MLM adapter on the bare encoder"},
    ),
    Layout(
        name="modernbert",
        family="modernbert",
        model_class="ModernBertModel",
        model_module="transformers.models.modernbert.modeling_modernbert",
        model_type="modernbert",
        description="ModernBERT encoder without a head (layers.*.attn.Wqkv)",
        requires=(r"^layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        lora_leaves=("Wqkv", "Wo", "Wi"),
        remaps={"modernbert_mlm": (Rule(r"^(?=(?:layers|embeddings|final_norm)\.)", "model."),)},
        is_encoder=True,
        hint=r"modernbert",
        tiny=Tiny("ModernBertConfig", _modernbert),
        move_words={"modernbert_mlm": "bare-encoder adapter on the MLM model"},
    ),
)

SMOKE: tuple[str, ...] = ("modernbert_mlm",)
"""This family's layouts in ``train-smoke --layout all``, in run order."""
