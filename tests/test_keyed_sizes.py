"""Keyed laws at realistic sizes: the fast Gumbel and GLS forms against slow references.

The references below are the former O(V^2) implementations (Gumbel's double sum, GLS's per-token
``a(s)`` by its breakpoints and a fine per-token ``log s`` grid), kept only here, plus a direct
scipy double integral for a few GLS tokens. At V = 150,000 the checks are cheap independent
facts (the K = 1 Gumbel identity, monotonicity in K, the list-matching bound, the i.i.d.
optimum, per-token Gumbel values by the direct formula). No test is timed; speed claims live in
``benchmarks/keyed_sizes.py``.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

import specsampling as ss
from proofs_tests.oracles import random_pairs
from specsampling.keyed.gls_law import ERROR_BOUND, gls_acceptance, list_matching_bound, match_law
from specsampling.keyed.laws import gumbel_acceptance, gumbel_hits

# --- slow references (the former implementations) ------------------------------------------------


def reference_gumbel_hits(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``c_j = p_j / sum_i max(p_i, q_i p_j / q_j)``, one O(V) sum per token."""
    out = np.zeros(p.shape[0], dtype=p.dtype)
    for j in range(p.shape[0]):
        if p[j] > 0 and q[j] > 0:
            out[j] = p[j] / sum(max(pi, qi * p[j] / q[j]) for pi, qi in zip(p, q, strict=True))
    return out


def _other_row_match(p: np.ndarray, q: np.ndarray, j: int, s: np.ndarray) -> np.ndarray:
    """``a(s) = int_0^inf e^{-x} exp(-sum_{i != j} (c_i x + s (c_i p_j - p_i))_+) dx``."""
    c = q / q[j]
    gap = c * p[j] - p
    keep = (c > 0) & (np.arange(p.shape[0]) != j)
    c, gap = c[keep], gap[keep]
    starts = np.maximum(0.0, -gap / c)
    order = np.argsort(starts, kind="stable")
    starts, c, gap = starts[order], c[order], gap[order]
    bounds = np.concatenate(([0.0], starts, [np.inf]))
    slopes = 1.0 + np.concatenate(([0.0], np.cumsum(c)))
    g_start = bounds[:-1] * slopes + np.concatenate(([0.0], np.cumsum(gap)))
    g_start[0] = 0.0
    total = np.zeros_like(s)
    for g0, slope, width in zip(g_start, slopes, np.diff(bounds), strict=True):
        head = np.exp(-s * g0)
        if np.isinf(width):
            total += head / slope
        elif width > 0:
            total += head * -np.expm1(-slope * s * width) / slope
    return np.clip(total, 0.0, 1.0)


def _binom(trials: int, count: int, success: np.ndarray) -> np.ndarray:
    if count < 0 or count > trials:
        return np.zeros_like(success)
    return math.comb(trials, count) * success**count * (1 - success) ** (trials - count)


def reference_match_law(p: np.ndarray, q: np.ndarray, active: int, rows: int) -> np.ndarray:
    """The former match law: per token, trapezoid in ``log s`` with step 0.05 (O(V^2))."""
    law = np.zeros((p.shape[0], active + 1))
    for j in np.flatnonzero(p > 0):
        if q[j] == 0:
            law[j, 0] = p[j]
            continue
        gaps = np.maximum(q * (p[j] / q[j]) - p, 0.0)
        gaps[j] = 0.0
        spread = float(gaps.sum())
        scale = rows + spread + float(np.sum(q / q[j])) + 1.0 / float(q[j])
        y = np.arange(-np.log(scale) - 40.0, np.log(40.0 / rows) + 0.05, 0.05)
        s = np.exp(y)
        weights = np.full(y.shape[0], 0.05) * s
        weights[[0, -1]] /= 2
        winner, other = np.exp(-s * spread), _other_row_match(p, q, int(j), s)
        mass = np.zeros((active + 1, s.shape[0]))
        for m in range(active + 1):
            mass[m] = active * (
                winner * _binom(active - 1, m - 1, other)
                + (1 - winner) * _binom(active - 1, m, other)
            )
            mass[m] += (rows - active) * _binom(active, m, other)
        hits = p[j] * ((np.exp(-rows * s) * mass[1:]) @ weights)
        law[j, 1:] = hits
        law[j, 0] = p[j] - hits.sum()
    return law


