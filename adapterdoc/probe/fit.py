"""The verdict: fit the served logprobs against the canaries' expected logprobs at each scale (pure Python).

The adapter's effect is not linear in its scale, so the factor is read off the expected curve itself: between two
neighbouring scales of the grid the curve is taken as a straight segment, the served vector is projected on each
segment (least squares), and the segment point with the smallest worst-case deviation gives the factor.

The verdict: within tolerance of scale 1 is ``applied``, of scale 0 ``base``; else, when the curve explains the served
values (the best fit within max(1, 5% of the separation) tolerances), ``scale`` at the fitted factor, except where
no point of the curve is within tolerance (:attr:`Fit.off`: the served precision is coarser than the tolerance, e.g. a
bfloat16 server against float32 canaries): there the factor cannot be read finer than :data:`NEAR`, and one within it
of 1 is ``applied``, of 0 ``base``. A curve that explains nothing is ``differs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TOLERANCES = {
    "float64": (2e-3, 1e-4),
    "float32": (2e-3, 1e-4),
    "float16": (1e-2, 2e-3),
    "bfloat16": (3e-2, 8e-3),
}
"""dtype → (absolute, relative) tolerance on one logprob: a served value ``y`` matches ``e`` when
``|y - e| <= abs + rel * |e|``. float32 covers another runtime's kernels (llama.cpp's f32 GGUF, mlx) against
torch's (~1e-4 measured; float64 canaries get float32's: the server computes in float32 at best); bfloat16 covers its
rounding (2⁻⁸ relative) and kernel order."""
SEPARATION = 4.0
"""The canaries must move the adapter away from the base by this many tolerances, or the probe cannot decide."""
NEAR = 0.05
"""A fitted factor within this of 1 (or 0) is the adapter (or the base) when the served values are off by more than
the tolerance everywhere: the factor is then read to 5% at best, so a closer one is no other scale."""
LEEWAY = 0.05
"""The expected curve explains the served values when its best fit is within max(1, this × the separation)
tolerances."""

Verdict = str
"""``applied`` | ``base`` | ``scale`` | ``differs``."""


@dataclass(frozen=True)
class Observation:
    """One served logprob and what PEFT expects there at each scale."""

    served: float
    expected: Sequence[float]


@dataclass(frozen=True)
class Fit:
    """The verdict and its numbers (deviations in units of the tolerance: 1.0 is the edge)."""

    verdict: Verdict
    factor: float | None
    """The fitted scale factor (1 applied, 0 base), or None when nothing fits."""
    deviation: dict[float, float]
    """scale → the largest |served - expected| over the observations, in tolerances."""
    best: float
    """The smallest deviation along the expected curve (at ``factor``), in tolerances."""
    separation: float
    """How far the adapter moves the canaries from the base, in tolerances (the largest over observations)."""
    count: int

    @property
    def off(self) -> bool:
        """Whether the served values are farther than the tolerance from every point of the expected curve (the
        verdict then rests on the factor alone: another served dtype, or another computation)."""
        return self.best > 1.0


def tolerance(dtype: str, expected: float) -> float:
    """The tolerance on one logprob ``expected`` computed in ``dtype`` (a key of :data:`TOLERANCES`)."""
    absolute, relative = TOLERANCES[dtype]
    return absolute + relative * abs(expected)


def anchors(scales: Sequence[float]) -> tuple[int, int]:
    """The indices of scale 1 (the adapter as PEFT applies it) and scale 0 (the base) in ``scales``."""
    values = list(scales)
    return values.index(1.0), values.index(0.0)


def separation_of(expected: Sequence[Sequence[float]], scales: Sequence[float], dtype: str) -> float:
    """How far the adapter moves ``expected`` (one value per scale each) from the base: the largest
    |scale 1 − scale 0|, in tolerances of ``dtype``."""
    unit, zero = anchors(scales)
    return max(abs(e[unit] - e[zero]) / tolerance(dtype, e[unit]) for e in expected)


def fit(observations: Sequence[Observation], scales: Sequence[float], dtype: str) -> Fit:
    """The verdict of ``observations`` against the expected curve over ``scales`` (which hold 0 and 1)."""
    unit, _ = anchors(scales)
    tols = [tolerance(dtype, o.expected[unit]) for o in observations]
    deviation = {
        s: _deviation(observations, tols, [o.expected[i] for o in observations]) for i, s in enumerate(scales)
    }
    separation = separation_of([o.expected for o in observations], scales, dtype)
    factor, best = _along_curve(observations, tols, scales)
    explained = best <= max(1.0, LEEWAY * separation)
    imprecise = (
        explained and best > 1.0
    )  # the curve explains the values, but none of its points is within tolerance
    if deviation[1.0] <= 1.0 or (imprecise and abs(factor - 1.0) <= NEAR):
        verdict, factor = "applied", 1.0
    elif deviation[0.0] <= 1.0 or (imprecise and abs(factor) <= NEAR):
        verdict, factor = "base", 0.0
    elif explained:
        verdict = "scale"
    else:
        verdict = "differs"
    return Fit(
        verdict, factor if verdict != "differs" else None, deviation, best, separation, len(observations)
    )


def _deviation(
    observations: Sequence[Observation], tols: Sequence[float], expected: Sequence[float]
) -> float:
    return max(abs(o.served - e) / t for o, t, e in zip(observations, tols, expected, strict=True))


def _along_curve(
    observations: Sequence[Observation], tols: Sequence[float], scales: Sequence[float]
) -> tuple[float, float]:
    """(factor, deviation) of the point on the piecewise-linear expected curve closest to the served values."""
    best_factor, best = 0.0, float("inf")
    y = [o.served / t for o, t in zip(observations, tols, strict=True)]
    for i in range(len(scales) - 1):
        a = [o.expected[i] / t for o, t in zip(observations, tols, strict=True)]
        b = [o.expected[i + 1] / t for o, t in zip(observations, tols, strict=True)]
        d = [bb - aa for aa, bb in zip(a, b, strict=True)]
        norm = sum(x * x for x in d)
        u = 0.0 if norm == 0 else sum((yy - aa) * dd for yy, aa, dd in zip(y, a, d, strict=True)) / norm
        u = min(1.0, max(0.0, u))
        dev = max(abs(yy - (aa + u * dd)) for yy, aa, dd in zip(y, a, d, strict=True))
        if dev < best:
            best, best_factor = dev, scales[i] + u * (scales[i + 1] - scales[i])
    return best_factor, best
