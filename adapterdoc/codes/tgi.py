"""AD440-AD459: the TGI profile's findings (``verify --profile tgi``), part of the serving area.

Each explanation names the TGI release or commit its rule was read from (the profile's ``TGI_VERSION``; a test
keeps the two in step). TGI's LoRA code is LoRAX's (``adapters/lora.py`` and ``utils/adapter.py`` say so).
"""

from adapterdoc.codes import Code

_V = "Describes TGI db931fcf (v3.3.7+1)."
_FIX = "`adapterdoc remap ADAPTER --for tgi --out DIR` (the finding prints it), then verify the new folder."

CODES: list[Code] = [
    Code(
        "AD440",
        "tgi-not-safetensors",
        "error",
        "The adapter's weights are not safetensors (`adapter_model.bin`). " + _V,
        "TGI lists only `*.safetensors` files of an adapter (`_weight_files_from_dir(..., extension='.safetensors')` "
        'in utils/adapter.py) and stops at start with "No adapter weights found".',
        "an adapter folder holding adapter_model.bin",
        "Save the adapter with `save_pretrained(..., safe_serialization=True)` (PEFT's default), or convert the file "
        "once with safetensors' `save_file`.",
    ),
    Code(
        "AD441",
        "tgi-no-adapter-config",
        "error",
        "There is no adapter_config.json: TGI reads the adapter's config with PEFT's `LoraConfig.from_pretrained`. "
        + _V,
        "Without it TGI cannot load the adapter at all (`LoraConfig.load` in adapters/lora.py).",
        "a bare adapter_model.safetensors",
        "Ship the adapter_config.json PEFT wrote with the weights.",
    ),
    Code(
        "AD442",
        "tgi-keys-not-text-style",
        "error",
        "LoRA tensors on layer types TGI supports are not named exactly "
        "`base_model.model.model.layers.{i}.self_attn.*` / `mlp.*` (`.lora_A.weight` / `.lora_B.weight`). "
        + _V,
        "TGI builds those exact names for every layer (`build_layer_weight_lookup`: `model.layers.{i}...`, also for a "
        "VL model whose language model it finds under `language_model`) and looks each one up with `in`: a "
        "VL-style `model.language_model.layers`, an Omni `thinker.model.layers`, a missing `model.` or an adapter name "
        'left in the key (`lora_A.default.weight`) matches nothing and is only logged as "unused adapter weights". '
        "The server answers with the base model.",
        "`base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight`",
        _FIX,
    ),
    Code(
        "AD443",
        "tgi-module-type-dropped",
        "error",
        "A LoRA layer type (e.g. `q_proj`) is present in some layers and missing in others. " + _V,
        "`LoraWeights.prepare_weights` loads a layer type only when every layer has both lora_A and lora_B; at the "
        "first layer without them it returns None and the whole type is dropped in every layer, without an error "
        "(adapters trained with `layers_to_transform` or `layers_pattern`, or with a tower's layers renamed).",
        "`q_proj` LoRA in layers 0-13 of a 28-layer model",
        "`adapterdoc remap ADAPTER --for tgi --out DIR` adds exact zero LoRA on the layers that lack the type (the "
        "base must have the module there: not on a hybrid stack's linear-attention layers); else train every layer, "
        "or merge the adapter (`adapterdoc merge`) and serve the merged model.",
    ),
    Code(
        "AD444",
        "tgi-module-not-applied",
        "error",
        "LoRA modules sit on layers TGI never loads: TGI applies LoRA only to `q_proj`, `k_proj`, `v_proj`, "
        "`o_proj`, `gate_proj`, `up_proj`, `down_proj`, `qkv_proj`, `c_proj` and `c_fc` of the decoder layers: no "
        "`lm_head`, no embeddings, no MoE experts, no vision or audio tower, no lora_B bias. " + _V,
        "The list is fixed in `get_model_with_lora_adapters` (models/__init__.py); everything else is logged as "
        '"unused adapter weights" and the part of the adapter\'s effect it carries is lost.',
        "`base_model.model.model.layers.0.mlp.experts.3.down_proj.lora_A.weight`",
        "Train only the supported linear layers, or merge the adapter and serve the merged model.",
    ),
    Code(
        "AD445",
        "tgi-dora-ignored",
        "error",
        "The adapter uses DoRA (`use_dora`, `lora_magnitude_vector` tensors). " + _V,
        "TGI's `LoraConfig.load` reads only `r`, `target_modules`, `fan_in_fan_out`, `lora_alpha` and `use_rslora`: "
        "DoRA's magnitude vectors are never read and the adapter is served as the plain LoRA it is not. There is no "
        "exact rewrite to plain LoRA.",
        '"use_dora": true',
        "Merge the adapter into the base (`adapterdoc merge`) and serve the merged model, or retrain without DoRA.",
    ),
    Code(
        "AD446",
        "tgi-modules-to-save-ignored",
        "error",
        "The adapter carries `modules_to_save` (whole trained copies of a module, e.g. `lm_head`). " + _V,
        "TGI never reads them: the served model keeps the base's module, not the trained one. There is no exact "
        "rewrite into LoRA.",
        '"modules_to_save": ["lm_head"]',
        "Merge the adapter and serve the merged model, or retrain with LoRA on those modules instead.",
    ),
    Code(
        "AD447",
        "tgi-patterns-ignored",
        "error",
        "`rank_pattern` / `alpha_pattern` give some modules a scaling other than `lora_alpha / r`. " + _V,
        "TGI scales every module with the top-level `lora_alpha` and `r` (`get_scaling_factor(config.lora_alpha, "
        "config.r, ...)`); the pattern fields are never read, so those modules are served at the wrong strength "
        "(and ranks that differ between layers of one type cannot be stacked).",
        '"r": 8, "rank_pattern": {"v_proj": 16}',
        "`adapterdoc remap ADAPTER --for tgi --out DIR` makes the ranks uniform (zero-padding is exact); then verify "
        "the new folder.",
    ),
    Code(
        "AD448",
        "tgi-base-architecture",
        "error",
        "The adapter's `base_model_name_or_path` names a model of another architecture than the served base. "
        + _V,
        "TGI compares the two configs' `architectures` (`check_architectures` in utils/adapter.py) and raises "
        'ValueError ("Architectures differ") at start; the same architecture under another name only warns.',
        '"base_model_name_or_path": "org/other-model" of another class',
        "Serve the adapter on the base it was trained for, or fix `base_model_name_or_path` if it is only wrong.",
    ),
    Code(
        "AD449",
        "tgi-model-type-unsupported",
        "error",
        "TGI has no adapter-aware model class for the base's `model_type`. " + _V,
        "TGI loads LoRA only into its own flash layers (llama, phi3, granite, mistral, qwen2, gemma2, gemma3, "
        "starcoder2); on any other type `build_layer_weight_lookup` reads a `self_attn.query_key_value` the class "
        "does not have, so no adapter can be served on that base. qwen2_vl and qwen2_5_vl have adapter-aware "
        "layers, but the loader reads `text_model.model`, which their text model lacks: start-up fails with an "
        "AttributeError (huggingface/text-generation-inference#3335, open).",
        "a qwen3_5 or qwen2_5_vl base",
        "Serve the adapter on an engine that supports the architecture (vLLM, SGLang), or merge it and serve the "
        "merged model.",
    ),
    Code(
        "AD450",
        "tgi-rank-padding",
        "info",
        "TGI pads LoRA ranks for its SGMV kernel: to 8 at or below 8, else to the next multiple of 16 (per "
        "tensor-parallel shard). " + _V,
        "The padded rows are zeros (the output is unchanged) but cost memory; the finding says the padded rank and "
        "the extra bytes.",
        "r 4 served as rank 8",
        "Nothing to do; train with a rank the kernel does not pad (8, 16, 32, ...) to avoid the cost.",
    ),
    Code(
        "AD451",
        "tgi-padding-rescales",
        "warning",
        "The adapter's rank is one TGI pads, and it has more than one LoRA layer type: TGI computes every layer "
        "type's scaling after the first with the padded rank. " + _V,
        "`prepare_weights` sets `config.r = padded_rank` after each layer type on the one shared config, and the "
        "next type's `get_scaling_factor(config.lora_alpha, config.r)` reads it: with r 4 and q_proj, v_proj, "
        "v_proj is served at half strength. A warning because the padding itself comes from the "
        "kernels-community/punica-sgmv kernel (not in the TGI repository; its LoRAX original pads this way).",
        "r 4 with target_modules q_proj, v_proj",
        "`adapterdoc remap ADAPTER --for tgi --out DIR` pads the rank in the file and scales `lora_alpha` to keep "
        "the scaling exact; or train with rank 8 or a multiple of 16.",
    ),
    Code(
        "AD452",
        "tgi-fan-in-fan-out",
        "info",
        "`fan_in_fan_out` is set. " + _V,
        "TGI reads the field and never uses it; PEFT stores lora_A/lora_B in the same orientation either way, so it "
        "has no effect on the served adapter.",
        '"fan_in_fan_out": true',
        "Nothing to do.",
    ),
    Code(
        "AD453",
        "tgi-reads",
        "info",
        "What TGI would load of the adapter: the layer types applied and how many tensors. " + _V,
        "The other findings say why any tensor is not loaded; this one makes the verdict checkable at a glance.",
        "applies q_proj, v_proj on 28 layers (56 of 56 LoRA tensors)",
        "Nothing to do.",
    ),
]
