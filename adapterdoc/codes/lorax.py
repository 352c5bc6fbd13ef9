"""AD460-AD479: the LoRAX profile's findings (``verify --profile lorax``), part of the serving area.

Each explanation names the LoRAX release or commit its rule was read from (the profile's ``LORAX_VERSION``; a
test keeps the two in step).
"""

from adapterdoc.codes import Code

_V = "Describes LoRAX a7394ba3 (v0.4.0+23)."
_FIX = "`adapterdoc remap ADAPTER --for lorax --out DIR` (the finding prints it), then verify the new folder."

CODES: list[Code] = [
    Code(
        "AD460",
        "lorax-not-safetensors",
        "error",
        "The adapter's weights are not safetensors (`adapter_model.bin`). " + _V,
        "LoRAX's local and S3 sources list only `*.safetensors` files (utils/sources/local.py: \"No local weights "
        'found ... with extension .safetensors"); only a Hub download converts `.bin` on the way.',
        "an adapter folder holding adapter_model.bin",
        "Save with `save_pretrained(..., safe_serialization=True)`, or convert the file once.",
    ),
    Code(
        "AD461",
        "lorax-no-adapter-config",
        "error",
        "There is no adapter_config.json: LoRAX reads the adapter's config with PEFT's "
        "`LoraConfig.from_pretrained`. " + _V,
        'Without it `load_adapter_config` raises ValueError ("No valid adapter config file found").',
        "a bare adapter_model.safetensors",
        "Ship the adapter_config.json PEFT wrote with the weights.",
    ),
    Code(
        "AD462",
        "lorax-keys-not-text-style",
        "error",
        "LoRA tensors on layer types LoRAX supports are not named exactly "
        "`base_model.model.model.layers.{i}.self_attn.*` / `mlp.*` (or `base_model.model.lm_head`). " + _V,
        "Each flash model's `adapter_target_to_layer` builds the names `model.layers.{i}...` and "
        "`map_weights_for_model` looks up exactly `base_model.model.{name}.lora_A.weight`: a VL-style "
        "`model.language_model.layers`, an Omni `thinker.model.layers`, a missing `model.` or an adapter name in the "
        'key matches nothing and is only logged as "unused adapter weights". The request is answered by the base.',
        "`base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight`",
        _FIX,
    ),
    Code(
        "AD463",
        "lorax-module-type-dropped",
        "error",
        "A LoRA layer type is present in some layers and missing in others. " + _V,
        "`LoraWeights.load` (adapters/lora.py) returns None at the first layer without the type, so the type is "
        "dropped in every layer, without an error.",
        "`q_proj` LoRA in layers 0-13 of a 28-layer model (`layers_to_transform`)",
        "`adapterdoc remap ADAPTER --for lorax --out DIR` adds exact zero LoRA on the layers that lack the type "
        "(where the base has the module); else train every layer, or merge the adapter and serve the merged model.",
    ),
    Code(
        "AD464",
        "lorax-module-not-applied",
        "error",
        "LoRA modules sit on layers outside the architecture's `ADAPTER_LAYERS` (embeddings, MoE experts, towers, "
        "lora_B biases, `lm_head` where the model has none: e.g. gemma, mixtral). " + _V,
        "LoRAX loads only the layer types its flash model lists (models/flash_<type>.py `ADAPTER_LAYERS`); "
        'everything else is logged as "unused adapter weights" and its effect is lost.',
        "`base_model.model.model.layers.0.mlp.experts.3.down_proj.lora_A.weight` on mixtral (q, k, v, o only)",
        "Train only the listed layer types, or merge the adapter and serve the merged model.",
    ),
    Code(
        "AD465",
        "lorax-dora-ignored",
        "error",
        "The adapter uses DoRA (`use_dora`, `lora_magnitude_vector` tensors). " + _V,
        "LoRAX's `LoraConfig.load` reads only `r`, `target_modules`, `fan_in_fan_out`, `lora_alpha` and "
        "`use_rslora`: the magnitude vectors are never read and the adapter is served as plain LoRA. There is no "
        "exact rewrite.",
        '"use_dora": true',
        "Merge the adapter and serve the merged model, or retrain without DoRA.",
    ),
    Code(
        "AD466",
        "lorax-modules-to-save-ignored",
        "error",
        "The adapter carries `modules_to_save`. " + _V,
        "LoRAX never reads them: the served model keeps the base's module. There is no exact rewrite into LoRA.",
        '"modules_to_save": ["lm_head"]',
        "Merge the adapter and serve the merged model, or retrain with LoRA on those modules.",
    ),
    Code(
        "AD467",
        "lorax-patterns-ignored",
        "error",
        "`rank_pattern` / `alpha_pattern` give some modules a scaling other than `lora_alpha / r`. " + _V,
        "LoRAX scales every module with the top-level `lora_alpha` and `r`; the pattern fields are never read, so "
        "those modules are served at the wrong strength (ranks that differ between layers of one type cannot even "
        "be stacked).",
        '"r": 8, "alpha_pattern": {"v_proj": 32}',
        "`adapterdoc remap ADAPTER --for lorax --out DIR` makes the ranks uniform (zero-padding is exact); then "
        "verify the new folder.",
    ),
    Code(
        "AD468",
        "lorax-base-architecture",
        "error",
        "The adapter's `base_model_name_or_path` names a model of another architecture than the served base. "
        + _V,
        "LoRAX compares the two configs' `architectures` (`check_architectures` in utils/adapter.py) and raises "
        "ValueError when the adapter is loaded; the same architecture under another name only warns.",
        '"base_model_name_or_path": "org/other-model" of another class',
        "Serve the adapter on the base it was trained for, or fix `base_model_name_or_path`.",
    ),
    Code(
        "AD469",
        "lorax-model-type-unsupported",
        "error",
        "LoRAX has no model class with adapter loading for the base's `model_type`. " + _V,
        'models/__init__.py raises "Unsupported model type" for any type it does not route (its text-style '
        "classes: llama, mistral, qwen2, cohere, granite, gemma, gemma2, solar, mixtral).",
        "a qwen3_5 base",
        "Serve the adapter on an engine that supports the architecture (vLLM, SGLang), or merge it.",
    ),
    Code(
        "AD470",
        "lorax-rank-padding",
        "info",
        "LoRAX pads LoRA ranks for SGMV: to 8 at or below 8, else to the next multiple of 16 (`pad_rank`, "
        "utils/punica.py; per tensor-parallel shard). " + _V,
        "The padded rows are zeros but cost memory; the finding gives the padded rank and the extra bytes.",
        "r 4 served as rank 8",
        "Nothing to do; train with rank 8 or a multiple of 16 to avoid the cost.",
    ),
    Code(
        "AD471",
        "lorax-padding-rescales",
        "error",
        "The adapter's rank is one LoRAX pads, and it has more than one LoRA layer type: every layer type after "
        "the first in `ADAPTER_LAYERS` order is served with the scaling of the padded rank. " + _V,
        "`LoraWeights.load` sets `config.r = padded_rank` on the adapter's one config after each layer type, and "
        "the next type's `get_scaling_factor(config.lora_alpha, config.r)` reads it: with r 4 on q_proj and v_proj, "
        "v_proj is served at half strength (alpha/8 instead of alpha/4), silently.",
        "r 4 with target_modules q_proj, v_proj",
        "`adapterdoc remap ADAPTER --for lorax --out DIR` pads the rank in the file and scales `lora_alpha` so the "
        "scaling stays exact; or train with rank 8 or a multiple of 16.",
    ),
    Code(
        "AD472",
        "lorax-rank-above-kernels",
        "warning",
        "The padded rank is above 128, the largest rank LoRAX's custom SGMV and BGMV kernels handle. " + _V,
        "Above `MAX_RANK_CUSTOM` / `BGMV_MAX_RANK` (128) decoding uses the SGMV path and `can_vectorize` is false, "
        "so the adapter runs on the slower per-adapter loop; outputs are unchanged.",
        '"r": 256',
        "Accept the slower path, or train with rank 128 or less.",
    ),
    Code(
        "AD473",
        "lorax-fan-in-fan-out",
        "info",
        "`fan_in_fan_out` is set. " + _V,
        "LoRAX reads the field and never uses it; PEFT stores lora_A/lora_B the same way either way.",
        '"fan_in_fan_out": true',
        "Nothing to do.",
    ),
    Code(
        "AD474",
        "lorax-keys-not-modelled",
        "warning",
        "LoRAX serves this `model_type` with LoRA under other weight names (gpt2/qwen `c_attn`, phi3 fused "
        "`qkv_proj`, llava wrappers); this profile does not model them. " + _V,
        "The key checks below assume text-style names and may fail adapters LoRAX does read.",
        "a phi3 base",
        "Check the adapter's names against the model's `adapter_target_to_layer` in LoRAX's source.",
    ),
    Code(
        "AD475",
        "lorax-reads",
        "info",
        "What LoRAX would load of the adapter: the layer types applied and how many tensors. " + _V,
        "The other findings say why any tensor is not loaded; this one makes the verdict checkable at a glance.",
        "applies q_proj, v_proj on 28 layers (56 of 56 LoRA tensors)",
        "Nothing to do.",
    ),
]
