"""AD6xx: training findings (the reference runs of ``train-smoke``, ``train`` and ``eval``, and the doctor's
checks on their output)."""

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
    Code(
        "AD611",
        "smoke-expert-coverage-gap",
        "error",
        "The mixture-of-experts adapter train-smoke trained does not carry LoRA on every expert of every MoE block "
        "for each expert projection its LoRA config targets, or carries it in a layout remap --experts cannot move.",
        "The smoke's LoRA config targets the experts (fused gate_up_proj/down_proj on transformers 5), so every "
        "expert of every block must come out trained: a gap means PEFT or the saving code dropped experts, and "
        "a real run with the same config would ship an adapter that leaves those experts untouched.",
        "experts: fused: 3/4 MoE blocks × 4 experts; coverage gate_up 12/16, down 16/16; targeted gate_up, down",
        "Run `adapterdoc inspect OUT/LAYOUT/adapter` and compare its experts coverage with the model's MoE blocks.",
    ),
    Code(
        "AD612",
        "smoke-expert-roundtrip-differs",
        "error",
        "The trained mixture-of-experts adapter, moved to the other expert layout and back with remap --experts, "
        "lost a tensor, changed one that the move keeps exactly, or changes the outputs when PEFT loads it.",
        "Per-expert and fused are two spellings of the same adapter (PEFT converts per-expert to fused at load): "
        "on the tiny base it was trained on, both spellings must reproduce the trained outputs exactly.",
        "experts_trip: fused→per-expert→fused: as per-expert max |Δlogits| = 0.013",
        "Run `adapterdoc roundtrip OUT/LAYOUT/adapter --base tiny:LAYOUT --keep DIR` to look at the moved adapters.",
    ),
    Code(
        "AD620",
        "trained-adapter-fails-verify",
        "error",
        "The adapter `adapterdoc train` just wrote does not verify against the base it was trained on.",
        "The run trained and saved this adapter on exactly that base, so missing, unexpected or mis-shaped keys (or "
        "another verify error) mean the saved naming is not what a loader of that base reads: a server would load "
        "it with LoRA modules silently missing.",
        "verify runs/q35/adapter --base ./qwen3.5-0.8b: 24 missing",
        "Run `adapterdoc verify OUT/adapter --base BASE` for the details and report it with `--debug`.",
    ),
    Code(
        "AD621",
        "trained-adapter-has-tower-lora",
        "error",
        "The adapter `adapterdoc train` wrote holds LoRA tensors on a vision/audio tower, projector, talker or MTP head.",
        "Towers are frozen and excluded by default; tower LoRA in the output means `--targets` reached into a tower, "
        "and text-only servers drop or refuse such keys.",
        "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight",
        "Name language-model leaves in `--targets` (or leave the default), then train again.",
    ),
    Code(
        "AD622",
        "trained-lora-b-zero",
        "error",
        "A `lora_B` tensor of the adapter `adapterdoc train` wrote is all zeros.",
        "`lora_B` starts at zero, so a zero one after training means its module never got a gradient (no "
        "supervised token reached it, a learning rate of zero, or too few steps with warmup): it does nothing.",
        "3/56 lora_B tensors are all zero",
        "Check that the rows have supervised tokens (assistant turns, completions), the learning rate and --warmup.",
    ),
    Code(
        "AD623",
        "train-loss-did-not-fall",
        "warning",
        "The training loss of `adapterdoc train` is not lower after the run than before it.",
        "On a user's data a few steps may not move the loss, but usually it means the learning rate is too low "
        "or too high, or the supervised tokens are not the ones meant (check the chat template's mask).",
        "train loss 2.113 -> 2.140",
        "Train longer or tune --lr; `adapterdoc eval` on held-out rows tells whether the adapter helps.",
    ),
    Code(
        "AD624",
        "eval-adapter-does-not-load",
        "error",
        "`adapterdoc eval`: PEFT reported missing adapter keys when loading the adapter onto the base.",
        "PEFT only warns and leaves those modules at zero, so the adapter's numbers would silently be the base's.",
        "Found missing adapter keys while loading the checkpoint: [...language_model.layers.0...]",
        "Remap the adapter to the base's layout (`adapterdoc remap ADAPTER --vl` or `--to LAYOUT`) and evaluate again.",
    ),
    Code(
        "AD625",
        "eval-improvement-below-gate",
        "error",
        "`adapterdoc eval --min-improvement X`: the adapter lowers the loss by less than X.",
        "The gate lets CI refuse an adapter that does not help on the evaluation rows.",
        "loss 2.31 -> 2.29: improvement 0.02 < --min-improvement 0.1",
        "Train longer or on better data, or lower the gate if the threshold was too strict.",
    ),
    Code(
        "AD626",
        "loss-curve-skipped",
        "info",
        "RUN_REPORT.md has no loss-curve picture because matplotlib is not installed.",
        "The picture is optional (the `plot` extra); the numbers are in progress.jsonl either way.",
        "loss curve skipped: matplotlib is not installed",
        "`pip install matplotlib` (or `adapterdoc[plot]`) and train again.",
    ),
    Code(
        "AD627",
        "trained-outside-the-registry",
        "info",
        "`adapterdoc train` trained a base whose family is not a layout of the registry: the LoRA targets came from "
        "`--targets` or PEFT's own `all-linear` rule, and no tower was excluded.",
        "The registry knows each family's language-model leaves and its towers (vision, audio, projectors, MTP "
        "heads); outside it, PEFT's `all-linear` puts LoRA on every linear layer but the output head, which on a "
        "multimodal model includes its towers.",
        "LlamaForCausalLM is not a layout of the registry: LoRA from PEFT's all-linear rule on 14 modules "
        "(down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj); no towers are known for it",
        "Nothing, for a text-only causal LM. For a model with a tower, name the language-model leaves with "
        "`--targets q_proj,k_proj,v_proj,o_proj`.",
    ),
    Code(
        "AD628",
        "run-started-again",
        "warning",
        "`adapterdoc train` found no complete checkpoint in `--out` (an earlier run stopped before its first one, "
        "or `--resume` was given for a new folder) and started the run again from step 0.",
        "A run interrupted (Ctrl-C, a full disk, a killed job) before its first checkpoint left nothing to continue "
        "from: its folder is restarted rather than refused, and its partial `progress.jsonl` is replaced.",
        "the earlier run here stopped before its first complete checkpoint; the run started from step 0",
        "Nothing, if a fresh start was meant. To keep more of a long run, checkpoint more often (`--save-steps N`).",
    ),
    Code(
        "AD629",
        "no-canaries-from-training",
        "warning",
        "`adapterdoc train` of a causal LM wrote no `canaries.json` into its run folder: the run was sharded (the "
        "main process alone may not hold the model), making them failed, or the trained adapter moves the logprobs "
        "of the run's own rows too little for `adapterdoc probe` to tell it from the base.",
        "The canaries file is what `adapterdoc probe` sends a deployed server and what PEFT expects back; without "
        "one the post-deploy check needs `--make-canaries` (or `--local`) where the model is. The run itself and "
        "its adapter are unaffected.",
        "no canaries: the adapter moves the logprobs of its own rows by 1.3 tolerances of float32 at most (the "
        "probe needs 4)",
        "Train longer or at a higher `--lr` if the adapter barely moved; otherwise make the canaries where the model "
        "fits, with rows of the training data as `--prompts`: "
        "`adapterdoc probe --make-canaries ADAPTER --base BASE --out FILE`.",
    ),
    Code(
        "AD630",
        "canaries-weak-at-bfloat16",
        "warning",
        "`adapterdoc train` wrote `canaries.json`, but the adapter moves their logprobs by fewer than 4 tolerances of "
        "bfloat16: `adapterdoc probe` can judge a server that computes in the run's dtype (llama.cpp's f32 GGUF, "
        "mlx-lm), not one that serves in bfloat16 (vLLM's and SGLang's default).",
        "Against a bfloat16 server such canaries cannot tell the adapter from the base: the probe refuses them "
        "(exit 3) instead of giving a verdict.",
        "canaries.json moves the logprobs by 2.1 tolerances of bfloat16 at most (the probe needs 4): it can judge a "
        "server that computes in float32, not one in bfloat16",
        "Train longer or at a higher `--lr`, or make canaries from prompts where the adapter matters more "
        "(`adapterdoc probe --make-canaries ... --prompts FILE`); or serve in float32 and probe with "
        "`--served-dtype float32`.",
    ),
]
