"""What several families share: LoRA leaf names, module-path shapes for detection, the tiny decoder's sizes."""

from __future__ import annotations

from adapterdoc.layouts.registry import Experts

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

DENSE_MLP = r"\.mlp\.(gate_proj|up_proj|down_proj)$"
"""A dense MLP's projections right under a decoder layer's ``mlp`` (not a shared or routed expert's)."""
EXPERT_LORA = r"\.mlp\.experts(\.base_layer|\.\d+\.(gate_proj|up_proj|down_proj))?$"
"""Routed-expert LoRA in either layout: PEFT's fused wrappers or one module per expert and projection."""
EXPERT_SIGNALS = (
    (EXPERT_LORA, "routed-expert LoRA"),
    (FUSED_EXPERTS, "fused-expert LoRA (target_parameters)"),
)
"""Detection evidence every MoE layout gives alike (so that neither tips a tie between MoE families)."""
QWEN_MOE_EXPERTS = Experts(served_fused=False)
"""Qwen3-MoE and the Omni thinker: ``mlp.experts.{e}.{gate,up,down}_proj`` / fused ``gate_up_proj``, ``down_proj``;
no shared expert. vLLM's ``Qwen3MoeForCausalLM`` leaves ``is_3d_moe_weight`` at ``False`` (per-expert LoRA)."""
OMNI_EXPERTS = Experts(count_field="num_experts", served_fused=True)
"""The Omni thinker: Qwen3-MoE's expert names. vLLM 0.33.0's ``Qwen3OmniMoeThinkerForConditionalGeneration`` sets
``is_3d_moe_weight = True`` (``vllm/model_executor/models/qwen3_omni_moe_thinker.py:1621``: fused LoRA)."""
QWEN35_MOE_EXPERTS = Experts(shared=("shared_expert", "shared_expert_gate"), served_fused=True)
"""Qwen3.5-MoE (and Qwen2-MoE): the Qwen3-MoE experts plus one shared expert and its sigmoid gate.
vLLM 0.33.0's ``Qwen3_5MoeForConditionalGeneration`` sets ``is_3d_moe_weight = True`` (fused LoRA,
``vllm/model_executor/models/qwen3_5.py:707``)."""
QWEN35_MOE_TEXT_EXPERTS = Experts(shared=("shared_expert", "shared_expert_gate"), served_fused=False)
"""Qwen3.5-MoE's text class: the same experts, but vLLM 0.33.0's ``Qwen3_5MoeForCausalLM`` leaves
``is_3d_moe_weight`` at ``False`` (``qwen3_5.py:455``: per-expert LoRA)."""
MIXTRAL_EXPERTS = Experts(
    per_expert=("w1", "w3", "w2"),
    block="block_sparse_moe",
    count_field="num_local_experts",
    name_hints=("mixtral",),
)
"""Mixtral (no layout of its own here; its adapters are read by their keys): ``block_sparse_moe.experts.{e}.w1/w3/w2``
are gate/up/down; transformers 5 renames ``block_sparse_moe`` to ``mlp`` and fuses them like Qwen's."""
MOE_NAME_HINT = r"moe|mixtral|a\d+(\.\d+)?b\b|\d+x\d+b"
"""A model name or path that says mixture-of-experts (``Qwen3-30B-A3B``, ``Mixtral-8x7B``, ``...-MoE``): lets an adapter
with no expert keys be recognised as an MoE adapter."""


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


def tiny_decoder(*, drop: tuple[str, ...] = (), **over: object) -> dict[str, object]:
    """The tiny decoder's sizes (:data:`DECODER`) without the fields in ``drop``, with ``over`` changed or added
    (in :data:`DECODER`'s order, then ``over``'s)."""
    return {k: v for k, v in DECODER.items() if k not in drop} | over


QWEN_VISION_DEFAULTS = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
}
"""The defaults of the Qwen3.5-style vision config (``Qwen3_5VisionConfig``; the Omni thinker's vision config adds
``deepstack_visual_indexes``), transformers 5.24: the fields a config may leave out."""
QWEN_VISION_TINY = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN)
"""The tiny Qwen-VL-style vision tower every Qwen vision family's tiny config starts from (one block, projecting to
``HIDDEN``); each family adds its own fields (``fullatt_block_indexes``, ``deepstack_visual_indexes``)."""

PLAIN_ACTIVATIONS = frozenset(
    {
        "gelu",
        "gelu_10",
        "gelu_accurate",
        "gelu_fast",
        "gelu_new",
        "gelu_python",
        "gelu_python_tanh",
        "gelu_pytorch_tanh",
        "laplace",
        "linear",
        "mish",
        "quick_gelu",
        "relu",
        "relu2",
        "relu6",
        "sigmoid",
        "silu",
        "swish",
        "tanh",
    }
)
"""``transformers.activations.ACT2CLS`` names (5.24) whose module has no children and no parameters: an
activation outside this set (``prelu``, ``xielu``, a typo transformers refuses) is not modelled by the trees."""
