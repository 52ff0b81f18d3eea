"""Khisti's canonical decomposition (specsampling/schemes/khisti.py): exactness, goldens, mutants.

Goldens are worked out independently in exact arithmetic (as in ``tests/test_ot_optimal.py``),
Khisti columns ("acc" is
P(Y in drafts) with hits, "sel" is sum min(p, r_n)):

| Case | n | alpha* | s=|V| acc / sel | s=2 acc / sel |
|---|---|---|---|---|
| G1 | 2 | 1 | 1 / 1 | 0.966667 / 0.944444 (= 17/18) |
| G2 | 3 | 0.671 | 0.671 / 0.671 | 0.671 / 0.671 |
| G3 | 2 | 0.59 | 0.59 / 0.59 | 0.59 / 0.59 |
| G4 | 2 | 1 | 1 / 1 | 0.922414 (LP vertex, highs-ds) / 0.91 |
| G5 | 3 | 0 | 0 / 0 | 0 / 0 |
| G6 | 4 | 0.78549375 | 0.778011 / 0.776469 | 0.770533 / 0.747969 |
| G7 | 3 | 0.7 | 0.7 / 0.7 | 0.670527 / 0.653375 |
| G8 | 4 | 1 | 1 / 1 | 0.932630 / 0.816406 |
| G9 | 2 | 0.79 | 0.79 / 0.79 | 0.79 / 0.79 |

Only the n = 2 "sel" values (unique LP optimum) and the n = 2, s >= |supp q| acceptance (= alpha*)
are asserted tightly; the rest are regression values at 1e-6 with ``highs-ds``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction as F
from types import SimpleNamespace

import numpy as np
import pytest

import specsampling as ss
from proofs_tests.chisquare import chi_square_pvalue
from specsampling import DraftTree, Noise, Shape
from specsampling.pairs import Random, Stationary
from specsampling.schemes import khisti, tables
from specsampling.schemes.khisti import (
    SCHEME,
    Khisti,
    khisti_selection_acceptance,
    pair_plan,
    selection,
    winner_law,
)
from specsampling.schemes.standard import SCHEME as STANDARD
from specsampling.tree import DrawLaw

EXACT = 1e-12
REGRESSION = 1e-6
#: Mutants must move the output law by more than this.
CAUGHT = 1e-6
#: Significance of the one chi-square test (its whole false-positive budget).
ALPHA = 1e-3

# (p, q, n, (acc, sel) at s = |V|, (acc, sel) at s = 2)
GOLDEN = {
    "G1": ("1/2 1/3 1/6", "1/3 1/3 1/3", 2, (1, 1), (0.966667, F(17, 18))),
    "G2": ("3/5 3/10 1/10", "1/10 3/10 3/5", 3, (0.671, 0.671), (0.671, 0.671)),
    "G3": ("3/5 3/10 1/10 0", "1/10 1/5 3/10 2/5", 2, (F(59, 100),) * 2, (0.59, F(59, 100))),
    "G4": ("7/10 1/5 1/10", "7/10 1/5 1/10", 2, (1, 1), (0.922414, F(91, 100))),
    "G5": ("1/2 1/2 0 0", "0 0 1/2 1/2", 3, (0, 0), (0, 0)),
    "G6": (
        "2/5 1/4 1/5 3/20 0",
        "1/20 1/10 1/4 3/10 3/10",
        4,
        (0.778011, 0.776469),
        (0.770533, 0.747969),
    ),
    "G7": (
        "3/10 1/5 1/5 3/20 1/10 1/20",
        "0 1/10 1/5 3/10 1/4 3/20",
        3,
        (0.7, 0.7),
        (0.670527, 0.653375),
    ),
    "G8": ("1/4 1/4 1/4 1/4", "1/2 1/4 1/8 1/8", 4, (1, 1), (0.932630, 0.816406)),
    "G9": ("1/10 1/5 3/10 2/5", "2/5 3/10 1/5 1/10", 2, (F(79, 100),) * 2, (0.79, F(79, 100))),
}
OPTIMUM = {"G2": F(671, 1000), "G6": F(125679, 160000), "G7": F(7, 10), "G9": F(79, 100)}


def _case(name):
    target, draft, num_drafts, *_ = GOLDEN[name]
    exact = [[F(x) for x in text.split()] for text in (target, draft)]
    return [float(x) for x in exact[0]], [float(x) for x in exact[1]], num_drafts, exact


def _error(scheme, target, draft, num_drafts):
    out = ss.output_law(scheme, target, draft, num_drafts)
    return float(np.max(np.abs(out - np.asarray(target))))


def _random_pairs(count, seed):
    """Pairs built by mapping (Dirichlet weights, zeros, p == q, disjoint), never filtering."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        vocab = int(rng.integers(2, 6))
        num_drafts = int(rng.integers(2, 5))
        target, draft = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
        kind = index % 5
        if kind == 1:  # zeros in both
            target[rng.integers(vocab)] = 0.0
            draft[rng.integers(vocab)] = 0.0
        elif kind == 2:
            draft = target.copy()
        elif kind == 3 and vocab >= 2:  # disjoint supports
            split = int(rng.integers(1, vocab))
            target[split:], draft[:split] = 0.0, 0.0
        elif kind == 4:  # near one-hot target
            target = 0.999 * np.eye(vocab)[rng.integers(vocab)] + 0.001 * target
        yield target / target.sum(), draft / draft.sum(), num_drafts


