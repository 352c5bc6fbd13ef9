"""The factorisations of a large delta (:mod:`adapterdoc.algebra.large`, ``extract``'s): the reported error equal
to the one measured on the full float64 matrix within 1e-6, and to the Eckart–Young optimum from numpy's SVD
(within 1e-6 for the Gram route; with a gap in the spectrum for the subspace iteration); the rank the Gram route
chooses for ``--energy`` / ``--max-error`` equal to the one numpy's singular values give; tall, wide, float32,
float64 and transposed (an embedding's) deltas alike."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from adapterdoc.algebra.factors import rank_for_energy, rank_for_error
from adapterdoc.algebra.large import by_gram, leading, route


def _low_rank_plus_noise(rows: int, cols: int, noise: float, seed: int) -> np.ndarray:
    """Singular values 10, 8, 6, 5, 2, 1 plus Gaussian noise."""
    gen = np.random.default_rng(seed)
    u = np.linalg.qr(gen.standard_normal((rows, 6)))[0]
    v = np.linalg.qr(gen.standard_normal((cols, 6)))[0]
    return (u * np.array([10.0, 8, 6, 5, 2, 1])) @ v.T + noise * gen.standard_normal((rows, cols))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_leading_error_is_measured_and_meets_the_optimum(dtype: Any):
    """A large module under --rank: subspace iteration, the reported error equal to the measured one on the full
    matrix (float64) and, with a gap in the spectrum, to the Eckart–Young optimum (numpy's SVD)."""
    delta = _low_rank_plus_noise(300, 500, 0.01, 1).astype(dtype)
    b, a, energy, error, _ = leading(delta, 4)
    exact = delta.astype(np.float64)
    measured = np.linalg.norm(exact - b @ a)
    assert b.shape == (300, 4) and a.shape == (4, 500)
    assert abs(energy - np.linalg.norm(exact) ** 2) <= 1e-9 * energy
    assert abs(error - measured) / math.sqrt(energy) <= 1e-6
    s = np.linalg.svd(exact, compute_uv=False)
    assert abs(error - math.sqrt((s[4:] ** 2).sum())) / math.sqrt(energy) <= 1e-6
    assert np.allclose(np.linalg.svd(b, compute_uv=False), np.linalg.svd(a, compute_uv=False))  # split evenly


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_leading_of_a_delta_of_lower_rank_than_asked_is_exact_at_the_rank_asked(dtype: Any):
    """A delta of exact rank 3 asked for rank 8: the sweeps' basis has directions with no energy (zero columns,
    never divided by), the final basis is still orthonormal, the factors have the rank asked for, and the error
    measured on the full matrix is zero to rounding, as reported."""
    gen = np.random.default_rng(5)
    delta = (gen.standard_normal((400, 3)) @ gen.standard_normal((3, 600))).astype(dtype)
    b, a, energy, error, _ = leading(delta, 8)
    assert b.shape == (400, 8) and a.shape == (8, 600)
    exact = delta.astype(np.float64)
    assert np.isfinite(b).all() and np.isfinite(a).all()
    assert error / math.sqrt(energy) <= 1e-6
    assert np.linalg.norm(exact - b @ a) / math.sqrt(energy) <= 1e-6


def test_leading_of_a_transposed_view_is_the_transposed_result():
    """An embedding's delta reaches :func:`leading` as ``delta.T`` (a Fortran-ordered view): it is worked on as the
    array it views (float64 rows widened contiguously) and gives the transposed factors: the same product, energy
    and error as a C-ordered copy, within rounding."""
    stored = _low_rank_plus_noise(500, 300, 0.01, 2).astype(np.float32)  # (vocab, hidden) as stored
    b, a, energy, error, _ = leading(stored.T, 4)
    b2, a2, energy2, error2, _ = leading(np.ascontiguousarray(stored.T), 4)
    assert b.shape == (300, 4) and a.shape == (4, 500) and b.flags.c_contiguous and a.flags.c_contiguous
    exact = stored.T.astype(np.float64)
    assert abs(error - np.linalg.norm(exact - b @ a)) / math.sqrt(energy) <= 1e-6
    assert abs(energy - energy2) <= 1e-9 * energy and abs(error - error2) / math.sqrt(energy) <= 1e-6
    assert np.allclose(b @ a, b2 @ a2, atol=1e-6 * math.sqrt(energy))


def _decaying(rows: int, cols: int, seed: int) -> np.ndarray:
    """A full-rank delta whose singular values decay as 1/i (a fine-tune's slow tail): every rank matters."""
    gen = np.random.default_rng(seed)
    k = min(rows, cols)
    u = np.linalg.qr(gen.standard_normal((rows, k)))[0]
    v = np.linalg.qr(gen.standard_normal((cols, k)))[0]
    return (u / np.arange(1, k + 1)) @ v.T


@pytest.mark.parametrize("shape", [(700, 300), (300, 700)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ask", [("energy", 0.9), ("max_error", 0.05), ("max_error", 0.0), ("rank", 40)])
def test_by_gram_meets_the_optimum_at_numpys_rank(shape: tuple[int, int], dtype: Any, ask: tuple[str, float]):
    """The Gram route on a tall and a wide delta: the rank numpy's singular values give for the same request, the
    reported error equal to the measured one and to the optimum within 1e-6 (``--max-error 0``: zero), and every
    singular value above RANK_TOL counted."""
    delta = _decaying(*shape, seed=3).astype(dtype)
    kind, value = ask
    done = by_gram(delta, **{"rank": None, "energy": None, "max_error": None, kind: value})  # type: ignore[arg-type]
    exact = delta.astype(np.float64)
    s = np.linalg.svd(exact, compute_uv=False)
    want = {"energy": rank_for_energy, "max_error": rank_for_error}[kind](s, value) if kind != "rank" else 40
    assert done.b.shape == (shape[0], want) and done.a.shape == (want, shape[1])
    scale = math.sqrt(done.energy)
    assert abs(done.energy - float((exact**2).sum())) <= 1e-9 * done.energy
    assert abs(done.error - np.linalg.norm(exact - done.b @ done.a)) / scale <= 1e-6
    assert abs(done.error - math.sqrt(float((s[want:] ** 2).sum()))) / scale <= 1e-6
    assert done.effective_rank == int((s > s[0] * 1e-6).sum())


def test_by_gram_of_a_transposed_view_and_of_exact_low_rank():
    """An embedding's ``delta.T`` gives the transposed factors; a delta of exact rank 6 asked for 99% of its energy
    keeps the ranks numpy keeps and counts 6 effective singular values."""
    stored = _low_rank_plus_noise(900, 300, 0.0, 4).astype(np.float32)
    done = by_gram(stored.T, None, 0.99, None)
    s = np.linalg.svd(stored.astype(np.float64), compute_uv=False)
    assert done.b.shape[0] == 300 and done.a.shape[1] == 900 and done.b.flags.c_contiguous
    assert done.a.shape[0] == rank_for_energy(s, 0.99) and done.effective_rank == 6
    exact = stored.T.astype(np.float64)
    assert abs(done.error - np.linalg.norm(exact - done.b @ done.a)) / math.sqrt(done.energy) <= 1e-6


def test_the_route_of_each_delta():
    """numpy's SVD only for a small delta; the iteration for a rank well below the smaller side; else the Gram."""
    assert route((1024, 1024), 16) == "svd" and route((1024, 1024), None) == "svd"
    assert route((4096, 4096), 16) == "leading" and route((4096, 4096), None) == "gram"
    assert route((32000, 256), 16) == "leading" and route((32000, 256), 64) == "gram"
    assert route((32000, 64), 4) == "gram"


@pytest.mark.parametrize("shape", [(2000, 600), (600, 2000)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_factorisation_that_keeps_everything_reports_no_error(shape: tuple[int, int], dtype: Any):
    """The Gram route at the full rank (``--energy 1``, ``--max-error 0``, a rank at the smaller side): the error is
    measured from the residual where ‖Δ‖² − ‖projection‖² would be rounding, so it reads as float64 rounding
    (≤ 1e-12 relative: no AD959), not as the ~6e-8 the subtraction of two sums gave."""
    delta = (np.random.default_rng(6).standard_normal(shape) * 0.01).astype(dtype)
    for ask in (
        {"rank": 600, "energy": None, "max_error": None},
        {"rank": None, "energy": 1.0, "max_error": None},
    ):
        done = by_gram(delta, **ask)  # type: ignore[arg-type]
        assert done.a.shape[0] == 600 and done.error / math.sqrt(done.energy) <= 1e-12, ask
    exact = delta.astype(np.float64)
    measured = np.linalg.norm(exact - done.b.astype(np.float64) @ done.a.astype(np.float64))
    assert measured / math.sqrt(done.energy) <= (
        1e-12 if dtype == np.float64 else 1e-7
    )  # float32: as written


def test_a_float64_delta_of_tiny_values_gives_finite_factors():
    """Values of 1e-80 (a float64 checkpoint): the projection is held in float64, so no part underflows and no
    scale overflows (in float32 they gave NaN factors)."""
    delta = np.random.default_rng(7).standard_normal((2000, 600)) * 1e-80
    done = by_gram(delta, 4, None, None)
    assert np.isfinite(done.b).all() and np.isfinite(done.a).all()
    measured = np.linalg.norm(delta - done.b @ done.a)
    assert abs(done.error - measured) <= 1e-6 * math.sqrt(done.energy)
