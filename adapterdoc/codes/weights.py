"""AD3xx: weight findings, from reading the adapter's tensors (``lora_B`` for zeros, every LoRA tensor for NaN/Inf)."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD301",
        "lora-b-all-zero",
        "error",
        "Every `lora_B` tensor of the adapter is exactly zero, so the adapter's delta `B @ A` is zero everywhere.",
        "PEFT initialises `lora_B` to zero, so an adapter saved before training, saved from a ZeRO-3 shard that was never "
        "gathered, or re-saved after a load whose keys matched nothing (PEFT only warns) is an exact identity. It loads "
        "without an error and the server answers with the base model; the seed trainer aborted runs on this after a "
        "silently discarded warm-start.",
        "adapter_model.safetensors where all 56 `...lora_B.weight` tensors hold only 0.0",
        "Re-export the adapter from the trained model (with ZeRO-3, gather the state dict first); if it came from a "
        "load-and-save, check that load with `adapterdoc verify ADAPTER --base BASE --load` first.",
    ),
    Code(
        "AD302",
        "lora-b-module-zero",
        "warning",
        "Some modules' `lora_B` tensors are exactly zero while others are not.",
        "Those modules contribute nothing. It happens when part of the model was frozen, when a module never received a "
        "gradient (an unused expert, a layer skipped by the data), or when a partial state dict was merged by hand.",
        "`model.layers.3.mlp.down_proj.lora_B.weight` all zero, 55 other lora_B tensors non-zero",
        "If the module was meant to train, check the trainer's frozen parameters and the data; otherwise drop it from "
        "`target_modules` so the adapter says what it does.",
    ),
    Code(
        "AD303",
        "non-finite-weights",
        "error",
        "An adapter tensor holds NaN or ±Inf values.",
        "One NaN in `lora_A` or `lora_B` turns every output of that layer into NaN once the adapter is applied: the "
        "served model emits garbage or fails sampling. Typical causes are fp16 overflow during training or a bad cast "
        "on export (e.g. to FP8 without scaling).",
        "`model.layers.0.self_attn.q_proj.lora_B.weight` has 12 NaN values (BF16)",
        "Discard the checkpoint and use an earlier one; train in bf16 or with loss scaling; export in the training dtype.",
    ),
    Code(
        "AD304",
        "weights-not-scanned",
        "info",
        "Some adapter tensors were not scanned for zeros or NaN/Inf (a dtype the scanner does not read, or a pickle "
        "without torch installed).",
        "The zero and NaN checks are only as good as what was read; a tensor that was skipped could still be all zero "
        "or non-finite.",
        "a lora_B tensor stored as F6_E2M3",
        "Save adapters in F32, BF16 or F16 (PEFT's default is the training dtype), or install torch to read .bin files.",
    ),
]
