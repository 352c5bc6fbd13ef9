"""What several families share: LoRA leaf names, module-path shapes for detection, the tiny decoder's sizes."""

from __future__ import annotations

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LINEAR_ATTN = r"\.linear_attn\."
FUSED_EXPERTS = r"\.mlp\.experts(\.base_layer)?$"
MOE = r"\.mlp\.(experts|shared_expert)(\.|$)"
VL_LM = r"^model\.language_model\.layers\.\d+\."
TEXT_LM = r"^model\.layers\.\d+\."
VL_DECODER = r"^model\.language_model\.layers\.\d+\.(self_attn|mlp)\.[^.]+$"
TEXT_DECODER = r"^model\.layers\.\d+\.(self_attn|mlp)\.[^.]+$"
BERT_LEAF = r"\.(Wqkv|Wi|Wo)$"


# tiny reference sizes (every tiny config is a few of these)

HIDDEN = 64
VOCAB = 1000
LAYERS = 4
DECODER = dict(
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
