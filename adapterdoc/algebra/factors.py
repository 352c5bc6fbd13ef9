"""The factor maths: a sum of scaled LoRA products as stacked factors, and its best rank-R factorisation computed
from the factors alone.

For ``ΔW = B A`` with ``B`` (d, r) and ``A`` (r, k), the SVD of ``ΔW`` comes from the ``r x r`` Gram matrices of the
factors, a Cholesky factor of one and one symmetric eigensolve of an ``r x r`` matrix (:func:`spectrum`), without
forming the ``d x k`` matrix or an orthonormal basis of it: only the R kept columns are multiplied out. By
Eckart–Young the first R singular triples are the best rank-R factorisation in the Frobenius norm, and its error is
exact from ``S`` alone: ``‖ΔW − ΔŴ‖_F² = Σ_{i>R} s_i²``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.report.algebra_report import ModuleRow, kept_share, relative_error

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


RANK_TOL = 1e-6
"""Singular values at or below this share of the largest do not count in the effective rank (the Gram route
below resolves singular values to about 1e-8 of the largest; a float32 or bf16 delta is noisier still)."""
_NOISE = 1e-7
"""Singular values at or below this share of the largest are not inverted (their directions are below the Gram
route's resolution): kept, their factors are zero."""


@dataclass(frozen=True)
class Spectrum:
    """The SVD of ``b @ a`` kept factored: ``b @ a = (b @ left) · diag(s) · (right @ a)``, with ``left`` (r, n) and
    ``right`` (n, r) small; for a full matrix ``b`` is ``U`` and ``a`` is ``Vᵀ`` (``left``, ``right`` identity)."""

    b: NDArray
    left: NDArray
    s: NDArray
    right: NDArray
    a: NDArray

    @property
    def energy(self) -> float:
        """``‖B A‖_F²``."""
        return float((self.s**2).sum())

    def effective_rank(self) -> int:
        """Singular values above :data:`RANK_TOL` of the largest."""
        if not self.s.size or self.s[0] == 0:
            return 0
        return int((self.s > float(self.s[0]) * RANK_TOL).sum())


def spectrum(b: NDArray, a: NDArray, coefficient: float = 1.0) -> Spectrum:
    """The SVD of ``c · b @ a`` (``c``: ``coefficient``) from the factors alone. Any square root ``F Fᵀ = a aᵀ``
    (its Cholesky factor) gives ``c · b @ a = (c · b F) Qᵀ`` with ``Q`` orthonormal, so the singular values are the
    square roots of the eigenvalues of the ``r x r`` matrix ``M = c² Fᵀ (bᵀb) F = W S² Wᵀ``; the left singular
    vectors are ``c · b F W S⁻¹`` and the right ones (``Vᵀ = S⁻¹ Uᵀ ΔW``) ``S⁻² Wᵀ Fᵀ c² (bᵀb) a``. Cost: two Gram
    products (BLAS syrk), a Cholesky and one symmetric eigensolve of ``r x r`` matrices; neither the ``d x k``
    matrix nor an orthonormal basis of either factor is formed."""
    import numpy as np

    gram_b = (coefficient * coefficient) * (b.T @ b)
    root = _square_root(a @ a.T)
    eig, w = np.linalg.eigh(root.T @ gram_b @ root)
    s = np.sqrt(np.clip(eig[::-1], 0, None))
    w = w[:, ::-1]
    inv = _inverse(s)
    left = coefficient * (root @ w) * inv[None, :]
    right = (inv * inv)[:, None] * ((w.T @ root.T) @ gram_b)
    return Spectrum(b, left, s, right, a)


def _square_root(gram: NDArray) -> NDArray:
    """An ``F`` with ``F Fᵀ = gram`` (symmetric, positive semi-definite): its Cholesky factor, or where that fails
    (a singular ``gram``: dependent rows of ``a``) ``V √Λ`` from its eigendecomposition."""
    import numpy as np

    try:
        root: NDArray = np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        eig, v = np.linalg.eigh(gram)
        root = v * np.sqrt(np.clip(eig, 0, None))[None, :]
    return root


def full_spectrum(delta: NDArray) -> Spectrum:
    """The SVD of a full matrix (``extract``, ``ties``/``dare``), numpy's."""
    import numpy as np

    u, s, vt = np.linalg.svd(delta, full_matrices=False)
    eye = np.eye(s.size)
    return Spectrum(u, eye, s, eye, vt)


def _inverse(s: NDArray) -> NDArray:
    """``1/s`` where ``s`` is above :data:`_NOISE` of its largest, else 0."""
    import numpy as np

    out = np.zeros_like(s)
    if s.size and s.max() > 0:
        keep = s > s.max() * _NOISE
        out[keep] = 1.0 / s[keep]
    return out


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
        return kept_share(self.energy, self.error)

    @property
    def rel_error(self) -> float:
        """``‖ΔW − ΔŴ‖_F / ‖ΔW‖_F`` (0 for a zero delta)."""
        return relative_error(self.energy, self.error)

    def row(self, module: str, rank_in: int) -> ModuleRow:
        """The report's row of ``module`` (its factors' rank ``rank_in`` before)."""
        return ModuleRow(module, rank_in, self.rank, self.effective_rank, self.energy, self.error)


def truncate(sp: Spectrum, rank: int) -> Truncated:
    """The best rank-``rank`` factorisation (Eckart–Young), singular values split evenly between the factors
    (``b = left·√s``, ``a = √s·right``); at least rank 1 (PEFT needs ``r ≥ 1``: a zero column and row)."""
    import numpy as np

    keep = kept_rank(rank, sp.s.size)
    root = np.sqrt(sp.s[:keep])
    b = sp.b @ (sp.left[:, :keep] * root[None, :])
    a = (root[:, None] * sp.right[:keep]) @ sp.a
    dropped = float((sp.s[keep:] ** 2).sum())
    return Truncated(b, a, keep, sp.effective_rank(), sp.energy, math.sqrt(dropped))


def kept_rank(rank: int, rank_in: int) -> int:
    """The rank :func:`truncate` keeps of a module of rank ``rank_in`` asked for ``rank``: at most ``rank_in``,
    at least 1."""
    return max(1, min(rank, rank_in))


def method_name(rank: int | None, energy: float | None, max_error: float | None) -> str:
    """How the rank is chosen, as the report names it: ``rank``, ``energy`` or ``max-error``."""
    return "rank" if rank is not None else "energy" if energy is not None else "max-error"


def chosen_rank(s: NDArray, rank: int | None, energy: float | None, max_error: float | None) -> int:
    """The rank asked for, given the singular values ``s`` (largest first): ``rank`` itself, else the smallest
    keeping ``energy`` of ``‖ΔW‖_F² = Σ s²``, else the smallest within ``max_error``."""
    if rank is not None:
        return rank
    if energy is not None:
        return rank_for_energy(s, energy)
    assert max_error is not None
    return rank_for_error(s, max_error)


def rank_for_energy(s: NDArray, fraction: float) -> int:
    """The smallest rank keeping at least ``fraction`` of ``Σ s²`` (``s``: the singular values, largest first)."""
    total = float((s**2).sum())
    if total == 0:
        return 1
    kept = 0.0
    for i, x in enumerate(s.tolist()):
        kept += x * x
        if kept >= fraction * total * (1 - 1e-12):
            return i + 1
    return int(s.size)


def rank_for_error(s: NDArray, max_error: float) -> int:
    """The smallest rank whose relative error ``sqrt(Σ_{i ≥ rank} s_i² / Σ s²)`` is at most ``max_error``."""
    total = float((s**2).sum())
    if total == 0:
        return 1
    tail = [float(x) for x in (s**2)[::-1].cumsum()[::-1]]  # tail[i] = Σ_{j ≥ i} s_j²
    for r in range(1, s.size + 1):
        dropped = tail[r] if r < len(tail) else 0.0
        if math.sqrt(max(dropped, 0.0) / total) <= max_error:
            return r
    return int(s.size)


__all__ = [
    "Spectrum",
    "Term",
    "Truncated",
    "chosen_rank",
    "full_spectrum",
    "kept_rank",
    "rank_for_energy",
    "rank_for_error",
    "spectrum",
    "stack",
    "truncate",
]
