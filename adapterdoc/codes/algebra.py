"""AD95x: adapter algebra (``combine``, ``resize``): what has no meaning as a sum or truncation of LoRA factors
(refused with exit 3, the code in the message), and what the written adapter differs by."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD950",
        "algebra-not-lora",
        "error",
        "The input is a PEFT adapter of another type (IA3, LoHa, ...); only LoRA adapters are products of factors.",
        "Summing or truncating another adapter type's tensors as if they were LoRA factors writes a different model.",
        "peft_type IA3 given to `adapterdoc combine`",
        "Combine LoRA adapters only; merge other types into the base with PEFT.",
    ),
    Code(
        "AD951",
        "algebra-dora-magnitude",
        "error",
        "A DoRA adapter's magnitude vector rescales each output row of the merged weight by its norm; a sum or "
        "truncation of DoRA factors has no defined meaning.",
        "PEFT's add_weighted_adapter is silently wrong on DoRA (peft#3761): it combines the LoRA factors and drops "
        "or mixes the magnitudes.",
        "use_dora: true in adapter_config.json",
        "Turn it into plain LoRA on its base first (`adapterdoc resize ADAPTER --to-lora --base BASE --max-error 0 "
        "--out DIR`), or merge it into its base with `adapterdoc merge`.",
    ),
    Code(
        "AD952",
        "algebra-lora-bias",
        "error",
        "The adapter trains a bias on lora_B (lora_bias), a term that is no product of factors.",
        "Combining such adapters by their factors drops or double-counts the bias (peft#3761).",
        "lora_bias: true, lora_B.bias tensors",
        "Merge it with `adapterdoc merge`, or train without lora_bias.",
    ),
    Code(
        "AD953",
        "algebra-target-parameters",
        "error",
        "The adapter puts LoRA on parameters (target_parameters: fused MoE experts), whose factors hold every "
        "expert at once; the algebra handles per-module LoRA only.",
        "A truncation across the experts' stacked factors would mix experts.",
        'target_parameters: ["mlp.experts.gate_up_proj"]',
        "Move it to one LoRA per expert with `adapterdoc remap ADAPTER --experts per-expert` first.",
    ),
    Code(
        "AD954",
        "algebra-trainable-tokens",
        "error",
        "The adapter holds trainable-token deltas, which have no factors.",
        "Dropping them changes the model; summing them as factors is meaningless.",
        "embed_tokens.token_adapter.trainable_tokens_delta",
        "Merge the adapter with `adapterdoc merge` instead.",
    ),
    Code(
        "AD955",
        "algebra-layouts-differ",
        "error",
        "The adapters to combine name their modules for different model layouts (a text-only class and its "
        "vision-language sibling), so no module of one is a module of the other.",
        "A combine by name would keep both halves side by side, and PEFT loads only the half whose names fit.",
        "model.layers.0.self_attn.q_proj in A, model.language_model.layers.0.self_attn.q_proj in B",
        "Move one adapter's keys to the other's layout with `adapterdoc remap ADAPTER --to LAYOUT`, then combine.",
    ),
    Code(
        "AD956",
        "algebra-shapes-differ",
        "error",
        "A module both adapters hold has different shapes in each: they were trained on different bases.",
        "The sum of deltas of different shapes does not exist; adapters of different bases have no common model.",
        "q_proj lora_B [4096, 8] in A, [2048, 8] in B",
        "Combine adapters trained on the same base model.",
    ),
    Code(
        "AD957",
        "algebra-modules-to-save-conflict",
        "error",
        "Two adapters save the same whole module (modules_to_save) with different values; no one value is their "
        "combination.",
        "PEFT refuses it too (add_weighted_adapter); keeping one would silently drop the other's training.",
        "lm_head saved by both A and B",
        "Combine adapters where at most one saves the module, or retrain with the module as LoRA.",
    ),
    Code(
        "AD958",
        "algebra-base-names-differ",
        "warning",
        "The adapters' configs name different base models (base_model_name_or_path), though their modules fit.",
        "Adapters of different bases combined by shape load, and mean nothing together.",
        "meta-llama/Llama-3.1-8B and ./my-llama",
        "Check that they were trained on the same weights; `adapterdoc verify OUT --base BASE` checks the result.",
    ),
    Code(
        "AD959",
        "algebra-truncation-error",
        "info",
        "A module's written delta is a truncation of the exact one: its relative error is reported per module.",
        "A lower rank loses what the dropped singular values held; the number says how much.",
        "q_proj 16 → 8, kept energy 0.97, relative error 0.17",
        "Raise --rank (or --energy / lower --max-error) where the error is too large.",
    ),
    Code(
        "AD960",
        "extract-not-lora",
        "warning",
        "Tensors of the tuned model changed that are no Linear or Embedding weight (norms, biases), so the "
        "extracted LoRA does not hold them.",
        "An extracted adapter silently missing a trained norm behaves differently from the tuned model.",
        "model.norm.weight changed by up to 0.02",
        "List those modules in modules_to_save when training, or use the merged tuned model itself.",
    ),
    Code(
        "AD961",
        "extract-vocabulary-grew",
        "warning",
        "A tensor of the tuned model has another shape than the base's, or is not in the base: a vocabulary that "
        "grew, a new head. A LoRA cannot add rows.",
        "An adapter cut to the base's shapes loses the new tokens' rows without a word.",
        "model.embed_tokens.weight grew from [32000, 4096] to [32002, 4096]",
        "Resize the base's embeddings to the tuned vocabulary and save the embedding whole (modules_to_save).",
    ),
    Code(
        "AD962",
        "algebra-kasa",
        "error",
        "A KaSA adapter (kasa_config) puts a learned diagonal between its factors, ΔW = s·B diag(lora_diag) A, on "
        "a base whose smallest singular directions KaSA removes: no sum or truncation of B and A holds it.",
        "Reading lora_diag as a whole saved weight and dropping it from the product writes an adapter whose "
        "outputs are far from the KaSA adapter's (a relative 1.5 on the logits at full rank, measured), without "
        "a word; PEFT's own add_weighted_adapter is wrong on it too (peft#3761).",
        "kasa_config set, lora_diag tensors beside lora_A / lora_B",
        "Merge the adapter into its base with `adapterdoc merge` (or PEFT's merge_and_unload).",
    ),
]
