"""ResiSpec residual shaping (specsampling/schemes/resispec.py): exactness, members, contract.

Checked here:

* losslessness of every policy on i.i.d. and without-replacement shapes, exactly (``Fraction``:
  error ``== 0``) and in float64 (``<= 1e-12``);
* the family's members: greedy == SpecInfer (i.i.d.) and == RSD (without replacement), constant
  ratio at rho* == SpecTr K-SEQ, round laws and sampled verdicts alike;
* closed form == exact enumeration; the optimised default between SpecInfer/SpecTr and the LP
  optimum; goldens where shaping beats both (and reaches the optimum);
* the contract: a_k > t_k raises (never clamped), a policy cannot see later candidates, and
  mutants that break either half are caught by the exact law.

Goldens (exact): p = (1/3, 2/3), q = (2/3, 1/3): SpecInfer 7/9 and 23/27, SpecTr 0.811420 and
0.896576, ResiSpec 8/9 and 1 (= the LP optimum) for k = 2 and 3, and E[tokens per round] 209/81
on two i.i.d. paths of length 2 (SpecInfer 7/3, SpecTr 2.405487); p = (1/2, 1/3, 1/6), q
uniform, k = 2: SpecInfer 8/9, SpecTr 0.924764, ResiSpec 679/720 = 0.943056.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest
from scipy import stats

import specsampling as ss
from specsampling import DraftTree, Noise, Shape
from specsampling.calculators import specinfer_acceptance
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.pairs import Random, Stationary
from specsampling.schemes import resispec_optimise, tables
from specsampling.schemes.resispec import (
    SCHEME,
    ConfidenceDamping,
    ConstantRatio,
    Greedy,
    Optimised,
    Policy,
    ResiSpec,
    Stage,
    check_sub_target,
    optimise,
    resispec_acceptance,
)
from specsampling.schemes.rsd import SCHEME as RSD
from specsampling.schemes.specinfer import SCHEME as SPECINFER
from specsampling.schemes.spectr import SCHEME as SPECTR
from specsampling.schemes.spectr import spectr_acceptance

FLOAT_TOLERANCE = 1e-12
POLICIES = {
    "greedy": Greedy(),
    "ratio": ConstantRatio(),
    "tempering": ConfidenceDamping(scale=F(1, 2)),
    "top1": ConfidenceDamping(scale=(F(0), F(3, 4)), top=1),
    "optimised": Optimised(),
}
SHAPES = [
    Shape.chain(2),
    Shape.star(2),
    Shape.star(3),
    Shape.star(2, replacement=False),
    Shape.star(3, replacement=False),
    Shape.paths(2, 2),
    Shape.branching((2, 2)),
    Shape.delayed(2, trunk=1, branch=1),
]
IID_STARS = [Shape.star(2), Shape.star(3)]
WO_SHAPES = [Shape.star(2, replacement=False), Shape.star(3, replacement=False)]
WO_SHAPES += [Shape.branching((2, 2))]
PAIRS = [(3, 1), (3, 4), (4, 2)]
TOY = ([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
THIRDS = ([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3)


def _floats(values):
    return [float(x) for x in values]


def enumerated_acceptance(scheme, target, draft, num_drafts, replacement=True):
    """P(first emitted token is a drafted root token), summed over ``scheme.outcomes``."""
    total = 0
    shape = Shape.star(num_drafts, replacement=replacement)
    for tree, weight, verdicts in scheme.outcomes(Stationary(target, draft), shape, ()):
        drafted = {tree.tokens[child] for child in tree.candidates[0]}
        for (node, token), prob in verdicts.items():
            if (*tree.prefix(node), token)[0] in drafted:
                total = total + weight * prob
    return total


def random_rows(seeds, vocab=4, exact=True):
    for seed in seeds:
        pair = Random(vocab, seed=seed, exact=exact)
        yield pair.target(()), pair.draft(())


# --------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("shape", SHAPES, ids=repr)
@pytest.mark.parametrize("name", list(POLICIES))
def test_lossless_exact(name, shape):
    scheme = ResiSpec(POLICIES[name])
    for vocab, seed in PAIRS:
        assert ss.lossless_error(scheme, Random(vocab, seed=seed, exact=True), shape) == 0
    assert ss.lossless_error(scheme, Stationary(*TOY), shape) == 0


@pytest.mark.parametrize("shape", SHAPES, ids=repr)
@pytest.mark.parametrize("name", list(POLICIES))
def test_lossless_float(name, shape):
    scheme = ResiSpec(POLICIES[name])
    for vocab, seed in [*PAIRS, (2, 0), (4, 7)]:
        pair = Random(vocab, seed=seed)
        assert ss.lossless_error(scheme, pair, shape) <= FLOAT_TOLERANCE, (vocab, seed)


def test_default_scheme_and_degenerate_pairs():
    assert SCHEME.name == "resispec" and isinstance(SCHEME.policy, Optimised)
    assert SCHEME.rational
    equal = [F(7, 10), F(2, 10), F(1, 10)]
    disjoint = ([F(1), F(0)], [F(0), F(1)])
    for shape in (Shape.star(3), Shape.star(3, replacement=False), Shape.paths(2, 2)):
        for pair in (Stationary(equal, equal), Stationary(*disjoint)):
            assert ss.lossless_error(SCHEME, pair, shape) == 0
    assert resispec_acceptance(equal, equal, 3) == 1  # p == q: stage 1 accepts surely
    assert resispec_acceptance(*disjoint, 3) == 0


def test_certain_stage_guard():
    """1 - sum m_k <= 0: the stage accepts with probability 1 and no division happens."""
    equal = np.array([F(1, 2), F(1, 4), F(1, 4)], dtype=object)
    checks, _ = SCHEME.plan(equal, equal, (0, 1, 0), replacement=True)
    assert checks == [(F(1, 2), F(1, 2))]  # m = q: the drafted token's own check, ratio 1
    tree = DraftTree.from_draws([(0, 0), (0, 1), (0, 0)], law="iid")
    probs = np.stack([equal] * tree.num_nodes), np.stack([equal] * tree.num_nodes)
    descend, stop = SCHEME.node_law(tree, 0, *probs)
    assert descend == [(1, 1)] and not any(stop)
    floats = np.array([0.5, 0.25, 0.25])
    assert ResiSpec(Greedy()).plan(floats, floats, (2, 1), replacement=True)[0] == [(0.25, 0.25)]


# --------------------------------------------------------------------------- members
@pytest.mark.parametrize("shape", [Shape.chain(2), *IID_STARS, Shape.paths(2, 2)], ids=repr)
def test_greedy_is_specinfer(shape):
    scheme = ResiSpec(Greedy())
    for vocab, seed in PAIRS:
        pair = Random(vocab, seed=seed, exact=True)
        assert ss.round_law(scheme, pair, shape) == ss.round_law(SPECINFER, pair, shape)
    rng = np.random.default_rng(0)
    pair = Random(4, seed=3)
    for tree, _ in shape.enumerate(pair):
        probs = tables(pair, tree)
        for _ in range(3):
            noise = Noise.draw(rng, tree.num_nodes)
            assert scheme.verify(tree, *probs, noise) == SPECINFER.verify(tree, *probs, noise)


@pytest.mark.parametrize("shape", WO_SHAPES, ids=repr)
def test_greedy_without_replacement_is_rsd(shape):
    scheme = ResiSpec(Greedy())
    for vocab, seed in PAIRS:
        pair = Random(vocab, seed=seed, exact=True)
        assert ss.round_law(scheme, pair, shape) == ss.round_law(RSD, pair, shape)
    direct = ResiSpec(Greedy())
    rng = np.random.default_rng(1)
    pair = Random(4, seed=3)
    for tree, _ in shape.enumerate(pair):
        probs = tables(pair, tree)
        assert direct.verdict_law(tree, *probs).keys() == RSD.verdict_law(tree, *probs).keys()
        for _ in range(3):
            noise = Noise.draw(rng, tree.num_nodes)
            assert direct.verify(tree, *probs, noise) == RSD.verify(tree, *probs, noise)


@pytest.mark.parametrize("shape", [*IID_STARS, Shape.paths(2, 2)], ids=repr)
def test_constant_ratio_is_spectr(shape):
    scheme = ResiSpec(ConstantRatio())
    for vocab, seed in [*PAIRS, (4, 5)]:
        pair = Random(vocab, seed=seed, exact=True)
        assert ss.round_law(scheme, pair, shape) == ss.round_law(SPECTR, pair, shape)
        pair = Random(vocab, seed=seed)
        ours, theirs = ss.round_law(scheme, pair, shape), ss.round_law(SPECTR, pair, shape)
        assert max(abs(ours.get(o, 0) - theirs.get(o, 0)) for o in {*ours, *theirs}) <= 1e-12
    for target, draft in random_rows(range(10)):
        for k in (2, 3):
            assert resispec_acceptance(target, draft, k, ConstantRatio()) == spectr_acceptance(
                target, draft, k
            )


# --------------------------------------------------------------------------- acceptance
@pytest.mark.parametrize("name", list(POLICIES))
def test_closed_form_is_enumeration(name):
    scheme = ResiSpec(POLICIES[name])
    rows = [THIRDS, TOY, *random_rows(range(8))]
    for target, draft in rows:
        for k in (1, 2, 3):
            closed = resispec_acceptance(target, draft, k, POLICIES[name])
            assert closed == enumerated_acceptance(scheme, target, draft, k)
            assert ss.acceptance(scheme, target, draft, k) == closed
    for target, draft in random_rows(range(3), exact=False):
        closed = resispec_acceptance(target, draft, 2, POLICIES[name])
        assert abs(closed - enumerated_acceptance(scheme, target, draft, 2)) <= 1e-12


def test_optimised_between_members_and_optimum():
    for exact in (True, False):
        for target, draft in random_rows(range(25), vocab=5, exact=exact):
            for k in (2, 3, 4):
                value = resispec_acceptance(target, draft, k)
                slack = 0 if exact else FLOAT_TOLERANCE
                assert value >= specinfer_acceptance(target, draft, k) - slack
                assert value >= spectr_acceptance(target, draft, k) - slack
                assert value <= ss.optimal_acceptance(target, draft, k) + slack
                bound = sum(min(p, 1 - (1 - q) ** k) for p, q in zip(target, draft, strict=True))
                assert value <= bound + slack


def test_goldens_shaping_beats_rrs_and_spectr():
    expected = {2: (F(7, 9), 0.811420, F(8, 9)), 3: (F(23, 27), 0.896576, F(1))}
    for k, (rrs, spectr, ours) in expected.items():
        assert specinfer_acceptance(*TOY, k) == rrs
        assert abs(float(spectr_acceptance(*TOY, k)) - spectr) <= 5e-7
        assert resispec_acceptance(*TOY, k) == ours == ss.optimal_acceptance(*TOY, k)
        assert ss.acceptance(SCHEME, *TOY, k) == ours
    choice = optimise(*TOY, 2)
    assert choice.policy == ConfidenceDamping(scale=F(0), threshold=F(2, 3))
    paths = Shape.paths(2, 2)  # tree: E[tokens per round] 209/81 vs 7/3 (SpecInfer), 2.405487
    assert ss.expected_emitted(SCHEME, Stationary(*TOY), paths) == F(209, 81)
    assert resispec_acceptance(*THIRDS, 2) == F(679, 720)
    assert specinfer_acceptance(*THIRDS, 2) < spectr_acceptance(*THIRDS, 2) < F(679, 720)
    floats = resispec_acceptance(*map(_floats, THIRDS), 2)
    assert abs(floats - 679 / 720) <= FLOAT_TOLERANCE


def test_optimise_stays_rational_and_handles_k1():
    choice = optimise(*THIRDS, 3)
    assert isinstance(choice.acceptance, F)
    assert all(isinstance(v, F) for v in (choice.policy.scale, choice.policy.threshold))
    rho = ConstantRatio().at_node(*(np.array(x, dtype=object) for x in THIRDS), 2)
    assert isinstance(rho.rho, F)
    assert optimise(*THIRDS, 1).policy == Greedy()


def test_large_vocabulary_compressed_search(monkeypatch):
    rng = np.random.default_rng(5)
    logits = 2 * rng.standard_normal(6000)
    target = np.exp(logits) / np.exp(logits).sum()
    draft_logits = 0.7 * logits + rng.standard_normal(6000)
    draft = np.exp(draft_logits) / np.exp(draft_logits).sum()
    compressed = optimise(target, draft, 4)
    assert compressed.acceptance >= spectr_acceptance(target, draft, 4) - FLOAT_TOLERANCE
    assert compressed.acceptance >= specinfer_acceptance(target, draft, 4) - FLOAT_TOLERANCE
    rule = compressed.policy
    assert compressed.acceptance == resispec_acceptance(target, draft, 4, rule)
    monkeypatch.setattr(resispec_optimise, "COMPRESS_ABOVE", 10**9)
    full = optimise(target, draft, 4)
    assert compressed.acceptance >= full.acceptance - 1e-4


# --------------------------------------------------------------------------- the contract
class AlwaysTarget(Policy):
    """Mutant: a_k = p at every stage. a_k <= p holds at every stage, a_k <= t_k does not."""

    def sub_target(self, stage):
        return stage.target


class Inflated(Policy):
    """a_k = t_k (1 + eps): a rounding-sized excess is clamped, a real one raises."""

    oblivious = True

    def __init__(self, eps):
        self.eps = eps

    def sub_target(self, stage):
        return stage.current * (1 + self.eps)


def test_over_target_raises_never_clamped():
    pair = Random(3, seed=1, exact=True)
    for shape in (Shape.star(2), Shape.star(2, replacement=False), Shape.paths(2, 2)):
        with pytest.raises(ValueError, match=r"AlwaysTarget.*candidate 2 of 2: a_k > t_k"):
            ss.lossless_error(ResiSpec(AlwaysTarget()), pair, shape)
    with pytest.raises(ValueError, match="a_k > t_k"):
        resispec_acceptance(*THIRDS, 2, Inflated(F(1, 10**12)))
    floats = Random(3, seed=1)
    with pytest.raises(ValueError, match="a_k > t_k"):
        ss.lossless_error(ResiSpec(Inflated(1e-9)), floats, Shape.star(2))
    assert ss.lossless_error(ResiSpec(Inflated(1e-15)), floats, Shape.star(2)) <= 1e-12
    with pytest.raises(ValueError, match="must lie in"):
        ConfidenceDamping(scale=F(3, 2))


def test_check_sub_target_rejects_malformed_values():
    current = np.array([0.5, 0.5])
    stage = Stage(current, current, current, current, 1, 2, ())
    for bad, message in [
        (np.array([0.5, -1e-6]), "a_k < 0"),
        (np.array([np.nan, 0.5]), "a_k < 0"),
        (np.array([0.5]), "expected shape"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_sub_target(bad, stage, "mutant")
    exact = np.array([F(1, 2), F(1, 2)], dtype=object)
    stage = Stage(exact, exact, exact, exact, 1, 2, ())
    with pytest.raises(ValueError, match="exact"):
        check_sub_target(current, stage, "mutant")
    assert check_sub_target(exact, stage, "ok") is exact


class Recording(Policy):
    """Greedy, recording what each stage exposes."""

    def __init__(self):
        self.seen = []

    def sub_target(self, stage):
        self.seen.append((stage.index, stage.count, stage.earlier))
        with pytest.raises(ValueError, match="read-only"):
            stage.current[0] = 0
        return stage.current


def test_policy_sees_only_earlier_candidates():
    names = [f.name for f in dataclasses.fields(Stage)]
    assert names == ["target", "draft", "current", "proposal", "index", "count", "earlier"]
    pair = Random(3, seed=4, exact=True)
    for shape in (Shape.star(3), Shape.star(3, replacement=False)):
        for tree, _ in shape.enumerate(pair):
            policy = Recording()
            ResiSpec(policy).verdict_law(tree, *tables(pair, tree))
            tokens = tuple(tree.tokens[c] for c in tree.candidates[0])
            count = len(tokens)
            assert policy.seen == [(k, count, tokens[: k - 1]) for k in range(1, count + 1)]


class DampNext(Policy):
    """Mutant: damp the NEXT candidate's token (a valid sub-target, built from the future)."""

    def sub_target(self, stage):
        damped = stage.current.copy()
        if stage.index < stage.count:
            damped[stage.earlier[stage.index]] = 0 * damped[0]
        return damped