def _pairs(seed: int, count: int, max_size: int = 50):
    """The shared random pairs (:func:`proofs_tests.oracles.random_pairs`: zeros, p == q, near
    one-hot, plain Dirichlet), plus disjoint supports and a one-token vocabulary."""
    yield from random_pairs(seed, count, max_size)
    rng = np.random.default_rng(seed + 1)
    for size in (2, 5, max_size):
        half = size // 2
        p = np.concatenate((rng.dirichlet(np.full(half, 0.3)), np.zeros(size - half)))
        q = np.concatenate((np.zeros(half), rng.dirichlet(np.full(size - half, 0.3))))
        yield p, q
    yield np.ones(1), np.ones(1)


# --- agreement at small vocabularies ----------------------------------------------------------


def test_gumbel_hits_agree_with_the_double_sum() -> None:
    for p, q in _pairs(1, 300):
        assert np.abs(gumbel_hits(p, q) - reference_gumbel_hits(p, q)).max() < 1e-14
        assert 0.0 <= gumbel_acceptance(p, q) <= 1.0


def test_gumbel_hits_stay_exact_for_fractions() -> None:
    rng = np.random.default_rng(2)
    for _ in range(40):
        size = int(rng.integers(1, 9))
        p_raw = [int(w) for w in rng.integers(0, 5, size)]
        q_raw = [int(w) for w in rng.integers(0, 5, size)]
        if sum(p_raw) == 0 or sum(q_raw) == 0:
            continue
        p = np.array([Fraction(w, sum(p_raw)) for w in p_raw], dtype=object)
        q = np.array([Fraction(w, sum(q_raw)) for w in q_raw], dtype=object)
        hits = gumbel_hits(p, q)
        assert all(isinstance(h, Fraction) or h == 0 for h in hits)
        assert list(hits) == list(reference_gumbel_hits(p, q))
        assert gumbel_acceptance(p, q) == sum(reference_gumbel_hits(p, q))


@pytest.mark.parametrize(("active", "rows"), [(1, 1), (1, 3), (2, 2), (2, 3), (3, 3), (4, 6)])
def test_match_law_agrees_with_the_former_law(active: int, rows: int) -> None:
    for p, q in _pairs(10 + 7 * active + rows, 25, max_size=20):
        law = match_law(p, q, active, rows)
        assert np.abs(law - reference_match_law(p, q, active, rows)).max() < ERROR_BOUND
        assert np.all(law >= 0) and np.all(law <= p[:, None] * (1 + 1e-12))
        assert law.sum(axis=1) == pytest.approx(p, abs=1e-15)


@pytest.mark.parametrize("num_drafts", [2, 3, 5, 8])
def test_gls_acceptance_agrees_with_the_former_law(num_drafts: int) -> None:
    for p, q in _pairs(20 + num_drafts, 40, max_size=30):
        reference = float(reference_match_law(p, q, num_drafts, num_drafts)[:, 1:].sum())
        acc = gls_acceptance(p, q, num_drafts)
        assert abs(acc - reference) < ERROR_BOUND and 0.0 <= acc <= 1.0
        assert abs(float(match_law(p, q, num_drafts)[:, 1:].sum()) - acc) < ERROR_BOUND


def _scipy_other_row(s: float, c: np.ndarray, gap: np.ndarray) -> float:
    """``a(s)`` by scipy's adaptive quadrature, split at the kinks of the integrand."""
    from scipy import integrate

    def inner(x: float) -> float:
        return float(np.exp(-x - np.maximum(c * x + s * gap, 0.0).sum()))

    edges = [0.0, *sorted(x for x in -s * gap / c if x > 0)]
    pieces = [
        integrate.quad(inner, lo, hi, epsabs=1e-15, epsrel=1e-13)[0]
        for lo, hi in itertools.pairwise(edges)
    ]
    tail = integrate.quad(inner, edges[-1], np.inf, epsabs=1e-15, epsrel=1e-13)[0]
    return float(sum(pieces) + tail)


def _scipy_miss(s: float, k: int, spread: float, c: np.ndarray, gap: np.ndarray) -> float:
    """``K e^{-Ks} (1 - b(s)) (1 - a(s))^{K-1}``, the integrand of ``P(Y = j, M = 0) / p_j``."""
    miss = 1 - _scipy_other_row(s, c, gap)
    return k * math.exp(-k * s) * (1 - math.exp(-s * spread)) * miss ** (k - 1)


