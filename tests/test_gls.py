"""GLS (Gumbel-max list sampling): match laws, acceptance, invariance and mutants.

Statistical budget: 5 chi-square checks at ``ALPHA = 1e-4`` each plus 7 z-tests at
``|z| < 4.5`` (two-sided ``6.8e-6`` each): below ``5.5e-4`` per run for a correct
implementation (Bonferroni); the mutant's chi-square must *fail* (its p-value is about 1e-80).
Every seed is fixed. The Monte Carlo references draw exponentials with numpy and race them
directly, independently of the library's race code.

The mutants below must fail the same check the real scheme passes:

* (a) the active-set update inverted (keep the rows whose draft *missed* ``Y``). Its rows stay
  fresh, so each emitted token is still an exact draw from ``p``; what breaks is the round law:
  a perfect drafter no longer always reaches the bonus, and the accepted counts no longer follow
  ``ss.round_law("gls", ...)``.
* a verifier that reads the draft probabilities on a miss (a residual step): it breaks
  conditional invariance.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

import specsampling as ss
from proofs_tests.oracles import pooled_chi2, random_pairs
from specsampling.keyed import KeyedNoise
from specsampling.keyed.gls_law import gls_acceptance, list_matching_bound, match_law
from specsampling.keyed.laws import decode, gumbel_acceptance, gumbel_hits, keyed_select
from specsampling.pairs import Random, Swapped
from specsampling.schemes import Verdict

ALPHA = 1e-4
Z_MAX = 4.5
P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.3, 0.5])
BASE = Random(6, seed=4)
PROMPT = (0, 1)


def _cases(seed: int, count: int):
    return random_pairs(seed, count, max_size=6)


def _law(p, q, active, rows=None):
    """match_law, turning the scipy overflow (see the regression test) into a clear failure."""
    try:
        return match_law(p, q, active, rows)
    except OverflowError as error:  # pragma: no cover - only on a regression
        pytest.fail(f"match_law overflow (library bug) at p={list(p)}, q={list(q)}: {error}")


def _race(e: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Numpy reference race ``argmin E / probs`` over the last axis (zero prob: never)."""
    with np.errstate(divide="ignore"):
        return np.argmin(np.where(probs > 0, e / np.where(probs > 0, probs, 1), np.inf), axis=-1)


def _mc_gls(p, q, active, rows, n, seed):
    """Monte Carlo of (Y, M): target races ``rows`` rows, the first ``active`` rows draft."""
    e = np.random.default_rng(seed).exponential(size=(n, rows, p.shape[0]))
    y = _race(e.min(axis=1), p)
    matched = np.sum(_race(e[:, :active], q) == y[:, None], axis=1)
    return y, matched


# --- the law of one position --------------------------------------------------------------------


def test_match_law_rows_sum_to_target_and_one_row_is_gumbel() -> None:
    for p, q in _cases(1, 60):
        assert _law(p, q, 1)[:, 1] == pytest.approx(gumbel_hits(p, q), abs=1e-12)
        assert gls_acceptance(p, q, 1) == pytest.approx(gumbel_acceptance(p, q), abs=1e-12)
        for active, rows in ((1, 1), (1, 3), (2, 2), (2, 3), (3, 3)):
            law = _law(p, q, active, rows)
            assert law.shape == (p.shape[0], active + 1) and np.all(law >= 0)
            assert law.sum(axis=1) == pytest.approx(p, abs=1e-12)
            assert np.all(law[q == 0, 1:] == 0)  # a token the drafts never draw never matches


def test_match_law_survives_subnormal_match_probabilities() -> None:
    """Regression: ``scipy.stats.binom.pmf(1, 2, 1.4e-308)`` raised OverflowError inside it."""
    p, q = [0.64, 0.08, 0.28], [0.632, 0.3678, 0.0002]
    try:
        law = match_law(p, q, 3)
    except OverflowError as error:
        raise AssertionError(f"match_law({p}, {q}, 3) raised OverflowError: {error}") from None
    assert law.sum(axis=1) == pytest.approx(p, abs=1e-12)
    assert gls_acceptance(p, q, 3) >= gls_acceptance(p, q, 2) - 1e-12


@pytest.mark.parametrize(("active", "rows"), [(1, 3), (2, 2), (2, 3), (3, 3)])
def test_match_law_matches_monte_carlo(active: int, rows: int) -> None:  # 1 check each
    rng = np.random.default_rng(10 * active + rows)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5) * 0.6)
    y, matched = _mc_gls(p, q, active, rows, 100_000, rows)
    counts = np.bincount(y * (active + 1) + matched, minlength=5 * (active + 1))
    assert pooled_chi2(counts, match_law(p, q, active, rows).ravel()) > ALPHA