class Peeking(ResiSpec):
    """Mutant verifier: hands the policy every candidate, later ones included."""

    def stage(self, target, draft, current, proposal, index, tokens):
        stage = super().stage(target, draft, current, proposal, index, tokens)
        return dataclasses.replace(stage, earlier=tokens)


class Unchecked(ResiSpec):
    """Mutant verifier: skips the a_k <= t_k check."""

    def sub_target(self, rule, stage):
        return rule.sub_target(stage)


@pytest.mark.parametrize("shape", [*IID_STARS, Shape.star(2, replacement=False)], ids=repr)
def test_mutants_are_caught(shape):
    errors = [
        ss.lossless_error(Peeking(DampNext()), Random(v, seed=s, exact=True), shape)
        for v, s in PAIRS
    ]
    assert max(errors) > 1e-9
    errors = [
        ss.lossless_error(Unchecked(AlwaysTarget()), Random(v, seed=s), shape) for v, s in PAIRS
    ]
    assert max(errors) > 1e-9
    # Through the real API the later candidate does not exist: the mutant policy cannot run.
    with pytest.raises(IndexError):
        ss.lossless_error(ResiSpec(DampNext()), Random(3, seed=1, exact=True), shape)


# --------------------------------------------------------------------------- proposal mode
def test_proposal_mode_follows_the_tree_law():
    """One registered object, no per-call configuration: the tree's law picks the proposals."""
    scheme = ResiSpec(Greedy())
    assert not hasattr(scheme, "replacement") and not hasattr(scheme, "for_shape")
    assert scheme.single_shape(2) == Shape.star(2)
    # The same tokens drawn i.i.d. or without replacement have different verdict laws.
    pair = Stationary([F(1, 2), F(3, 10), F(1, 5)], [F(1, 5), F(1, 5), F(3, 5)])
    drawn = [(0, 2), (0, 1)]
    iid_tree = DraftTree.from_draws(drawn, law="iid")
    wo_tree = DraftTree.from_draws(drawn, law="without")
    iid = scheme.verdict_law(iid_tree, *tables(pair, iid_tree))
    wo = scheme.verdict_law(wo_tree, *tables(pair, wo_tree))
    # x1 = 2 is rejected w.p. 2/3; then x2 = 1 is accepted w.p. 1 (q_2 = q) or 1/2
    # (q_2 = (1/2, 1/2, 0)), the rest of the w/o law going to the residual token 0.
    assert (0, 0) not in iid and wo[(0, 0)] == F(1, 3)
    assert wo == RSD.verdict_law(wo_tree, *tables(pair, wo_tree))
    for law in ("deterministic", "unknown", "greedy", "hub"):
        tree = DraftTree.from_draws(drawn, law=law)
        with pytest.raises(ss.UnsupportedShape, match=f"law '{law}'"):
            scheme.verdict_law(tree, *tables(pair, tree))


