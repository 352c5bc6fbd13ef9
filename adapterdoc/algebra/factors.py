"""The factor maths: a sum of scaled LoRA products as stacked factors, and its best rank-R factorisation computed
from the factors alone.

For ``ΔW = B A`` with ``B`` (d, r) and ``A`` (r, k): ``B = Q_b R_b`` and ``Aᵀ = Q_a R_a`` (thin QR), so
``ΔW = Q_b (R_b R_aᵀ) Q_aᵀ``; the SVD of the small core ``R_b R_aᵀ = U S Vᵀ`` gives the SVD of ``ΔW``
(``Q_b U``, ``S``, ``Q_a V``) without forming the ``d x k`` matrix. By Eckart–Young the first R singular triples are
the best rank-R factorisation in the Frobenius norm, and its error is exact from ``S`` alone:
``‖ΔW − ΔŴ‖_F² = Σ_{i>R} s_i²``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from numpy import ndarray as NDArray


@dataclass(frozen=True)
class Term:
    """``weight · scaling · b @ a``: one source's contribution to a module."""

    a: NDArray
    b: NDArray
    coefficient: float
    """``weight · scaling``."""


def stack(terms: Sequence[Term]) -> tuple[NDArray, NDArray]:
    """The exact sum ``Σ cᵢ Bᵢ Aᵢ`` as one factor pair ``(B, A)`` of rank ``Σ rᵢ``: each coefficient folded into
    its ``A`` (a negative weight is exact: no square roots, no cross terms)."""
    import numpy as np

    b = np.concatenate([t.b for t in terms], axis=1)
    a = np.concatenate([t.coefficient * t.a for t in terms], axis=0)
    return b, a


@dataclass(frozen=True)
class Spectrum:
    """The SVD of ``B A`` from its factors: ``B A = left · diag(s) · right`` (left (d, n), right (n, k))."""

    left: NDArray
    s: NDArray
    right: NDArray

    @property
    def energy(self) -> float:
        """``‖B A‖_F²``."""
        return float((self.s**2).sum())

    def effective_rank(self) -> int:
        """Singular values above numpy's ``matrix_rank`` tolerance (``s_max · max(d, k) · eps``)."""
        import numpy as np

        if not self.s.size:
            return 0
        tol = (
            float(self.s[0]) * max(self.left.shape[0], self.right.shape[1]) * float(np.finfo(np.float64).eps)
        )
        return int((self.s > tol).sum())


def spectrum(b: NDArray, a: NDArray) -> Spectrum:
    """The SVD of ``b @ a`` through QR of each factor and an SVD of the ``r x r`` core."""
    import numpy as np

    qb, rb = np.linalg.qr(b)
    qa, ra = np.linalg.qr(a.T)
    u, s, vt = np.linalg.svd(rb @ ra.T)
    return Spectrum(qb @ u, s, vt @ qa.T)


@dataclass(frozen=True)
class Truncated:
    """A rank-``rank`` factorisation ``b @ a`` of a delta and how far it is from it."""

    b: NDArray
    a: NDArray
    rank: int
    effective_rank: int
    energy: float
    """``‖ΔW‖_F²``."""
    error: float
    """``‖ΔW − b a‖_F`` (exact, from the dropped singular values)."""

    @property
    def kept_energy(self) -> float:
        """Share of ``‖ΔW‖_F²`` kept (1 for a zero delta)."""
        return 1.0 if self.energy == 0 else 1.0 - self.error**2 / self.energy

    @property
    def rel_error(self) -> float:
        """``‖ΔW − ΔŴ‖_F / ‖ΔW‖_F`` (0 for a zero delta)."""
        return 0.0 if self.energy == 0 else self.error / math.sqrt(self.energy)


def truncate(sp: Spectrum, rank: int) -> Truncated:
    """The best rank-``rank`` factorisation (Eckart–Young), singular values split evenly between the factors
    (``b = left·√s``, ``a = √s·right``); at least rank 1 (PEFT needs ``r ≥ 1``: a zero column and row)."""
    import numpy as np

    keep = max(1, min(rank, sp.s.size))
    root = np.sqrt(sp.s[:keep])
    b = sp.left[:, :keep] * root
    a = root[:, None] * sp.right[:keep]
    dropped = float((sp.s[keep:] ** 2).sum())
    return Truncated(b, a, keep, sp.effective_rank(), sp.energy, math.sqrt(dropped))


def rank_for_energy(sp: Spectrum, fraction: float) -> int:
    """The smallest rank keeping at least ``fraction`` of ``‖ΔW‖_F²``."""
    total = sp.energy
    if total == 0:
        return 1
    kept = 0.0
    for i, s in enumerate(sp.s.tolist()):
        kept += s * s
        if kept >= fraction * total * (1 - 1e-12):
            return i + 1
    return int(sp.s.size)


def rank_for_error(sp: Spectrum, max_error: float) -> int:
    """The smallest rank whose relative error ``‖ΔW − ΔŴ‖_F / ‖ΔW‖_F`` is at most ``max_error``."""
    total = sp.energy
    if total == 0:
        return 1
    tail = [float(x) for x in (sp.s**2)[::-1].cumsum()[::-1]]  # tail[i] = Σ_{j ≥ i} s_j²
    for r in range(1, sp.s.size + 1):
        dropped = tail[r] if r < len(tail) else 0.0
        if math.sqrt(max(dropped, 0.0) / total) <= max_error:
            return r
    return int(sp.s.size)


__all__ = [
    "Spectrum",
    "Term",
    "Truncated",
    "rank_for_energy",
    "rank_for_error",
    "spectrum",
    "stack",
    "truncate",
]
