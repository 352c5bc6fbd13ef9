"""The report of ``adapterdoc probe``: what the server's answer to the user's request was judged to be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from adapterdoc.report.base import FrozenReport, pick


@dataclass(frozen=True, kw_only=True)
class ProbeReport(FrozenReport):
    """One probe: the request convention used, the verdict (``applied`` | ``base`` | ``scale`` | ``differs``), the
    fitted factor, and the deviations from each expected scale in tolerances (1.0 is the edge)."""

    url: str
    engine: str
    engine_detected: bool
    request: str
    """How the request named the adapter (``model='my-adapter'``)."""
    alignment: str | None = None
    """How the served prompt logprobs were lined up with the canaries' positions (``offset +0``), for a convention
    that has several ways (llama.cpp); None otherwise."""
    verdict: str
    factor: float | None
    dtype: str
    """The dtype whose tolerance the fit used."""
    observations: int
    separation: float
    best: float
    deviation: Mapping[float, float] = field(default_factory=dict)
    requests: Sequence[str] = ()
    """``METHOD path`` of each request made."""
    canaries: str = ""

    def body(self) -> dict[str, object]:
        body = pick(
            self, ("url", "engine", "engine_detected", "request", "alignment", "verdict", "factor", "dtype")
        )
        numbers = pick(self, ("observations", "separation", "best"))
        deviation = {str(k): v for k, v in self.deviation.items()}
        return {
            **body,
            **numbers,
            "deviation": deviation,
            "requests": list(self.requests),
            "canaries": self.canaries,
        }


@dataclass(frozen=True, kw_only=True)
class CanariesReport(FrozenReport):
    """``probe --make-canaries``: the canaries file written and what it holds."""

    command: str = "probe"
    out: str
    adapter: str
    base: str
    prompts: int
    positions: int
    candidates: int
    """Next-token candidates, over all prompts."""
    scales: Sequence[float] = ()
    largest_move: float = 0.0
    """The largest |adapter - base| logprob over the stored values."""

    def body(self) -> dict[str, object]:
        body = pick(self, ("out", "adapter", "base", "prompts", "positions", "candidates", "largest_move"))
        return {**body, "scales": list(self.scales)}
