"""Keyed noise, Gumbel / Poisson list couplings, strong drafter invariance and mutants.

Statistical budget: 8 chi-square / KS / Poisson checks at ``ALPHA = 1e-4`` each plus 5 z-tests
at ``|z| < 4.5`` (two-sided ``6.8e-6`` each), so a correct implementation fails a run with
probability below ``8.4e-4`` (Bonferroni). Every seed is fixed, so a pass is reproducible.
Monte Carlo references draw exponentials with numpy, independently of the library's race code.
"""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import numpy as np
import pytest
from scipy import stats

import specsampling as ss
from proofs_tests.oracles import pooled_chi2, random_pairs
from specsampling import keyed
from specsampling.keyed import KeyedNoise
from specsampling.keyed.laws import (
    decode,
    gumbel_acceptance,
    gumbel_draft,
    gumbel_hits,
    gumbel_target,
    poisson_acceptance,
    poisson_acceptance_bound,
    poisson_list,
)
from specsampling.pairs import Random, Swapped

ALPHA = 1e-4
Z_MAX = 4.5
P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.3, 0.5])


def _field(key: int, n: int, vocab: int) -> np.ndarray:
    """Exponentials for n positions (rows of the result), one column per token."""
    ctx = keyed.position_context(np.arange(n, dtype=np.uint64))[:, None]
    return keyed.exponentials(key, ctx, 0, np.arange(vocab))


def _cases(seed: int, count: int):
    return random_pairs(seed, count, max_size=7)


# --- keyed field -------------------------------------------------------------------------------


def test_field_is_deterministic_and_each_value_regenerates_alone() -> None:
    batch = keyed.exponentials(5, 123, 2, np.arange(1000))
    again = keyed.exponentials(5, 123, 2, np.arange(1000))
    assert np.array_equal(batch, again) and batch.dtype == np.float64
    for token in (0, 17, 999):
        assert keyed.exponentials(5, 123, 2, token) == batch[token]
    perm = np.random.default_rng(0).permutation(1000)  # cf. flashinfer-ai/flashinfer#4861
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
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError):
            keyed.uniforms(bad, 0, 0, 0)


def test_field_is_uniform_and_independent() -> None:  # 4 checks
    u = keyed.uniforms(
        2024, keyed.position_context(np.arange(400, dtype=np.uint64))[:, None], 0, np.arange(500)
    )
    counts = np.histogram(u, bins=100, range=(0, 1))[0]
    assert pooled_chi2(counts, np.full(100, 0.01)) > ALPHA
    assert stats.kstest(u.ravel()[:50_000], "uniform").pvalue > ALPHA
    pairs = np.floor(u[:, :-1] * 10) * 10 + np.floor(u[:, 1:] * 10)  # neighbouring tokens
    counts = np.bincount(pairs.astype(int).ravel(), minlength=100)
    assert pooled_chi2(counts, np.full(100, 0.01)) > ALPHA
    rows = keyed.uniforms(2024, 7, np.arange(2)[:, None], np.arange(100_000))
    joint = np.floor(rows[0] * 10) * 10 + np.floor(rows[1] * 10)  # neighbouring rows
    assert pooled_chi2(np.bincount(joint.astype(int), minlength=100), np.full(100, 0.01)) > ALPHA


def test_tail_resolution_is_float64() -> None:  # 1 check (two halves)
    u = keyed.uniforms(9, 1, 0, np.arange(2**20))
    assert np.mean((u * 2.0**24) % 1 != 0) > 0.99  # bits below 2**-24: fp32 would have none
    assert np.all((u * 2.0**53) % 1 == 0)  # exactly multiples of 2**-53
    e = keyed.exponentials(9, 1, 0, np.arange(2**20))
    hits = int(np.count_nonzero(e < 2.0**-15))  # expected 32
    assert stats.poisson.sf(hits - 1, 32) > ALPHA / 2 and stats.poisson.cdf(hits, 32) > ALPHA / 2


def test_context_hash_matches_vectorised_form() -> None:
    seq = [3, 1, 4, 1, 5, 9, 2, 6]
    table = keyed.context_hashes(seq, 3)
    assert [int(h) for h in table] == [keyed.context_hash(seq[:t], 3) for t in range(9)]
    assert keyed.context_hash([7, 1, 4], 2) == keyed.context_hash([1, 4], 2)
    assert keyed.context_hash([4], 2) != keyed.context_hash([1, 4], 2)


# --- selections --------------------------------------------------------------------------------


