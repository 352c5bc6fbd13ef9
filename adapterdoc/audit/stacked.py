"""One module's delta norms and singular values, every expert at once: the ``r × r`` Gram matrices of all its
slices in one stacked computation per tensor, the norms from their traces, the singular values (only when asked)
from a stacked Cholesky + ``eigvalsh``; the slices these shortcuts cannot vouch for go through
:func:`core_singular_values`, the per-slice route (Gram ``eigh``, then Householder QR when ill-conditioned).

Numerics. ``‖B A‖_F² = tr((BᵀB)(AAᵀ)) = Σ (BᵀB) ∘ (AAᵀ)`` (both Grams symmetric). Its rounding error is about
``n · eps · ‖B‖_F² ‖A‖_F²`` (``n`` the longer side), so the trace is kept when ``‖B‖_F² ‖A‖_F²`` is at most
:data:`TRACE_SAFE` × ``‖B A‖_F²`` (relative error under ~1e-8; independent random factors sit near ``r``), and the
slice takes the per-slice route otherwise (heavy cancellation between the rank-1 terms). The singular values:
with ``AAᵀ = L Lᵀ`` (Cholesky), ``σ_i(B A)² = λ_i(Lᵀ (BᵀB) L)``, a symmetric eigenvalue problem (``eigvalsh``,
no vectors), accurate to ``r · eps · σ_max²`` like the two-``eigh`` core it replaces, and held to the same
:data:`GRAM_SAFE` test: a slice with a singular value under 1e-4 of its largest, or whose Cholesky fails, takes
the per-slice route, exactly as before."""

from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from numpy import ndarray as NDArray

GRAM_SAFE = 1e-8
"""The Gram route is kept when every singular value of ``B A`` is at least ``sqrt(GRAM_SAFE)`` (1e-4) of the
largest; below that, the module is recomputed through QR."""
TRACE_SAFE = 1e4
"""The trace norm is kept when ``‖B‖_F² ‖A‖_F² ≤ TRACE_SAFE · ‖B A‖_F²``."""
_TSQR_ROWS = 1024
_EINSUM_RANK = 4
"""Up to this rank the per-expert Grams are einsum sums (a few passes); above it, BLAS products per slice."""


def narrow_ok(experts: int, r: int) -> bool:
    """Whether :func:`stacked_grams` takes float32 factors for this shape (the einsum route widens them to
    float64 as it multiplies; the BLAS routes need float64)."""
    return experts > 1 and r <= _EINSUM_RANK


def stacked_grams(np: ModuleType, a: NDArray, b: NDArray, experts: int) -> tuple[NDArray, NDArray]:
    """The per-slice Gram matrices ``A_e A_eᵀ`` and ``B_eᵀ B_e``, each ``[experts, r, r]`` float64 (layouts as
    in :func:`stacked_measure`; float32 factors only where :func:`narrow_ok`). Their traces sum to ``‖A‖_F²`` and ``‖B‖_F²``: the audit reads its finite and
    non-zero checks from them instead of one more pass over the factors."""
    r = a.shape[0] // experts
    if experts == 1:
        return (a @ a.T)[None], (b.T @ b)[None]
    a3 = a.reshape(experts, r, a.shape[1])
    b3 = b.reshape(b.shape[0], r, experts)
    if (
        r <= _EINSUM_RANK
    ):  # float32 factors (exact decodes) are widened inside einsum: the float64 result bitwise
        f64 = np.float64
        return np.einsum("eji,eki->ejk", a3, a3, dtype=f64), np.einsum("oje,oke->ejk", b3, b3, dtype=f64)
    c = np.ascontiguousarray(b3.transpose(2, 0, 1))
    return a3 @ a3.transpose(0, 2, 1), c.transpose(0, 2, 1) @ c