# -- losslessness -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOLDEN)
@pytest.mark.parametrize("truncation", [2, 5])
def test_lossless_on_golden_cases(name, truncation):
    target, draft, num_drafts, _ = _case(name)
    assert _error(Khisti(truncation), target, draft, num_drafts) <= EXACT


def test_lossless_on_random_cases():
    worst = 0.0
    for index, (target, draft, num_drafts) in enumerate(_random_pairs(60, seed=11)):
        scheme = Khisti(truncation=1 + index % 4)
        worst = max(worst, _error(scheme, target, draft, num_drafts))
    assert worst <= EXACT


@pytest.mark.parametrize(
    "shape",
    [
        Shape.paths(2, 2),
        Shape.star(3),
        Shape.delayed(2, trunk=1, branch=1),
        Shape.chain(2),
        Shape.branching((2, 1), replacement=True),
    ],
    ids=repr,
)
@pytest.mark.parametrize("vocab_size,seed", [(3, 0), (4, 1)])
def test_lossless_on_trees(shape, vocab_size, seed):
    pair = Random(vocab_size=vocab_size, seed=seed)
    assert ss.lossless_error(SCHEME, pair, shape) <= EXACT
    assert ss.lossless_error(Khisti(truncation=1), pair, shape) <= EXACT


def test_fraction_pairs_are_converted_and_stay_lossless():
    pair = Random(vocab_size=3, seed=4, exact=True)
    assert float(ss.lossless_error(SCHEME, pair, Shape.paths(2, 2))) <= EXACT


def test_selection_law_matches_the_winner_law():
    """sum over draft tuples of Q(x) sel(.|x) is r_n: the law stage 2 uses is the true one."""
    for index, (target, draft, num_drafts) in enumerate(_random_pairs(20, seed=3)):
        rounds = SCHEME.rounds(target, draft, num_drafts)
        expected = winner_law(rounds, draft)
        law = np.zeros_like(draft)
        for drafts in itertools.product(np.flatnonzero(draft), repeat=num_drafts):
            weight = np.prod(draft[list(drafts)])
            for token, prob in selection(rounds, [int(t) for t in drafts]).items():
                law[token] += weight * prob
        assert np.max(np.abs(law - expected)) <= EXACT, index
        assert len(rounds) == num_drafts - 1


# -- goldens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_acceptance_and_selection(name):
    target, draft, num_drafts, exact = _case(name)
    for truncation, (acc, sel) in ((len(target), GOLDEN[name][3]), (2, GOLDEN[name][4])):
        scheme = Khisti(truncation)
        got_acc = float(ss.acceptance(scheme, target, draft, num_drafts))
        got_sel = khisti_selection_acceptance(target, draft, num_drafts, truncation)
        tight = num_drafts == 2 or acc in (0, 1)
        assert got_sel == pytest.approx(float(sel), abs=EXACT if tight else REGRESSION)
        assert got_acc == pytest.approx(float(acc), abs=REGRESSION)
        assert got_sel <= got_acc + EXACT  # hits only add
    if num_drafts == 2:  # the full canonical LP is optimal
        alpha = float(ss.optimal_acceptance(exact[0], exact[1], 2))
        assert float(ss.acceptance(Khisti(len(target)), target, draft, 2)) == pytest.approx(
            alpha, abs=1e-9
        )


