"""AD4xx: serving-profile findings (``verify --profile vllm``): vLLM's adapter rules as its own source states them.

The rules themselves and the vLLM release they describe are the vLLM profile's (:mod:`adapterdoc.engines.vllm`,
``VLLM_VERSION``); the explanations here name that release, because vLLM changes these rules between releases (a
test keeps the two in step).
"""

from adapterdoc.codes import Code, lorax, sglang, tgi, vllm

_V = "Describes vLLM 0.33.0."
_S = "Describes SGLang 0.5.23."
_P = "Describes PEFT 0.21.2."

CODES = [
    Code(
        "AD401",
        "vllm-missing-config-field",
        "error",
        "adapter_config.json lacks a field vLLM requires: `r`, `lora_alpha` or `target_modules`. " + _V,
        'vLLM\'s PEFTHelper refuses the adapter at load time ("Missing required configuration fields"); PEFT itself '
        "fills in defaults, so the adapter works in training code and fails only on the server.",
        'adapter_config.json without "lora_alpha"',
        "Write the missing fields explicitly (PEFT's `save_pretrained` always does).",
    ),
    Code(
        "AD402",
        "vllm-dora-unsupported",
        "error",
        "The adapter uses DoRA (`use_dora`, or `lora_magnitude_vector` tensors). " + _V,
        'vLLM refuses it ("vLLM does not yet support DoRA."): the request that names the adapter fails.',
        '"use_dora": true',
        "Retrain without DoRA for vLLM, or merge the adapter into the base weights (`adapterdoc merge`) and serve "
        "the merged model.",
    ),
    Code(
        "AD403",
        "vllm-modules-to-save",
        "error",
        "`modules_to_save` names modules other than `classifier`/`score`. " + _V,
        'vLLM only supports `modules_to_save` being None or ["classifier", "score"] (classification heads); any '
        "other whole-module weights (an `lm_head`, `embed_tokens`) make it refuse the adapter. It also loads only one "
        "full classification module per adapter (full weights for both `classifier` and `score` are refused), and "
        "only on a model that exposes one classification head.",
        '"modules_to_save": ["lm_head"]',
        "Train without `modules_to_save` (LoRA on the module instead), or merge the adapter and serve the merged model.",
    ),
    Code(
        "AD404",
        "vllm-lora-bias",
        "error",
        "The adapter trains LoRA biases (`lora_bias: true`, `lora_B.bias` tensors). " + _V,
        "vLLM refuses `lora_bias`; the tensors are also not an accepted LoRA weight name.",
        '"lora_bias": true',
        "Retrain with `lora_bias=False`, or merge the adapter.",
    ),
    Code(
        "AD405",
        "vllm-init-changes-base",
        "error",
        "`init_lora_weights` is a method that changes the base weights (PiSSA, OLoRA, CorDA, LoftQ). " + _V,
        "Such adapters are only correct on the modified base they were initialised from; vLLM serves them on the "
        "original base and refuses these init methods (only gaussian, eva, orthogonal, mica, lora_ga and booleans pass).",
        '"init_lora_weights": "pissa_niter_4"',
        "Convert the adapter to a plain LoRA against the original base (PEFT's `path_initial_model_for_weight_conversion` "
        "when saving), or serve the merged model.",
    ),
    Code(
        "AD406",
        "vllm-alora",
        "error",
        "The adapter is an activated LoRA (`alora_invocation_tokens`). " + _V,
        "vLLM refuses aLoRA adapters in its standard LoRA path.",
        '"alora_invocation_tokens": [128000, 9125]',
        "Serve it with a server that supports aLoRA, or retrain as a plain LoRA.",
    ),
    Code(
        "AD407",
        "vllm-layer-replication",
        "error",
        "The adapter uses `layer_replication`. " + _V,
        "vLLM refuses it: the served model's layer stack would differ from the one the adapter was trained on.",
        '"layer_replication": [[0, 4], [2, 5]]',
        "Retrain without layer replication.",
    ),
    Code(
        "AD408",
        "vllm-bdlora",
        "error",
        "The adapter uses block-diagonal LoRA (`use_bdlora`). " + _V,
        "vLLM refuses BD-LoRA adapters.",
        '"use_bdlora": true',
        "Retrain without BD-LoRA, or merge the adapter.",
    ),
    Code(
        "AD409",
        "vllm-qalora",
        "error",
        "The adapter uses QA-LoRA (`use_qalora`). " + _V,
        "vLLM refuses QA-LoRA adapters.",
        '"use_qalora": true',
        "Retrain without QA-LoRA, or merge the adapter.",
    ),
    Code(
        "AD410",
        "vllm-bias-unsupported",
        "error",
        '`bias` is not "none": the adapter trains base-layer biases. ' + _V,
        'vLLM refuses it ("Adapter bias is not supported.").',
        '"bias": "lora_only"',
        'Retrain with `bias="none"`, or merge the adapter.',
    ),
    Code(
        "AD411",
        "vllm-rank-above-limit",
        "error",
        "The adapter's largest rank (`r` and every `rank_pattern` value) exceeds the server's `--max-lora-rank`. "
        + _V,
        'vLLM refuses the adapter when it is loaded ("LoRA rank N is greater than max_lora_rank M"); the default '
        "limit is 16, so a rank-32 or rank-64 adapter fails on a server started without `--max-lora-rank`.",
        '"r": 64 on a server with the default --max-lora-rank 16',
        "Start the server with `--max-lora-rank` at least the adapter's rank (one of 1, 8, 16, 32, 64, 128, 256, 320, "
        "512) and pass the same value to `adapterdoc verify --max-lora-rank`, or retrain with a smaller rank.",
    ),
    Code(
        "AD412",
        "vllm-unsupported-tensor",
        "error",
        "A tensor name is not one vLLM accepts (`lora_A.weight`, `lora_B.weight`, `lora_embedding_A/B`, or the "
        "`score`/`classifier` weights of classification models). " + _V,
        'vLLM refuses the adapter ("<name> is unsupported LoRA weight").',
        "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
        "Remove the tensor or retrain without the feature that produced it (DoRA, lora_bias, modules_to_save).",
    ),
    Code(
        "AD413",
        "vllm-unexpected-module",
        "error",
        "A LoRA module's last name component is not one the served model supports for LoRA. " + _V,
        "vLLM compares only the leaf name against the model's LoRA modules (expanded through its packed modules, e.g. "
        'qkv_proj → q/k/v_proj) and refuses the whole adapter ("While loading ..., expected target modules in ... but '
        'received ...").',
        "a LoRA on `model.layers.0.linear_attn.conv1d`",
        "Train with `target_modules` limited to the language model's linear layers.",
    ),
    Code(
        "AD414",
        "vllm-tower-lora-dropped",
        "error",
        "LoRA modules sit on a vision/audio tower or a multimodal projector. " + _V,
        "vLLM gives no tower or connector module a LoRA wrapper unless the server runs "
        "`--enable-tower-connector-lora` on a class that supports it (and not `language_model_only`): the adapter "
        "loads, those modules' LoRA is applied nowhere, and the served adapter is not the trained one.",
        "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight",
        "Train with the towers excluded (`exclude_modules` regex), or enable tower LoRA on the server if it supports it.",
    ),
    Code(
        "AD415",
        "vllm-path-not-served",
        "error",
        "Adapter module paths do not exist in the model as vLLM serves it (text-only vs vision-language naming). "
        + _V,
        "vLLM checks only the last name component, so an adapter saved on the VL class and served text-only (or the "
        "reverse) passes its check and is then silently not applied: the server answers with the base model. This is "
        "the failure users report most.",
        "`model.language_model.layers.0.self_attn.q_proj` on a model served as Qwen3_5ForCausalLM (`model.layers.*`)",
        "Remap the adapter to the served layout (the finding's hint has the exact `adapterdoc remap` command), or "
        "serve the model class the adapter was trained on; set `--served-as` to what the server runs.",
    ),
    Code(
        "AD416",
        "vllm-served-as",
        "info",
        "Which model class the vLLM profile assumed the server runs (text-only or vision-language), and why. "
        + _V,
        "The full-path check depends on it; when it is inferred from the base config, say it explicitly with "
        "`--served-as` if the server runs something else (e.g. a text-only architecture override).",
        "served as vl: the base is Qwen3_5ForConditionalGeneration",
        "Pass `--served-as text|vl` to match the server.",
    ),
    Code(
        "AD417",
        "vllm-invalid-rank",
        "error",
        "`r` or a `rank_pattern` value is not a positive integer. " + _V,
        "vLLM refuses the adapter at once; PEFT may have accepted the config in training code.",
        '"rank_pattern": {"q_proj": 0}',
        "Fix the config: every rank must be a positive integer that matches the tensors.",
    ),
    Code(
        "AD418",
        "vllm-expert-layout",
        "error",
        "The adapter's routed-expert LoRA is in the other expert layout from the one vLLM reads for this model "
        "class: vLLM picks the layout from the class (`is_3d_moe_weight`), not from the file. " + _V,
        "On a class with 3-D MoE LoRA (`is_3d_moe_weight` True: Qwen3.5-MoE's VL class) vLLM stacks PEFT's fused "
        "pair (`experts.base_layer` = gate_up, `experts` = down) and its name check refuses per-expert "
        "`experts.N.*` modules at load; on the other MoE classes (Qwen3-MoE, `is_3d_moe_weight` False) it packs "
        'per-expert `experts.N.{gate,up,down}_proj` and refuses a fused `experts` tensor at load ("contains fused '
        '3D MoE weights ... uses a 2D MoE LoRA wrapper"); a lone fused gate_up (`experts.base_layer`) is passed over '
        'by the name check (`"base_layer" in name`) and applied nowhere. `--enable-mixed-moe-lora-format` makes the '
        "2-D wrapper read both, the fused form when the request sets `is_3d_lora_weight` "
        "(vllm/lora/model_manager.py, lora_model.py).",
        "PEFT-fused `model.layers.0.mlp.experts.base_layer.lora_A.weight` served on Qwen3MoeForCausalLM",
        "`adapterdoc remap ADAPTER --experts per-expert --out DIR` (or `--experts fused` for a 3-D class), "
        "then verify the new folder.",
    ),
    Code(
        "AD419",
        "vllm-expert-pair",
        "error",
        "A fused expert adapter carries only one of the two fused parameters (`gate_up_proj` or `down_proj`) on a "
        "class vLLM serves with 3-D MoE LoRA. " + _V,
        "vLLM reads a LoRA on `experts` itself as down_proj (PEFT saves a lone wrapper there even when only gate_up "
        "is targeted) and stacks only when it is there: with `experts` alone `assert gate_up_proj_lora is not None` "
        "in `_stack_moe_lora_weights` fails the load; with `experts.base_layer` alone the stacking never runs and "
        "gate_up is applied nowhere.",
        "`experts.lora_A.weight` (down_proj) without `experts.base_layer.lora_A.weight`",
        "Train both fused parameters (`target_parameters: [gate_up_proj, down_proj]`).",
    ),
    Code(
        "AD480",
        "vllm-lora-on-quantized-base",
        "info",
        "vLLM applies the adapter unmerged beside the quantized base's kernels (FP8, compressed-tensors, GPTQ, "
        "AWQ, MXFP4). " + _V,
        "Each LoRA linear runs the base layer's own quantized kernel and adds the LoRA product to its output: "
        "`BaseLinearLayerWithLoRA._apply_sync` calls `self._get_quant_method().apply(self.base_layer, x, bias)` "
        "and then `punica_wrapper.add_lora_linear` (vllm/lora/layers/base_linear.py). The quantized weights are "
        "never changed, so the adapter's delta is applied exactly, however small against a quantization step.",
        "a GPTQ base served with `--enable-lora`",
        "Nothing to fix: serve it unmerged. Do not merge it into the quantized weights for vLLM.",
    ),
    Code(
        "AD481",
        "vllm-quantization-unknown",
        "warning",
        "The base's `quantization_config.quant_method` is not one vLLM reads (bitsandbytes, in this release). "
        + _V,
        '`ModelConfig._verify_quantization` (vllm/config/model.py) raises "Unknown quantization method" for a '
        "method outside `QuantizationMethods` (vllm/model_executor/layers/quantization/__init__.py), which lists "
        "no `bitsandbytes`: the base does not start at all, with or without the adapter.",
        "a bitsandbytes NF4 base (`quant_method: bitsandbytes`)",
        "Serve the unquantized base (or a format vLLM lists: FP8, compressed-tensors, GPTQ, AWQ) with the adapter "
        "unmerged; the adapter itself needs no change.",
    ),
    Code(
        "AD482",
        "sglang-lora-on-quantized-base",
        "info",
        "SGLang applies the adapter unmerged beside the quantized base's kernels. " + _S,
        "Its LoRA linears run the base layer's own kernel and add the LoRA product: `base_fn` calls "
        "`self.base_layer.quant_method.apply(...)` and `lora_backend.forward_with_base` adds the LoRA output "
        "(`ColumnParallelLinearWithLoRA.forward`, `RowParallelLinearWithLoRA.forward`, "
        "`ReplicatedLinearWithLoRA.forward` in python/sglang/srt/lora/layers.py). No check in srt/lora/ or "
        "srt/server_args.py refuses LoRA by quantization method; whether the base itself loads is SGLang's "
        "quantization support, not a LoRA rule.",
        "a compressed-tensors W4A16 base served with `--enable-lora`",
        "Nothing to fix: serve it unmerged.",
    ),
    Code(
        "AD483",
        "peft-bnb-merge-requantizes",
        "info",
        "On a bitsandbytes base PEFT applies the adapter unmerged, and its merge re-quantizes. " + _P,
        "PEFT wraps bitsandbytes layers in `Linear4bit` / `Linear8bitLt` (peft/tuners/lora/bnb.py), whose "
        "`forward` adds the LoRA output to the quantized layer's. Their `merge` dequantizes "
        "(`dequantize_bnb_weight`), adds the delta and quantizes again (`bnb.nn.Params4bit` / `Int8Params`), only "
        'warning "may get different generations due to rounding errors": a delta smaller than one NF4 step '
        "is erased (measured: 1.7% of the delta kept on a tiny Llama).",
        "`merge_and_unload()` on a `load_in_4bit` base",
        "Serve it unmerged, or merge into a bf16 copy of the base (`adapterdoc merge`).",
    ),
]

CODES += sglang.CODES + tgi.CODES + lorax.CODES + vllm.CODES
