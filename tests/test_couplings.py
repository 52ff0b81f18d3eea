"""Keyed noise field, Gumbel / Poisson list couplings, drafter invariance and mutants.

Statistical budget: 9 randomised checks at alpha = 1e-4 each (fixed seeds, so a pass is
reproducible; the budget bounds the chance that a correct implementation was unlucky).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from specsampling import keyed
from specsampling.couplings import (
    count_rounds,
    couple,
    gumbel_acceptance,
    gumbel_draft,
    gumbel_target,
    poisson_acceptance,
    poisson_acceptance_bound,
    poisson_list,
)
from specsampling.pairs import Random, Stationary

ALPHA = 1e-4
P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.3, 0.5])


def _field(key: int, n: int, vocab: int) -> np.ndarray:
    """Exponentials for n positions (rows of the result), one column per token."""
    ctx = keyed.position_context(np.arange(n, dtype=np.uint64))[:, None]
    return keyed.exponentials(key, ctx, 0, np.arange(vocab))


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(stats.chisquare(counts, expected).pvalue)


# --- keyed field -------------------------------------------------------------------------------


def test_field_is_deterministic_and_each_value_regenerates_alone() -> None:
    batch = keyed.exponentials(5, 123, 2, np.arange(1000))
    again = keyed.exponentials(5, 123, 2, np.arange(1000))
    assert np.array_equal(batch, again) and batch.dtype == np.float64
    for token in (0, 17, 999):
        assert keyed.exponentials(5, 123, 2, token) == batch[token]
    perm = np.random.default_rng(0).permutation(1000)  # B8: no dependence on batch position
    assert np.array_equal(keyed.exponentials(5, 123, 2, perm), batch[perm])
    others = [
        keyed.exponentials(6, 123, 2, np.arange(1000)),
        keyed.exponentials(5, 124, 2, np.arange(1000)),
        keyed.exponentials(5, 123, 3, np.arange(1000)),
    ]
    for other in others:
        assert np.mean(other == batch) < 0.01


def test_field_extreme_inputs_stay_in_range() -> None:
    big = 2**64 - 1
    u = keyed.uniforms(big, big, big, np.array([0, 2**63 - 1, 2**64 - 1], dtype=np.uint64))
    assert u.dtype == np.float64 and np.all((u >= 0) & (u < 1))
    top = keyed.to_unit(np.array([big], dtype=np.uint64))
    assert top[0] == keyed.LARGEST_UNIFORM < 1.0
    assert -np.log1p(-top[0]) == pytest.approx(53 * np.log(2), rel=1e-12)
    with pytest.raises(ValueError):
        keyed.uniforms(-1, 0, 0, 0)
    with pytest.raises(ValueError):
        keyed.uniforms(2**64, 0, 0, 0)


def test_field_is_uniform_and_independent() -> None:
    u = keyed.uniforms(
        2024, keyed.position_context(np.arange(400, dtype=np.uint64))[:, None], 0, np.arange(500)
    )
    counts = np.histogram(u, bins=100, range=(0, 1))[0]
    assert _chi2(counts, np.full(100, 0.01)) > ALPHA
    assert stats.kstest(u.ravel()[:50_000], "uniform").pvalue > ALPHA
    pairs = np.floor(u[:, :-1] * 10) * 10 + np.floor(u[:, 1:] * 10)  # neighbouring tokens
    assert _chi2(np.bincount(pairs.astype(int).ravel(), minlength=100), np.full(100, 0.01)) > ALPHA
    rows = keyed.uniforms(2024, 7, np.arange(2)[:, None], np.arange(100_000))
    joint = np.floor(rows[0] * 10) * 10 + np.floor(rows[1] * 10)  # neighbouring rows
    assert _chi2(np.bincount(joint.astype(int), minlength=100), np.full(100, 0.01)) > ALPHA


def test_tail_resolution_is_float64_b9() -> None:
    e = keyed.exponentials(9, 1, 0, np.arange(2**24))
    hits = int(np.count_nonzero(e < 2.0**-19))  # expected 32; fp32 noise would floor at 2**-24
    assert stats.poisson.sf(hits - 1, 32) > ALPHA / 2 and stats.poisson.cdf(hits, 32) > ALPHA / 2
    assert np.count_nonzero((e > 0) & (e < 2.0**-22)) >= 1


def test_context_hash_matches_vectorised_form() -> None:
    seq = [3, 1, 4, 1, 5, 9, 2, 6]
    table = keyed.context_hashes(seq, 3)
    assert [int(h) for h in table] == [keyed.context_hash(seq[:t], 3) for t in range(9)]
    assert keyed.context_hash([7, 1, 4], 2) == keyed.context_hash([1, 4], 2)
    assert keyed.context_hash([4], 2) != keyed.context_hash([1, 4], 2)


# --- selections --------------------------------------------------------------------------------


def test_gumbel_selections_follow_their_laws() -> None:
    e = _field(1, 40_000, 3)
    target = np.bincount(gumbel_target(P, e), minlength=3)
    draft = np.bincount(gumbel_draft(Q, e), minlength=3)
    assert _chi2(target, P) > ALPHA and _chi2(draft, Q) > ALPHA
    assert gumbel_target([0.0, 1.0], [0.0, 30.0]) == 1  # zero probability never selected


def test_poisson_list_is_without_replacement_sample() -> None:
    q = np.array([0.4, 0.3, 0.2, 0.1])
    e = _field(2, 20_000, 4)
    lists = [poisson_list(q, row, 2) for row in e]
    pairs = [(a, b) for a in range(4) for b in range(4) if a != b]
    law = np.array([q[a] * q[b] / (1 - q[a]) for a, b in pairs])
    counts = np.array([sum(1 for x in lists if x == pr) for pr in pairs])
    assert _chi2(counts, law) > ALPHA
    assert poisson_list([0.5, 0.5, 0.0], [1.0, 2.0, 0.0], 3) == (0, 1)


# --- acceptance --------------------------------------------------------------------------------


def test_gumbel_acceptance_goldens_and_bounds() -> None:
    tv = 0.5 * np.abs(P - Q).sum()
    acc = gumbel_acceptance(P, Q)
    assert acc == pytest.approx(0.6307692307692307, abs=1e-12)  # = 41/65
    # j=0: 1/(1 + 1.5 + 2.5); j=1: 1/(5/3 + 1 + 5/3); j=2: 1/(2.5 + 1.5 + 1) -> 2/5 + 3/13
    assert acc == pytest.approx(2 / 5 + 3 / 13, abs=1e-15)
    m, big = np.minimum(P, Q), np.maximum(P, Q)
    disd = float(np.sum(m / (m + (1 + tv) - big)))
    pml = float(np.sum(P * Q / (P + Q)))
    assert acc >= disd >= (1 - tv) / (1 + tv) and acc >= pml == pytest.approx(0.435714, abs=1e-6)
    assert gumbel_acceptance(P, P) == pytest.approx(1.0)
    assert gumbel_acceptance([1.0, 0.0], [0.0, 1.0]) == 0.0


@pytest.mark.parametrize("list_size", [1, 2, 4])
def test_acceptance_matches_monte_carlo(list_size: int) -> None:
    rng = np.random.default_rng(list_size)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6) * 0.5)
    e = _field(100 + list_size, 30_000, 6)
    hits = np.array([gumbel_target(p, row) in poisson_list(q, row, list_size) for row in e])
    exact = poisson_acceptance(p, q, list_size)
    se = np.sqrt(exact * (1 - exact) / hits.shape[0])
    assert abs(hits.mean() - exact) / se < stats.norm.isf(ALPHA / 2)
    assert exact >= poisson_acceptance_bound(p, q, list_size) - 1e-12
    if list_size == 1:
        assert exact == pytest.approx(gumbel_acceptance(p, q), rel=1e-10)


def test_poisson_acceptance_numerics() -> None:
    tiny_p = np.array([1 - 2e-12, 1e-12, 1e-12])
    tiny_q = np.array([1e-15, 0.5, 0.5 - 1e-15])
    for p, q in ((tiny_p, tiny_q), (tiny_q, tiny_p)):
        assert poisson_acceptance(p, q, 1) == pytest.approx(gumbel_acceptance(p, q), rel=1e-9)
    rng = np.random.default_rng(7)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(5) * 0.3), rng.dirichlet(np.ones(5) * 0.3)
        accs = [poisson_acceptance(p, q, size) for size in (1, 2, 3, 5)]
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(accs))
        assert accs[-1] == pytest.approx(float(p[q > 0].sum()), abs=1e-12)
        assert accs[1] >= poisson_acceptance_bound(p, q, 2) - 1e-12


# --- decoding: drafter invariance and mutants --------------------------------------------------


def _target_only(pair: Random | Stationary, length: int, key: int) -> tuple[int, ...]:
    seq: tuple[int, ...] = ()
    for t in range(length):
        e = keyed.exponentials(key, keyed.position_context(t), 0, np.arange(pair.vocab_size))
        seq = (*seq, gumbel_target(pair.target(seq), e))
    return seq


class _Swap:
    """Same target as ``base``, draft from ``other``."""

    def __init__(self, base: Random, other: Random | None) -> None:
        self.base, self.other = base, other
        self.vocab_size = base.vocab_size

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.base.target(prefix)

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.base.target(prefix) if self.other is None else self.other.draft(prefix)


@pytest.mark.parametrize("window", [None, 2])
def test_output_is_bitwise_drafter_invariant(window: int | None) -> None:
    base = Random(8, seed=4)
    drafters = [_Swap(base, None), _Swap(base, base), _Swap(base, Random(8, seed=99))]
    runs = [
        couple(d, 60, key=31, list_size=s, window=window, draft_length=g)
        for d in drafters
        for s in (1, 3)
        for g in (1, 5)
    ]
    assert len({r.tokens for r in runs}) == 1
    assert all(runs[0].hits)  # draft == target: every position accepted
    assert len({r.hits for r in runs}) > 1  # acceptance does depend on the drafter
    if window is None:
        assert runs[0].tokens == _target_only(base, 60, 31)
    assert couple(drafters[0], 60, key=32, window=window).tokens != runs[0].tokens


def test_count_rounds() -> None:
    assert count_rounds([], 3) == 0
    assert count_rounds([True] * 8, 3) == 2  # 3 drafts + bonus per round
    assert count_rounds([False] * 5, 3) == 5


def _round_keyed(pair: _Swap, length: int, key: int, gamma: int) -> tuple[int, ...]:
    """Mutant: noise keyed by (round, draft step) instead of absolute position."""
    seq: tuple[int, ...] = ()
    rnd = step = 0
    while len(seq) < length:
        e = keyed.exponentials(key, rnd, step, np.arange(pair.vocab_size))
        token = gumbel_target(pair.target(seq), e)
        hit = token in poisson_list(pair.draft(seq), e, 1)
        seq = (*seq, token)
        step += 1
        if not hit or step > gamma:
            rnd, step = rnd + 1, 0
    return seq


def test_round_keyed_mutant_depends_on_the_drafter() -> None:
    base = Random(8, seed=4)
    a = _round_keyed(_Swap(base, None), 60, 31, 3)
    b = _round_keyed(_Swap(base, Random(8, seed=99)), 60, 31, 3)
    c = _round_keyed(_Swap(base, Random(8, seed=99)), 60, 31, 1)
    assert a != b and b != c  # the stream changes with the drafter and the round boundaries


def test_log_u_mutant_breaks_at_the_extremes() -> None:
    u = np.array([0.0, 2.0**-60, 1e-20, keyed.LARGEST_UNIFORM])
    good = -np.log1p(-u)
    assert np.all(np.isfinite(good)) and good[0] == 0.0 and good[2] == 1e-20
    with np.errstate(divide="ignore"):
        mutant = -np.log(u)
    assert mutant[0] == np.inf  # U = 0 gives an infinite exponential
    naive = -np.log(1 - u)  # the other spelling loses every u below 2**-53 to rounding
    assert naive[1] == 0.0 and naive[2] == 0.0 and good[1] > 0.0
