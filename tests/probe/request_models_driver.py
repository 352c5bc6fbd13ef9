"""Run in the vLLM or SGLang oracle environment: validate the probe's request bodies (JSON on stdin, a list) with the
engine's own request model and print, per body, what the engine reads from it (one JSON line each).

``vllm``: ``CompletionRequest`` (vllm/entrypoints/openai/completion/protocol.py): model, prompt, prompt_logprobs.
``sglang``: ``CompletionRequest`` (sglang/srt/entrypoints/openai/protocol.py) and the adapter the completions
handler resolves from it (``OpenAIServingBase._resolve_lora_path``: ``BASE:ADAPTER`` in model, else lora_path),
with SGLang's own stubs for the modules its import chain reaches and a CPU cannot load (scripts/sglang_oracle.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def vllm(bodies: list[dict[str, object]]) -> None:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    for body in bodies:
        r = CompletionRequest.model_validate(body)
        print(json.dumps({"model": r.model, "prompt": r.prompt, "prompt_logprobs": r.prompt_logprobs}))


def sglang(bodies: list[dict[str, object]], served: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import sglang_oracle

    sglang_oracle.install_stubs()
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase

    handler = SimpleNamespace(tokenizer_manager=SimpleNamespace(served_model_name=served))
    handler._parse_model_parameter = lambda m: OpenAIServingBase._parse_model_parameter(handler, m)  # type: ignore[arg-type]
    for body in bodies:
        r = CompletionRequest.model_validate(body)
        lora = OpenAIServingBase._resolve_lora_path(handler, r.model, r.lora_path)  # type: ignore[arg-type]
        start = 0 if r.echo and r.logprobs else -1  # serving_completions.py's logprob_start_len
        print(
            json.dumps({"model": r.model, "lora_path": lora, "logprob_start_len": start, "prompt": r.prompt})
        )


if __name__ == "__main__":
    rows = json.loads(sys.stdin.read())
    if sys.argv[1] == "vllm":
        vllm(rows)
    else:
        sglang(rows, sys.argv[2])
