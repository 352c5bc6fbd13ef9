"""AD9xx: what ``adapterdoc probe`` finds on a running server. AD900-AD919 the verdict (is the adapter applied as
PEFT applies it?), AD920-AD939 request conventions that fall back to the base without an error. A server that cannot
be probed is no finding but exit 3 (AD100), as every unusable input."""

from adapterdoc.codes import Code

CODES: list[Code] = [
    Code(
        "AD900",
        "adapter-applied",
        "info",
        "The server's logprobs on the canaries equal PEFT's with the adapter at its own scale, within the tolerance "
        "of the served dtype: the request gets the adapter as PEFT applies it.",
        "This is the proof, after deploy, that the engine loaded every module of the adapter at the right strength.",
        "12 of 12 canary logprobs within 1e-3 of PEFT's (max 2.1e-5)",
        "Nothing; keep the probe as a post-deploy gate.",
    ),
    Code(
        "AD901",
        "adapter-ignored-base-served",
        "error",
        "The server answered the request that names the adapter with the base model's logprobs: the adapter is not "
        "applied (not loaded, not selected by the request, or every module dropped).",
        "The engine answers 200 OK with the base's output; nothing else shows that the fine-tuning is missing.",
        "the served logprobs equal the base's (max 3e-5) and differ from the adapter's by 0.41",
        "Check that the adapter is loaded under the name the request sends, in the field the engine reads (the "
        "finding's hint names it), then probe again.",
    ),
    Code(
        "AD902",
        "adapter-applied-at-other-scale",
        "error",
        "The server applies the adapter, but at another strength than PEFT: the canaries fit the adapter with its "
        "scaling multiplied by the reported factor (√r: rsLoRA ignored or applied twice; ½ or 2: an alpha read "
        "wrongly; a lora_scale in the server's config).",
        "The adapter runs too weak or too strong: outputs drift from what was trained and evaluated.",
        "the served logprobs fit the adapter at 0.50× its scale (residual 1e-4)",
        "Fix the scaling: for rsLoRA on an engine that ignores use_rslora, `adapterdoc remap --for ENGINE` folds √r "
        "into lora_alpha; remove a lora_scale from the server's config.",
    ),
    Code(
        "AD903",
        "served-output-differs",
        "error",
        "The served logprobs match neither the base nor the adapter at any scale: the server runs another model, "
        "another adapter, another tokenizer, or applies only part of the adapter.",
        "Something between the file and the server changed the model; the adapter's evaluation does not describe "
        "what is served.",
        "best fit: the adapter at 0.7× its scale with residual 0.2 (tolerance 1e-3)",
        "Run `adapterdoc verify ADAPTER --profile ENGINE` for modules the engine drops, and check that the canaries "
        "were made with the served base and adapter.",
    ),
    Code(
        "AD920",
        "mlx-request-without-model",
        "warning",
        "mlx_lm.server (mlx-lm 0.32) answers a request without `model` with the base, even when it names `adapters` (its CLI's "
        "adapter map overrides the body).",
        "A client that omits `model` gets the base model with 200 OK.",
        "the request names adapters=/srv/adapter but no model",
        "Send the served model's name in `model` (`--base-model NAME`) beside `adapters`.",
    ),
    Code(
        "AD921",
        "llama-cpp-unknown-alias",
        "warning",
        "llama-cpp-python's server (0.3.36) serves an unknown or omitted model alias with its default model, and its response "
        "echoes the unknown name.",
        "A typo in the alias, or an alias whose lora_path was never configured, serves the base with 200 OK.",
        "the request sends model=my-adapter, which /v1/models does not list",
        "Use an alias from the server's --config_file whose entry has the adapter's lora_path.",
    ),
    Code(
        "AD922",
        "sglang-bare-adapter-name",
        "warning",
        'SGLang (0.5.23) resolves `model="NAME"` (vLLM\'s convention) to no adapter: the base answers. Its own ways are '
        '`model="BASE:ADAPTER"` or the `lora_path` field.',
        "Clients written for vLLM get the base model from SGLang without an error.",
        'the request sends model="my-adapter"',
        'Send `model="BASE:my-adapter"`, or `lora_path: "my-adapter"` beside the base\'s model.',
    ),
    Code(
        "AD923",
        "adapter-not-in-vllm-models",
        "warning",
        "vLLM's (0.33) /v1/models does not list the adapter name as a LoRA card: the request is refused (404), or, with "
        "VLLM_SKIP_MODEL_NAME_VALIDATION set, served by the base.",
        "A deployment that skips name validation serves the base for a name it does not know.",
        "my-adapter is not among /v1/models' cards (listed: base, other-adapter)",
        "Start vLLM with `--lora-modules my-adapter=PATH` or load it (`/v1/load_lora_adapter`).",
    ),
]
