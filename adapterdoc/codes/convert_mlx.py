"""AD8xx codes of the MLX format (see :mod:`adapterdoc.codes.convert`): AD800-AD809 what ``convert`` refuses or
reports between PEFT and mlx-lm's adapter folder, AD810-AD819 what ``verify`` finds in an mlx-lm adapter folder
that mlx-lm's ``load_adapters`` would refuse (or load wrongly) on a base."""

from adapterdoc.codes import Code

CODES: list[Code] = [
    Code(
        "AD801",
        "mlx-cannot-hold-whole-weights",
        "error",
        "The PEFT adapter holds whole weights (modules_to_save, a resized embedding or lm_head, trainable-token "
        "deltas) or is not LoRA; an mlx-lm LoRA adapter folder holds only lora_a, lora_b and m tensors.",
        'mlx-lm\'s load_adapters refuses every other tensor name ("not an adapter parameter in the model"); '
        "dropping them silently would serve a different model.",
        "`base_model.model.lm_head.weight` is a whole weight (modules_to_save)",
        "Convert an adapter without modules_to_save, or merge it (`adapterdoc merge`) and convert the merged "
        "model with mlx-lm's own `mlx_lm.convert`.",
    ),
    Code(
        "AD802",
        "mlx-cannot-hold-lora-bias",
        "error",
        "The adapter has LoRA biases (PEFT's lora_bias=True: `lora_B.bias`); mlx-lm's LoRALinear has none.",
        "The bias is part of the adapter's output; without it the converted adapter computes something else.",
        "`...q_proj.lora_B.bias` is a LoRA bias",
        "Train without lora_bias, or merge the adapter into the base and convert the merged model.",
    ),
    Code(
        "AD803",
        "mlx-no-dora-on-experts",
        "error",
        "DoRA on a mixture-of-experts expert: mlx-lm's LoRASwitchLinear has no DoRA (linear_to_lora_layers raises "
        '"SwitchLinear doesn\'t support DoRA yet").',
        "mlx-lm cannot build the layer, so the adapter cannot be loaded at all.",
        "`model.layers.0.mlp.experts.3.gate_proj`: DoRA on an expert",
        "Use plain LoRA on the experts, or DoRA only on attention and dense MLP modules.",
    ),
    Code(
        "AD804",
        "mlx-embedding-lora-not-exact",
        "error",
        "The adapter has LoRA on the token embedding of a base that ties its output projection to it (or whose "
        "`--base` does not say, or no `--base` was given). mlx-lm's LoRAEmbedding adds the same delta to the "
        "embedding rows as PEFT, but on a tied model it also adds it to the output projection (as_linear), which "
        "PEFT's does not: the two runtimes would compute different models. On a base with "
        "`tie_word_embeddings: false`, embedding LoRA converts exactly.",
        "A Qwen3 or Llama 3.2 adapter with embedding LoRA would change the logits in mlx-lm but not in PEFT.",
        "`base_model.model.model.embed_tokens.lora_embedding_A` is embedding LoRA, and the base is tied",
        "Pass `--base` of an untied base; on a tied one, train without LoRA on embed_tokens (or with a trainable "
        "lm_head instead), or merge and convert the merged model.",
    ),
    Code(
        "AD805",
        "mlx-module-outside-language-model",
        "error",
        "A LoRA module lies outside the language model (a vision tower, projector or audio encoder); mlx-lm's "
        "Qwen3.5 and Mistral 3 models load only the text part and drop the rest.",
        'mlx-lm refuses the tensor ("not an adapter parameter in the model") or, if dropped, the adapter does '
        "less than it did.",
        "`model.visual.blocks.0.attn.qkv` has no place in mlx-lm's model",
        "Drop the tower's LoRA (train with exclude_modules for the towers), or serve the VL adapter with an engine "
        "that runs the tower.",
    ),
    Code(
        "AD806",
        "mlx-scaling-rounded",
        "warning",
        "mlx-lm has one `scale` for every module; modules whose PEFT scaling differs (rank_pattern, alpha_pattern) "
        "had the ratio multiplied into their lora_b, and a ratio that is not a power of two rounds once per "
        "element.",
        "The result is as close as the dtype allows (float32: 2^-24 relative; bfloat16: up to 2^-9), not bit "
        "exact; a round trip back to PEFT then gives equal outputs up to that rounding.",
        "3 lora_B tensors carry their module's own scaling (scale 2): rounded once per element, largest relative "
        "rounding 5.9e-08",
        "Nothing, if that rounding is acceptable; else use one lora_alpha / r ratio for all modules (powers of two "
        "apart are exact) or --outtype f32.",
    ),
    Code(
        "AD807",
        "mlx-full-fine-tune",
        "error",
        "The mlx-lm folder has fine_tune_type `full`: its adapters.safetensors holds whole weights, not LoRA.",
        "There is no adapter to convert; reading the weights as one would be wrong.",
        "adapter_config.json: fine_tune_type is `full`",
        "Load the full fine-tune with mlx-lm and save it as a model (`mlx_lm.fuse`), then use it as a base.",
    ),
    Code(
        "AD808",
        "runtime-format-roundtrip-changed",
        "error",
        "`roundtrip`: converting the adapter to a runtime's format (MLX, GGUF) and back to PEFT changed a module's "
        "delta (scaling · B A, or DoRA's magnitude) beyond the rounding the conversion reported, or lost a module.",
        "`convert` promises exact conversions; a conversion that changes the delta serves a different model in "
        "that runtime.",
        "convert: peft → mlx → peft: `model.layers.0.self_attn.q_proj`: the delta changed by 0.5",
        "Report it (a conversion bug); until fixed, keep the PEFT adapter and check the converted one with "
        "`adapterdoc verify`.",
    ),
    Code(
        "AD810",
        "mlx-layer-outside-num-layers",
        "error",
        "A tensor sits in a decoder layer that `num_layers` does not give LoRA to: mlx-lm converts only the last "
        "num_layers layers (num_layers -1 or 0: all of them).",
        'load_adapters refuses the whole adapter: "model.layers.0.self_attn.q_proj.lora_a: not an adapter '
        'parameter in the model".',
        "`model.layers.0.self_attn.q_proj.lora_a`: layer 0, but num_layers 2 of 4 layers covers layers 2-3",
        "Set num_layers to the layer count minus the first adapted layer (or -1 for all): the message names it.",
    ),
    Code(
        "AD811",
        "mlx-module-not-in-keys",
        "error",
        "A tensor's module is not one of lora_parameters.keys: mlx-lm puts LoRA only on the listed module paths.",
        'load_adapters refuses the adapter ("not an adapter parameter in the model").',
        "`model.layers.1.mlp.down_proj.lora_a`: `mlp.down_proj` is not in keys [self_attn.q_proj]",
        "Add the key to lora_parameters.keys (the message lists the missing ones), or remove keys to let mlx-lm "
        "convert every linear layer.",
    ),
    Code(
        "AD812",
        "mlx-name-not-in-model",
        "error",
        "A tensor names a module the base model does not have under mlx-lm's parameter names (for example PEFT's "
        "`base_model.model.` prefix, transformers' `experts.N` instead of mlx-lm's `switch_mlp`, or "
        "`model.language_model.` instead of `language_model.model.`).",
        'load_adapters refuses the adapter ("not an adapter parameter in the model").',
        "`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` is a PEFT name",
        "Convert the adapter with `adapterdoc convert ADAPTER --to mlx --base BASE` rather than renaming by hand.",
    ),
    Code(
        "AD813",
        "mlx-shape-mismatch",
        "error",
        "A tensor's shape differs from the one mlx-lm builds: lora_a [in, rank] and lora_b [rank, out] (PEFT's "
        "lora_A / lora_B transposed), stacked experts [E, rank, in] and [E, out, rank], m [out].",
        'load_adapters refuses the adapter ("adapter shape ... does not match model parameter shape").',
        "`model.layers.0.self_attn.q_proj.lora_a` is [8, 64], mlx-lm builds [64, 8]",
        "A PEFT tensor copied without its transpose: convert with `adapterdoc convert --to mlx`; the message gives "
        "the expected shape.",
    ),
    Code(
        "AD814",
        "mlx-rank-mismatch",
        "error",
        "A tensor's rank differs from lora_parameters.rank: mlx-lm builds every LoRA layer with that one rank.",
        "load_adapters refuses the adapter (shape mismatch), or the config lies about the adapter.",
        "`...q_proj.lora_a` has rank 4, lora_parameters.rank is 8",
        "Set lora_parameters.rank to the tensors' rank, or zero-pad the smaller ranks (`adapterdoc convert` does).",
    ),
    Code(
        "AD815",
        "mlx-config-incomplete",
        "error",
        "adapter_config.json lacks a field mlx-lm's load_adapters reads: num_layers, lora_parameters.rank or "
        "lora_parameters.scale (or fine_tune_type is unknown).",
        "load_adapters fails with an AttributeError or KeyError (\"'SimpleNamespace' object has no attribute "
        "'num_layers'\" is what a PEFT folder gives).",
        "adapter_config.json lacks num_layers",
        "A PEFT folder is not an mlx-lm folder: convert it with `adapterdoc convert ADAPTER --to mlx`; else add "
        "the field the message names.",
    ),
    Code(
        "AD816",
        "mlx-model-type-unsupported",
        "warning",
        "mlx-lm has no model file for the base's model_type, so it cannot load the base, with or without the "
        "adapter.",
        "The adapter may be correct and still never run in mlx-lm.",
        "model_type `qwen3_5_text` is not one of mlx-lm's models (it loads the qwen3_5 checkpoint instead)",
        "Use the base mlx-lm supports (for Qwen3.5, the published checkpoint with model_type qwen3_5).",
    ),
    Code(
        "AD809",
        "mlx-family-names-unmapped",
        "error",
        "The adapter's module names are not the ones mlx-lm's model for this family has (its parameter paths start "
        "with other top-level modules, read from mlx-lm's model file), and adapterdoc has no rule that maps them; "
        "or nothing (no --base, no registry layout) says which family it is and its names are not mlx-lm's common "
        "`model.` / `lm_head`.",
        'mlx-lm\'s load_adapters refuses every such tensor ("not an adapter parameter in the model").',
        "`transformer.h.0.attn.c_attn` has no place in mlx-lm's `gpt2` model",
        "Give --base so the family is known; for a family adapterdoc does not map, merge the adapter and convert "
        "the merged model with mlx-lm's own `mlx_lm.convert`.",
    ),
]