def test_gumbel_selections_follow_their_laws() -> None:  # 2 checks
    e = _field(1, 40_000, 3)
    target = np.bincount(gumbel_target(P, e), minlength=3)
    draft = np.bincount(gumbel_draft(Q, e), minlength=3)
    assert pooled_chi2(target, P) > ALPHA and pooled_chi2(draft, Q) > ALPHA
    assert gumbel_target([0.0, 1.0], [0.0, 30.0]) == 1  # zero probability never selected


def test_poisson_list_is_without_replacement_sample() -> None:  # 1 check
    q = np.array([0.4, 0.3, 0.2, 0.1])
    e = _field(2, 20_000, 4)
    lists = [poisson_list(q, row, 2) for row in e]
    pairs = [(a, b) for a in range(4) for b in range(4) if a != b]
    law = np.array([q[a] * q[b] / (1 - q[a]) for a, b in pairs])
    counts = np.array([sum(1 for x in lists if x == pr) for pr in pairs])
    assert pooled_chi2(counts, law) > ALPHA
    assert poisson_list([0.5, 0.5, 0.0], [1.0, 2.0, 0.0], 3) == (0, 1)


# --- acceptance: goldens, inequalities, Monte Carlo --------------------------------------------


def test_golden_vector_and_gumbel_closed_form() -> None:
    tv = 0.5 * np.abs(P - Q).sum()
    assert tv == pytest.approx(0.3, abs=1e-15)
    assert float(np.sum(P * Q / (P + Q))) == pytest.approx(0.435714, abs=1e-6)
    assert (1 - tv) / (1 + tv) == pytest.approx(0.538462, abs=1e-6)
    # j=0: 1/(1 + 1.5 + 2.5); j=1: 1/(5/3 + 1 + 5/3); j=2: 1/(2.5 + 1.5 + 1) -> 41/65
    exact = gumbel_acceptance([F(1, 2), F(3, 10), F(1, 5)], [F(1, 5), F(3, 10), F(1, 2)])
    assert exact == F(41, 65) == F(1, 5) + F(3, 13) + F(1, 5)
    assert gumbel_acceptance(P, Q) == pytest.approx(41 / 65, abs=1e-15)
    assert ss.acceptance("gumbel", P, Q, 1) == pytest.approx(41 / 65, abs=1e-15)
    assert gumbel_acceptance(P, P) == pytest.approx(1.0)
    assert gumbel_acceptance([1.0, 0.0], [0.0, 1.0]) == 0.0


def test_gumbel_acceptance_sits_above_its_lower_bounds() -> None:
    for p, q in _cases(11, 300):
        tv = 0.5 * np.abs(p - q).sum()
        m, big = np.minimum(p, q), np.maximum(p, q)
        with np.errstate(divide="ignore", invalid="ignore"):
            pml = float(np.sum(np.where(p + q > 0, p * q / (p + q), 0.0)))
            disd = float(np.sum(np.where(m > 0, m / (m + (1 + tv) - big), 0.0)))
        acc = gumbel_acceptance(p, q)
        tol = 1e-12
        assert acc >= pml - tol and acc >= disd - tol and disd >= (1 - tv) / (1 + tv) - tol
        assert acc <= 1 - tv + tol  # the maximal coupling is the optimum
        assert sum(gumbel_hits(p, q)) == pytest.approx(acc, abs=1e-15)


def test_poisson_acceptance_bounds_and_monotonicity() -> None:
    for p, q in _cases(12, 60):
        accs = [poisson_acceptance(p, q, size) for size in (1, 2, 3, 4)]
        assert accs[0] == pytest.approx(gumbel_acceptance(p, q), abs=1e-12)
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(accs))
        for size, acc in zip((1, 2, 3, 4), accs, strict=True):
            assert acc >= poisson_acceptance_bound(p, q, size) - 1e-12  # unproven: inequality
            assert acc <= ss.optimal_acceptance(p, q, size, replacement=False) + 1e-12
        assert ss.acceptance("poisson", p, q, 2) == pytest.approx(accs[1], abs=1e-15)


def _mc_list_hits(p: np.ndarray, q: np.ndarray, size: int, n: int, seed: int) -> np.ndarray:
    """Numpy reference: is Y = argmin E/p among the ``size`` smallest E/q? (no library code)."""
    e = np.random.default_rng(seed).exponential(size=(n, p.shape[0]))
    with np.errstate(divide="ignore"):
        y = np.argmin(np.where(p > 0, e / np.where(p > 0, p, 1), np.inf), axis=1)
        scores = np.where(q > 0, e / np.where(q > 0, q, 1), np.inf)
    rank = np.sum(scores < scores[np.arange(n), y][:, None], axis=1)
    return (q[y] > 0) & (rank < size)


