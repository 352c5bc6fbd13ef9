"""``combine --method ties|dare``: the merges defined element by element on each source's full delta, exactly as
PEFT's ``peft.utils.merge_utils`` computes them (``ties``: magnitude pruning to ``density``, a sign elected by the
weighted total, the disjoint mean; ``dare``: ``dare_linear``, random pruning to ``density`` rescaled by
``1/density``, then the weighted sum), in float64. The random masks of ``dare`` come from torch's generator seeded
with ``seed + i`` for the i-th module, so a run is reproducible. The merged delta is then factorised like ``svd``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from numpy import ndarray as NDArray

ELEMENTWISE = ("ties", "dare")


def merged_delta(
    method: str, deltas: Sequence[NDArray], weights: Sequence[float], *, density: float, seed: int
) -> NDArray:
    """PEFT's ``ties`` or ``dare_linear`` of the full deltas (each ``scaling · B A``) with ``weights``."""
    import numpy as np
    import torch
    from peft.utils.merge_utils import dare_linear, ties

    tensors = [torch.from_numpy(np.ascontiguousarray(d)) for d in deltas]
    w = torch.tensor(list(weights), dtype=torch.float64)
    if method == "ties":
        out = ties(tensors, w, density, "total")
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = dare_linear(tensors, w, density)
    result: NDArray = out.numpy()
    return result


__all__ = ["ELEMENTWISE", "merged_delta"]
