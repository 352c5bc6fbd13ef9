"""Each engine's way of asking for an adapter and for logprobs: the request the user's clients send (never a
substitute name) with the fields that make the server return logprobs, and the served values read back as
observations against a canary. Read from the engines' own code (SERVING.md): mlx-lm 0.32, llama-cpp-python 0.3.36,
vLLM 0.33, SGLang 0.5.23.

- vLLM: ``model=NAME``; ``prompt_logprobs`` gives the teacher-forced logprob of every prompt token.
- SGLang: ``model="BASE:ADAPTER"``, or ``lora_path`` beside the base's ``model``; ``echo`` + ``logprobs`` give the
  prompt's logprobs (``logprob_start_len=0``).
- llama.cpp (llama-cpp-python's server): ``model=ALIAS``; ``echo`` + ``logprobs`` give the prompt's logprobs; how
  they line up with the canaries' positions (with a BOS, or without one, when llama-cpp-python scores each token's
  own logits row) is read from the fit of each :class:`Alignment`, not assumed. Token-id prompts are refused.
- mlx-lm: ``adapters=PATH`` beside ``model``; only generated tokens have logprobs, so the probe reads the top
  logprobs of the first generated token, after the whole prompt, and matches them to the canary's candidates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from adapterdoc.probe.canaries import Canary
from adapterdoc.probe.fit import Observation

TOP_LOGPROBS_MLX = 11
"""mlx_lm.server's largest ``top_logprobs``."""
NAMED_BY_OPTIONS = {"model": "--adapter or --base-model", "adapters": "--adapter", "lora_path": "--adapter"}
"""The request fields that name the adapter or the base: they come from these options, never from ``--extra-body``
(so that the report says what the request named)."""
SET_BY_PROBE = ("prompt", "max_tokens", "temperature", "echo", "logprobs", "top_logprobs", "prompt_logprobs",
                "logprob_start_len", "stream")  # fmt: skip
"""The request fields the probe sets to have the canaries' logprobs back, which ``--extra-body`` may not change."""
CHANGE_LOGPROBS = ("logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty")
"""Request fields that change the logprobs a server returns, which ``--extra-body`` may not set: mlx-lm 0.32 applies
them as logits processors before it computes the logprobs it reports (``generate_step``); its sampler's fields
(``top_p``, ``top_k``, ``min_p``, ``xtc_*``) act after, and vLLM's prompt logprobs and llama-cpp-python's echoed ones
are the model's own, so those are left to the user."""


@dataclass(frozen=True)
class Ask:
    """What the user's request looks like on one engine."""

    adapter: str
    base_model: str | None = None
    extra: Mapping[str, object] | None = None


class Alignment(NamedTuple):
    """How a served list of prompt logprobs lines up with the canaries' positions: the value for position ``p`` is
    at index ``p + offset``, and it is compared with the position's ``logprobs`` (the logprob of its token given the
    tokens before it) or, with ``same``, its ``same`` values (the logprob of its token in the distribution after it:
    llama-cpp-python's echo on a prompt without BOS scores the logits row of each token at that token itself)."""

    offset: int = 0
    same: bool = False

    def label(self) -> str:
        """How the report names it: ``offset +0``, ``offset -1``, ``offset +0, each token's own row``."""
        return f"offset {self.offset:+d}" + (", each token's own row" if self.same else "")


@dataclass(frozen=True)
class Convention:
    """One engine's request builder and response reader."""

    name: str
    describe: Callable[[Ask], str]
    """How the adapter is named in the request (for the report)."""
    build: Callable[[Ask, Canary], dict[str, object]]
    read: Callable[[object, Canary, Alignment], list[Observation]]
    """(response body, canary, alignment) → observations."""
    alignments: tuple[Alignment, ...] = (Alignment(),)
    """The alignments to try: each is fitted and the best fit is kept (:func:`adapterdoc.probe.run.choose_alignment`)."""


def _with(ask: Ask, body: dict[str, object]) -> dict[str, object]:
    return {**body, **(ask.extra or {})}


# ------------------------------------------------------------------------------------------------------ vLLM


