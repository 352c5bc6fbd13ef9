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

# AD220-AD239: `adapterdoc verify` (adapter vs. base, with PEFT's own injection on a meta-device model).
CODES += [
    Code(
        "AD220",
        "missing-lora-keys",
        "error",
        "PEFT would create LoRA weights on the base that the adapter file does not provide.",
        'PEFT only warns ("Found missing adapter keys while loading the checkpoint") and keeps those weights at their '
        "initialisation: `lora_B` stays zero, so the modules do nothing. When every key is missing the server answers "
        "with the base model.",
        "`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` expected, not in the file",
        "Remap the adapter to the base's layout (see the hint), or verify against the base it was trained on.",
    ),
    Code(
        "AD221",
        "unexpected-adapter-keys",
        "error",
        "Adapter tensors that match no weight of the base with PEFT's injection applied.",
        "`PeftModel.load_adapter` and `from_pretrained` drop them without any warning; vLLM compares only the last "
        "name component and drops them too. The trained weights never reach the model.",
        "`base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight` on a text-only base",
        "Remap the adapter to the base's layout (see the hint), or check that `--base` is the model it was trained on.",
    ),
    Code(
        "AD222",
        "lora-shape-mismatch",
        "error",
        "A LoRA tensor's shape differs from what PEFT builds on this base (rank, in or out features).",
        "PEFT's load stops with a size-mismatch error; a wrong in/out feature count means the adapter belongs to a "
        "different model size, a wrong rank means `r`/`rank_pattern` disagree with the tensors.",
        "q_proj.lora_A.weight is [8, 4096], PEFT builds [8, 2048]",
        "Verify against the right base size; fix `r`/`rank_pattern` to match the tensors.",
    ),
    Code(
        "AD223",
        "layout-move",
        "error",
        "The key mismatch is a known layout move: the adapter was saved on a neighbouring model class.",
        "A VL adapter on a text-only base (or the reverse), an Omni full-wrapper adapter on the thinker, an MLM adapter "
        "on the bare encoder, pre-4.52 VL names, keys without `base_model.model.`, a non-default adapter name: each "
        "loads with nothing applied, and each is fixed by a rename of the keys.",
        "qwen3_5_vl adapter on a qwen3_5_text base: all 50 keys match after stripping `.language_model.`",
        "Run the `adapterdoc remap ...` command in the hint (header-only, in place, atomic), then verify again.",
    ),
    Code(
        "AD224",
        "key-on-untargeted-module",
        "error",
        "Adapter tensors sit on base modules that the adapter's own config does not target (or excludes).",
        "PEFT injects LoRA only where `target_modules`/`target_parameters` point (minus `exclude_modules`), so these "
        "tensors are dropped on load without a warning.",
        '`...mlp.down_proj.lora_A.weight` with target_modules ["q_proj", "v_proj"]',
        "Add the modules to `target_modules` (or remove them from `exclude_modules`) if they were trained; otherwise "
        "remove the stray tensors.",
    ),
    Code(
        "AD225",
        "peft-config-rewrite",
        "info",
        "PEFT rewrites this adapter's LoRA config for this model type before injecting it.",
        "For fused-expert models (Qwen3-MoE, Qwen3-Omni, Mixtral in transformers 5) PEFT moves expert projections from "
        "`target_modules` to `target_parameters` and doubles rank/alpha on fused `gate_up_proj`; dense MLP layers then "
        "get no LoRA. The expected keys here follow the rewritten config, as PEFT's load does.",
        "target_modules [q,k,v,o,gate,up,down]_proj → [q,k,v,o]_proj + target_parameters {gate_up_proj, down_proj}",
        "Nothing to do if intended; save adapters with the rewritten config so what the file says is what loads.",
    ),
    Code(
        "AD226",
        "targets-match-nothing",
        "error",
        "PEFT refuses to inject this adapter's config into the base: no module matches `target_modules`.",
        "`PeftModel.from_pretrained` raises (or, for some configs, wraps nothing), so the adapter cannot be loaded on "
        "this base at all.",
        'target_modules ["Wqkv", "Wo"] on a decoder base',
        "Check that `--base` is the model family the adapter was trained on.",
    ),
    Code(
        "AD227",
        "targets-reach-tower",
        "warning",
        "On this base, the adapter's targets select modules in a vision/audio tower, projector, talker or MTP head.",
        "Tower LoRA is dropped by vLLM and by text-only serving; for Qwen3-Omni the talker must never get LoRA. A "
        "retrain with this config would spend rank on modules that are never served.",
        "target_modules all-linear reaching `model.visual.blocks.0.attn.qkv`",
        "Add an `exclude_modules` regex covering the towers, e.g. "
        "`(^|.*\\.)(visual|vision_tower|multi_modal_projector|audio_tower|talker|code2wav|mtp)(\\..*|$)`.",
    ),
    Code(
        "AD228",
        "pattern-matches-nothing",
        "warning",
        "A `rank_pattern` or `alpha_pattern` key matches no module the adapter targets on this base.",
        "The pattern has no effect: those modules use the default `r`/`lora_alpha`, so the scaling differs from what "
        "the config's author intended (and, for rank, the tensor shapes will not match).",
        '"rank_pattern": {"model.layers.0.attn.q_proj": 16} on a model whose modules are named `self_attn`',
        "Fix the pattern to name the module as it appears in the model (PEFT matches `(.*\\.)?(KEY)$`).",
    ),
    Code(
        "AD229",
        "lora-scaling",
        "info",
        "The scaling LoRA applies: `lora_alpha / r` (or `lora_alpha / sqrt(r)` with rsLoRA), per pattern.",
        "Scaling multiplies the whole delta; an alpha copied from another run, or rsLoRA turned on or off between "
        "training and serving, changes the adapter's effect without any error.",
        "scaling 2 (alpha 16 / r 8)",
        "Check that it matches the training run.",
    ),
    Code(
        "AD230",
        "dora-adapter",
        "info",
        "The adapter uses DoRA (weight-decomposed LoRA, `lora_magnitude_vector` tensors).",
        "DoRA needs the base weight norms at load time and is not supported by every server (vLLM refuses it); merging "
        "is the portable way to serve it.",
        '"use_dora": true',
        "Serve with PEFT, or merge the adapter into the base (`adapterdoc merge`).",
    ),
    Code(
        "AD231",
        "adapter-config-inferred",
        "warning",
        "The input has no adapter_config.json; the LoRA config used for the check was inferred from the tensors.",
        "PEFT and vLLM both need adapter_config.json to load an adapter; the inferred target list and ranks are a "
        "best guess (leaf names, most common rank), so scaling and targeting could differ from the training run.",
        "verify model.safetensors --base ...",
        "Ship the adapter as a directory with the adapter_config.json the trainer wrote.",
    ),
    Code(
        "AD232",
        "loaded-no-lora-modules",
        "error",
        "After a real PEFT load (`--load`) the model holds no LoRA modules.",
        "The seed trainer's first post-load assertion: a warm-start that ends with zero LoRA modules trains or serves "
        "the plain base model.",
        "0 modules named `...lora_A.<adapter>` after PeftModel.load_adapter",
        "Check `target_modules` against the base's module names (see the other findings).",
    ),
    Code(
        "AD233",
        "loaded-key-mismatch",
        "error",
        "A real PEFT load (`--load`) reported missing or unexpected LoRA keys.",
        "The seed trainer's second post-load assertion: PEFT injects modules from the config before loading weights, "
        "so a non-zero module count does not prove that any saved weight was used; only the load result does.",
        "load_adapter(...).missing_keys lists 56 `...lora_A.adapterdoc.weight` keys",
        "Remap the adapter to the base's layout; the key findings name the move.",
    ),
    Code(
        "AD234",
        "loaded-output-unchanged",
        "error",
        "With the adapter loaded (`--load`), the model's output on a fixed probe input equals the base model's.",
        "The seed trainer's third post-load assertion, and the only one independent of PEFT's bookkeeping: an adapter "
        "that changes nothing is a silent no-op (zero lora_B, keys that matched nothing, a disabled adapter).",
        "max |logits(adapter) - logits(base)| = 0.0 on 8 probe tokens",
        "See the zero-lora_B and key findings; re-export the trained adapter.",
    ),
    Code(
        "AD235",
        "load-check",
        "info",
        "Summary of the real PEFT load (`--load`): LoRA modules present, keys matched, and how much the probe output moved.",
        "It is the end-to-end confirmation of what the header-level checks predict.",
        "56 LoRA modules, 0 missing, 0 unexpected, max |Δ logits| 0.031",
        "Nothing to do.",
    ),
    # expert layout and coverage (adapterdoc.adapter.expert_picture)
    Code(
        "AD240",
        "moe-experts-without-lora",
        "warning",
        "A mixture-of-experts adapter whose routed experts carry no LoRA at all (attention, dense MLPs or the "
        "shared expert only).",
        'Most of an MoE model\'s parameters sit in its routed experts; trainers have shipped "MoE adapters" that '
        "never reached them (axolotl-ai-cloud/axolotl#3514: 13.5 MB for a 35B MoE). It loads and runs, but trains "
        "a small part of the model.",
        "a Qwen3-MoE adapter with keys only under `self_attn.{q,k,v,o}_proj`",
        "If experts were meant to train: target the expert projections (`gate_proj`, `up_proj`, `down_proj` on a "
        "transformers-4 model; `target_parameters: [gate_up_proj, down_proj]` on a transformers-5 one).",
    ),
    Code(
        "AD241",
        "one-sided-gate-up",
        "warning",
        "Routed experts carry LoRA on one half of the gate/up pair (`gate_proj` without `up_proj`, Mixtral's `w1` "
        "without `w3`, or the reverse). An error in `verify` on a transformers-5 base, whose experts are fused.",
        "transformers 5 fuses gate and up into one `gate_up_proj` parameter; PEFT's conversion of per-expert "
        'adapters refuses half a pair ("Cannot convert PEFT target(s) gate_proj without also targeting up_proj"), '
        "so the adapter loads only on a transformers-4 stack; SGLang drops one-sided expert targets.",
        "`mlp.experts.0.gate_proj.lora_A.weight` and `mlp.experts.0.down_proj.lora_A.weight`, no `up_proj`",
        "`adapterdoc remap ADAPTER --experts fused --out DIR` (the missing half becomes a zero LoRA, exact), or "
        "retrain targeting both halves.",
    ),
    Code(
        "AD242",
        "partial-expert-coverage",
        "warning",
        "Some routed experts lack LoRA on a projection that other experts of the same block carry.",
        "A per-expert adapter normally covers every expert; gaps come from a truncated save, an expert-parallel "
        "shard saved alone, or a target regex that missed some indices. vLLM packs every expert's three "
        "projections together and PEFT's fused conversion needs each expert.",
        "`model.layers.0.mlp.experts.{0..5}.up_proj` present, experts 6 and 7 missing",
        "Re-save from all ranks (gather the expert-parallel shards) or check the target regex.",
    ),
    Code(
        "AD243",
        "experts-converted-at-load",
        "info",
        "PEFT converts this per-expert adapter to its fused layout when it loads it on this transformers-5 base.",
        "PEFT's `convert_peft_adapter_state_dict_for_transformers` (and `_convert_peft_config_moe` for the config) "
        "concatenates gate and up `lora_A` along the rank and makes `lora_B` block-diagonal: exact in function, "
        "rank doubled for `gate_up_proj`. The reverse is not implemented in PEFT.",
        "8 per-expert modules x 3 projections -> `gate_up_proj` (rank 4) and `down_proj` (rank 2) per block",
        "Nothing to do; `adapterdoc remap --experts fused` writes the converted form if you want it on disk.",
    ),
    # remap --for
    Code(
        "AD260",
        "dora-not-served",
        "error",
        "`remap --for ENGINE` refused: the adapter is DoRA (`use_dora`, `lora_magnitude_vector`) and the engine does "
        "not serve DoRA.",
        "DoRA rescales each output column by its magnitude vector over the norm of the merged weight; no LoRA-only "
        "adapter reproduces that, so any rewrite would serve different outputs (vLLM and SGLang refuse DoRA, TGI and "
        "LoRAX ignore it). The command exits 3 and changes nothing.",
        "`base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector` with `--for sglang`",
        "Merge the adapter into the base (`adapterdoc merge ADAPTER --base BASE --out DIR`) and serve the merged "
        "model, or retrain with `use_dora: false`.",
    ),
    Code(
        "AD261",
        "modules-to-save-not-served",
        "error",
        "`remap --for ENGINE` refused: the adapter carries `modules_to_save` (whole trained weights) that the engine "
        "does not apply.",
        "SGLang skips them with a debug log, TGI and LoRAX ignore them, vLLM refuses any but the classification "
        "heads: the engine would serve the base's weights for those modules. Dropping them is not exact, so the "
        "command exits 3 and changes nothing.",
        '`"modules_to_save": ["lm_head"]` with `--for tgi`',
        "Merge the adapter into the base (`adapterdoc merge ...`) and serve the merged model, or retrain without "
        "`modules_to_save`.",
    ),
    Code(
        "AD262",
        "expert-lora-not-served",
        "error",
        "`remap --for ENGINE` refused: the adapter has LoRA on MoE experts and the engine applies no expert LoRA.",
        "TGI and LoRAX map only attention and dense-MLP keys; expert tensors are logged as unused and the experts run "
        "as the base. No key rename makes them load, so the command exits 3 and changes nothing.",
        "`base_model.model.model.layers.0.mlp.experts.0.gate_proj.lora_A.weight` with `--for tgi`",
        "Merge the adapter (`adapterdoc merge ...`) and serve the merged model, or serve it on vLLM / SGLang.",
    ),
    Code(
        "AD263",
        "scaling-rounded",
        "warning",
        "`remap --for ENGINE` multiplied some `lora_B` tensors by their scaling ratio and the products were rounded.",
        "An engine that ignores `alpha_pattern` reads one scaling for every module; modules whose `alpha/r` differed "
        "keep their scaling only through their values (`B' = B * s_m / s`). A power-of-two ratio is exact; any other "
        "is rounded once per element: up to 2^-24 relative in float32, 2^-9 in bfloat16. The JSON's `rewrites` "
        "entry `scaling` gives the largest relative change measured.",
        '`alpha_pattern: {"v_proj": 24}` with `lora_alpha: 16`: `v_proj`\'s lora_B times 1.5 in bfloat16',
        "Accept the rounding (it is below the dtype's own precision), retrain with one alpha/r for every module, or "
        "serve on an engine that honours `alpha_pattern` (vLLM).",
    ),
    Code(
        "AD264",
        "rslora-folded",
        "info",
        "`remap --for ENGINE` folded rsLoRA into `lora_alpha`: `use_rslora` false, `lora_alpha' = lora_alpha * "
        "sqrt(r)` (and per `alpha_pattern` entry with its module's rank).",
        "SGLang ignores `use_rslora` (sgl-project/sglang#40835) and serves `alpha/r`, sqrt(r) times too weak; "
        "`alpha*sqrt(r)/r = alpha/sqrt(r)` gives every module its rsLoRA scaling exactly, in the config alone.",
        "`r: 16, lora_alpha: 16, use_rslora: true` -> `lora_alpha: 64, use_rslora: false`",
        "Nothing to do; serve the rewritten adapter.",
    ),
    Code(
        "AD265",
        "ranks-padded",
        "info",
        "`remap --for ENGINE` zero-padded every module to the largest rank (the engine ignores `rank_pattern`).",
        "Zero rows of `lora_A` and zero columns of `lora_B` leave `B A` unchanged exactly, in every dtype; `r` and "
        "`lora_alpha` follow (`lora_alpha = scaling * R`) so each module keeps its scaling. It costs the bytes of the "
        "zeros, given as `bytes_added` in the JSON's `rewrites`.",
        '`r: 8, rank_pattern: {"q_proj": 16}` -> every module rank 16, `lora_alpha` 2x',
        "Nothing to do; or retrain with one rank to save the padding bytes.",
    ),
    Code(
        "AD266",
        "regex-targets-listed",
        "info",
        "`remap --for ENGINE` replaced a regex `target_modules` by the list of module paths it selected.",
        "SGLang refuses a string `target_modules` other than `all` / `all-linear`. PEFT matches a list entry as the "
        "exact module name or a dotted suffix, so the adapter's own module paths select exactly the modules the "
        "regex did; the tensors are unchanged.",
        '`target_modules: ".*\\\\.(q_proj|v_proj)"` -> `["model.layers.0.self_attn.q_proj", ...]`',
        "Nothing to do; serve the rewritten adapter.",
    ),
    Code(
        "AD267",
        "served-model-unknown",
        "warning",
        "`remap --for ENGINE` could not tell which model the engine serves, so the keys were kept as they are.",
        "vLLM serves the base folder's own class, whose key layout may differ from the one the adapter was trained "
        "on (a text-class adapter on a vision-language base); neither `--base`, a locally available "
        "`base_model_name_or_path` nor the adapter's keys named a registry layout.",
        "an adapter whose keys match no registry layout, remapped `--for vllm` without `--base`",
        "Pass `--base BASE` (the model folder the server loads, or its config.json).",
    ),
    Code(
        "AD268",
        "zero-lora-added",
        "info",
        "`remap --for ENGINE` added zero LoRA (`lora_A` and `lora_B` all zeros) on modules the engine needs and the "
        "adapter lacked.",
        "A module with `B = A = 0` adds `B A x = 0`: PEFT's outputs are unchanged exactly, in every dtype. TGI and "
        "LoRAX load a layer type only when every layer has it (an adapter trained with `layers_to_transform`, or "
        "`q_proj` on some layers only, loses the whole type); SGLang stacks `q_proj` with `k_proj`/`v_proj` "
        "(`q_proj` without `v_proj` fails to load) and `gate_proj` with `up_proj` (a `k_proj`/`v_proj` without "
        "`q_proj`, an `up_proj` without `gate_proj`, is skipped). The zeros take the base module's shape and the "
        "module's rank; adapter_config.json then makes PEFT build exactly these modules (the leaf names added to "
        "`target_modules`, `layers_to_transform` / `layers_pattern` dropped). The JSON's `rewrites` entry `fill` "
        "lists the modules and `bytes_added`.",
        "`layers_to_transform: [0, 1]` on a 4-layer base with `--for tgi`: q_proj and v_proj added on layers 2-3",
        "Nothing to do; serve the rewritten adapter (the zeros cost their bytes and the engine's compute on them).",
    ),
    Code(
        "AD269",
        "zero-lora-fill-impossible",
        "error",
        "`remap --for ENGINE` refused: the engine needs zero LoRA added and it cannot be added exactly.",
        "The zeros need the base's module shapes (no `--base` and no local `base_model_name_or_path`), or the base "
        "itself has no such module on some layer (a hybrid stack whose linear-attention layers have no `q_proj`: "
        "TGI and LoRAX then drop that layer type whatever the adapter holds), or no `target_modules` makes PEFT "
        "build exactly the filled modules. The command exits 3 and changes nothing.",
        "a `q_proj` adapter for `--for tgi` on a base whose layers 0-2 are linear attention",
        "Pass `--base BASE` when the shapes are missing; otherwise serve the adapter on an engine that loads the "
        "layers it has (vLLM, SGLang), or merge it into the base (`adapterdoc merge ADAPTER --base BASE --out DIR`).",
    ),
    Code(
        "AD270",
        "engine-cannot-serve",
        "error",
        "`remap --for ENGINE` refused: the engine cannot apply this adapter whatever is rewritten.",
        "Some of its LoRA is on modules the engine has no LoRA support for (SGLang: Qwen3.5's `in_proj_qkv` / "
        "`in_proj_z`; TGI and LoRAX: anything outside their layer lists, such as `lm_head` on TGI or the "
        "linear-attention projections), or the engine serves no LoRA on the base's model type at all. Renaming or "
        "padding cannot make those modules served, and dropping them would change the outputs, so the command "
        "exits 3 and changes nothing (verify under the engine's profile names the same modules).",
        "a Qwen3.5 adapter on `in_proj_qkv` with `--for sglang`",
        "Serve it on an engine that applies those modules (vLLM), merge it into the base "
        "(`adapterdoc merge ADAPTER --base BASE --out DIR`), or retrain without those targets.",
    ),
    Code(
        "AD271",
        "fused-experts-old-peft-layout",
        "error",
        "A fused-expert adapter (`target_parameters`) written by a PEFT that laid out the factors of 3-D expert "
        "parameters the other way round from today's PEFT (`peft_version` 0.17 or 0.18, or 0.19.0).",
        "PEFT 0.17-0.18 reads an expert parameter `[E, d1, d2]` as `[E, in, out]`; PEFT >= 0.19.1 swaps in and out "
        "for the experts transformers stores `[E, out, in]` (every fused-expert model but gpt-oss, Aria, Ergo and "
        "the OpenAI privacy filter), and 0.19.0 swapped them for those four only. Today's PEFT therefore refuses "
        "such an adapter with a size mismatch, or, where the two sizes are equal (`2 * moe_intermediate_size == "
        "hidden_size` for `gate_up_proj`), loads it and applies every expert's delta transposed without a word.",
        "`peft_version: 0.18.1`, `...mlp.experts.base_layer.lora_A.weight [8, 24]` on a Qwen3-MoE base whose "
        "`gate_up_proj` is `[4, 24, 16]` (today's PEFT builds `[8, 16]`)",
        "Convert it to today's layout, exactly (each expert's factors swapped and transposed; `peft_version` set "
        "to 0.19.1): `adapterdoc remap ADAPTER --experts fused --out DIR`.",
    ),
    Code(
        "AD280",
        "quantized-base",
        "info",
        "The base is stored quantized (block FP8, compressed-tensors, GPTQ, AWQ, bitsandbytes, MXFP4): the scheme, "
        "its geometry and how many of the modules the adapter targets are quantized.",
        "The base stores a quantized module under renamed tensors (`q_proj.qweight`, `q_proj.weight_packed`, "
        "`q_proj.weight` + `weight_scale_inv`), while LoRA targets the module `q_proj` itself: the keys match by "
        "module path. Serving the adapter unmerged beside the quantized kernel applies it exactly; merging it into "
        "the quantized weights and quantizing again can erase a delta smaller than one quantization step.",
        "ct-w4a16 (bits 4, group 128): 14 of 14 targeted modules are quantized, e.g. model.layers.0.self_attn.q_proj",
        "Nothing to fix. Serve it unmerged, or merge into a bf16 copy of the base; check the survival before "
        "re-quantizing a merge.",
    ),
    Code(
        "AD281",
        "quantized-shape-mismatch",
        "warning",
        "A targeted module's logical shape `(out, in)`, as the quantized base stores it (unpacked from its codes), "
        "disagrees with the LoRA factors (`lora_A` `[r, in]`, `lora_B` `[out, r]`).",
        "The quantized tensors' own shapes are packed (`qweight [in/8, out]`, `weight_packed [out, in/8]`), so "
        "the logical shape is read back from the packing; where it differs from the factors the adapter was "
        "trained on another model (or the base's config and its tensors disagree), and loading it fails or "
        "applies a delta of the wrong size.",
        "model.layers.0.mlp.down_proj stored (256, 576), lora_A [4, 768]",
        "Verify against the base the adapter was trained on; compare `adapterdoc inspect BASE`'s quantization with "
        "the base's config.json.",
    ),
]