def test_golden_optima_and_the_measured_gap():
    target, draft, _, exact = _case("G6")
    assert ss.optimal_acceptance(exact[0], exact[1], 4) == OPTIMUM["G6"]
    assert float(ss.acceptance(SCHEME, target, draft, 4)) == pytest.approx(0.778011, abs=1e-6)
    assert float(OPTIMUM["G6"]) - 0.778011 > 7e-3  # the tournament is suboptimal for n >= 3


def test_two_drafts_full_truncation_is_optimal_on_random_cases():
    for target, draft, _ in _random_pairs(40, seed=5):
        support = int(np.count_nonzero(draft))
        scheme = Khisti(truncation=max(support, 1))
        alpha = ss.optimal_acceptance(target, draft, 2)
        assert float(ss.acceptance(scheme, target, draft, 2)) == pytest.approx(alpha, abs=1e-9)
        bound = khisti_selection_acceptance(target, draft, 2, max(support, 1))
        assert bound == pytest.approx(alpha, abs=1e-9)


def test_acceptance_never_exceeds_the_optimum():
    for target, draft, num_drafts in _random_pairs(30, seed=8):
        alpha = float(ss.optimal_acceptance(target, draft, num_drafts))
        acc = float(ss.acceptance(SCHEME, target, draft, num_drafts))
        bound = khisti_selection_acceptance(target, draft, num_drafts)
        assert bound <= acc + EXACT
        assert acc <= alpha + 1e-9


def test_pair_plan_intermediate_values():
    """G1 with s = 2: kappa = (7, 4, 1)/18, Omega_1 = {0, 1}, Omega_2 = {2}.

    r(2) = q(2)^2 = 1/9 (token 2 loses every pair); the lottery on (0, 1) and (1, 0) moves
    x in [0, 2/9] to token 0: r = (1/3 + x, 5/9 - x, 1/9). Every x in [1/6, 2/9] is optimal
    (sum min(p, r) = 17/18); highs-ds returns the vertex w = 1, x = 2/9 (a regression value).
    """
    target, draft, _, _ = _case("G1")
    plan = pair_plan(target, draft, draft, 2)
    assert plan.solved
    assert plan.top.tolist() == [0, 1] and plan.rank.tolist() == [0, 1, 2]
    law = plan.winner_law
    assert law[2] == pytest.approx(1 / 9, abs=EXACT)
    assert 1 / 2 - EXACT <= law[0] <= 5 / 9 + EXACT and law.sum() == pytest.approx(1, abs=EXACT)
    assert float(np.minimum(target, law).sum()) == pytest.approx(17 / 18, abs=EXACT)
    assert plan.first_wins(2, 0) == 0.0 and plan.first_wins(0, 2) == 1.0
    assert plan.weights.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert np.allclose(law, [5 / 9, 1 / 3, 1 / 9], atol=EXACT, rtol=0)


def test_ties_are_broken_by_token_id():
    plan = pair_plan([0.25] * 4, [0.25] * 4, [0.25] * 4, 2)
    assert plan.rank.tolist() == [0, 1, 2, 3]
    assert plan.top.tolist() == [0, 1]


# -- chains and refusals ------------------------------------------------------------------------


def test_chains_equal_standard_for_the_same_noise():
    pair = Random(vocab_size=4, seed=2)
    rng = np.random.default_rng(7)
    shape = Shape.chain(3)
    for _ in range(200):
        tree = shape.draft(pair, rng)
        noise = Noise.draw(rng, tree.num_nodes)
        target, draft = tables(pair, tree)
        assert SCHEME.verify(tree, target, draft, noise) == STANDARD.verify(
            tree, target, draft, noise
        )
    assert ss.round_law(SCHEME, pair, shape) == ss.round_law(STANDARD, pair, shape)


REFUSED_SHAPES = [
    Shape.star(2, replacement=False),
    Shape.hub(),
    Shape.greedy((2,)),
    Shape.top((2,)),
]
REFUSED_LAWS = [
    DrawLaw.WITHOUT,
    DrawLaw.HUB,
    DrawLaw.GREEDY,
    DrawLaw.DETERMINISTIC,
    DrawLaw.UNKNOWN,
]