@pytest.mark.parametrize("num_drafts", [1, 2, 3])
def test_gls_acceptance_matches_monte_carlo(num_drafts: int) -> None:  # 1 z-test each
    rng = np.random.default_rng(num_drafts)
    p, q = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7) * 0.5)
    _, matched = _mc_gls(p, q, num_drafts, num_drafts, 200_000, 50 + num_drafts)
    exact = gls_acceptance(p, q, num_drafts)
    z = (np.mean(matched > 0) - exact) / np.sqrt(exact * (1 - exact) / matched.shape[0])
    assert abs(z) < Z_MAX, (num_drafts, np.mean(matched > 0), exact)


def test_gls_acceptance_goldens_and_inequalities() -> None:
    assert gls_acceptance(P, Q, 1) == pytest.approx(41 / 65, abs=1e-12)
    assert list_matching_bound(P, Q, 1) == pytest.approx(41 / 65, abs=1e-12)
    assert ss.acceptance("gls", P, Q, 2) == ss.acceptance("gls_strong", P, Q, 2)
    for p, q in _cases(2, 40):
        accs = [float(_law(p, q, k)[:, 1:].sum()) for k in (1, 2, 3, 4)]
        assert accs[0] == pytest.approx(list_matching_bound(p, q, 1), abs=1e-12)
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(accs))
        for k, acc in enumerate(accs, start=1):
            assert acc >= list_matching_bound(p, q, k) - 1e-12
            assert acc <= ss.optimal_acceptance(p, q, k) + 1e-12  # K i.i.d. drafts from q


# --- rounds: exact engine vs keyed sampling ----------------------------------------------------

ROUND_SHAPES = [ss.Shape.paths(2, 2), ss.Shape.paths(3, 2)]


@pytest.mark.parametrize("shape", ROUND_SHAPES, ids=repr)
@pytest.mark.parametrize("name", ["gls", "gls_strong"])
def test_expected_emitted_matches_keyed_rounds(name: str, shape: ss.Shape) -> None:  # z-test
    law = ss.round_law(name, BASE, shape, PROMPT)
    mean = ss.expected_emitted(name, BASE, shape, PROMPT)
    var = sum(prob * len(out) ** 2 for out, prob in law.items()) - mean**2
    rng, n = np.random.default_rng(5), 1000  # a fresh random key per round
    emitted = [len(ss.speculate(name, BASE, shape, rng, PROMPT).tokens) for _ in range(n)]
    assert abs(np.mean(emitted) - mean) / np.sqrt(var / n) < Z_MAX


@pytest.mark.parametrize("name", ["gls", "gls_strong"])
def test_round_law_is_lossless_and_strong_accepts_less(name: str) -> None:
    for seed in range(4):
        pair = Random(4, seed=seed)
        for shape in (ss.Shape.star(3), ss.Shape.paths(2, 3)):
            assert ss.lossless_error(name, pair, shape) < 1e-12
            strong = ss.expected_emitted("gls_strong", pair, shape)
            assert strong <= ss.expected_emitted("gls", pair, shape) + 1e-12  # docs/schemes/gls.md


# --- a reference walk and the mutants ----------------------------------------------------------


def _walk(keep, on_miss=None):
    """One keyed GLS round written here; ``keep(draft_token, token)`` updates the active set."""

    def sample(pair, shape, noise, prefix=()):
        rows = ss.SCHEMES["gls"].rows(shape)
        depth, vocab = shape.depth, pair.vocab_size
        drafts: list[list[int]] = [[] for _ in range(rows)]

        def pick(proposal, path, step):
            row = step // depth  # paths(K, L): row k drafts path k
            token = int(_race(noise.exponentials(prefix + path, rows, vocab)[row], proposal))
            drafts[row].append(token)
            return token

        tree = shape.draft_with(pair, pick, prefix)
        active, node = list(range(rows)), 0
        for position in range(depth + 1):
            context = prefix + tree.prefix(node)
            exps = noise.exponentials(context, rows, vocab)[active]
            token = keyed_select(pair.target(context), exps)
            if position == depth:
                return tree, Verdict(node, token)
            active = [k for k in active if keep(drafts[k][position], token)]
            child = tree.child_with_token(node, token)
            if not active or child is None:
                if on_miss is not None:
                    token = on_miss(pair.target(context), pair.draft(context), exps, token)
                return tree, Verdict(node, token)
            node = child
        raise AssertionError("unreachable")

    return sample


REFERENCE = _walk(lambda drafted, token: drafted == token)
INVERTED = _walk(lambda drafted, token: drafted != token)  # mutant (a)


def _residual_on_miss(target, draft, exps, token):
    residual = np.maximum(target - draft, 0.0)
    return keyed_select(residual / residual.sum(), exps) if residual.sum() > 0 else token


READS_DRAFT = _walk(lambda drafted, token: drafted == token, _residual_on_miss)


def test_reference_walk_is_the_library_verifier() -> None:
    shape = ss.Shape.paths(3, 2)
    for key in range(60):
        noise = KeyedNoise(key, start=len(PROMPT))
        ours = REFERENCE(Swapped(BASE, Random(6, seed=9)), shape, noise, PROMPT)
        assert ours == ss.SCHEMES["gls"].sample_keyed(
            Swapped(BASE, Random(6, seed=9)), shape, noise, PROMPT
        )


