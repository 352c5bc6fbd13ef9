"""The scale grid of a large rank has no gap between 2 and √r (r = 64: 0…2 then 8 left factors 3-6 "differs" or
read as 7.4): the served factor is read to 5% along it. The expected curves are a two-token softmax's logprob,
curved as a real adapter's are (pure Python, no model)."""

from __future__ import annotations

import itertools
import math

import pytest

from adapterdoc.probe.canaries import scale_grid
from adapterdoc.probe.fit import Observation, fit

CURVES = [(-2.0, 0.2), (-1.0, -0.15), (0.5, 0.12), (-3.0, 0.25)]
"""(logit, slope per unit of scale) of each observed token against one rival token."""


def _logprob(logit: float, slope: float, scale: float) -> float:
    return -math.log1p(math.exp(logit + slope * scale))


@pytest.mark.parametrize("factor", [1.75, 3.0, 4.0, 6.0, 8.0])
def test_a_large_ranks_factor_is_read_to_5_percent(factor: float) -> None:
    scales = scale_grid(64)
    observations = [
        Observation(_logprob(c, d, factor), [_logprob(c, d, s) for s in scales]) for c, d in CURVES
    ]
    result = fit(observations, scales, "float32")
    assert result.verdict == "scale" and result.factor is not None, result
    assert abs(result.factor - factor) <= 0.05 * factor, result.factor


def test_the_grid_steps_by_at_most_root_two_beyond_two_and_below_a_quarter() -> None:
    for rank in (1, 2, 4, 8, 16, 64, 128, 4096):
        grid = scale_grid(rank)
        assert grid[0] == 0.0 and 1.0 in grid and grid == tuple(sorted(set(grid)))
        assert max(grid) == max(2.0, math.sqrt(rank)) and min(grid[1:]) == min(0.25, 1 / math.sqrt(rank))
        outer = [s for s in grid if s >= 2.0 or 0 < s <= 0.25]
        assert all(
            b / a <= math.sqrt(2) + 1e-9 for a, b in itertools.pairwise(outer) if a >= 2.0 or b <= 0.25
        )
    assert len(scale_grid(64)) == 13
