"""Factorising a large delta (``extract``) without numpy's full SVD of it: its values stay in their float32 or
float64 buffer, whole rows are widened to float64 a block at a time, and the factors written are the delta
projected onto orthonormal columns, so their error is measured exactly:
``‖Δ − U Uᵀ Δ‖_F² = ‖Δ‖_F² − ‖Uᵀ Δ‖_F²`` (and the same for ``Δ V Vᵀ``).

- :func:`leading` (``--rank`` R well below the smaller side): the leading R singular directions by seeded subspace
  iteration, a few passes over the delta; its error can sit a little above the Eckart–Young optimum where the
  spectrum has no gap after R.
- :func:`by_gram` (``--energy`` / ``--max-error``, whose rank needs the whole spectrum, or a rank near the smaller
  side): the Gram matrix of the shorter side in float64 (``ΔᵀΔ`` or ``ΔΔᵀ``, a block of the longer side at a time)
  and its eigendecomposition give every singular value and the singular vectors of that side; the rank is chosen
  from them and the delta projected onto the kept vectors (the Eckart–Young optimum, to the eigensolver's
  rounding). Memory: the delta, the ``short × short`` Gram matrix and the projection; numpy's SVD held a float64
  copy, ``U`` and its workspace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from adapterdoc.algebra.factors import RANK_TOL, chosen_rank, full_spectrum, kept_rank, truncate

if TYPE_CHECKING:
    from numpy import ndarray as NDArray

OVERSAMPLE = 16
"""Directions beyond the rank asked for that :func:`leading` carries (Halko, Martinsson and Tropp's ``p``)."""
FULL_SVD_VALUES = 1 << 20
"""A delta of at most this many values gets numpy's full SVD (its float64 copy, ``U`` and workspace stay a few
MiB); a larger one is factorised here (:func:`route`)."""
LEADING_FACTOR = 4
"""Under ``--rank``, a large delta whose smaller side exceeds this many times ``rank + OVERSAMPLE`` gets
:func:`leading`; a smaller side (the rank near it) gets :func:`by_gram`."""
_SWEEPS = 4
"""At most this many power sweeps (``Δᵀ`` then ``Δ``) in :func:`leading` (on a 2048 × 5632 delta with a slowly
decaying spectrum, four leave the error within 0.02 % of the optimum; with a gap after the rank, one suffices)."""
_SETTLED = 1e-3
""":func:`leading` stops when a sweep raises the kept energy by less than this share of the energy left out."""
_BLOCK = 1 << 18
"""Values of the delta widened to float64 at a time (2 MiB)."""
_CANCELS = 1e-8
"""Where ``‖Δ‖² − ‖projection‖²`` is under this share of ``‖Δ‖²``, :func:`_error` measures the residual instead of
subtracting (the difference of two float64 sums would be rounding at ~1e-16 of them: an exact factorisation would
read as ~1e-8 off)."""


class Projected(NamedTuple):
    """``b @ a``: the delta projected onto orthonormal columns, and how far it is from the delta."""

    b: NDArray
    a: NDArray
    energy: float
    """``‖Δ‖_F²`` (float64)."""
    error: float
    """``‖Δ − b a‖_F``, measured: ``sqrt(‖Δ‖² − ‖projection‖²)``."""
    effective_rank: int | None = None
    """Singular values above :data:`~adapterdoc.algebra.factors.RANK_TOL` of the largest, where the whole spectrum
    was computed (:func:`by_gram`)."""


def _small(shape: tuple[int, ...]) -> bool:
    """Whether a delta of ``shape`` gets numpy's full SVD: at most :data:`FULL_SVD_VALUES` values."""
    return math.prod(shape) <= FULL_SVD_VALUES


def route(shape: tuple[int, ...], rank: int | None) -> str:
    """How a delta of ``shape`` is factorised: ``svd`` (numpy's full SVD: at most :data:`FULL_SVD_VALUES` values),
    ``leading`` (``--rank`` well below its smaller side) or ``gram`` (``--energy`` / ``--max-error``, or a rank
    near the smaller side)."""
    if _small(shape):
        return "svd"
    if rank is not None and min(shape) > LEADING_FACTOR * (rank + OVERSAMPLE):
        return "leading"
    return "gram"


def optimal(delta: NDArray, rank: int | None, energy: float | None, max_error: float | None) -> Projected:
    """The best factorisation of a full delta at the rank asked for: numpy's full SVD of a small one (in float64),
    :func:`by_gram` of a large one; both the Eckart–Young optimum (to rounding), their error exact."""
    import numpy as np

    if not _small(delta.shape):
        return by_gram(delta, rank, energy, max_error)
    sp = full_spectrum(np.asarray(delta, dtype=np.float64))
    t = truncate(sp, chosen_rank(sp.s, rank, energy, max_error))
    return Projected(t.b, t.a, t.energy, t.error, t.effective_rank)


def factorised(delta: NDArray, rank: int | None, energy: float | None, max_error: float | None) -> Projected:
    """``extract``'s factorisation of a delta, by the :func:`route` its shape and rank take: :func:`leading` for a
    rank well below its smaller side, else :func:`optimal`."""
    if rank is not None and route(delta.shape, rank) == "leading":
        return leading(delta, rank)
    return optimal(delta, rank, energy, max_error)


def leading(delta: NDArray, rank: int) -> Projected:
    """``delta`` projected onto its leading ``rank`` left singular vectors, found by subspace iteration (a seeded
    random start of ``rank + OVERSAMPLE`` directions, power sweeps until the kept energy settles, at most
    :data:`_SWEEPS`). The sweeps run in ``delta``'s dtype, each orthonormalised by :func:`_span`; the final basis
    is numpy's SVD of the last sweep (exactly orthonormal). A transposed view (an embedding's ``delta.T``) is worked
    on as the array it views, and the factors swapped."""
    import numpy as np

    if _transposed(delta):
        return _swapped(leading(delta.T, rank))
    m, n = delta.shape
    width = min(rank + OVERSAMPLE, m, n)
    start = np.random.default_rng(0).standard_normal((n, width)).astype(delta.dtype)
    q, _ = _span(delta @ start)
    scale = float(np.linalg.norm(delta)) ** 2
    kept = -1.0
    for _ in range(_SWEEPS):
        y = delta @ _span(delta.T @ q)[0]
        q, energies = _span(y)
        now = float(energies[:rank].sum())
        if now - kept <= _SETTLED * max(scale - now, 0.0):
            break
        kept = now
    basis = np.linalg.svd(y.astype(np.float64), full_matrices=False)[0][:, :rank]
    return _left_projected(delta, basis)


def by_gram(delta: NDArray, rank: int | None, energy: float | None, max_error: float | None) -> Projected:
    """The best factorisation of ``delta`` at the rank asked for (``rank``, or the smallest keeping ``energy`` of
    ``‖Δ‖²``, or within relative error ``max_error``), from the eigendecomposition of the float64 Gram matrix of its
    shorter side (its eigenvalues are the squared singular values; they resolve singular values to about 1e-8 of
    the largest, below :data:`~adapterdoc.algebra.factors.RANK_TOL`). The delta is then projected onto the kept
    eigenvectors (orthonormal to rounding), so the error is the projection's, measured: each kept direction's part
    ``p_j`` (a column of ``Δ V`` or a row of ``Uᵀ Δ``) is written beside its unit vector, both scaled to
    ``sqrt(‖p_j‖)``, and the projection is held in the delta's dtype."""
    import numpy as np

    if _transposed(delta):
        return _swapped(by_gram(delta.T, rank, energy, max_error))
    m, n = delta.shape
    axis = 0 if n <= m else 1  # blocks along the longer side: the Gram of the shorter one (ΔᵀΔ or ΔΔᵀ)
    lam, vectors = np.linalg.eigh(_gram(delta, axis))
    s = np.sqrt(np.clip(lam[::-1], 0.0, None))
    keep = kept_rank(chosen_rank(s, rank, energy, max_error), s.size)
    basis = np.ascontiguousarray(vectors[:, ::-1][:, :keep])  # V (n × keep) for axis 0, else U (m × keep)
    del vectors
    parts = np.empty((m, keep) if axis == 0 else (keep, n), dtype=delta.dtype)
    norms = np.zeros(keep)  # ‖p_j‖²
    total = 0.0
    for sl, block in _blocks(delta, axis):
        flat = block.reshape(-1)
        total += float(flat @ flat)
        if axis == 0:
            part = block @ basis
            norms += np.einsum("ij,ij->j", part, part)
            parts[sl] = part
        else:
            part = basis.T @ block
            norms += np.einsum("ij,ij->i", part, part)
            parts[:, sl] = part
    error = _error(delta, axis, total, float(norms.sum()), lambda _, x: _onto(basis, x, axis))
    root = np.sqrt(np.sqrt(norms))
    inv = np.divide(1.0, root, out=np.zeros_like(root), where=root > 0).astype(parts.dtype)
    effective = int((s > s[0] * RANK_TOL).sum()) if s.size and s[0] > 0 else 0
    if axis == 0:  # Δ V Vᵀ = Σ p_j v_jᵀ
        parts *= inv[None, :]
        return Projected(parts, root[:, None] * basis.T, total, error, effective)
    parts *= inv[:, None]  # U Uᵀ Δ = Σ u_j p_j
    return Projected(basis * root[None, :], parts, total, error, effective)


def _onto(basis: NDArray, block: NDArray, axis: int) -> NDArray:
    """``block`` projected onto ``basis``'s orthonormal columns: ``block V Vᵀ`` for a block of rows (``axis`` 0),
    ``U Uᵀ block`` for a block of columns."""
    projected: NDArray = (block @ basis) @ basis.T if axis == 0 else basis @ (basis.T @ block)
    return projected


def _error(
    delta: NDArray, axis: int, total: float, kept: float, projection: Callable[[slice, NDArray], NDArray]
) -> float:
    """``‖Δ − P‖_F`` for ``P`` the projection of ``delta`` onto orthonormal columns (``kept = ‖P‖²``,
    ``total = ‖Δ‖²``): ``sqrt(total − kept)``, unless that difference is under :data:`_CANCELS` of ``total``,
    where it would be mostly rounding (a delta the factors hold to 1e-4 or better); then the residual is measured
    directly, ``Σ ‖block − P_block‖²`` over a second float64 pass (``projection(slice, block)`` gives ``P``'s block)."""
    left = total - kept
    if left > _CANCELS * total:
        return math.sqrt(left)
    out = 0.0
    for sl, block in _blocks(delta, axis):
        block -= projection(sl, block)
        flat = block.reshape(-1)
        out += float(flat @ flat)
    return math.sqrt(out)


def _gram(delta: NDArray, axis: int) -> NDArray:
    """The float64 Gram matrix of ``delta``'s shorter side (``ΔᵀΔ`` from blocks of rows, ``axis`` 0, else ``ΔΔᵀ``
    from blocks of columns), each block at least a quarter of that side long (so an update's arithmetic outweighs
    its pass over the Gram matrix)."""
    import numpy as np

    short = delta.shape[1 - axis]
    gram = np.zeros((short, short))
    for _, block in _blocks(delta, axis, at_least=max(1, short // 4)):
        gram += block.T @ block if axis == 0 else block @ block.T
    return gram


def _left_projected(delta: NDArray, basis: NDArray) -> Projected:
    """``U Uᵀ Δ`` for ``basis`` ``U`` (``m × k``, orthonormal columns) and a C-ordered ``delta``: ``Uᵀ Δ`` in float64
    a block of rows at a time, its singular values split evenly between ``b`` and ``a`` (as
    :func:`~adapterdoc.algebra.factors.truncate`)."""
    import numpy as np

    proj = np.zeros((basis.shape[1], delta.shape[1]))
    total = 0.0
    for sl, block in _blocks(delta, 0):
        flat = block.reshape(-1)
        total += float(flat @ flat)
        proj += basis[sl].T @ block
    kept = float(np.einsum("ij,ij->", proj, proj))
    error = _error(delta, 0, total, kept, lambda sl, _: basis[sl] @ proj)
    p, s, vt = np.linalg.svd(proj, full_matrices=False)
    root = np.sqrt(s)
    return Projected((basis @ p) * root, root[:, None] * vt, total, error)  # U · proj = (U p) s vt


def _blocks(delta: NDArray, axis: int, *, at_least: int = 1) -> Iterator[tuple[slice, NDArray]]:
    """Blocks of whole rows (``axis`` 0) or columns (1) of a C-ordered ``delta``, about :data:`_BLOCK` values each
    and at least ``at_least`` rows (columns) each, widened to float64 in one reused buffer: each valid until the
    next is taken."""
    import numpy as np

    length, across = delta.shape[axis], delta.shape[1 - axis]
    step = min(length, max(1, _BLOCK // max(across, 1), at_least))
    buffer = np.empty((step, across) if axis == 0 else (across, step))
    for start in range(0, length, step):
        sl = slice(start, min(start + step, length))
        if axis == 0:
            block = buffer[: sl.stop - start]
            block[...] = delta[sl]
        else:
            block = buffer[:, : sl.stop - start]
            block[...] = delta[:, sl]
        yield sl, block


def _span(y: NDArray) -> tuple[NDArray, NDArray]:
    """Orthonormal columns (in ``y``'s dtype) spanning ``y``'s, and the squared singular values of ``y`` (largest
    first), from the eigendecomposition of its float64 Gram matrix ``yᵀy = V Λ Vᵀ``: ``y V Λ^{-1/2}``, with a zero
    column for a direction below :data:`~adapterdoc.algebra.factors.RANK_TOL`² of the largest. Cheaper than a QR
    of a tall ``y`` and orthonormal to about float32 rounding where the columns are well apart: enough for the
    sweeps of :func:`leading`, whose final basis comes from numpy's SVD (exactly orthonormal)."""
    import numpy as np

    tall = y.astype(np.float64)
    lam, v = np.linalg.eigh(tall.T @ tall)
    lam, v = np.clip(lam[::-1], 0.0, None), v[:, ::-1]
    inv = np.zeros_like(lam)
    live = lam > lam[0] * RANK_TOL**2 if lam.size and lam[0] > 0 else np.zeros(lam.shape, dtype=bool)
    inv[live] = 1.0 / np.sqrt(lam[live])
    return ((tall @ v) * inv[None, :]).astype(y.dtype), lam


def _transposed(delta: NDArray) -> bool:
    """Whether ``delta`` is a transposed view of a C-ordered array (worked on as that array)."""
    return not delta.flags.c_contiguous and bool(delta.T.flags.c_contiguous)


def _swapped(p: Projected) -> Projected:
    """The factors of the transpose: ``(b a)ᵀ = aᵀ bᵀ``."""
    import numpy as np

    return p._replace(b=np.ascontiguousarray(p.a.T), a=np.ascontiguousarray(p.b.T))


__all__ = [
    "FULL_SVD_VALUES",
    "LEADING_FACTOR",
    "OVERSAMPLE",
    "Projected",
    "by_gram",
    "factorised",
    "leading",
    "optimal",
    "route",
]
