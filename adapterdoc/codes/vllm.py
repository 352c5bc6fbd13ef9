"""AD476-AD489: more of vLLM's adapter rules (``verify --profile vllm``), read from vLLM 0.33.0's source and checked by
running it (tests/oracles/test_vllm_oracle.py). Part of the serving area (:mod:`adapterdoc.codes.serving`)."""

from adapterdoc.codes import Code

_V = "Describes vLLM 0.33.0."

CODES = [
    Code(
        "AD476",
        "vllm-expert-coverage",
        "error",
        "A per-expert adapter served on a class vLLM packs per-expert expert LoRA for (`is_3d_moe_weight` False: "
        "Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM) lacks the gate, up or down LoRA of some expert in a block "
        "that has expert LoRA. " + _V,
        "`PackedLoRALayerWeights.pack_moe` (vllm/lora/lora_weights.py) stacks one gate, up and down LoRA per expert "
        "and asserts each is there: adding the adapter fails, so the first request that names it fails.",
        "`experts.0.gate_proj` and `experts.0.down_proj` with no `experts.0.up_proj`",
        "Train every expert's gate, up and down projection (PEFT's `target_parameters` gate_up_proj and down_proj, "
        "then `adapterdoc remap --for vllm`), or add zero LoRA for the missing ones.",
    ),
    Code(
        "AD477",
        "vllm-expert-ranks",
        "error",
        "The experts of one MoE block have different LoRA ranks for the same projection, on a class vLLM packs "
        "per-expert expert LoRA for. " + _V,
        '`pack_moe` refuses it ("The experts of ... have different LoRA ranks for the same projection, which is '
        'not supported."): adding the adapter fails.',
        "`rank_pattern` giving `experts.0.down_proj` rank 8 and the other experts rank 4",
        "Give every expert of a projection one rank (zero-pad the smaller ones: exact).",
    ),
]
