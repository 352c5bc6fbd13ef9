"""AD7xx: round-trip findings (`adapterdoc roundtrip`)."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD701",
        "remap-not-reversible",
        "error",
        "A registry remap there and back did not give the input's exact bytes (or its adapter_config.json).",
        "Users move adapters between layouts (VL ↔ text, wrapper ↔ thinker) and back; a move that loses or "
        "changes anything corrupts the adapter silently.",
        "qwen3_5_vl → qwen3_5_text → qwen3_5_vl changed the header of adapter_model.safetensors",
        "Report it: a registry rule is not the inverse of its partner. Until fixed, keep the original file.",
    ),
    Code(
        "AD702",
        "format-conversion-changed",
        "error",
        "Converting between adapter_model.safetensors and adapter_model.bin changed a name, dtype, shape or value.",
        "Format conversions must be lossless; a changed dtype or value changes the model's outputs.",
        "`...q_proj.lora_A.weight` BF16 in safetensors, F32 after the .bin round trip",
        "Keep the safetensors file; report the conversion bug.",
    ),
    Code(
        "AD703",
        "reload-changed-outputs",
        "error",
        "Loading the adapter, saving it and loading it again changed its tensors or the model's outputs.",
        "save → load must be the identity; if it is not, every checkpoint in a training run drifts.",
        "outputs after load → save → load differ by 0.02",
        "Check for adapter-name or wrapper-prefix problems (AD207, AD208) and for mixed dtypes (AD101).",
    ),
    Code(
        "AD704",
        "merge-changed-outputs",
        "error",
        "The merged model's outputs differ from the unmerged adapter model's beyond float rounding.",
        "A merge is how adapters reach servers without LoRA support; a wrong merge ships a different model.",
        "merged outputs differ by 0.5 (bound 1e-4)",
        "Check DoRA, rsLoRA and rank/alpha patterns in adapter_config.json; run `adapterdoc merge --json` for "
        "unused modules.",
    ),
    Code(
        "AD705",
        "counterpart-outputs-differ",
        "error",
        "The adapter remapped to the text-only counterpart layout does not reproduce the original outputs there.",
        "This is the silent failure adapterdoc exists for: the remapped adapter loads on the text class or server "
        "but part of it matches nothing, so the base model is served.",
        "qwen3_5_text outputs differ from qwen3_5_vl's by 0.3",
        "Run `adapterdoc verify ADAPTER --base BASE` on the remapped adapter to see missing/unexpected keys.",
    ),
    Code(
        "AD706",
        "identity-adapter-proves-nothing",
        "warning",
        "Every lora_B tensor is zero, so the adapter does not change the model: output comparisons pass trivially.",
        "A round trip that compares outputs of an identity adapter would also pass after a broken move; this "
        "warning keeps a green report from being read as proof.",
        "a freshly initialised PEFT adapter (lora_B = 0) saved before training",
        "Round-trip a trained adapter (e.g. one from `adapterdoc train-smoke`).",
    ),
    Code(
        "AD707",
        "expert-layout-roundtrip-differs",
        "error",
        "The mixture-of-experts adapter moved to the other expert layout and back (`remap --experts`) lost or "
        "renamed a tensor, changed one that the move keeps exactly, or gives different outputs on the base.",
        "Per-expert and fused are two spellings of the same weight deltas (PEFT converts one into the other at "
        "load): a trip that changes the outputs means one of the two spellings serves a different model.",
        "experts:outputs fused→per-expert→fused: as per-expert: outputs differ from the original's by 0.02",
        "Run `adapterdoc roundtrip ADAPTER --base BASE --keep DIR` and compare the moved adapters with "
        "`adapterdoc inspect`.",
    ),
]
