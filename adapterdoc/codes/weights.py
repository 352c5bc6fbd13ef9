"""AD3xx: weight findings, from reading the adapter's tensors (``lora_B`` for zeros, every LoRA tensor for NaN/Inf,
the weights audit of each module's delta for AD310-AD319)."""

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
    Code(
        "AD310",
        "adapter-delta-zero",
        "error",
        "The weights audit found every LoRA module's delta `scaling · B @ A` to be exactly zero.",
        "The adapter is an identity: it loads and serves, and the model answers as the base. Besides an all-zero "
        "`lora_B` (AD301, PEFT's initial state), this also catches an all-zero `lora_A` with a trained `lora_B`, "
        "and factors whose products cancel, which the lora_B scan alone cannot see. (A delta that is merely small "
        "everywhere is not inert by this rule: inertness is measured relative to the adapter's other modules.)",
        "`adapterdoc inspect ADAPTER --weights`: 56 of 56 modules inert, total delta norm 0",
        "Re-export the adapter from the trained model; check that training updated the LoRA parameters at all "
        "(learning rate, frozen parameters, a load whose keys matched nothing).",
    ),
    Code(
        "AD311",
        "many-modules-inert",
        "warning",
        "At least a quarter of the adapter's LoRA modules (or experts) are inert: their delta norm "
        "`‖scaling · B A‖_F` is zero or at most 1e-3 of the root-mean-square delta norm of all modules.",
        "Those modules carry rank, memory and serving cost but change nothing next to the rest: part of the model "
        "was frozen, a layer range never received gradients, experts were never routed to, or the adapter was "
        "assembled from a partial state dict. The heat map (`inspect --weights --plot FILE.png`) shows where.",
        "`adapterdoc inspect ADAPTER --weights`: 23 of 24 LoRA modules (96%) are inert; only layer 11 changed",
        "If the modules were meant to train, check the trainer's frozen parameters, the layer range and the data; "
        "otherwise drop them from `target_modules` (or use `layers_to_transform`). `verify --max-inert-share` "
        "turns the share into a gate.",
    ),
    Code(
        "AD312",
        "rank-above-effective-rank",
        "info",
        "Every non-inert module of some rank needs at most a quarter of that rank: the top-k singular values of "
        "each module's `B @ A` hold 99% of its squared Frobenius norm for a k no larger than rank / 4.",
        "The extra rank costs adapter size, optimizer memory and, on servers that pad to `--max-lora-rank`, "
        "serving memory for every request, without changing the model: a truncated SVD to the effective rank "
        "keeps the delta within 10% (Frobenius).",
        "rank 64, but no module of that rank needs more than 9 for 99% of its delta (56 module(s)): r=16 would do",
        "Train with the suggested rank (or set `rank_pattern` for the modules that need less), or compress the "
        "adapter by a truncated SVD of each module's delta.",
    ),
    Code(
        "AD313",
        "inert-share-over-limit",
        "error",
        "The share of inert LoRA modules is above the limit set with `verify --max-inert-share` (or "
        "`max-inert-share` in `[tool.adapterdoc]`).",
        "A gate for pipelines that must not ship adapters where a large part of the targeted modules learned "
        "nothing, e.g. after a trainer silently froze most layers.",
        "38 of 56 LoRA modules (68%) are inert; the limit is 25%",
        "Find the inert modules with `adapterdoc inspect ADAPTER --weights --plot map.png`, fix the training run, "
        "or raise the limit if the adapter is lopsided by design.",
    ),
]
