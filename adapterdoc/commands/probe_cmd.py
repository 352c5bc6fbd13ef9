"""`adapterdoc probe URL --adapter NAME (--canaries FILE | --local ADAPTER --base BASE)` and
`adapterdoc probe --make-canaries ADAPTER --base BASE --out FILE [--prompts FILE.jsonl]`."""

from __future__ import annotations

import os

import click

from adapterdoc.commands import options as opt

ENGINES = ("vllm", "sglang", "llama.cpp", "mlx-lm")
"""The request conventions ``--engine`` names (:data:`adapterdoc.probe.conventions.CONVENTIONS`; a test keeps the
two equal)."""
DTYPES = ("float32", "float16", "bfloat16")
EPILOG = """\b
Exit codes: 0 the adapter is applied as PEFT applies it; 1 the server
answers with the base, at another scale, or with something else; 3 the
server cannot be probed (down, no logprobs, engine not detected).
Only URL is contacted; the API key (--api-key-env) is never printed."""


@click.command("probe", epilog=EPILOG)
@click.argument("url", required=False)
@click.option("--adapter", "adapter", metavar="NAME", help="What your clients send to select the adapter, in the "
              "engine's own field (vLLM: model; SGLang: model BASE:ADAPTER, or lora_path with --base-model; "
              "llama.cpp: the model alias; mlx-lm: adapters).")  # fmt: skip
@click.option(
    "--base-model", metavar="NAME", help="What your clients send as the base's model (omitted if not given)."
)
@click.option(
    "--engine", type=click.Choice(ENGINES), help="The server's engine (default: detected from /v1/models)."
)
@click.option("--extra-body", metavar="JSON", help="Other fields your clients send, as a JSON object.")
@click.option("--canaries", "canaries_file", type=click.Path(), metavar="FILE",
              help="The canaries file (probe --make-canaries, or train's run folder).")  # fmt: skip
@click.option(
    "--local",
    "local",
    metavar="ADAPTER",
    help="Make canaries on the fly from this PEFT adapter (needs --base).",
)
@opt.base_option("The base model folder (weights and tokenizer) for --local or --make-canaries.")
@click.option(
    "--api-key-env", metavar="VAR", help="Send the API key held in environment variable VAR (never printed)."
)
@click.option(
    "--timeout",
    type=float,
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds one request may take, its whole answer read.",
)
@click.option(
    "--served-dtype",
    type=click.Choice(DTYPES),
    help="The dtype the server computes in, for the tolerance (default: bfloat16 for vLLM and SGLang, else the "
    "canaries' dtype).",
)
@click.option(
    "--make-canaries", "make", metavar="ADAPTER", help="Write canaries for this PEFT adapter to --out."
)
@opt.out_option("Where --make-canaries writes the canaries file.", metavar="FILE")
@click.option("--prompts", type=click.Path(dir_okay=False), metavar="FILE.jsonl",
              help="Rows (prompt, text or messages) to pick canaries from (default: a built-in set).")  # fmt: skip
@opt.force_option("Replace an existing --out canaries file.")
@opt.output_options(output_file=True)
@opt.junit_file_option()
@opt.handle_errors
def command(
    url: str | None,
    adapter: str | None,
    base_model: str | None,
    engine: str | None,
    extra_body: str | None,
    canaries_file: str | None,
    local: str | None,
    base: str | None,
    api_key_env: str | None,
    timeout: float,
    served_dtype: str | None,
    make: str | None,
    out: str | None,
    prompts: str | None,
    force: bool,
    output: opt.Output,
    junit_file: str | None,
) -> None:
    """Ask a running server whether it applies the adapter as PEFT does (exit 0), or serves the base, another
    scale or something else (exit 1); exit 3 when it cannot be probed."""
    if make:
        if url or not base or not out or junit_file:
            raise click.UsageError(
                "--make-canaries ADAPTER takes --base BASE and --out FILE, and no URL or --junit-file"
            )
        from adapterdoc.probe.make import write_canaries

        output.check(make, base, prompts)
        inputs = [make, base, *([prompts] if prompts else [])]
        opt.check_output_file(out, inputs, "--out")  # never an input or inside one, --force or not
        if output.file and os.path.realpath(output.file) == os.path.realpath(out):
            raise click.BadParameter("--out and --output-file name the same file", param_hint="--out")
        opt.finish(write_canaries(make, base, out, prompts, force=force), output)
    if not url or not adapter:
        raise click.UsageError("give URL and --adapter NAME (or --make-canaries ADAPTER)")
    if bool(canaries_file) == bool(local) or (local and not base):
        raise click.UsageError("give either --canaries FILE or --local ADAPTER --base BASE")
    from adapterdoc.probe.conventions import Ask
    from adapterdoc.probe.run import Target, parse_extra_body, probe

    extra = parse_extra_body(extra_body)
    output.check(canaries_file, local, base)
    opt.check_report_files(output, junit_file, [i for i in (canaries_file, local, base) if i])
    if canaries_file:
        from adapterdoc.probe.canaries import load

        canaries, source = load(canaries_file), canaries_file
    else:
        from adapterdoc.probe.make import make_canaries

        assert local and base
        canaries, source = make_canaries(local, base), f"{local} (local)"
    target = Target(url, Ask(adapter, base_model, extra), engine, api_key_env, served_dtype, timeout)
    report = probe(target, canaries, source)
    if junit_file:
        from adapterdoc.report.formats import render

        opt.write_report(junit_file, render(report, "junit"))
    opt.finish(report, output)