@pytest.mark.parametrize("list_size", [1, 2, 4])
def test_acceptance_matches_monte_carlo(list_size: int) -> None:  # 1 z-test each
    rng = np.random.default_rng(list_size)
    p, q = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7) * 0.5)
    hits = _mc_list_hits(p, q, list_size, 200_000, 100 + list_size)
    exact = gumbel_acceptance(p, q) if list_size == 1 else poisson_acceptance(p, q, list_size)
    z = (hits.mean() - exact) / np.sqrt(exact * (1 - exact) / hits.shape[0])
    assert abs(z) < Z_MAX, (list_size, hits.mean(), exact)


def test_poisson_acceptance_numerics() -> None:
    tiny_p = np.array([1 - 2e-12, 1e-12, 1e-12])
    tiny_q = np.array([1e-15, 0.5, 0.5 - 1e-15])
    for p, q in ((tiny_p, tiny_q), (tiny_q, tiny_p)):
        assert poisson_acceptance(p, q, 1) == pytest.approx(gumbel_acceptance(p, q), rel=1e-9)
    rng = np.random.default_rng(7)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(5) * 0.3), rng.dirichlet(np.ones(5) * 0.3)
        assert poisson_acceptance(p, q, 5) == pytest.approx(float(p[q > 0].sum()), abs=1e-12)


@pytest.mark.parametrize(
    ("name", "shape"), [("gumbel", ss.Shape.chain(3)), ("poisson", ss.Shape.branching((2, 2)))]
)
def test_expected_emitted_matches_keyed_rounds(name: str, shape: ss.Shape) -> None:  # z-test
    pair, prefix, n = Random(5, seed=21), (2,), 1500
    law = ss.round_law(name, pair, shape, prefix)
    mean = ss.expected_emitted(name, pair, shape, prefix)
    var = sum(prob * len(out) ** 2 for out, prob in law.items()) - mean**2
    rng = np.random.default_rng(3)  # speculate draws a fresh random key per round from rng
    emitted = [len(ss.speculate(name, pair, shape, rng, prefix).tokens) for _ in range(n)]
    assert abs(np.mean(emitted) - mean) / np.sqrt(var / n) < Z_MAX


# --- strong drafter invariance ------------------------------------------------------------------

BASE = Random(8, seed=4)
DRAFTERS = [Swapped(BASE, None), Swapped(BASE, BASE), Swapped(BASE, Random(8, seed=99))]
PROMPT = (3, 1)
STRONG = {
    "gumbel": [ss.Shape.chain(1), ss.Shape.chain(3), ss.Shape.chain(5)],
    "poisson": [
        ss.Shape.chain(2),
        ss.Shape.star(3, replacement=False),
        ss.Shape.branching((2, 2)),
    ],
    "gls_strong": [ss.Shape.star(3), ss.Shape.paths(3, 2), ss.Shape.paths(3, 4)],
}


class _TargetOnly:
    """A target model with no drafter at all."""

    vocab_size = BASE.vocab_size

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return BASE.target(prefix)


def _strong_streams(run, shapes, window=None) -> dict[tuple[int, int], tuple[int, ...]]:
    """The check shared by the schemes and the mutant: stream per (drafter, shape)."""
    return {
        (d, s): tuple(run(drafter, shape, window))
        for (d, drafter), (s, shape) in itertools.product(enumerate(DRAFTERS), enumerate(shapes))
    }


def _generate(name: str, key: int, length: int = 40):
    def run(pair, shape, window):
        rng = np.random.default_rng(0)
        return ss.generate(name, pair, shape, length, rng, key=key, prefix=PROMPT, window=window)

    return run


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("name", sorted(STRONG))
def test_strong_invariance_equals_seeded_target_only_decoding(name: str, window) -> None:
    rows = ss.SCHEMES[name].rows(STRONG[name][0])
    assert ss.SCHEMES[name].strong_invariance
    reference = decode(
        _TargetOnly(), 40, KeyedNoise(31, window, len(PROMPT)), rows=rows, prefix=PROMPT
    )
    streams = _strong_streams(_generate(name, 31), STRONG[name], window)
    assert set(streams.values()) == {reference}  # bitwise, for every drafter and shape
    # Acceptance does depend on the drafter: rounds differ, a perfect drafter never misses.
    gens = [
        ss.generate(name, d, STRONG[name][1], 40, np.random.default_rng(0), key=31, window=window)
        for d in DRAFTERS
    ]
    assert len({len(g.rounds) for g in gens}) > 1
    if name != "gls_strong":  # all-rows GLS can miss even with draft = target
        depth = STRONG[name][1].depth
        assert all(len(r.tokens) == depth + 1 for r in gens[0].rounds[:-1])
    other = decode(_TargetOnly(), 40, KeyedNoise(32, window, len(PROMPT)), rows=rows, prefix=PROMPT)
    assert other != reference