def _full_rounds(sample) -> bool:
    """With draft = target every active row races on the target's prefix: never a miss."""
    shape, pair = ss.Shape.paths(3, 2), Swapped(BASE, None)
    for key in range(100):
        tree, verdict = sample(pair, shape, KeyedNoise(key, start=len(PROMPT)), PROMPT)
        if len(tree.prefix(verdict.node)) != shape.depth:
            return False
    return True


def _round_length_pvalue(sample, seed: int) -> float:
    """Accepted counts of keyed rounds against the exact ``ss.round_law("gls")``."""
    shape, n = ss.Shape.paths(3, 2), 800
    law = ss.round_law("gls", BASE, shape, PROMPT)
    probs = [sum(p for out, p in law.items() if len(out) == m) for m in (1, 2, 3)]
    counts = Counter()
    for key in np.random.default_rng(seed).integers(2**63, size=n):
        tree, verdict = sample(BASE, shape, KeyedNoise(int(key), start=len(PROMPT)), PROMPT)
        counts[len(tree.prefix(verdict.node)) + 1] += 1
    return pooled_chi2([counts[m] for m in (1, 2, 3)], probs)


def test_inverted_active_set_mutant_is_caught() -> None:  # 2 checks
    real = ss.SCHEMES["gls"].sample_keyed
    assert _full_rounds(real) and not _full_rounds(INVERTED)
    assert _round_length_pvalue(real, 1) > ALPHA
    assert _round_length_pvalue(INVERTED, 2) < ALPHA


# --- drafter invariance ------------------------------------------------------------------------


class _Reshaped:
    """A drafter with other draft probabilities but the same keyed race winners.

    At each prefix the winners ``argmin_i E[k, i] / q_i`` of every row are scaled by 2, every
    other token by a factor in ``[0.05, 1]``: the winners stay winners, ``q`` changes a lot.
    """

    def __init__(self, pair, noise: KeyedNoise, rows: int) -> None:
        self.pair, self.noise, self.rows = pair, noise, rows
        self.vocab_size = pair.vocab_size
        self.largest_change = 0.0

    def target(self, prefix):
        return self.pair.target(prefix)

    def draft(self, prefix):
        q = self.pair.draft(prefix)
        winners = _race(self.noise.exponentials(prefix, self.rows, self.vocab_size), q)
        factor = np.random.default_rng([7, *prefix]).uniform(0.05, 1.0, self.vocab_size)
        factor[winners] = 2.0
        out = q * factor / np.sum(q * factor)
        self.largest_change = max(self.largest_change, float(np.abs(out - q).max()))
        return out


def _conditional_violations(sample, window) -> tuple[int, float]:
    """Keys whose verdict changed between the two drafters (given identical trees)."""
    shape, changed, largest = ss.Shape.paths(3, 2), 0, 0.0
    for key in range(80):
        noise = KeyedNoise(key, window, len(PROMPT))
        other = _Reshaped(BASE, noise, 3)
        tree_a, verdict_a = sample(BASE, shape, noise, PROMPT)
        tree_b, verdict_b = sample(other, shape, noise, PROMPT)
        assert tree_a == tree_b  # the same draft tokens by construction
        changed += verdict_a != verdict_b
        largest = max(largest, other.largest_change)
    return changed, largest


@pytest.mark.parametrize("window", [None, 2])
def test_conditional_invariance_of_active_set_gls(window) -> None:
    assert not ss.SCHEMES["gls"].strong_invariance
    changed, largest = _conditional_violations(ss.SCHEMES["gls"].sample_keyed, window)
    assert changed == 0 and largest > 0.2  # q moved a lot, the verdicts did not
    assert _conditional_violations(READS_DRAFT, window)[0] > 0  # a q-reading verifier fails
    for key in range(20):  # whole streams, many rounds
        noise = KeyedNoise(key, window, len(PROMPT))
        runs = [
            ss.generate(
                "gls",
                pair,
                ss.Shape.paths(3, 2),
                20,
                np.random.default_rng(0),
                key=key,
                prefix=PROMPT,
                window=window,
            )
            for pair in (BASE, _Reshaped(BASE, noise, 3))
        ]
        assert runs[0] == runs[1]
        assert [r.tree for r in runs[0].rounds] == [r.tree for r in runs[1].rounds]


def test_active_set_gls_is_not_strongly_invariant() -> None:
    shape, other = ss.Shape.paths(3, 2), Swapped(BASE, Random(6, seed=99))
    differs = 0
    for key in range(30):
        reference = decode(BASE, 15, key, rows=3, prefix=PROMPT)
        run = {
            name: ss.generate(
                name, other, shape, 15, np.random.default_rng(0), key=key, prefix=PROMPT
            )
            for name in ("gls", "gls_strong")
        }
        assert run["gls_strong"] == reference
        differs += run["gls"] != reference
    assert differs > 0
