"""AD420-AD439 and AD490-AD499: the SGLang profile's findings (``verify --profile sglang``), part of the serving area.

Each explanation names the SGLang release its rule was read from (the profile's ``SGLANG_VERSION``, in
:mod:`adapterdoc.engines.sglang`; a test keeps the two in step). Sources: ``python/sglang/srt/lora/``
``lora_config.py``, ``lora.py``, ``lora_manager.py``, ``mem_pool.py``, ``utils.py`` and
``srt/arg_groups/fields/lora.py``.
"""

from adapterdoc.codes import Code

_S = "Describes SGLang 0.5.23."
_FIX = (
    "`adapterdoc remap ADAPTER --for sglang --out DIR` (the finding's hint has the command), then verify DIR."
)

CODES: list[Code] = [
    Code(
        "AD420",
        "sglang-rslora-ignored",
        "error",
        "The adapter uses rsLoRA (`use_rslora: true`), which SGLang ignores: it scales every adapter by "
        "`lora_alpha / r` (`LoRAAdapter.scaling`, lora.py). " + _S,
        "PEFT scales an rsLoRA adapter by `lora_alpha / sqrt(r)`; SGLang serves it `sqrt(r)` times too weak "
        "(4x at r=16) with no error or warning (sgl-project/sglang#40835, open): the server answers almost like "
        "the base model.",
        '"use_rslora": true, "r": 16, "lora_alpha": 16 (PEFT scaling 4, served 1)',
        "Fold the scaling into `lora_alpha` (`alpha' = alpha * sqrt(r)` is exact): " + _FIX,
    ),
    Code(
        "AD421",
        "sglang-dora-refused",
        "error",
        "The adapter uses DoRA (`use_dora`, or `lora_magnitude_vector` tensors). " + _S,
        "SGLang refuses it when it is loaded (`validate_new_adapter`: \"LoRA serving currently doesn't support "
        'DoRA adapters"); a config without `use_dora` but with magnitude tensors would load with the magnitudes '
        "dropped.",
        '"use_dora": true',
        "There is no exact rewrite: merge the adapter into the base (`adapterdoc merge`) and serve the merged "
        "model, or retrain without DoRA.",
    ),
    Code(
        "AD422",
        "sglang-config-refused",
        "error",
        "adapter_config.json cannot be read as an SGLang LoRA config: `peft_type` is not `LORA`, or one of "
        "`peft_type`, `r`, `lora_alpha`, `target_modules` is missing or not usable. " + _S,
        "`LoRAConfig` reads `target_modules`, `r` and `lora_alpha` by key and `LoRAAdapter` asserts "
        '`peft_type.lower() == "lora"` (lora.py): the load fails with a KeyError or an AssertionError.',
        '"peft_type": "LOHA"',
        "Serve only LoRA adapters saved by PEFT's `save_pretrained` (it writes every field).",
    ),
    Code(
        "AD423",
        "sglang-regex-targets",
        "error",
        "`target_modules` is a string other than `all` / `all-linear` (a PEFT regex), or not a list. " + _S,
        "SGLang refuses it: `get_normalized_target_modules` raises \"Only 'all' or 'all-linear' can be used as the "
        'string for target module" and `init_lora_shapes` "SGLang does not recognize target_modules=..." (utils.py, '
        "lora_manager.py).",
        '"target_modules": ".*\\\\.(q_proj|v_proj)"',
        "Replace the regex by the explicit list of the modules it matched: " + _FIX,
    ),
    Code(
        "AD424",
        "sglang-rank-above-limit",
        "error",
        "The adapter's rank `r` exceeds the server's `--max-lora-rank` (as given to `verify --max-lora-rank`). "
        + _S,
        "A startup `--lora-paths` adapter is not checked against it: SGLang starts, then the first request that "
        "uses the adapter fails (the pool's buffers are `--max-lora-rank` rows; \"LoRA buffer shape ... does not "
        'match weight shape ..."). Loaded later with `/load_lora_adapter`, the memory pool refuses it '
        '(`can_support`: `config.r > max_lora_rank`; "... with rank N is incompatible '
        'with the current LoRA memory pool configuration"). SGLang has no fixed ceiling: without `--max-lora-rank` '
        "the pool takes the largest rank among the startup adapters, so verify checks the rank only when given.",
        '"r": 64 on a server started with --max-lora-rank 32',
        "Start the server with `--max-lora-rank` at least the adapter's rank, or retrain with a smaller rank.",
    ),
    Code(
        "AD425",
        "sglang-targets-not-served",
        "error",
        "The adapter's normalised target modules are not a subset of the server's `--lora-target-modules`. "
        + _S,
        'SGLang refuses the adapter (`can_support`, and `init_lora_shapes` at startup: "contains target modules '
        '[...] that are not included in the specified --lora-target-modules"). Names are normalised first: '
        "q/k/v_proj count as qkv_proj, gate/up_proj as gate_up_proj.",
        "target_modules [q_proj, v_proj, o_proj] on a server with --lora-target-modules q_proj v_proj",
        "Add the modules to the server's `--lora-target-modules` (or use `all`) and pass the same list to "
        "`adapterdoc verify --lora-target-modules`.",
    ),
    Code(
        "AD426",
        "sglang-modules-to-save-skipped",
        "error",
        "The adapter has `modules_to_save` (whole trained copies of modules) outside the decoder layers, which "
        "SGLang does not apply. " + _S,
        "SGLang keeps a tensor outside the decoder layers only when it is a targeted `embed_tokens` / `lm_head` "
        "LoRA, and of those it loads only the `lora_A` / `lora_B` factors; a `modules_to_save` copy is skipped with "
        "at most a debug log (`_process_weight`, lora.py; `load_lora_weight_to_buffer`, mem_pool.py), so the trained "
        "head or embedding is silently replaced by the base one. (PEFT's `base_layer.weight` copy beside LoRA on "
        "`embed_tokens` / `lm_head` is not this: see AD490 / AD491. `modules_to_save` inside the decoder layers, "
        "such as a layer norm, is AD493.)",
        '"modules_to_save": ["lm_head"]',
        "There is no exact LoRA rewrite: merge the adapter into the base (`adapterdoc merge`) and serve the "
        "merged model, or retrain with LoRA on those modules (`target_modules`) instead.",
    ),
    Code(
        "AD427",
        "sglang-weight-matches-no-target",
        "error",
        "LoRA weights in the decoder layers match no target module of the server, after SGLang's own renames "
        "(q+k+v -> qkv_proj, gate+up -> gate_up_proj, w1/w3/w2 -> gate/up/down). " + _S,
        "SGLang starts, then the first request that uses the adapter fails. The memory pool matches each weight "
        "name against the server's target modules by substring (`get_target_module_name`) when it copies the "
        "adapter into its buffers, at that request: its pre-check only logs a warning for a weight that matches "
        "none (an error with `--lora-strict-loading`), and the copy loop then raises `ValueError: Cannot find "
        "target module name` (mem_pool.py `load_lora_weight_to_buffer`). Typical causes: v_proj (or k_proj + "
        "v_proj) LoRA without q_proj, up_proj without gate_proj (both left unrenamed, so they match neither "
        "qkv_proj nor gate_up_proj), or an adapter with `all-linear` targets on a server whose "
        "`--lora-target-modules` is narrower.",
        "layers.0.self_attn.k_proj.lora_A.weight with target_modules [k_proj, v_proj]",
        "Target q_proj with k/v_proj and gate_proj with up_proj, or widen the server's `--lora-target-modules`.",
    ),
    Code(
        "AD428",
        "sglang-non-layer-skipped",
        "error",
        "Tensors outside the decoder layers (no `layers.N.` in the name) that are not a targeted `embed_tokens` / "
        "`lm_head` LoRA. " + _S,
        "SGLang buckets weights by their `layers.N` part; outside the layers it keeps only targeted embedding and "
        "lm_head LoRA and added-token embeddings; everything else is dropped without a log line (lora.py "
        "`_process_weight`).",
        "base_model.model.model.norm.lora_A.weight",
        "Retrain without LoRA on those modules, or merge the adapter and serve the merged model.",
    ),
    Code(
        "AD429",
        "sglang-expert-pair",
        "error",
        "The adapter has routed-expert LoRA but the server's target modules lack `gate_up_proj` or `down_proj`. "
        + _S,
        "SGLang wraps a fused-MoE layer with LoRA only when both `gate_up_proj` and `down_proj` are targeted "
        "(`init_lora_modules`, lora_manager.py; sgl-project/sglang#32376): with one of them the expert LoRA is "
        "loaded and then applied nowhere.",
        "target_modules [down_proj] on Qwen3-MoE: experts.N.down_proj LoRA dropped",
        "Train (or serve with `--lora-target-modules`) both gate/up_proj and down_proj.",
    ),
    Code(
        "AD430",
        "sglang-fused-expert-layout",
        "error",
        "The adapter's routed-expert LoRA is in PEFT's fused-parameter layout (`target_parameters`, "
        "`experts.base_layer.lora_A` keys), which SGLang does not read. " + _S,
        "SGLang reads only `target_modules` (never `target_parameters`) and matches expert weights by their "
        "projection name (`experts.N.gate_proj`, or 3-D `experts.gate_up_proj`): PEFT's fused keys name no "
        "projection and match no target (sgl-project/sglang#25528). SGLang starts, then the first request that uses "
        "the adapter fails (`ValueError: Cannot find target module name`, mem_pool.py `load_lora_weight_to_buffer`).",
        "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight",
        "Rewrite the experts one LoRA per expert (exact): " + _FIX,
    ),
    Code(
        "AD431",
        "sglang-added-tokens",
        "error",
        "added_tokens.json holds token ids at or above the base model's vocabulary size. " + _S,
        "SGLang refuses the adapter (`validate_new_adapter`: \"LoRA serving currently doesn't support adapters "
        'that add tokens to the vocabulary"); ids below the vocabulary size are ignored as copies of the base '
        "tokenizer.",
        'added_tokens.json {"<tool>": 32000} on a base with vocab_size 32000',
        "Serve the merged model with the resized vocabulary, or train without new tokens.",
    ),
    Code(
        "AD432",
        "sglang-tower-lora",
        "error",
        "LoRA modules sit on a vision/audio tower or a multimodal projector. " + _S,
        "SGLang wraps only the language model's modules (`should_apply_lora` on the VL classes) and files "
        "weights under the decoder layer whose number their name carries: tower LoRA is dropped, or lands on the "
        "language model's layer of the same number.",
        "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight",
        "Train with the towers excluded, or merge the adapter and serve the merged model.",
    ),
    Code(
        "AD433",
        "sglang-rank-pattern",
        "error",
        "`rank_pattern` gives some modules a rank other than `r`; SGLang reads only `r`. " + _S,
        "SGLang starts, then the first request that uses the adapter fails: the memory pool slices every module's "
        "buffer to `r` rows (times the stacking) when it copies the adapter in, at that request, and asserts the "
        'weight fits ("LoRA buffer shape ... does not match weight shape ...", mem_pool.py).',
        '"r": 8, "rank_pattern": {"o_proj": 16}',
        "Make the ranks uniform (zero-padding lora_A/lora_B is exact): " + _FIX,
    ),
    Code(
        "AD434",
        "sglang-alpha-pattern",
        "error",
        "`alpha_pattern` gives some modules a `lora_alpha` of their own; SGLang ignores it. " + _S,
        "SGLang scales every module by the adapter's `lora_alpha / r`, so the modules named in `alpha_pattern` "
        "are served at the wrong strength, silently.",
        '"lora_alpha": 16, "alpha_pattern": {"o_proj": 64}',
        "Fold each module's scaling into its lora_B (exact): " + _FIX,
    ),
    Code(
        "AD435",
        "sglang-qkv-incomplete",
        "error",
        "A layer has q_proj LoRA without v_proj LoRA. " + _S,
        "SGLang stacks q/k/v into qkv_proj and assumes v_proj is present (`normalize_qkv_proj` reads it, and "
        "fills a missing k_proj with zeros shaped like v_proj): loading the adapter fails with a KeyError.",
        "target_modules [q_proj] or [q_proj, k_proj]",
        "Train with v_proj targeted as well (PEFT's default q_proj + v_proj works).",
    ),
    Code(
        "AD436",
        "sglang-target-unsupported",
        "error",
        "A normalised target module is not one SGLang has LoRA support for (its `--lora-target-modules` choices "
        "and the modules its memory pool can size). " + _S,
        "A server started with the adapter infers its target modules from it and fails to size a buffer for an "
        "unknown module (`get_hidden_dim` raises NotImplementedError); with `--lora-target-modules` the adapter "
        "is refused as not a subset.",
        "target_modules [conv1d] (a linear-attention convolution)",
        "Train with `target_modules` limited to the language model's supported linear layers.",
    ),
    Code(
        "AD437",
        "sglang-server-assumed",
        "info",
        "The SGLang server settings the profile checked against: `--max-lora-rank` and `--lora-target-modules` "
        "as given to verify, or inferred from this adapter as SGLang does for a startup `--lora-paths` adapter. "
        + _S,
        "The rank and target checks depend on them; pass the server's own values to `adapterdoc verify` when it "
        "serves several adapters or is started with explicit values.",
        "server targets ['o_proj', 'qkv_proj'] (inferred from the adapter), no --max-lora-rank",
        "Pass `--max-lora-rank N` and `--lora-target-modules ...` to match the server.",
    ),
    Code(
        "AD438",
        "sglang-lora-bias",
        "error",
        "The adapter trains LoRA biases (`lora_bias: true`, `lora_B.bias` tensors). " + _S,
        "SGLang serves the adapter without its biases, with no error: `load_lora_weight_to_buffer` (mem_pool.py) "
        "files every tensor of a module without `lora_A` in its name as that module's lora_B, the bias first and "
        "then the `lora_B.weight`, which overwrites it; the buffers have no bias. Every output of those modules is "
        "off by the bias. `remap --for sglang` refuses the adapter (AD492): no LoRA-only rewrite is exact.",
        '"lora_bias": true',
        "Retrain with `lora_bias=False`, or merge the adapter and serve the merged model.",
    ),
    Code(
        "AD490",
        "sglang-embedding-copy-differs",
        "error",
        "PEFT's `base_layer.weight` copy of a LoRA-targeted `embed_tokens` / `lm_head` differs from the base "
        "model's weight (a resized vocabulary, or an embedding that was trained). " + _S,
        "PEFT saves the whole embedding beside LoRA on it and loads it over the base's; SGLang skips the copy on "
        "purpose (it loads only the `lora_A` / `lora_B` factors, mem_pool.py) and serves the base's own weight, so "
        "its outputs differ from PEFT's; a resized vocabulary does not even fit its buffers. verify compares the "
        "copy with the base's weight when the base has weights (the safetensors bytes; a `tiny:` base is rebuilt), "
        "and the shapes with the base's config otherwise.",
        "`base_model.model.model.embed_tokens.base_layer.weight` of shape [1010, 64] on a base with vocab_size 1000",
        "Merge the adapter into the base (`adapterdoc merge`) and serve the merged model (with its tokenizer).",
    ),
    Code(
        "AD491",
        "sglang-embedding-copy-skipped",
        "info",
        "PEFT's `base_layer.weight` copy of a LoRA-targeted `embed_tokens` / `lm_head` equals the base's weight "
        "(or the base has no weights to compare with): SGLang skips the copy and applies the LoRA. " + _S,
        "SGLang applies LoRA on the embedding and on the output head, a tied one included (it splits a tied "
        "`lm_head` from `embed_tokens` for LoRA, lora_manager.py `init_lora_modules`); the saved copy is not "
        "needed where it equals the base's. Without base weights only the shapes were checked.",
        "`base_model.model.lm_head.base_layer.weight` equal to the base's tied embedding",
        "Nothing to do; verify against a base folder with weights to have the copy compared.",
    ),
    Code(
        "AD492",
        "sglang-lora-bias-not-served",
        "error",
        "`remap --for sglang` refused: the adapter trains LoRA biases (`lora_B.bias`), which SGLang drops (AD438). "
        + _S,
        "SGLang's memory pool has no bias buffer and overwrites each bias with its module's `lora_B.weight`; no "
        "LoRA-only rewrite reproduces a bias, so the command exits 3 and writes nothing.",
        '`"lora_bias": true` with `--for sglang`',
        "Merge the adapter into the base (`adapterdoc merge ...`) and serve the merged model, or retrain with "
        "`lora_bias=False`.",
    ),
    Code(
        "AD493",
        "sglang-saved-module-in-layer",
        "error",
        "`modules_to_save` tensors (whole weights, such as a layer norm's) sit inside the decoder layers. "
        + _S,
        "SGLang starts, then the first request that uses the adapter fails: it files every tensor with `layers.N.` "
        "in its name as a LoRA weight of that layer, and copying the adapter into the memory pool at that request "
        "raises `ValueError: Cannot find target module name` for a weight that matches no LoRA target "
        "(mem_pool.py `load_lora_weight_to_buffer`).",
        '"modules_to_save": ["input_layernorm"]',
        "Merge the adapter into the base (`adapterdoc merge`) and serve the merged model, or retrain without "
        "`modules_to_save`.",
    ),
    Code(
        "AD494",
        "sglang-alora-ignored",
        "error",
        "The adapter is an activated LoRA (`alora_invocation_tokens`), which SGLang does not read. " + _S,
        "PEFT applies an aLoRA only to the tokens from its invocation sequence on (the base model before it); "
        "SGLang's LoRAConfig reads `r`, `lora_alpha`, `target_modules` and `use_dora` only, and applies the LoRA to "
        "every token of every request that names the adapter: other outputs, with no error.",
        '"alora_invocation_tokens": [271, 1035]',
        "Serve it on an engine that implements activated LoRA, or retrain as a plain LoRA.",
    ),
]
