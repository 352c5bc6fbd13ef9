"""AD5xx: merge findings."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD501",
        "unused-adapter-module",
        "error",
        "An adapter module (or a saved whole weight) matched no tensor of the base checkpoint, so the merge could "
        "not apply it.",
        "A merged model missing part of its adapter loads and runs without any warning; it simply behaves like a "
        "different, half-trained model. Streaming mergers that skip unmatched names report nothing.",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight on a base stored as "
        "model.language_model.layers.* (adapter trained on the text-only class)",
        "Check the pairing with `adapterdoc verify ADAPTER --base BASE`; if the adapter was trained on a sibling "
        "class, move its keys with `adapterdoc remap ADAPTER --to LAYOUT` and merge again.",
    ),
    Code(
        "AD502",
        "merge-shape-mismatch",
        "error",
        "A module's LoRA tensors do not have the shapes PEFT builds for it on this base (rank, in/out features, "
        "experts), or a factor is missing.",
        "PEFT refuses such an adapter with a size-mismatch error; a merge that forced it would write wrong weights.",
        "q_proj.lora_A.weight [8, 4096] where the config's r gives [16, 4096]",
        "Fix `r`/`rank_pattern` in adapter_config.json to match the tensors, or merge onto the base the adapter "
        "was trained on.",
    ),
    Code(
        "AD503",
        "merge-unsupported",
        "error",
        "adapterdoc cannot merge this module: a layer type, variant or checkpoint layout the streaming merge "
        "does not implement (convolution LoRA, DoRA over a split tensor, an integer or FP8 base weight, an unknown "
        "transformers conversion op).",
        "Skipping it would silently drop part of the adapter; guessing the layout would corrupt the weight.",
        "LoRA on model.visual.patch_embed.proj (Conv3d)",
        "Merge with PEFT's `merge_and_unload()` on a loaded model, or retrain without that module.",
    ),
    Code(
        "AD504",
        "tied-weights-untied",
        "warning",
        "The adapter changes one side of tied weights differently from the other (LoRA on `embed_tokens` or "
        "`lm_head` alone, `lm_head` in `modules_to_save`); the merged checkpoint stores both matrices and sets "
        "`tie_word_embeddings` to false.",
        "With the tie kept, the update of one side would also land in the other and the merged model would not "
        "compute what the adapter computed. PEFT's `merge_and_unload()` does exactly that for LoRA on a tied "
        "embedding: it adds the update to the shared matrix, and the merged logits differ from the adapter's.",
        "target_modules = ['embed_tokens'] on a model with tie_word_embeddings = true",
        "Nothing to do if intended; the merged folder is larger by one vocabulary-sized matrix.",
    ),
    Code(
        "AD505",
        "targeted-module-absent",
        "info",
        "PEFT creates LoRA layers for modules the adapter file has no tensors for; they keep their "
        "initialisation (lora_B = 0) and change nothing.",
        "Usually harmless (a config broader than what was saved); it can also mean the file lost tensors.",
        "target_modules = ['q_proj', 'v_proj'] but only q_proj tensors in the file",
        "Nothing to do unless you expected those modules to be trained.",
    ),
    Code(
        "AD506",
        "merge-not-finite",
        "error",
        "A merged weight contains NaN or infinity.",
        "The merged model would produce NaN logits; PEFT's safe_merge refuses the same adapter.",
        "lora_B holding inf after a diverged run",
        "Inspect the adapter's weights (`adapterdoc verify`); retrain or take an earlier checkpoint.",
    ),
    Code(
        "AD507",
        "peft-refuses-config",
        "error",
        "PEFT refuses to build the adapter's LoRA layers on this base (its injection raises), so there is nothing "
        "PEFT would load and nothing to merge. On a transformers-5 MoE base the usual cause is a per-expert adapter "
        "that targets one half of a pair transformers fuses (`gate_proj` without `up_proj`, Mixtral's `w1` "
        "without `w3`): both live in one `gate_up_proj` parameter.",
        "Merging what PEFT cannot load would give a checkpoint no PEFT model reproduces; without this finding "
        "every module of the adapter would be reported as unused, which hides the one reason.",
        "target_modules = ['q_proj', 'gate_proj', 'down_proj'] (no up_proj) on Qwen3-MoE under transformers 5: "
        "PEFT's ValueError 'Cannot convert PEFT target(s) gate_proj without also targeting up_proj because they "
        "are fused into gate_up_proj'",
        "Retrain targeting both halves, or merge on the stack the adapter was written for (transformers 4).",
    ),
    Code(
        "AD508",
        "experts-converted",
        "info",
        "The adapter has one LoRA per expert (a transformers-4 MoE layout) and the base's experts are fused "
        "parameters in transformers 5; merge converted the per-expert modules to PEFT's fused layout exactly as "
        "PEFT does at load (`convert_peft_adapter_state_dict_for_transformers`: lora_A concatenated along the "
        "rank, lora_B block-diagonal, gate_up's rank and alpha doubled) and merged that.",
        "The merged weights are what PEFT's `merge_and_unload()` gives on a transformers-5 model, whether the base "
        "stores its experts one tensor per expert or fused.",
        "model.layers.0.mlp.experts.0.gate_proj ... experts.3.up_proj -> model.layers.0.mlp.experts.base_layer "
        "(gate_up_proj, rank 2r)",
        "Nothing to do; to keep a fused copy of the adapter, `adapterdoc remap ADAPTER --experts fused`.",
    ),
    Code(
        "AD509",
        "experts-not-convertible",
        "error",
        "Per-expert LoRA modules land on a fused expert parameter, but PEFT's per-expert to fused conversion "
        "cannot turn them into the fused layer PEFT builds (experts missing from the set, extra tensor kinds "
        "such as lora bias, or fused and per-expert tensors for the same parameter).",
        "PEFT would fail to load these tensors, or load something else than the file says; a merge of them "
        "would not match any PEFT model.",
        "LoRA on experts 0 and 1 of 4 only: stacking gives lora_A [2·2r, H] where PEFT builds [4·2r, H]",
        "Give every expert its LoRA (zeros where untrained), or convert with "
        "`adapterdoc remap ADAPTER --experts fused` and check the result with `adapterdoc verify`.",
    ),
    Code(
        "AD520",
        "quantized-base-not-decodable",
        "error",
        "The base checkpoint is quantized in a method or layout adapterdoc cannot decode exactly (a quant_method it "
        "does not read, or a module whose logical shape its tensors do not give).",
        "A merge needs every weight the adapter changes decoded exactly as the format's library does; a guess "
        "would write a model that differs from the base everywhere.",
        "an adapter on a base with quant_method 'hqq'",
        "Merge into the unquantized base, or serve the adapter unmerged beside the quantized base (vLLM applies "
        "LoRA beside the quantized kernel, exactly).",
    ),
    Code(
        "AD521",
        "merged-into-quantized-base",
        "info",
        "The base is quantized: every weight the adapter changes was decoded exactly (bit for bit as the format's "
        "library decodes it) and merged in float32; the output is a bf16/f16 checkpoint without "
        "quantization_config, or with --requantize the same format.",
        "A merged bf16 model is larger than the quantized base and loads without the quantization library; a "
        "requantized one can lose the update (see AD522).",
        "an adapter on a block-FP8 base (weight + weight_scale_inv) merged to bf16",
        "Check `adapterdoc merge --dry-run` to see whether the update survives requantization.",
    ),
    Code(
        "AD522",
        "update-lost-on-requantize",
        "error",
        "Quantizing the merged weight again keeps too little of the adapter's update: fewer than 90% (or more than "
        "110%) of ⟨Δ, Δ⟩ is kept, or the stored update points elsewhere (cosine below 0.9).",
        "A delta smaller than one quantization step rounds back to the same codes: on NF4 0.000 of the codes change "
        "and 1.7% of the update survives, and the merged model behaves like the base while every tool says done.",
        "q_proj on an NF4 base: 0.000 of the codes change and 1.7% of the update is kept (cosine 0.04)",
        "Keep the merged model in bf16 (merge without --requantize), serve the adapter unmerged (exact on engines "
        "that keep LoRA beside the quantized kernel: vLLM, SGLang), or quantize to a finer format.",
    ),
    Code(
        "AD523",
        "cannot-requantize",
        "error",
        "adapterdoc cannot encode this format as its library does (its scales come from calibration data, or the "
        "library's rounding cannot be reproduced here).",
        "A requantized file that its library would not write is a new format under an old name.",
        "--requantize on an MXFP4 base",
        "Merge to bf16 (without --requantize) and quantize with the format's own tool, or serve unmerged.",
    ),
]
