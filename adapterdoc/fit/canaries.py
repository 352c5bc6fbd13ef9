"""The canaries file `adapterdoc train` leaves in its run folder (``OUT/canaries.json``) for `adapterdoc probe`:
made by :func:`adapterdoc.probe.make.canaries_of` (what ``probe --make-canaries`` runs) with PEFT on the saved
adapter, reloaded on the base the run used (its dtype, a ``tiny:`` base's seed), with rows of the run's own data as
the prompts. A causal LM's run only; when none can be made the run still succeeds, with AD629 saying why. The file
is checked at bfloat16's tolerance too (vLLM and SGLang serve in bfloat16): when it separates the adapter from the
base by too few of those, it is written and AD630 says so."""

from __future__ import annotations

import os
from collections.abc import Sequence

from adapterdoc.errors import AdapterdocError
from adapterdoc.ml.build import first_line
from adapterdoc.probe.canaries import Canaries
from adapterdoc.report.findings import Finding, make
from adapterdoc.train import rows as R
from adapterdoc.train.base_model import Base
from adapterdoc.train.checkpoints import CANARIES
from adapterdoc.train.objectives import CAUSAL
from adapterdoc.train.records import TrainResult

PROMPT_ROWS = 6
"""Rows of the training data tried as prompts (spread over the file); the canaries keep the ones that move most."""


def write_run_canaries(
    base: Base, result: TrainResult, rows: Sequence[R.UserRow], target: str, *, wanted: bool = True
) -> tuple[str | None, Finding | None]:
    """Write ``target/canaries.json`` for the finished run: (its path, None or the AD630 warning), or (None, the
    AD629 warning) when none can be made; (None, None) for an encoder's run or when not ``wanted``. An earlier run's file is removed
    first (a resumed run's adapter is another)."""
    path = os.path.join(target, CANARIES)
    _remove(path)
    if not wanted or result.objective != CAUSAL:
        return None, None
    if _sharded(result):
        why = "the run was sharded (FSDP); make them where the model fits on one device"
        return None, _no_canaries(why, result.adapter_dir)
    try:
        canaries = run_canaries(base, result, prompts_of(rows))
    except (AdapterdocError, OSError, RuntimeError, ValueError) as e:
        return None, _no_canaries(first_line(e), result.adapter_dir)
    from adapterdoc.probe.fit import SEPARATION
    from adapterdoc.probe.make import separation

    moved = separation(canaries)
    if moved < SEPARATION:
        why = (
            f"the adapter moves the logprobs of its own rows by {moved:.1f} tolerances of {canaries.dtype} at most "
            f"(the probe needs {SEPARATION:g})"
        )
        return None, _no_canaries(why, result.adapter_dir)
    from adapterdoc.probe.canaries import save
    from adapterdoc.st.paths import writing

    with writing(path):
        save(canaries, path)
    return path, coarse_warning(canaries, path)


def coarse_warning(canaries: Canaries, path: str) -> Finding | None:
    """AD630 when ``canaries`` separate the adapter from the base by fewer than the probe's tolerances at bfloat16
    (what vLLM and SGLang serve by default), else None."""
    from adapterdoc.probe.fit import SEPARATION
    from adapterdoc.probe.make import separation

    moved = separation(canaries, "bfloat16")
    if moved >= SEPARATION or canaries.dtype == "bfloat16":
        return None
    return make(
        "AD630",
        f"canaries.json moves the logprobs by {moved:.1f} tolerances of bfloat16 at most (the probe needs "
        f"{SEPARATION:g}): it can judge a server that computes in {canaries.dtype}, not one in bfloat16",
        path=path,
    )


def run_canaries(base: Base, result: TrainResult, prompts: Sequence[str]) -> Canaries:
    """The canaries of the run's saved adapter on its base (built as the run built it), computed on the CPU."""
    from adapterdoc.ml.quiet import quiet_libraries
    from adapterdoc.probe.make import adapter_rank, canaries_of
    from adapterdoc.train.base_model import load_model
    from adapterdoc.train.lora import load_peft
    from adapterdoc.train.runtime import torch_threads

    s = result.settings
    rank = adapter_rank(result.adapter_dir)
    with torch_threads(s.threads), quiet_libraries():
        model, _ = load_peft(load_model(base, s.dtype, s.base_seed), result.adapter_dir)
        return canaries_of(
            model, base.tokenizer, rank, adapter=result.adapter_dir, base=base.name, prompts=prompts
        )


def prompts_of(rows: Sequence[R.UserRow], count: int = PROMPT_ROWS) -> list[str]:
    """Up to ``count`` distinct rows spread evenly over ``rows``, each as the text it trained on: ``text``;
    ``prompt`` then ``completion``; the messages' contents, one per line."""
    texts = [
        "\n".join(c for _, c in r.messages) if r.messages else r.text or r.prompt + r.completion for r in rows
    ]
    distinct = list(dict.fromkeys(t for t in texts if t.strip()))
    n = min(count, len(distinct))
    return [distinct[i * len(distinct) // n] for i in range(n)]


def _sharded(result: TrainResult) -> bool:
    """Whether the trained model's parameters are sharded across processes (FSDP)."""
    from adapterdoc.train.sharding import is_sharded

    model = result.model
    return model is not None and any(is_sharded(p) for p in model.parameters())


def _remove(path: str) -> None:
    from adapterdoc.st.paths import writing

    if os.path.lexists(path):
        with writing(path):
            os.unlink(path)


def _no_canaries(why: str, adapter: str) -> Finding:
    return make("AD629", f"no canaries: {why}", path=adapter)
