"""AD6xx: training findings (the reference runs of ``train-smoke`` and the doctor checks on their output)."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD601",
        "tower-parameter-trainable",
        "error",
        "After LoRA injection a parameter of a vision/audio tower, projector, talker, code2wav or MTP head is trainable.",
        "The exclusion regex missed a tower: the adapter will carry tower LoRA that text-only servers drop or refuse, "
        "and for Omni the talker is changed behind the thinker's back.",
        "base_model.model.model.vision_tower.transformer.layers.0.attention.q_proj.lora_A.default.weight trainable",
        "Pass the layout's exclusion regex as `exclude_modules`, e.g. "
        "`(^|.*\\.)(visual|vision_tower|multi_modal_projector|audio_tower|talker|code2wav|mtp)(\\..*|$)`.",
    ),
    Code(
        "AD602",
        "empty-adapter-state",
        "error",
        "The gathered adapter state has an empty LoRA tensor, or no LoRA tensor at all.",
        "Under ZeRO-3 (or any sharded wrapper) a state read before gathering holds zero-element placeholders; saved "
        "as-is, the adapter loads without an error and does nothing.",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight with shape [0]",
        "Gather the full state on the main process (`accelerator.get_state_dict(model)`) before extracting the "
        "LoRA tensors, and refuse to save if any is empty.",
    ),
    Code(
        "AD603",
        "loss-did-not-fall",
        "error",
        "The training loss on the training rows is not lower after training than before.",
        "A run whose loss does not move has usually trained nothing: no trainable parameter reached the loss, the "
        "labels are all -100, or the learning rate is zero.",
        "train loss 6.903 -> 6.903",
        "Check the trainable-parameter count, the label mask (answer tokens must be supervised) and the optimizer.",
    ),
    Code(
        "AD604",
        "layout-misdetected",
        "error",
        "`inspect` did not detect the layout the adapter was trained on, or reported an error finding on it.",
        "Every later step (remap, serving profile, merge names) is chosen from the detected layout; a wrong one "
        "means the wrong rules.",
        "trained on qwen3_5_moe_vl, detected qwen3_5_vl",
        "Fix the registry entry's detection evidence (requires/forbids/signals) for the layout.",
    ),
    Code(
        "AD605",
        "reload-output-mismatch",
        "error",
        "Loading the saved adapter into a fresh copy of the same base does not reproduce the trained model's outputs.",
        "The saved keys do not line up with the model (silently skipped on load) or tensors were saved from the "
        "wrong place; every consumer of the file gets a different model than the one that was evaluated.",
        "max |Δlogits| = 0.73 with 'Found missing adapter keys' on load",
        "Save with the PEFT model's own key naming (`get_peft_model_state_dict`) from the unwrapped model.",
    ),
    Code(
        "AD606",
        "lora-b-zero-after-training",
        "error",
        "A `lora_B` tensor in the saved adapter is all zeros after training.",
        "`lora_B` starts at zero; still zero after training means that module never received a gradient (or the "
        "saved state is the initial one), so its LoRA does nothing.",
        "base_model.model.model.language_model.layers.3.mlp.down_proj.lora_B.weight all zeros",
        "Check that the module is on the loss path and that the state was saved after the optimizer steps.",
    ),
    Code(
        "AD607",
        "counterpart-output-mismatch",
        "error",
        "The adapter remapped to the text-only counterpart layout does not reproduce the trained outputs there.",
        "The remap rules and the counterpart's module names disagree: a text-only trainer or server would load the "
        "adapter with some (or all) LoRA modules silently missing.",
        "qwen3_5_vl -> qwen3_5_text: 12 missing adapter keys, max |Δlogits| = 0.41",
        "Fix the registry's remap rules for the move, or remap with `adapterdoc remap ADAPTER --to LAYOUT`.",
    ),
    Code(
        "AD608",
        "merge-output-mismatch",
        "error",
        "The merged model's outputs differ from the unmerged adapter model's beyond float rounding.",
        "A merge that lands deltas on the wrong weights (or skips some) ships a model that differs from the one "
        "that was validated.",
        "max |Δlogits| = 0.02 after merge_and_unload",
        "Merge with the adapter's own scaling (alpha / r) onto the exact base it was trained on.",
    ),
    Code(
        "AD609",
        "smoke-step-crashed",
        "error",
        "A train-smoke step (training or a doctor check) raised an exception.",
        "The pipeline train → save → inspect → remap → load → merge is broken for this layout on this machine.",
        "reload: RuntimeError: size mismatch for lora_A",
        "Rerun that layout with `adapterdoc --debug train-smoke --layout NAME` for the traceback.",
    ),
    Code(
        "AD610",
        "reference-adapter-fails-verify",
        "error",
        "`adapterdoc verify` against the tiny base the adapter was trained on reports missing, unexpected or "
        "mis-shaped keys, or an error finding.",
        "The adapter was trained on exactly this base, so any verify complaint is a bug in the saving code or in "
        "verify's expectations, and the same complaint would block real adapters at the deploy gate.",
        "verify runs/smoke/qwen3_5_vl/adapter --base tiny:qwen3_5_vl: 2 missing",
        "Compare the saved keys with `adapterdoc verify --format json` output and fix whichever side is wrong.",
    ),
]