def test_gls_strong_on_a_chain_is_the_gumbel_stream() -> None:
    for shape in (ss.Shape.chain(1), ss.Shape.chain(4)):
        runs = [
            ss.generate(n, DRAFTERS[2], shape, 30, np.random.default_rng(0), key=5)
            for n in ("gls_strong", "gumbel")
        ]
        assert runs[0] == runs[1] == decode(BASE, 30, 5)


class _RoundKeyedNoise:
    """Mutant (b): noise keyed by (round, draft step) instead of the absolute position."""

    def __init__(self, key: int, round_index: int, round_start: int) -> None:
        self.key, self.round_index, self.round_start = key, round_index, round_start

    def exponentials(self, sequence, rows: int, vocab_size: int) -> np.ndarray:
        step = len(sequence) - self.round_start
        context = keyed.position_context(1_000_000 * self.round_index + step)
        return keyed.exponentials(
            self.key, context, np.arange(rows)[:, None], np.arange(vocab_size)
        )


def _round_keyed(name: str, key: int, length: int = 40):
    def run(pair, shape, window):
        tokens: tuple[int, ...] = ()
        rng, index = np.random.default_rng(0), 0
        while len(tokens) < length:
            context = PROMPT + tokens
            noise = _RoundKeyedNoise(key, index, len(context))
            tokens += ss.speculate(name, pair, shape, rng, context, noise=noise).tokens
            index += 1
        return tokens[:length]

    return run


@pytest.mark.parametrize("name", sorted(STRONG))
def test_round_keyed_mutant_breaks_strong_invariance(name: str) -> None:
    assert len(set(_strong_streams(_generate(name, 31), STRONG[name]).values())) == 1
    mutant = _strong_streams(_round_keyed(name, 31), STRONG[name])
    assert len(set(mutant.values())) > 1  # the stream depends on drafter and draft length


# --- the generate API with keys ----------------------------------------------------------------


def test_keyed_generation_is_deterministic_and_validates() -> None:
    shape = ss.Shape.paths(2, 2)
    runs = [
        ss.generate("gls", BASE, shape, 25, np.random.default_rng(s), key=9, window=2)
        for s in (0, 1)
    ]
    assert runs[0] == runs[1] and [r.tokens for r in runs[0].rounds] == [
        r.tokens for r in runs[1].rounds
    ]
    with pytest.raises(ValueError, match="key"):
        ss.generate("specinfer", BASE, ss.Shape.star(2), 5, np.random.default_rng(0), key=1)
    with pytest.raises(ValueError, match="window"):
        ss.generate("gumbel", BASE, ss.Shape.chain(2), 5, np.random.default_rng(0), window=2)
    with pytest.raises(ValueError, match="window"):
        ss.generate("gumbel", BASE, ss.Shape.chain(2), 5, np.random.default_rng(0), key=1, window=0)
    with pytest.raises(ValueError, match="key"):
        ss.generate("gumbel", BASE, ss.Shape.chain(2), 5, np.random.default_rng(0), key=-3)
    with pytest.raises(ss.UnsupportedShape):
        ss.generate("gumbel", BASE, ss.Shape.star(2), 5, np.random.default_rng(0), key=1)


# --- mutant (c): exponentials as -log(u) -------------------------------------------------------


def test_log_u_mutant_breaks_at_the_extremes() -> None:
    u = np.array([0.0, 2.0**-60, 1e-20, keyed.LARGEST_UNIFORM])
    good = -np.log1p(-u)
    assert np.all(np.isfinite(good)) and good[0] == 0.0 and good[2] == 1e-20
    with np.errstate(divide="ignore"):
        mutant = -np.log(u)
    assert mutant[0] == np.inf  # U = 0 gives an infinite exponential
    naive = -np.log(1 - u)  # the other spelling loses every u below 2**-53 to rounding
    assert naive[1] == 0.0 and naive[2] == 0.0 and good[1] > 0.0