def test_match_law_agrees_with_a_direct_double_integral() -> None:
    """``P(Y = j, M >= 1)`` by scipy's adaptive quadrature of the defining double integral."""
    integrate = pytest.importorskip("scipy.integrate")
    rng = np.random.default_rng(5)
    for _ in range(4):
        p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5) * 0.5)
        k = 3
        law = match_law(p, q, k)
        for j in range(5):
            others = np.arange(5) != j
            c, gap = (q / q[j])[others], (q * p[j] / q[j] - p)[others]
            spread = float(np.maximum(gap, 0).sum())
            value = integrate.quad(
                _scipy_miss,
                0,
                np.inf,
                args=(k, spread, c, gap),
                epsabs=1e-13,
                epsrel=1e-12,
                limit=200,
            )[0]
            assert abs(law[j, 1:].sum() - p[j] * (1 - value)) < ERROR_BOUND


def test_list_matching_bound_agrees_with_its_formula() -> None:
    for p, q in _pairs(3, 100):
        for k in (1, 2, 5):
            direct = sum(
                p[j] / (1 - 1 / k + np.maximum(p, q * p[j] / q[j]).sum() / k)
                for j in range(p.shape[0])
                if p[j] > 0 and q[j] > 0
            )
            assert list_matching_bound(p, q, k) == pytest.approx(direct, abs=1e-14)


# --- large K ----------------------------------------------------------------------------------


def test_gls_works_for_large_num_drafts() -> None:
    p, q = np.array([0.7, 0.2, 0.1]), np.array([0.1, 0.2, 0.7])
    accs = [gls_acceptance(p, q, k) for k in (1, 8, 68, 69, 200, 1000)]
    assert all(a <= b + ERROR_BOUND for a, b in itertools.pairwise(accs)) and accs[-1] <= 1.0
    assert ss.acceptance("gls", p, q, 69) == pytest.approx(accs[3], abs=1e-15)
    law = match_law(p, q, 69, 70)
    assert law.shape == (3, 70) and np.all(law >= 0)
    assert law.sum(axis=1) == pytest.approx(p, abs=1e-15)
    assert float(match_law(p, q, 69)[:, 1:].sum()) == pytest.approx(accs[3], abs=ERROR_BOUND)


def test_compare_cli_takes_large_num_drafts(capsys: pytest.CaptureFixture[str]) -> None:
    from specsampling.cli import main

    code = main(["compare", "--target", "0.7,0.2,0.1", "--draft", "0.1,0.2,0.7", "-k", "69"])
    assert code in (0, None)
    assert "gls" in capsys.readouterr().out


# --- V = 150,000 ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_pair() -> tuple[np.ndarray, np.ndarray]:
    """A peaked target and a correlated draft over 150,000 tokens, with some zeros."""
    rng = np.random.default_rng(0)
    logits = 3.0 * rng.standard_normal(150_000)
    target = np.exp(logits - logits.max())
    draft = np.exp(logits + rng.standard_normal(150_000) - logits.max())
    target[:100] = 0.0
    draft[100:200] = 0.0
    return target / target.sum(), draft / draft.sum()


def test_gumbel_at_150k_matches_the_direct_formula_per_token(big_pair) -> None:
    p, q = big_pair
    hits = gumbel_hits(p, q)
    tokens = np.concatenate((np.argsort(p)[-20:], np.random.default_rng(1).integers(0, p.size, 30)))
    for j in tokens:
        direct = p[j] / np.maximum(p, q * p[j] / q[j]).sum() if p[j] * q[j] > 0 else 0.0
        assert hits[j] == pytest.approx(direct, rel=1e-12, abs=1e-300)
    tv = 0.5 * np.abs(p - q).sum()
    acc = gumbel_acceptance(p, q)
    assert (1 - tv) / (1 + tv) - 1e-12 <= acc <= 1 - tv + 1e-12


def test_gls_at_150k_is_monotone_and_between_its_bounds(big_pair) -> None:
    p, q = big_pair
    accs = [gls_acceptance(p, q, k) for k in range(1, 9)]
    assert accs[0] == gumbel_acceptance(p, q)
    assert all(a < b for a, b in itertools.pairwise(accs))
    for k, acc in enumerate(accs, start=1):
        assert list_matching_bound(p, q, k) - ERROR_BOUND <= acc <= 1.0
        assert acc <= ss.optimal_acceptance(p, q, k) + ERROR_BOUND  # K i.i.d. drafts from q
