"""AD1xx: file-format findings (non-fatal ones; unusable files are errors with exit code 3)."""

from adapterdoc.codes import Code

CODES = [
    Code(
        "AD100",
        "input-unusable",
        "error",
        "An input cannot be used: missing, unreadable, corrupt, unsupported, or the operation was refused to "
        "protect data. The command exits with code 3 and changes nothing.",
        "A gate that crashes or half-writes on bad input is worse than none; exit 3 tells CI that the input, "
        "not the adapter's quality, is the problem.",
        "adapterdoc: error: adapter_model.safetensors: header too large: 4294967296 bytes announced",
        "Fix or replace the input named in the message; with --json the same text is in `error`.",
    ),
    Code(
        "AD101",
        "mixed-dtypes",
        "info",
        "The file holds tensors of more than one dtype.",
        "Adapters are normally saved in one dtype. A mix (say F32 lora_A with BF16 lora_B) usually means part of the "
        "state was cast by a trainer callback or a hand edit, and merged results will round differently per module.",
        "lora_A tensors F32, lora_B tensors BF16",
        "Re-save the adapter from the trained model in one dtype, or accept the mix knowingly.",
    ),
    Code(
        "AD102",
        "metadata-format-not-pt",
        "warning",
        "`__metadata__` has no `format` entry, or one that is not pt/tf/flax/mlx.",
        "Older transformers readers refuse a safetensors file whose `format` metadata is missing or unknown; PEFT "
        'always writes `{"format": "pt"}`.',
        '__metadata__ = {"source": "my-script"}',
        'Write the file with `safetensors.torch.save_file(..., metadata={"format": "pt"})`.',
    ),
    Code(
        "AD103",
        "pickle-weights",
        "warning",
        "The adapter weights are a pickle (`adapter_model.bin`), not safetensors.",
        "Pickles can run code when loaded by tools that do not use `weights_only=True`; several servers and "
        "hubs refuse or flag them. adapterdoc reads them with a restricted unpickler that resolves only the globals "
        "a tensor state dict uses (what `torch.load(weights_only=True)` allows) and never calls anything else.",
        "adapter_model.bin without adapter_model.safetensors",
        "Convert: `adapterdoc remap ADAPTER --rule '^$=>' --out NEW_DIR` writes adapter_model.safetensors.",
    ),
    Code(
        "AD104",
        "shard-index-mismatch",
        "warning",
        "A shard holds tensors that its index does not list.",
        "Loaders follow the index: tensors missing from it are silently ignored, so the checkpoint is not what "
        "its files suggest.",
        "model-00002.safetensors has `lm_head.weight`, weight_map does not name it",
        "Regenerate the index from the shards' headers.",
    ),
    Code(
        "AD105",
        "empty-file",
        "warning",
        "The safetensors file holds no tensors.",
        "An empty adapter file loads without error and changes nothing.",
        "adapter_model.safetensors with header `{}`",
        "Check that the trainer saved the adapter state (ZeRO-3 needs a gathered state dict).",
    ),
    Code(
        "AD110",
        "config-typo-changes-loading",
        "error",
        "adapter_config.json has a field PEFT does not know, and the closest known field is one that changes how "
        "the adapter loads (r, lora_alpha, target_modules, use_rslora, use_dora, rank/alpha patterns, "
        "modules_to_save, ...), which the file does not set.",
        'PEFT drops unknown fields with an "Unexpected keyword arguments" warning and loads with the default: '
        "`lora_alhpa: 32` loads with lora_alpha 8, so the adapter is served at a quarter of its trained scale "
        "and nothing fails.",
        '"lora_alhpa": 32 (did you mean lora_alpha?)',
        "Rename the field to the one PEFT knows.",
    ),
    Code(
        "AD111",
        "config-unknown-field",
        "warning",
        "adapter_config.json has a field PEFT's LoraConfig does not know; PEFT drops it with a warning. Its "
        "closest known field does not change loading, or is set as well.",
        "Usually a typo or a field from a newer PEFT; either way PEFT does not use it, and a newer field may "
        "mean the adapter needs a newer PEFT to load as trained.",
        '"lora_dropuot": 0.05 (did you mean lora_dropout?)',
        "Fix the name, remove the field, or upgrade PEFT if a newer version wrote it.",
    ),
    Code(
        "AD112",
        "config-flag-not-boolean",
        "error",
        "A boolean field that changes loading (use_dora, use_rslora, lora_bias, use_qalora, use_bdlora) holds a "
        "string or number instead of true/false.",
        'PEFT never parses these: it tests their truthiness, so `"use_dora": "false"` builds DoRA layers and '
        '`"use_rslora": "false"` scales by alpha/sqrt(r). adapterdoc shows such a field as not set.',
        '"use_dora": "false"',
        'Write a JSON boolean without quotes: `"use_dora": false`.',
    ),
    Code(
        "AD113",
        "config-pattern-value-not-number",
        "error",
        "A rank_pattern value is not a positive integer, or an alpha_pattern value is not a number (a string, "
        "a float rank, a boolean).",
        "PEFT does not convert pattern values: it raises TypeError when it builds the LoRA layer of a module the "
        "key matches, so the adapter does not load. adapterdoc does not coerce them either.",
        '"rank_pattern": {"q_proj": "4"}',
        'Write the value as a JSON number: `"rank_pattern": {"q_proj": 4}`.',
    ),
    Code(
        "AD114",
        "config-field-wrong-type",
        "error",
        "A field that changes loading has a JSON type PEFT cannot use: bias not one of none/all/lora_only, "
        "modules_to_save or target_parameters not a list of names, layers_to_transform not an index or a list "
        "of indices, lora_dropout not a number.",
        "PEFT does not validate these when it reads the config; it raises when it builds the model, or, for a "
        "modules_to_save string, matches its letters one by one and saves whole modules nobody meant.",
        '"modules_to_save": "lm_head"',
        'Use the type PEFT expects: `"modules_to_save": ["lm_head"]`.',
    ),
    Code(
        "AD115",
        "base-built-as-adapter-class",
        "info",
        "The base can be built as more than one class (a VL model and its text-only counterpart, a wrapper and "
        "its thinker, an encoder with and without its head); verify built the one the adapter's "
        "auto_mapping.base_model_class names.",
        "PEFT records the class an adapter was made for; `adapterdoc remap` updates it. Checking a remapped "
        "text adapter against the VL class its base folder defaults to would report every key as unexpected.",
        "base built as Qwen3_5ForCausalLM (auto_mapping.base_model_class) from the qwen3_5 config's text_config",
        "Nothing; pass a base of the other class with --base to check the adapter against that instead.",
    ),
]
