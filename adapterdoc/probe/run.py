"""``adapterdoc probe``: send the user's own request for the canaries to the server, fit the served logprobs against
PEFT's at each scale, and report the verdict with the request convention's warnings."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from adapterdoc.probe.canaries import Canaries, Canary
from adapterdoc.probe.client import MAX_REQUESTS, TIMEOUT, Client, ProbeError, Response, printable
from adapterdoc.probe.conventions import (
    CHANGE_LOGPROBS,
    CONVENTIONS,
    NAMED_BY_OPTIONS,
    SET_BY_PROBE,
    Alignment,
    Ask,
    Convention,
    echo_values,
)
from adapterdoc.probe.fit import NEAR, SEPARATION, Fit, Observation, fit
from adapterdoc.report.findings import Finding, make
from adapterdoc.report.probe_report import ProbeReport

OWNERS = {"vllm": "vllm", "sglang": "sglang", "me": "llama.cpp"}
"""``/v1/models``' ``owned_by`` → engine (llama-cpp-python's server says ``me``)."""
BF16_ENGINES = ("vllm", "sglang")
"""Engines whose default tolerance is bfloat16's (:func:`served_dtype`)."""
LOGPROB_RANGE = (-1e6, 1.0)
"""A served logprob outside this range is no logprob (vLLM writes -inf as -9999; a float's rounding may put the
likeliest token a little above 0)."""


@dataclass(frozen=True)
class Target:
    """What to probe: the server, the user's request, and how to read the answer."""

    url: str
    ask: Ask
    engine: str | None = None
    api_key_env: str | None = None
    dtype: str | None = None
    """The served dtype (its tolerance); default: :func:`served_dtype`."""
    timeout: float = TIMEOUT
    """Seconds one request may take."""


def probe(target: Target, canaries: Canaries, source: str = "") -> ProbeReport:
    """Probe ``target.url`` with ``canaries``; an unreachable or unreadable server, or canaries that hold nothing
    to compare, is a :class:`ProbeError`."""
    check_canaries(canaries, source or "the canaries")
    client = Client(target.url, target.api_key_env, target.timeout)
    models = client.get("/v1/models")
    engine = target.engine or detect(models)
    convention = CONVENTIONS[engine]
    check_base_model(engine, target.ask)
    observed, bodies = _observe(client, convention, target.ask, canaries.canaries, target.engine is not None)
    dtype = target.dtype or served_dtype(engine, canaries.dtype)
    alignment, result = choose_alignment(observed, canaries.scales, dtype, client.url + "/v1/completions")
    if result.separation < SEPARATION:
        raise ProbeError(
            source or "the canaries",
            f"the adapter moves the served positions by {result.separation:.1f} tolerances of {dtype} at most "
            f"(at least {SEPARATION:g} are needed to tell it from the base); make canaries from prompts where it "
            "matters (--prompts)",
        )
    findings = [
        *convention_findings(engine, target.ask, models),
        verdict_finding(result, engine, target.ask, dtype, canaries.rank),
    ]
    if result.verdict == "differs" and engine == "llama.cpp":
        findings[-1] = replace(
            findings[-1], message=findings[-1].message + tokenizer_note(bodies, canaries.canaries)
        )
    return ProbeReport(
        url=client.url,
        engine=engine,
        engine_detected=target.engine is None,
        request=convention.describe(target.ask),
        alignment=alignment.label() if len(convention.alignments) > 1 else None,
        verdict=result.verdict,
        factor=result.factor,
        dtype=dtype,
        observations=result.count,
        separation=result.separation,
        best=result.best,
        deviation=result.deviation,
        requests=list(client.sent),
        canaries=source,
        findings=findings,
    )


def check_base_model(engine: str, ask: Ask) -> None:
    """Refuse ``--base-model`` where the engine's request has no place for it (vLLM and llama.cpp name the adapter
    in ``model``; SGLang's ``model="BASE:ADAPTER"`` holds the base already): it would not be sent."""
    if ask.base_model is None or engine == "mlx-lm" or (engine == "sglang" and ":" not in ask.adapter):
        return
    where = (
        "model=BASE:ADAPTER names the base already" if engine == "sglang" else "its model field is --adapter"
    )
    raise ProbeError(
        "--base-model",
        f"a {engine} request has no place for it ({where}); drop it, nothing else would be sent",
    )