@pytest.mark.parametrize("shape", REFUSED_SHAPES, ids=repr)
def test_refused_shapes(shape):
    assert not SCHEME.supports(shape)
    with pytest.raises(ss.UnsupportedShape, match="khisti"):
        SCHEME.check(shape)
    with pytest.raises(ss.UnsupportedShape):
        ss.round_law(SCHEME, Random(vocab_size=3, seed=0), shape)


@pytest.mark.parametrize("law", REFUSED_LAWS, ids=str)
def test_refused_hand_built_trees(law):
    tree = DraftTree.from_draws([(0, 1), (0, 2), (0, 1)], law=law)
    target, draft = tables(Stationary([0.5, 0.3, 0.2], [0.2, 0.3, 0.5]), tree)
    noise = Noise.draw(np.random.default_rng(0), tree.num_nodes)
    with pytest.raises(ss.UnsupportedShape, match=f"law '{law.value}'"):
        SCHEME.verify(tree, target, draft, noise)
    with pytest.raises(ss.UnsupportedShape, match=f"law '{law.value}'"):
        SCHEME.verdict_law(tree, target, draft)


def test_supported_shapes():
    for shape in (Shape.chain(2), Shape.star(3), Shape.paths(2, 2), Shape.delayed(2, 1, 1)):
        assert SCHEME.supports(shape)
        SCHEME.check(shape)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "5"])
def test_truncation_is_validated(value):
    with pytest.raises(ValueError, match="truncation"):
        Khisti(truncation=value)
    with pytest.raises(ValueError, match="truncation"):
        pair_plan([0.5, 0.5], [0.5, 0.5], [0.5, 0.5], value)


def test_bad_distributions_name_the_argument():
    with pytest.raises(ss.InvalidDistribution, match="first_draft"):
        pair_plan([0.5, 0.5], [0.7, 0.7], [0.5, 0.5])
    with pytest.raises(ss.InvalidDistribution, match="second_draft"):
        pair_plan([0.5, 0.5], [0.5, 0.5], [0.5, 0.5, 0.0])
    with pytest.raises(ss.InvalidDistribution, match="target"):
        khisti_selection_acceptance([0.5, -0.5, 1.0], [0.2, 0.3, 0.5], 2)
    with pytest.raises(ValueError, match="num_drafts"):
        khisti_selection_acceptance([0.5, 0.5], [0.5, 0.5], 0)


def test_a_winner_law_off_mass_is_an_error_never_renormalised():
    target = np.array([0.5, 0.3, 0.2])
    heavy = np.array([0.2, 0.3, 0.5 + 1e-9])
    with pytest.raises(ValueError, match="mass"):
        khisti._pair_plan(target, heavy, heavy, 2)


def test_repr_and_metadata():
    assert SCHEME.name == "khisti" and not SCHEME.rational and "2410.18234" in SCHEME.reference
    assert SCHEME.truncation == khisti.DEFAULT_TRUNCATION == 5
    assert "truncation=2" in repr(Khisti(2))
    assert SCHEME.closed_acceptance(np.array([0.5, 0.5]), np.array([0.5, 0.5]), 2) is None


# -- LP failure, and mutants --------------------------------------------------------------------


class Unmemoised(Khisti):
    """The real rounds, rebuilt on every call (so a monkeypatched solver is seen)."""

    def rounds(self, target, draft, num_drafts):
        return khisti._build_rounds(target, draft, num_drafts, self.truncation)


class PlainDraftEachRound(Khisti):
    """M5: q instead of the previous winner law as q1 in rounds >= 2."""

    def rounds(self, target, draft, num_drafts):
        return tuple(
            khisti._pair_plan(target, draft, draft, self.truncation) for _ in range(num_drafts - 1)
        )


class FallbackReturnsFirst(Khisti):
    """M7: on LP failure use w = 1/2 but return q1 as the winner law (the third-party code)."""

    def rounds(self, target, draft, num_drafts):
        plans, law = [], draft
        for _ in range(num_drafts - 1):
            plan = khisti._pair_plan(target, law, draft, self.truncation)
            plans.append(plan._replace(winner_law=law))
        return tuple(plans)


