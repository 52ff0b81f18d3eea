"""Greedy multi-draft (Hu et al.) and SpecHub: exact laws, closed forms, LP optimality, mutants.

Both schemes own their drafting law (``Shape.greedy``, ``Shape.hub``). Checked here:

* losslessness, exactly (``Fraction``: error ``== 0``) and in float64 (``<= 1e-12``), on seeded
  random pairs (vocabulary 2-4) and hand-made edge pairs, at depth 1 and 2;
* closed forms == exact enumeration of ``P(first emitted token in the root's drafts)``;
* closed forms == the LP (optimal transport, max-flow form) optimum for the scheme's own law;
* the greedy column of the golden table (``tests/test_goldens.py``, worked out independently);
* exhausted supports (greedy: ``T`` covers ``supp q``; SpecHub: ``q`` one-hot);
* mutants (known-buggy variants) caught by the exact law, each next to its correct twin;
* sampled ``verify`` against ``verdict_law`` given the tree (chi-square on counts, fixed seed,
  declared false-positive budget).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest
from scipy import stats
from scipy.optimize import linprog

import specsampling as ss
from specsampling import Noise, Shape
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.ops import normalise, positive_part, residual, total
from specsampling.pairs import Random, Stationary
from specsampling.schemes import tables
from specsampling.schemes.greedy import SCHEME as GREEDY
from specsampling.schemes.greedy import Greedy, greedy_acceptance, top_tokens
from specsampling.schemes.spechub import SCHEME as SPECHUB
from specsampling.schemes.spechub import SpecHub, hub_plan, spechub_acceptance

GREEDY_SHAPES = [Shape.greedy((2,)), Shape.greedy((3,)), Shape.greedy((2, 2)), Shape.greedy((1,))]
HUB_SHAPES = [Shape.hub(1), Shape.hub(2)]
CASES = [(GREEDY, s) for s in GREEDY_SHAPES] + [(SPECHUB, s) for s in HUB_SHAPES]
CASE_IDS = [f"{scheme.name}-{shape!r}" for scheme, shape in CASES]
SEEDS = range(10)

# Hand-made single-position pairs (exact); each is also used as a stationary model pair.
EDGE = {
    "uniform_draft": ((F(1, 2), F(1, 3), F(1, 6)), (F(1, 3), F(1, 3), F(1, 3))),
    "q_one_hot": ((F(1, 2), F(1, 3), F(1, 6)), (F(1), F(0), F(0))),
    "q_one_hot_banned": ((F(0), F(1, 2), F(1, 2)), (F(1), F(0), F(0))),
    "p_one_hot": ((F(0), F(0), F(1)), (F(1, 2), F(1, 4), F(1, 4))),
    "p_eq_q": ((F(7, 10), F(2, 10), F(1, 10)), (F(7, 10), F(2, 10), F(1, 10))),
    "disjoint": ((F(1, 2), F(1, 2), F(0), F(0)), (F(0), F(0), F(1, 3), F(2, 3))),
    "zeros": ((F(1, 2), F(0), F(1, 2), F(0)), (F(1, 4), F(1, 4), F(0), F(1, 2))),
    "ties": ((F(1, 10), F(2, 5), F(1, 4), F(1, 4)), (F(1, 3), F(1, 3), F(1, 6), F(1, 6))),
    "two_supported": ((F(1, 4), F(1, 4), F(1, 4), F(1, 4)), (F(0), F(3, 4), F(0), F(1, 4))),
    "hub_step4": ((F(3, 4), F(1, 8), F(1, 8)), (F(1, 2), F(1, 4), F(1, 4))),
}


def _floats(values):
    return [float(x) for x in values]


def _float_pair(pair):
    return Stationary(*(_floats(row) for row in pair))


# --------------------------------------------------------------------------- losslessness
@pytest.mark.parametrize(("scheme", "shape"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("vocab", [2, 3, 4])
def test_lossless_exact_and_float_on_random_pairs(scheme, shape, vocab):
    assert scheme.supports(shape)
    for seed in SEEDS:
        assert ss.lossless_error(scheme, Random(vocab, seed, exact=True), shape) == 0, seed
        assert ss.lossless_error(scheme, Random(vocab, seed), shape) <= 1e-12, seed


@pytest.mark.parametrize(("scheme", "shape"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("edge", sorted(EDGE))
def test_lossless_on_edge_pairs(scheme, shape, edge):
    target, draft = EDGE[edge]
    assert ss.lossless_error(scheme, Stationary(target, draft), shape) == 0
    assert ss.lossless_error(scheme, _float_pair(EDGE[edge]), shape) <= 1e-12


@pytest.mark.parametrize("scheme", [GREEDY, SPECHUB], ids=lambda s: s.name)
def test_chains_run_standard_speculative_sampling(scheme):
    pair = Random(3, seed=5, exact=True)
    for shape in (Shape.chain(2), Shape.star(1), Shape.greedy((1, 1))):
        assert scheme.supports(shape)
        assert ss.lossless_error(scheme, pair, shape) == 0
        assert ss.round_law(scheme, pair, shape) == ss.round_law("standard", pair, shape)
    target, draft = EDGE["zeros"]
    assert ss.acceptance(scheme, target, draft, 1) == F(1, 4)  # sum of min(p, q)


def test_supported_and_refused_shapes():
    assert GREEDY.supports(Shape.greedy((3, 2))) and SPECHUB.supports(Shape.hub(3))
    refused = [Shape.star(2), Shape.star(2, replacement=False), Shape.top((2,)), Shape.paths(2, 1)]
    for shape in [*refused, Shape.hub(1)]:
        assert not GREEDY.supports(shape), shape
    for shape in [*refused, Shape.greedy((2,)), Shape.greedy((3, 1))]:
        assert not SPECHUB.supports(shape), shape
    with pytest.raises(ss.UnsupportedShape):
        ss.round_law(GREEDY, Random(2, seed=0), Shape.star(2))
    with pytest.raises(ss.UnsupportedShape, match="exactly two candidates"):
        ss.round_law(SPECHUB, Random(2, seed=0), Shape.greedy((2,)))
    assert GREEDY.single_shape(3) == Shape.greedy((3,)) and SPECHUB.single_shape(2) == Shape.hub()
    # SpecHub has no law for three or more drafts: refused, never silently run.
    for k in (3, 4):
        assert not SPECHUB.supports(SPECHUB.single_shape(k))
        assert SPECHUB.closed_acceptance(np.array([0.5, 0.5]), np.array([0.5, 0.5]), k) is None
        with pytest.raises(ss.UnsupportedShape, match="exactly two candidates"):
            ss.acceptance(SPECHUB, [0.5, 0.5], [0.5, 0.5], k)


# --------------------------------------------------------------------------- closed forms
def acceptance_by_enumeration(scheme, target, draft, shape):
    """P(first emitted token is one of the root's drafted candidates), by exact enumeration."""
    result = 0
    for tree, weight, verdicts in scheme.outcomes(Stationary(target, draft), shape, ()):
        drafted = {tree.tokens[c] for c in tree.candidates[0]}
        for verdict, prob in verdicts.items():
            first = tree.prefix(verdict.node)[0] if verdict.node else verdict.token
            if first in drafted:
                result += weight * prob
    return result


def _single_positions():
    rows = [(Random(v, seed, exact=True), v, seed) for v in (2, 3, 4, 5) for seed in SEEDS]
    pairs = [(pair.target(()), pair.draft(())) for pair, _, _ in rows]
    return pairs + [tuple(np.array(x, dtype=object) for x in row) for row in EDGE.values()]


def test_closed_forms_equal_enumeration_exactly():
    for target, draft in _single_positions():
        for k in (1, 2, 3, 4):
            expected = acceptance_by_enumeration(GREEDY, target, draft, Shape.greedy((k,)))
            assert greedy_acceptance(target, draft, k) == expected, (target, draft, k)
            assert ss.acceptance(GREEDY, target, draft, k) == expected
        expected = acceptance_by_enumeration(SPECHUB, target, draft, Shape.hub())
        assert spechub_acceptance(target, draft) == expected, (target, draft)
        assert ss.acceptance(SPECHUB, target, draft, 2) == expected


def lp_optimum(shape, target, draft):
    """Max-flow form of the OT LP for ``shape``'s own tuple law at one position (HiGHS)."""
    tuples = [
        ({tree.tokens[c] for c in tree.candidates[0]}, float(weight))
        for tree, weight in shape.enumerate(Stationary(target, draft))
    ]
    vocab, num = len(target), len(tuples)
    gain = np.zeros((num, vocab))
    rows = np.zeros((num + vocab, num * vocab))
    for j, (drafted, _) in enumerate(tuples):
        gain[j, sorted(drafted)] = 1.0
        rows[j, j * vocab : (j + 1) * vocab] = 1.0  # sum_y pi(x, y) <= Q(x)
    for y in range(vocab):
        rows[num + y, y::vocab] = 1.0  # sum_x pi(x, y) <= p(y)
    bounds = np.array([w for _, w in tuples] + list(target), dtype=float)
    result = linprog(-gain.ravel(), A_ub=rows, b_ub=bounds, bounds=(0, None), method="highs")
    assert result.status == 0, result.message
    return -result.fun


def _float_positions(num=60, seed=7):
    rng = np.random.default_rng(seed)
    for i in range(num):
        vocab = int(rng.integers(2, 6))
        target, draft = rng.dirichlet(np.full(vocab, 0.7)), rng.dirichlet(np.full(vocab, 0.7))
        if i % 3 == 0:
            target[rng.integers(vocab)] = 0.0
        if i % 4 == 0:
            draft[rng.integers(vocab)] = 0.0
        yield target / target.sum(), draft / draft.sum()
    for target, draft in EDGE.values():
        yield np.array(_floats(target)), np.array(_floats(draft))


def test_closed_forms_attain_the_lp_optimum_of_their_own_draft_law():
    for target, draft in _float_positions():
        for k in (2, 3):
            optimum = lp_optimum(Shape.greedy((k,)), target, draft)
            assert abs(greedy_acceptance(target, draft, k) - optimum) <= 1e-9, (target, draft, k)
        optimum = lp_optimum(Shape.hub(), target, draft)
        assert abs(spechub_acceptance(target, draft) - optimum) <= 1e-9, (target, draft)


def test_closed_forms_are_vectorised_over_large_vocabularies():
    rng = np.random.default_rng(0)
    target, draft = rng.dirichlet(np.full(150_000, 0.1)), rng.dirichlet(np.full(150_000, 0.1))
    standard = ss.calculators.standard_acceptance(target, draft)
    assert greedy_acceptance(target, draft, 1) == pytest.approx(standard, abs=1e-12)
    alphas = [greedy_acceptance(target, draft, k) for k in (2, 4, 8)]
    assert standard <= alphas[0] <= alphas[1] <= alphas[2] <= 1
    assert standard <= spechub_acceptance(target, draft) <= 1


# Golden table, column "Greedy (Hu)": A, A3, D (T exhausts supp q), E.
GREEDY_GOLDEN = {
    "A": ((F(1, 2), F(1, 3), F(1, 6)), (F(1, 3),) * 3, 2, F(1)),
    "A3": ((F(1, 2), F(1, 3), F(1, 6)), (F(1, 3),) * 3, 3, F(1)),
    "D": ((F(1), F(0)), (F(0), F(1)), 2, F(0)),
    "E": ((F(7, 10), F(2, 10), F(1, 10)), (F(7, 10), F(2, 10), F(1, 10)), 2, F(1)),
}


@pytest.mark.parametrize("row", sorted(GREEDY_GOLDEN))
def test_greedy_golden_rows(row):
    target, draft, k, value = GREEDY_GOLDEN[row]
    assert ss.acceptance(GREEDY, target, draft, k) == value
    assert acceptance_by_enumeration(GREEDY, target, draft, Shape.greedy((k,))) == value
    assert greedy_acceptance(_floats(target), _floats(draft), k) == pytest.approx(float(value))


def test_spechub_equals_greedy_with_two_drafts_in_round_law():
    """Both laws draft the hub a = argmax q and one i ~ norm(q without a) (as an unordered pair),
    and both verifiers descend into i with min(p(i), q'(i)) and into a with p(a): same rounds."""
    for depth in (1, 2):
        greedy_shape, hub_shape = Shape.greedy((2,) * depth), Shape.hub(depth)
        pairs = [Random(v, seed, exact=True) for v in (2, 3, 4) for seed in SEEDS]
        for pair in pairs + [Stationary(*row) for row in EDGE.values()]:
            law = ss.round_law(SPECHUB, pair, hub_shape)
            assert law == ss.round_law(GREEDY, pair, greedy_shape), pair
    for target, draft in _single_positions():
        assert spechub_acceptance(target, draft) == greedy_acceptance(target, draft, 2)


def test_ties_follow_the_shape_lowest_id_first():
    draft = np.array([F(1, 6), F(1, 3), F(1, 6), F(1, 3)], dtype=object)
    assert list(top_tokens(draft, 2)) == [False, True, False, True]
    assert list(np.flatnonzero(top_tokens(draft, 3))) == [0, 1, 3]
    trees = list(Shape.greedy((3,)).enumerate(Stationary(draft, draft)))
    assert all(tree.tokens[1:3] == (1, 3) for tree, _ in trees)


# --------------------------------------------------------------------------- exhausted supports
def test_greedy_when_top_tokens_exhaust_the_draft_support():
    target, draft = EDGE["two_supported"]
    pair = Stationary(target, draft)
    for k in (2, 3, 4):
        trees = list(Shape.greedy((k,)).enumerate(pair))
        assert len(trees) == 1 and trees[0][1] == 1  # no random draft is left to draw
        tree = trees[0][0]
        assert sorted(tree.tokens[1:]) == [1, 3]
        # NSS at the root (y ~ p, hits descend), then a bonus y ~ p below each hit.
        law = GREEDY.verdict_law(tree, *tables(pair, tree))
        expected = {ss.Verdict(0, 0): F(1, 4), ss.Verdict(0, 2): F(1, 4)}
        expected |= {ss.Verdict(c, t): F(1, 16) for c in (1, 2) for t in range(4)}
        assert law == expected
        assert greedy_acceptance(target, draft, k) == F(1, 2) == target[1] + target[3]
        float_value = greedy_acceptance(_floats(target), _floats(draft), k)
        assert float_value == pytest.approx(0.5) and np.isfinite(float_value)


def test_spechub_with_a_one_hot_draft_has_one_candidate():
    target, draft = EDGE["q_one_hot"]
    pair = Stationary(target, draft)
    for shape in HUB_SHAPES:
        trees = list(shape.enumerate(pair))
        assert len(trees) == 1 and trees[0][0].candidates[0] == (1,)
    assert spechub_acceptance(target, draft) == F(1, 2)
    assert ss.acceptance(SPECHUB, target, draft, 2) == F(1, 2)
    assert spechub_acceptance(_floats(target), _floats(draft)) == pytest.approx(0.5)


def test_spechub_refuses_a_pair_without_the_hub():
    pair = Stationary([0.25] * 4, [0.4, 0.3, 0.2, 0.1])
    tree = ss.DraftTree.from_draws([(0, 1), (0, 2)], law="hub")
    with pytest.raises(ValueError, match="hub"):
        SPECHUB.verdict_law(tree, *tables(pair, tree))
    tree = ss.DraftTree.from_draws([(0, 1), (0, 0), (0, 2)], law="hub")
    with pytest.raises(ValueError, match="3 candidates"):
        SPECHUB.verdict_law(tree, *tables(pair, tree))


def test_spechub_plan_on_the_spec_example():
    target, draft = (np.array(row, dtype=object) for row in EDGE["hub_step4"])
    plan = hub_plan(target, draft)
    assert plan.hub == 0 and list(plan.pair_second) == [0, F(1, 4), F(1, 4)]
    assert list(plan.sent_first) == [0, F(1, 8), F(1, 8)] and total(plan.sent_second) == 0
    assert plan.hub_second == (F(3, 4), F(1, 2)) and plan.hub_first == (F(1, 4), F(1, 4))
    assert total(plan.leftover) == 0 and spechub_acceptance(target, draft) == 1


# --------------------------------------------------------------------------- mutants
class GreedyTestsAgainstFullDraft(Greedy):
    """Mutant: accept test and residual use the unrestricted q instead of q' = norm(q on V∖T)."""

    name = "mutant-greedy-full-draft"

    def split(self, tree, node, draft):
        split = super().split(tree, node, draft)
        return None if split is None else split._replace(rest=draft)


class GreedyResidualDropsT(Greedy):
    """Mutant: the residual forgets p on T, norm((p − q')_+ on V∖T) (T hits become impossible)."""

    name = "mutant-greedy-residual-drops-t"

    def residual(self, target, split):
        weights = np.where(split.deterministic, 0 * target, positive_part(target - split.rest))
        return normalise(weights) if total(weights) > 0 else target


class SpecHubSkipsStep4(SpecHub):
    """Mutant: leftovers of pairs (i, a) never go to the hub, yet p'' still excludes that mass."""

    name = "mutant-spechub-skips-step-4"

    def plan(self, target, draft):
        return hub_plan(target, draft)._replace(hub_first=(0 * target[0], 1))


MUTANTS = [
    (GreedyTestsAgainstFullDraft(), Shape.greedy((2,)), "uniform_draft"),
    (GreedyResidualDropsT(), Shape.greedy((2,)), "ties"),
    (SpecHubSkipsStep4(), Shape.hub(), "hub_step4"),
]


@pytest.mark.parametrize(("mutant", "shape", "edge"), MUTANTS, ids=[m.name for m, _, _ in MUTANTS])
def test_mutant_is_caught_and_its_twin_is_not(mutant, shape, edge):
    pair = Stationary(*EDGE[edge])
    twin = GREEDY if isinstance(mutant, Greedy) else SPECHUB
    assert ss.lossless_error(mutant, pair, shape) > F(1, 50)
    assert ss.lossless_error(twin, pair, shape) == 0
    caught = [ss.lossless_error(mutant, Random(4, s, exact=True), shape) > 0 for s in SEEDS]
    assert any(caught)


def test_residual_over_all_tokens_is_not_a_mutant():
    """(p − q')_+ over *all* tokens equals p on T (q' vanishes there): the same verifier."""

    class OverAllTokens(Greedy):
        name = "greedy-residual-over-all-tokens"

        def residual(self, target, split):
            return residual(target, split.rest)

    for seed in SEEDS:
        pair = Random(4, seed, exact=True)
        shape = Shape.greedy((3,))
        assert ss.round_law(OverAllTokens(), pair, shape) == ss.round_law(GREEDY, pair, shape)


def test_step_4_equals_a_residual_hit_on_the_hub():
    """Skipping step 4 *consistently* (its mass left in p'') is the same verifier in law:
    the residual lands on the hub, a drafted child, with exactly step 4's probability."""

    class Consistent(SpecHub):
        name = "spechub-step-4-by-residual-hit"

        def plan(self, target, draft):
            plan = hub_plan(target, draft)
            leftover = plan.leftover.copy()
            leftover[plan.hub] = plan.hub_first[0]
            return plan._replace(hub_first=(0 * target[0], 1), leftover=leftover)

    for seed in SEEDS:
        pair = Random(4, seed, exact=True)
        assert ss.round_law(Consistent(), pair, Shape.hub()) == ss.round_law(
            SPECHUB, pair, Shape.hub()
        )


# --------------------------------------------------------------------------- verify vs law
NUM_VERIFY = 20_000
MIN_EXPECTED = 5.0
FALSE_POSITIVE_BUDGET = 1e-4
VERIFY_CASES = [
    (GREEDY, Shape.greedy((3, 2)), Stationary([0.3, 0.1, 0.35, 0.25], [0.4, 0.3, 0.05, 0.25])),
    (GREEDY, Shape.greedy((2,)), Stationary([0.2, 0.5, 0.3], [0.5, 0.3, 0.2])),
    (GREEDY, Shape.greedy((3,)), _float_pair(EDGE["two_supported"])),
    (SPECHUB, Shape.hub(2), Stationary([0.3, 0.1, 0.35, 0.25], [0.4, 0.3, 0.05, 0.25])),
    (SPECHUB, Shape.hub(1), _float_pair(EDGE["hub_step4"])),
    (SPECHUB, Shape.hub(1), _float_pair(EDGE["q_one_hot"])),
]
ALPHA = FALSE_POSITIVE_BUDGET / len(VERIFY_CASES)  # per test, Bonferroni


def chi_square_pvalue(counts, law):
    """Pearson's chi-square p-value of ``counts`` against ``law``, bins merged to >= 5."""
    total_count = sum(counts.values())
    assert set(counts) <= {key for key, prob in law.items() if prob > 0}, "stray outcome"
    observed, expected = [], []
    bin_obs, bin_exp = 0, 0.0
    for key, prob in sorted(law.items(), key=lambda item: float(item[1])):
        bin_obs, bin_exp = bin_obs + counts.get(key, 0), bin_exp + float(prob) * total_count
        if bin_exp >= MIN_EXPECTED:
            observed.append(bin_obs)
            expected.append(bin_exp)
            bin_obs, bin_exp = 0, 0.0
    if expected:
        observed[-1] += bin_obs
        expected[-1] += bin_exp
    if len(expected) < 2:
        return 1.0
    expected = np.array(expected) * sum(observed) / sum(expected)
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("index", range(len(VERIFY_CASES)))
def test_verify_matches_verdict_law_given_the_tree(index):
    scheme, shape, pair = VERIFY_CASES[index]
    rng = np.random.default_rng(20250219 + index)
    tree = shape.draft(pair, rng)
    target_probs, draft_probs = tables(pair, tree)
    law = scheme.verdict_law(tree, target_probs, draft_probs)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    for value in (0.0, LARGEST_BELOW_ONE):  # boundary uniforms stay in the law's support
        noise = Noise.constant(value, tree.num_nodes)
        verdict = scheme.verify(tree, target_probs, draft_probs, noise)
        assert law.get(verdict, 0) > 0, (verdict, value)
    counts = Counter(
        scheme.verify(tree, target_probs, draft_probs, Noise.draw(rng, tree.num_nodes))
        for _ in range(NUM_VERIFY)
    )
    assert chi_square_pvalue(counts, law) > ALPHA, (scheme.name, shape)