def vllm_request(ask: Ask, canary: Canary) -> dict[str, object]:
    """vLLM's ``/v1/completions``: the adapter's name as ``model``, the prompt as token ids, ``prompt_logprobs``."""
    body: dict[str, object] = {
        "model": ask.adapter,
        "prompt": list(canary.ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
    }
    return _with(ask, body)


def read_vllm(body: object, canary: Canary, alignment: Alignment) -> list[Observation]:
    """``choices[0].prompt_logprobs``: per prompt position (the first is null) ``{token id: {"logprob": x}}``."""
    rows = _first_choice(body).get("prompt_logprobs")
    if not isinstance(rows, list):
        return []
    out = []
    for p in canary.positions:
        i = p.pos + alignment.offset
        row = rows[i] if 0 <= i < len(rows) else None
        entry = row.get(str(p.token)) if isinstance(row, dict) else None
        value = _logprob(entry.get("logprob")) if isinstance(entry, dict) else None
        if value is not None:
            out.append(Observation(value, p.logprobs))
    return out


# ---------------------------------------------------------------------------------------------------- SGLang


def sglang_request(ask: Ask, canary: Canary) -> dict[str, object]:
    """SGLang's ``/v1/completions``: ``model="BASE:ADAPTER"`` as given, else ``lora_path`` beside the base's
    ``model`` when ``--base-model`` is given, else ``model=NAME`` as the user sends it (which SGLang serves with the
    base: finding AD922); ``echo`` + ``logprobs`` for the prompt's logprobs."""
    if ":" in ask.adapter or not ask.base_model:
        named: dict[str, object] = {"model": ask.adapter}
    else:
        named = {"model": ask.base_model, "lora_path": ask.adapter}
    body: dict[str, object] = {
        **named,
        "prompt": list(canary.ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "echo": True,
        "logprobs": 1,
    }
    return _with(ask, body)


def sglang_naming(ask: Ask) -> str:
    if ":" in ask.adapter or not ask.base_model:
        return f"model={ask.adapter!r}"
    return f"model={ask.base_model!r}, lora_path={ask.adapter!r}"


# ------------------------------------------------------------------------------------------------- llama.cpp


def llama_cpp_request(ask: Ask, canary: Canary) -> dict[str, object]:
    """llama-cpp-python's ``/v1/completions``: the alias as ``model``, the prompt as text (token ids are refused),
    ``echo`` + ``logprobs`` for the prompt's logprobs."""
    body: dict[str, object] = {
        "model": ask.adapter,
        "prompt": canary.text,
        "max_tokens": 1,
        "temperature": 0.0,
        "echo": True,
        "logprobs": 1,
    }
    return _with(ask, body)


def echo_values(body: object) -> list[object] | None:
    """OpenAI's legacy ``logprobs``: the ``token_logprobs`` list of an echoed prompt (llama.cpp, SGLang), if any."""
    logprobs = _first_choice(body).get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    return values if isinstance(values, list) else None


def read_echo(body: object, canary: Canary, alignment: Alignment) -> list[Observation]:
    """``token_logprobs[i]`` of the echoed prompt's token ``i`` (:func:`echo_values`)."""
    values = echo_values(body)
    if values is None:
        return []
    out = []
    for p in canary.positions:
        i = p.pos + alignment.offset
        value = _logprob(values[i]) if 0 <= i < len(values) else None
        expected = p.same if alignment.same else p.logprobs
        if value is not None and expected:
            out.append(Observation(value, expected))
    return out


# ---------------------------------------------------------------------------------------------------- mlx-lm


def mlx_request(ask: Ask, canary: Canary) -> dict[str, object]:
    """mlx_lm.server's ``/v1/completions``: ``adapters`` (a path on the server) and ``model`` when given (without it
    the base answers: finding AD920); one greedy token with its top logprobs."""
    body: dict[str, object] = {"adapters": ask.adapter}
    if ask.base_model:
        body["model"] = ask.base_model
    body.update(
        prompt=canary.text, max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=TOP_LOGPROBS_MLX
    )
    return _with(ask, body)


def read_mlx(body: object, canary: Canary, alignment: Alignment) -> list[Observation]:
    """``choices[0].logprobs.content[0].top_logprobs``: ``{id, logprob}`` after the prompt, matched to the canary's
    next-token candidates."""
    logprobs = _first_choice(body).get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    first = content[0] if isinstance(content, list) and content else None
    top = first.get("top_logprobs") if isinstance(first, dict) else None
    out = []
    for entry in top if isinstance(top, list) else []:
        token, value = (
            (entry.get("id"), _logprob(entry.get("logprob"))) if isinstance(entry, dict) else (None, None)
        )
        if isinstance(token, int) and value is not None and token in canary.next:
            out.append(Observation(value, canary.next[token]))
    return out


def _logprob(value: object) -> float | None:
    """A JSON number as a float (``true`` is none; an integer beyond any float is infinite, which the probe
    refuses with the other values that are no logprob), else None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _first_choice(body: object) -> dict[str, object]:
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else {}


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        Convention("vllm", lambda a: f"model={a.adapter!r}", vllm_request, read_vllm),
        Convention("sglang", sglang_naming, sglang_request, read_echo),
        Convention(
            "llama.cpp",
            lambda a: f"model={a.adapter!r} (alias)",
            llama_cpp_request,
            read_echo,
            (Alignment(0), Alignment(-1), Alignment(1), Alignment(0, same=True)),
        ),
        Convention(
            "mlx-lm",
            lambda a: (
                f"adapters={a.adapter!r}" + (f", model={a.base_model!r}" if a.base_model else " (no model)")
            ),
            mlx_request,
            read_mlx,
        ),
    )
}
"""engine → its convention (``--engine`` choices)."""