class PerturbedSelection(Khisti):
    """M1: the selection weights perturbed by 10%, stage 2 still against the intended r."""

    def rounds(self, target, draft, num_drafts):
        plans = []
        for plan in khisti._build_rounds(target, draft, num_drafts, self.truncation):
            weights = np.clip(0.9 * plan.weights + 0.05, 0.0, 1.0)
            np.fill_diagonal(weights, 0.0)
            plans.append(plan._replace(weights=weights))
        return tuple(plans)


class WithoutReplacementFed(Khisti):
    """M6: the refusal bypassed, drafts without replacement verified as if i.i.d."""

    laws = frozenset({DrawLaw.IID, DrawLaw.WITHOUT})

    def single_shape(self, num_drafts):
        return Shape.star(num_drafts, replacement=False)


def _failing_linprog(*args, **kwargs):
    return SimpleNamespace(status=2, x=None, message="infeasible (simulated)")


def test_lp_failure_falls_back_to_half_and_stays_lossless(monkeypatch):
    import scipy.optimize

    monkeypatch.setattr(scipy.optimize, "linprog", _failing_linprog)  # khisti imports it per call
    target, draft, _, _ = _case("G8")
    plan = pair_plan(target, draft, draft, 2)
    assert not plan.solved
    assert plan.weights[0, 1] == plan.weights[1, 0] == khisti.FALLBACK_WEIGHT
    for name in GOLDEN:
        target, draft, num_drafts, _ = _case(name)
        assert _error(Unmemoised(2), target, draft, num_drafts) <= EXACT


def test_mutant_m7_fallback_returning_first_draft_law_is_caught(monkeypatch):
    import scipy.optimize

    monkeypatch.setattr(scipy.optimize, "linprog", _failing_linprog)  # khisti imports it per call
    target, draft, num_drafts, _ = _case("G8")
    assert _error(FallbackReturnsFirst(2), target, draft, num_drafts) > 0.1  # measured 0.22


def test_mutant_m5_plain_draft_each_round_is_caught():
    target, draft, num_drafts, _ = _case("G8")
    assert _error(PlainDraftEachRound(), target, draft, num_drafts) > 0.1  # measured 0.188
    target, draft, num_drafts, _ = _case("G6")
    assert _error(PlainDraftEachRound(), target, draft, num_drafts) > CAUGHT


def test_mutant_m1_perturbed_selection_is_caught():
    target, draft, num_drafts, _ = _case("G6")
    assert _error(PerturbedSelection(), target, draft, num_drafts) > 1e-2  # measured 0.022


def test_mutant_m6_without_replacement_drafts_are_caught():
    target, draft, num_drafts, _ = _case("G4")
    error = _error(WithoutReplacementFed(), target, draft, num_drafts)
    assert error == pytest.approx(0.406, abs=1e-3)  # 0.41, worked out independently


# -- the sampled rule matches its law ------------------------------------------------------------

#: Root candidates (1, 2, 1) (a duplicate), node 1 with two candidates, node 2 with one.
CHI_TREE = DraftTree.from_draws([(0, 1), (0, 2), (0, 1), (1, 0), (2, 3), (1, 2)], law="iid")


def _sampled_counts(scheme, tree, pair, draws, seed):
    rng = np.random.default_rng(seed)
    target, draft = tables(pair, tree)
    counts: Counter = Counter()
    for _ in range(draws):
        counts[tuple(scheme.verify(tree, target, draft, Noise.draw(rng, tree.num_nodes)))] += 1
    return counts


def test_verify_matches_verdict_law_chi_square():
    pair = Random(vocab_size=4, seed=3)
    target, draft = tables(pair, CHI_TREE)
    law = {tuple(v): p for v, p in SCHEME.verdict_law(CHI_TREE, target, draft).items()}
    assert sum(law.values()) == pytest.approx(1, abs=EXACT)
    counts = _sampled_counts(SCHEME, CHI_TREE, pair, 20_000, seed=2024)
    assert chi_square_pvalue(counts, law) > ALPHA
    # Power (a negative control): the same counts reject a wrong law (M5's).
    wrong = PlainDraftEachRound().verdict_law(CHI_TREE, target, draft)
    assert chi_square_pvalue(counts, {tuple(v): p for v, p in wrong.items()}) < ALPHA
