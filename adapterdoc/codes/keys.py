"""AD2xx: key, config and layout findings."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD201",
        "no-lora-keys",
        "error",
        "The adapter has no LoRA tensors (no `lora_A`/`lora_B`/`lora_embedding_*` keys).",
        "PEFT loads such an adapter without complaint and the model behaves exactly like the base model.",
        "adapter_model.safetensors holding only `base_model.model.score.weight`",
        "Check what the trainer saved; a ZeRO-3 run that saved before gathering writes empty or missing tensors.",
    ),
    Code(
        "AD202",
        "lora-on-tower",
        "warning",
        "LoRA modules sit on a vision/audio tower, a projector, the Omni talker, code2wav or an MTP head.",
        'vLLM drops tower LoRA ("only supports adding LoRA to language model") or refuses the adapter as having '
        "unexpected modules; text-only serving cannot apply them; for Omni the talker must never get LoRA.",
        "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight",
        "Train with an exclusion regex such as `(^|.*\\.)(visual|vision_tower|multi_modal_projector|audio_tower|"
        "talker|code2wav|mtp)(\\..*|$)` as `exclude_modules`.",
    ),
    Code(
        "AD203",
        "full-weights-saved",
        "info",
        "The adapter carries whole weights (modules_to_save, a saved embedding or lm_head), not only LoRA factors.",
        "They replace the base weights on load, make the adapter large, and vLLM refuses `modules_to_save` other "
        "than classifier/score.",
        "base_model.model.lm_head.weight [151936, 4096]",
        "Keep it if intended; otherwise drop `modules_to_save` / set `save_embedding_layers=False`.",
    ),
    Code(
        "AD204",
        "rank-mismatch",
        "error",
        "A LoRA tensor's rank dimension disagrees with `r` / `rank_pattern` in adapter_config.json.",
        "PEFT builds the module with the config's rank and then fails with a size-mismatch error, or (with "
        "edited configs) loads scaled wrongly.",
        "r = 16 but q_proj.lora_A.weight is [8, 4096]",
        "Fix `r`/`rank_pattern` to match the tensors, or re-save the adapter.",
    ),
    Code(
        "AD205",
        "module-not-targeted",
        "warning",
        "A LoRA module is not selected by the config's `target_modules`/`target_parameters` (or is excluded).",
        "PEFT creates LoRA layers only where the config points; tensors for other modules are silently ignored "
        "on load (reported as unexpected keys at best).",
        'target_modules = ["q_proj"] but the file has `...mlp.down_proj.lora_A.weight`',
        "Make `target_modules` cover every module in the file (or remove the stray tensors).",
    ),
    Code(
        "AD206",
        "unpaired-lora",
        "error",
        "A module has `lora_A` without `lora_B` (or the reverse).",
        "The missing half stays at its initialisation: a missing lora_B is zero, so the module is an exact identity.",
        "q_proj.lora_A.weight present, q_proj.lora_B.weight absent",
        "Re-save the adapter from the trained model.",
    ),
    Code(
        "AD207",
        "adapter-name-in-keys",
        "warning",
        "Keys still carry an adapter name (`lora_A.default.weight`): a raw in-memory state dict was saved.",
        "PEFT's loader expects saved keys without the adapter name; these keys load as unexpected and the LoRA "
        "weights stay at their initialisation.",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
        "Save with `model.save_pretrained()` or `get_peft_model_state_dict()`, or remap with "
        "`--rule '\\.(lora_[AB])\\.default\\.=>.\\1.'`.",
    ),
    Code(
        "AD208",
        "missing-wrapper-prefix",
        "warning",
        "Keys lack PEFT's `base_model.model.` prefix.",
        "PEFT and vLLM both expect it; without it nothing matches and the base model is served.",
        "model.layers.0.self_attn.q_proj.lora_A.weight",
        "`adapterdoc remap ADAPTER --rule '^=>base_model.model.'`.",
    ),
    Code(
        "AD209",
        "layout-unknown",
        "info",
        "The key layout matches no registry layout, or several equally well.",
        "adapterdoc cannot name the model class the adapter was trained on, so layout moves need `--to`/`--rule`.",
        "keys under `transformer.h.N.attn.c_attn`",
        "Pass the layout explicitly where a command asks for it.",
    ),
    Code(
        "AD210",
        "lora-shape-inconsistent",
        "error",
        "`lora_A` and `lora_B` of one module disagree on the rank (A rows ≠ B columns).",
        "The product B @ A cannot be formed; PEFT fails with a size mismatch at load time.",
        "lora_A [8, 64], lora_B [64, 4]",
        "Re-save the adapter; the file was assembled from different runs.",
    ),
    Code(
        "AD211",
        "unknown-adapter-tensor",
        "warning",
        "A tensor name follows no PEFT LoRA grammar and is not a saved whole weight of a known kind.",
        'Loaders ignore or reject it (vLLM: "is unsupported LoRA weight").',
        "base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight",
        "Remove it or rename it to what the loader expects.",
    ),
]