def test_oblivious_flag_gates_the_closed_form():
    class ReadsEarlier(Greedy):
        oblivious = False

    with pytest.raises(ValueError, match="no closed form"):
        resispec_acceptance(*THIRDS, 2, ReadsEarlier())
    scheme = ResiSpec(ReadsEarlier())
    assert ss.acceptance(scheme, *THIRDS, 2) == F(8, 9)  # by enumeration


# --------------------------------------------------------------------------- sampling
def test_duplicates_get_independent_tests_when_sampled():
    """verify vs verdict_law on a tree with a repeated candidate (damping keeps repeats alive).

    Chi-square on counts, bins merged to expected >= 5, fixed seed; false-positive budget 1e-3.
    """
    target = np.array([0.5, 0.3, 0.2])
    draft = np.array([0.6, 0.3, 0.1])
    scheme = ResiSpec(ConfidenceDamping(scale=0.25))
    tree = DraftTree.from_draws([(0, 0), (0, 0), (0, 1)], law="iid")
    probs = np.stack([target] * 3), np.stack([draft] * 3)
    law = scheme.verdict_law(tree, *probs)
    rng = np.random.default_rng(7)
    draws = 20_000
    counts = Counter(scheme.verify(tree, *probs, Noise.draw(rng, 3)) for _ in range(draws))
    assert set(counts) <= set(law)
    keys = sorted(law, key=lambda v: law[v])
    observed, expected, bucket = [], [], [0, 0.0]
    for key in keys:
        bucket = [bucket[0] + counts.get(key, 0), bucket[1] + draws * float(law[key])]
        if bucket[1] >= 5:
            observed.append(bucket[0])
            expected.append(bucket[1])
            bucket = [0, 0.0]
    observed[-1] += bucket[0]
    expected[-1] += bucket[1]
    assert len(observed) >= 3
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_sure_stage_still_checks_the_drafted_token():
    """Regression (found by the CI hypothesis profile): q = (1e-21, 1) sums to 1.0 in float64,
    so the stage keeps all mass (sum m = 1) while the drafted token 0 has p = 0 and m = 0. The
    sure-accept shortcut accepted it; the drafted token's own check must reject it."""
    pair = ss.pairs.Table(
        {
            (): ([0.0, 1.0], [9.99999998999e-22, 1.0]),
            (0,): ([0.5, 0.5], [0.5, 0.5]),
            (1,): ([0.5, 0.5], [0.5, 0.5]),
        }
    )
    tree = DraftTree.chain([0], law="iid")
    target_probs, draft_probs = tables(pair, tree)
    scheme = ss.SCHEMES["resispec"]
    for value in (0.0, LARGEST_BELOW_ONE):
        verdict = scheme.verify(tree, target_probs, draft_probs, Noise.constant(value, 2))
        assert verdict == ss.Verdict(0, 1)
    assert scheme.verdict_law(tree, target_probs, draft_probs) == {ss.Verdict(0, 1): 1.0}
    assert ss.lossless_error(scheme, pair, ss.Shape.chain(1)) <= 1e-12