def stacked_measure(
    np: ModuleType,
    a: NDArray,
    b: NDArray,
    experts: int,
    *,
    ranks: bool = True,
    grams: tuple[NDArray, NDArray] | None = None,
) -> tuple[list[float], list[list[float] | None]]:
    """``‖B_e A_e‖_F`` of each slice (``A`` [experts·r, in] with expert ``e`` in rows ``e·r … e·r+r-1``; ``B``
    [out, r·experts] with column ``j·experts + e``: PEFT's fused layout) and, with ``ranks``, each slice's
    singular values as a list (else ``None``). ``grams``: :func:`stacked_grams` of the same factors, if the
    caller has them already."""
    r = a.shape[0] // experts
    ga, gb = grams if grams is not None else stacked_grams(np, a, b, experts)
    sq = np.einsum("ejk,ejk->e", gb, ga)
    scale = np.einsum("ejj->e", gb) * np.einsum("ejj->e", ga)
    zero = scale == 0  # a zero factor, unless squares underflowed (tiny F64 values): then the slow route
    for e in np.flatnonzero(zero).tolist():
        b_e = b[:, e::experts] if experts > 1 else b
        zero[e] = not (a[e * r : (e + 1) * r].any() and b_e.any())
    trusted = zero | ((sq > 0) & (scale <= TRACE_SAFE * sq))
    norms = np.sqrt(np.where(trusted, sq, 0.0)).tolist()
    svs: list[list[float] | None] = [None] * experts
    if ranks:
        live = [e for e in range(experts) if not zero[e]]
        for e, sv in zip(live, _gram_singular_values(np, ga[live], gb[live])):
            svs[e] = sv
        for e in range(experts):
            if zero[e]:
                svs[e] = [0.0] * r
    for e in range(experts):
        if zero[e] or (trusted[e] and (not ranks or svs[e] is not None)):
            continue
        a_e = np.asarray(a[e * r : (e + 1) * r], dtype=np.float64)
        b_e = np.asarray(b[:, e::experts] if experts > 1 else b, dtype=np.float64)
        values = core_singular_values(np, a_e, b_e)
        if ranks:
            svs[e] = values.tolist()
        if not trusted[e]:
            norms[e] = math.sqrt(float(np.sum(values * values)))
    return norms, svs


def _gram_singular_values(np: ModuleType, ga: NDArray, gb: NDArray) -> list[list[float] | None]:
    """Singular values (descending lists) from stacked Grams, ``None`` for slices the fast route cannot vouch for."""
    n = ga.shape[0]
    if n == 0:
        return []
    ok = np.ones(n, dtype=bool)
    try:
        low = np.linalg.cholesky(ga)
    except np.linalg.LinAlgError:  # some slice is not positive definite: find which, one at a time
        low = np.zeros_like(ga)
        for i in range(n):
            try:
                low[i] = np.linalg.cholesky(ga[i])
            except np.linalg.LinAlgError:
                ok[i] = False
                low[i] = np.eye(ga.shape[1])
    lam = np.linalg.eigvalsh(low.transpose(0, 2, 1) @ gb @ low)[:, ::-1]
    sv = np.sqrt(np.clip(lam, 0, None))
    ok &= (sv[:, 0] > 0) & (sv[:, -1] ** 2 >= GRAM_SAFE * sv[:, 0] ** 2)
    rows = sv.tolist()
    return [row if good else None for row, good in zip(rows, ok.tolist())]


def core_singular_values(np: ModuleType, a: NDArray, b: NDArray) -> NDArray:
    """Singular values of ``B A`` (``A`` [r, in], ``B`` [out, r]) from an ``r × r`` core, largest first.

    Fast route: the Gram matrices ``BᵀB = V_B Λ_B V_Bᵀ`` and ``AAᵀ = V_A Λ_A V_Aᵀ`` (BLAS-3, symmetric ``eigh``)
    give ``R_B = Λ_B^½ V_Bᵀ`` and ``R_A = Λ_A^½ V_Aᵀ`` with ``B = Q_B R_B``, ``Aᵀ = Q_A R_A``, so the core
    ``R_B R_Aᵀ`` has the singular values of ``B A``. Its error in ``σ_i²`` is about ``r · eps · σ_max²``,
    harmless unless some ``σ_i`` is tiny; then (see :data:`GRAM_SAFE`) the core is rebuilt from Householder QR
    of ``B`` and ``Aᵀ`` (block-wise, TSQR), accurate to ``eps · σ_max`` whatever the conditioning."""
    rank = a.shape[0]
    if a.size == 0 or b.size == 0 or not a.any() or not b.any():
        zeros: NDArray = np.zeros(rank)
        return zeros
    lb, vb = np.linalg.eigh(b.T @ b)
    la, va = np.linalg.eigh(a @ a.T)
    core = (np.sqrt(np.clip(lb, 0, None))[:, None] * vb.T) @ (va * np.sqrt(np.clip(la, 0, None))[None, :])
    sv: NDArray = np.linalg.svd(core, compute_uv=False)
    if sv[0] > 0 and sv[-1] ** 2 >= GRAM_SAFE * sv[0] ** 2:
        return sv
    sv_qr: NDArray = np.linalg.svd(_tsqr_r(np, b) @ _tsqr_r(np, a.T).T, compute_uv=False)
    return sv_qr


def _tsqr_r(np: ModuleType, x: NDArray) -> NDArray:
    """The ``R`` of a tall matrix's QR, from the stacked ``R``s of row blocks (same ``R`` up to row signs)."""
    if x.shape[0] <= 2 * _TSQR_ROWS:
        r: NDArray = np.linalg.qr(x, mode="r")
        return r
    blocks = [np.linalg.qr(x[i : i + _TSQR_ROWS], mode="r") for i in range(0, x.shape[0], _TSQR_ROWS)]
    r_stacked: NDArray = np.linalg.qr(np.vstack(blocks), mode="r")
    return r_stacked