def served_dtype(engine: str, canaries_dtype: str) -> str:
    """The dtype whose tolerance the fit uses when ``--served-dtype`` is not given: bfloat16 for vLLM and SGLang
    (their ``--dtype auto`` serves a float32 checkpoint in bfloat16, and bfloat16's tolerance is the widest), else
    the canaries' dtype (llama.cpp and mlx-lm serve the converted file's precision)."""
    return "bfloat16" if engine in BF16_ENGINES else canaries_dtype


def detect(models: Response) -> str:
    """The engine behind ``/v1/models``' answer: ``owned_by`` (vLLM, SGLang, llama-cpp-python), else mlx-lm's shape
    (cards with ``created`` and no ``owned_by``)."""
    data = models.body.get("data") if isinstance(models.body, dict) else None
    cards = [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []
    for card in cards:
        engine = OWNERS.get(str(card.get("owned_by")))
        if engine:
            return engine
    if cards and all("owned_by" not in c and "created" in c for c in cards):
        return "mlx-lm"
    why = f"HTTP {models.status}" if models.status != 200 else "no engine named in its cards"
    raise ProbeError("/v1/models", f"cannot tell which engine serves it ({why}); give --engine")


def check_canaries(canaries: Canaries, source: str) -> None:
    """Refuse canaries the fit cannot use: none, an expected value or a scale that is no finite number, scales
    that do not rise."""
    scales = list(canaries.scales)
    values = [v for c in canaries.canaries for p in c.positions for v in (*p.logprobs, *p.same)]
    values += [v for c in canaries.canaries for vs in c.next.values() for v in vs]
    if not canaries.canaries or not values:
        raise ProbeError(source, "the canaries file holds no canaries (make it again: probe --make-canaries)")
    if len(canaries.canaries) >= MAX_REQUESTS:
        raise ProbeError(
            source,
            f"{len(canaries.canaries)} canaries; the probe sends at most {MAX_REQUESTS - 1} (one request each)",
        )
    if not all(_finite(s) for s in scales) or scales != sorted(set(scales)):
        raise ProbeError(source, f"its scales {scales} are not finite numbers in rising order")
    low, high = LOGPROB_RANGE
    bad = [v for v in values if not (_finite(v) and low <= v <= high)]
    if bad:
        raise ProbeError(source, f"an expected logprob is {bad[0]!r}, not a number in [{low:g}, {high:g}]")


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _observe(
    client: Client, convention: Convention, ask: Ask, canaries: Sequence[Canary], given: bool
) -> tuple[dict[Alignment, list[Observation]], list[object]]:
    """One request per canary; the served logprobs read at each alignment of the convention that reads any, and
    the answers' bodies."""
    bodies = []
    for canary in canaries:
        r = client.post("/v1/completions", convention.build(ask, canary))
        if r.status != 200:
            fix = f"; {_works(convention.name, ask)}" if r.status == 404 else _engine_hint(convention, given)
            raise ProbeError(
                client.url + "/v1/completions",
                f"HTTP {r.status} for {convention.describe(ask)}: {_short(r)}{fix}",
            )
        bodies.append(r.body)
    observed = {}
    for alignment in convention.alignments:
        seen = [
            o for body, c in zip(bodies, canaries, strict=True) for o in convention.read(body, c, alignment)
        ]
        _check_served(seen, client.url + "/v1/completions")
        if seen:
            observed[alignment] = seen
    if not observed:
        objects = any(isinstance(b, dict) for b in bodies)
        why = "no logprobs the canaries hold" if objects else "no JSON object"
        raise ProbeError(
            client.url, f"the {convention.name} server returned {why}{_engine_hint(convention, given)}"
        )
    return observed, bodies


def tokenizer_note(bodies: Sequence[object], canaries: Sequence[Canary]) -> str:
    """For a text prompt (llama.cpp): where the server's echo holds a number of tokens the canaries' tokenizer does
    not explain (more than 2 away: a BOS and the generated token may differ), the served model tokenizes the
    prompt otherwise, which alone makes every position differ; else nothing."""
    for i, (body, canary) in enumerate(zip(bodies, canaries, strict=True), 1):
        values = echo_values(body)
        if values is not None and abs(len(values) - len(canary.ids)) > 2:
            return (
                f"; the server split canary {i}'s text into {len(values)} tokens, the canaries' tokenizer into "
                f"{len(canary.ids)}: the served model's tokenizer is not the base's (convert the base's own "
                "tokenizer into the GGUF, or make the canaries with the served one)"
            )
    return ""


def choose_alignment(
    observed: Mapping[Alignment, Sequence[Observation]], scales: Sequence[float], dtype: str, where: str
) -> tuple[Alignment, Fit]:
    """The alignment whose fit is best (the smallest :attr:`Fit.best`) and its fit; a :class:`ProbeError` when
    another one fits about as well (within max(1, 2× the best) tolerances) with another verdict."""
    fits = {a: fit(seen, scales, dtype) for a, seen in observed.items()}
    chosen = min(fits, key=lambda a: fits[a].best)
    best = fits[chosen]
    for other, result in fits.items():
        rival = result.verdict != "differs" and result.best <= max(1.0, 2.0 * best.best)
        if other != chosen and rival and not _agree(result, best):
            raise ProbeError(
                where,
                "cannot tell how the answer lines up with the canaries' positions: read at "
                f"{chosen.label()} it is {_judged(best)}, at {other.label()} {_judged(result)} (best fits "
                f"{best.best:.2f} and {result.best:.2f} tolerances)",
            )
    return chosen, best


def _agree(a: Fit, b: Fit) -> bool:
    """Whether two fits give the same answer: factors within :data:`~adapterdoc.probe.fit.NEAR` of each other (the
    adapter is factor 1, the base 0)."""
    return a.factor is not None and b.factor is not None and abs(a.factor - b.factor) <= NEAR


def _judged(result: Fit) -> str:
    """The verdict in words, with a scale's factor."""
    if result.verdict == "scale" and result.factor is not None:
        return f"scale {result.factor:.3g}"
    return result.verdict


def _check_served(seen: Sequence[Observation], where: str) -> None:
    """Refuse a served value that is no logprob (NaN, infinite, far out of range): the answer is broken."""
    low, high = LOGPROB_RANGE
    bad = next((o.served for o in seen if not low <= o.served <= high), None)  # NaN compares false
    if bad is not None:
        raise ProbeError(
            where, f"the server returned {bad!r} as a logprob (a logprob is in [{low:g}, {high:g}])"
        )


def _engine_hint(convention: Convention, given: bool) -> str:
    return f" (--engine {convention.name} was given: is the server {convention.name}?)" if given else ""


def _short(r: Response) -> str:
    if r.body is None and r.text.lstrip().startswith("<"):
        return "an HTML page, not the engine's JSON (is URL the engine's server?)"
    detail = r.body.get("detail") or r.body.get("error") or r.body if isinstance(r.body, dict) else r.text
    text = detail.get("message", detail) if isinstance(detail, dict) else detail
    return printable(str(text))


def verdict_finding(result: Fit, engine: str, ask: Ask, dtype: str, rank: int = 0) -> Finding:
    """The verdict as a finding (AD900 applied, AD901 base, AD902 other scale with what may cause that factor,
    AD903 differs); when the served values are off the expected curve by more than the tolerance, the message says
    by how much."""
    numbers = (
        f"{result.count} logprobs; best fit {result.best:.2f}, separation {result.separation:.1f} tolerances"
    )
    if result.off and result.verdict != "differs":
        numbers += (
            f"; the served values differ from PEFT's by {result.best:.1f} tolerances of {dtype}: if the server "
            "computes in another dtype, pass --served-dtype"
        )
    if result.verdict == "applied":
        return make("AD900", f"the adapter is applied as PEFT applies it ({numbers})")
    if result.verdict == "base":
        return make(
            "AD901",
            f"the server answers with the base model ({numbers})",
            key=ask.adapter,
            hint=_works(engine, ask),
        )
    if result.verdict == "scale" and result.factor is not None:
        return make(
            "AD902",
            f"the adapter is applied at {result.factor:.3g}× PEFT's scaling ({numbers})",
            key=ask.adapter,
            hint=scale_hint(result.factor, rank, engine),
        )
    return make("AD903", f"the served logprobs fit neither the base nor the adapter at any scale ({numbers})")


def scale_hint(factor: float, rank: int, engine: str) -> str:
    """What may make an engine apply an adapter at ``factor`` × PEFT's scaling (``rank``: the canaries' ``r``)."""
    other = (
        "a scale setting on the server (llama.cpp's lora_scale, a scale in the adapter's config there), or only part "
        "of the adapter's modules applied (targets outside the engine's --lora-target-modules: adapterdoc verify "
        "ADAPTER --profile ENGINE names them)"
    )
    if rank > 1 and abs(factor * rank**0.5 - 1) <= 0.05:
        fold = (
            f"adapterdoc remap ADAPTER --for {engine} folds it"
            if engine in ("vllm", "sglang")
            else "set lora_alpha to lora_alpha · √r and use_rslora false"
        )
        return f"1/√r for r={rank}: if the adapter uses rsLoRA, the engine ignores it ({fold}); else {other}"
    return other


def _works(engine: str, ask: Ask) -> str:
    """The request that selects an adapter on ``engine``."""
    base = ask.base_model or "BASE"
    return {
        "vllm": f"load the adapter under that name (--lora-modules {ask.adapter}=PATH, or POST "
        "/v1/load_lora_adapter with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and send model="
        f"{ask.adapter!r}",
        "sglang": f"send model='{base}:{ask.adapter.split(':')[-1]}' or lora_path={ask.adapter!r}",
        "llama.cpp": "send a model alias whose --config_file entry has the adapter's lora_path",
        "mlx-lm": f"send model={base!r} beside adapters={ask.adapter!r} (a path on the server)",
    }[engine]


def convention_findings(engine: str, ask: Ask, models: Response) -> list[Finding]:
    """Warnings where the user's request convention falls back to the base without an error (AD920-AD923)."""
    listed = _listed(models)
    if engine == "mlx-lm" and not ask.base_model:
        return [
            make(
                "AD920", f"the request names adapters={ask.adapter!r} but no model", hint=_works(engine, ask)
            )
        ]
    if engine == "llama.cpp" and listed is not None and ask.adapter not in listed:
        ids = sorted(listed)
        shown = ", ".join(printable(i, 60) for i in ids[:5]) or "none"
        shown += f", … ({len(ids)} in all)" if len(ids) > 5 else ""
        return [
            make(
                "AD921", f"the alias {ask.adapter!r} is not among /v1/models' ids ({shown})", key=ask.adapter
            )
        ]
    if engine == "sglang" and ":" not in ask.adapter and not ask.base_model:
        return [
            make(
                "AD922", f"the request sends model={ask.adapter!r}", key=ask.adapter, hint=_works(engine, ask)
            )
        ]
    if engine == "vllm" and listed is not None and ask.adapter not in listed:
        return [make("AD923", f"{ask.adapter!r} is not among /v1/models' cards", key=ask.adapter)]
    return []


def _listed(models: Response) -> set[str] | None:
    data = models.body.get("data") if isinstance(models.body, dict) and models.status == 200 else None
    if not isinstance(data, list):
        return None
    return {str(c.get("id")) for c in data if isinstance(c, dict)}


def parse_extra_body(text: str | None) -> Mapping[str, object] | None:
    """``--extra-body JSON``: an object of other fields added to every request; the fields that name the adapter
    or the base come from ``--adapter`` / ``--base-model``, and those the probe sets to read logprobs are its own."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ProbeError("--extra-body", f"not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ProbeError("--extra-body", f"a JSON object is needed, not {text.strip()[:40]}")
    for key in value:
        if key in NAMED_BY_OPTIONS:
            raise ProbeError(
                "--extra-body", f"{key!r} names the adapter or the base: give it with {NAMED_BY_OPTIONS[key]}"
            )
        if key in SET_BY_PROBE:
            raise ProbeError(
                "--extra-body", f"the probe sets {key!r} itself, to have the canaries' logprobs back"
            )
        if key in CHANGE_LOGPROBS:
            raise ProbeError(
                "--extra-body",
                f"{key!r} changes the logprobs the server returns (mlx-lm applies it before them); the probe "
                "compares the model's own",
            )
    return value
