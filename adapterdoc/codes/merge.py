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
]
