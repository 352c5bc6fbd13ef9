"""The factor maths against numpy on the full matrices: the SVD from the factors' Gram matrices and a small core, the
exact error of a truncation, the Eckart–Young optimum, and the rank choices for --energy / --max-error."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapterdoc.algebra.factors import Term, rank_for_energy, rank_for_error, spectrum, stack, truncate


def _terms(seed: int, d: int = 40, k: int = 30, ranks: tuple[int, ...] = (4, 6)) -> list[Term]:
    rng = np.random.default_rng(seed)
    return [
        Term(rng.standard_normal((r, k)), rng.standard_normal((d, r)), float(c))
        for r, c in zip(ranks, (0.7, -1.3, 2.0))
    ]


def test_stack_is_the_exact_weighted_sum():
    terms = _terms(0)
    b, a = stack(terms)
    want = sum(t.coefficient * t.b @ t.a for t in terms)
    np.testing.assert_allclose(b @ a, want, rtol=0, atol=1e-12)
    assert a.shape[0] == sum(t.a.shape[0] for t in terms)


@pytest.mark.parametrize("rank", [1, 3, 5, 10, 12])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_truncation_error_is_exact_and_optimal(rank: int, seed: int):
    b, a = stack(_terms(seed))
    full = b @ a
    t = truncate(spectrum(b, a), rank)
    measured = np.linalg.norm(full - t.b @ t.a) / np.linalg.norm(full)
    assert abs(t.rel_error - measured) <= 1e-6
    s = np.linalg.svd(full, compute_uv=False)
    optimum = math.sqrt((s[rank:] ** 2).sum()) / np.linalg.norm(full)
    assert abs(t.rel_error - optimum) <= 1e-6
    assert t.rank == min(rank, 10)
    assert abs(t.kept_energy - (s[:rank] ** 2).sum() / (s**2).sum()) <= 1e-9


def test_exact_at_or_above_the_effective_rank():
    b, a = stack(_terms(3, ranks=(2, 3)))
    sp = spectrum(b, a)
    assert sp.effective_rank() == 5
    t = truncate(sp, 5)
    np.testing.assert_allclose(t.b @ t.a, b @ a, atol=1e-10)
    assert t.error == 0.0


def test_repeated_modules_collapse_to_their_effective_rank():
    """Two identical sources: rank 2r factors of effective rank r; what is dropped is at the Gram route's resolution
    (singular values to about 1e-8 of the largest), and the truncation is exact."""
    (t,) = _terms(4, ranks=(3,))
    b, a = stack([t, t])
    sp = spectrum(b, a)
    assert sp.effective_rank() == 3
    cut = truncate(sp, 3)
    assert cut.rel_error <= 1e-7
    np.testing.assert_allclose(cut.b @ cut.a, b @ a, rtol=0, atol=1e-10 * np.abs(b @ a).max())


def test_rank_choice_for_energy_and_error():
    b, a = stack(_terms(5))
    sp = spectrum(b, a)
    s2 = sp.s**2
    for fraction in (0.5, 0.9, 0.99, 1.0):
        r = rank_for_energy(sp.s, fraction)
        assert s2[:r].sum() >= fraction * s2.sum() * (1 - 1e-12)
        assert r == 1 or s2[: r - 1].sum() < fraction * s2.sum()
    for e in (0.0, 0.05, 0.3, 0.9):
        r = rank_for_error(sp.s, e)
        assert truncate(sp, r).rel_error <= e + 1e-12
        assert r == 1 or truncate(sp, r - 1).rel_error > e


def test_zero_delta():
    sp = spectrum(np.zeros((8, 2)), np.zeros((2, 5)))
    t = truncate(sp, 4)
    assert t.rank == 2 and t.rel_error == 0 and t.kept_energy == 1
    assert rank_for_energy(sp.s, 0.9) == 1 and rank_for_error(sp.s, 0.1) == 1
