"""Regressions, for the reference, of correctness bugs reported against peer libraries.

Strict accept test and CDF boundaries (sgl-project/sglang#35771); token ids in range at the top
of [0, 1) and over large vocabularies with a zero tail (sgl-project/sglang#30822,
vllm-project/vllm#44744); the zero-mass residual (SGLang's, FlashInfer's and vLLM's fallbacks);
inputs never mutated (vllm-project/vllm-ascend#2881); API smoke over the registry
(FasterDecoding/Medusa, ``medusa/model/utils.py``); plus ``ss.generate`` and our own: a
duplicate's uniform after a rejection by rounding at acceptance 1.
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from proofs_tests.oracles import BOUNDARY_EXPONENTIALS, ConstantKeyedNoise
from specsampling import DraftTree, Noise, Shape, calculators
from specsampling.keyed import KeyedNoise
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.ops import accepts, categorical, residual
from specsampling.pairs import Random, Stationary
from specsampling.schemes import tables

SCHEMES = sorted(ss.SCHEMES)
SHAPES = LAW_SHAPES
SUPPORTED = [
    (name, shape) for name in SCHEMES for shape in SHAPES if ss.SCHEMES[name].supports(shape)
]
#: Keyed couplings have no per-node ``verify``: tree and verdict come from one keyed field
#: (their boundary checks: proofs_tests/test_lossless.py, keyed_boundary_violations).
KEYED = {name for name, s in ss.SCHEMES.items() if isinstance(s, ss.schemes.KeyedCoupling)}
VERIFIED = [(name, shape) for name, shape in SUPPORTED if name not in KEYED]


def _noise(accept, sample):
    return Noise.checked(accept, sample, len(accept))


# ------------------------------------------------------------------ sgl-project/sglang#35771


def test_accept_test_is_strict():
    assert accepts(0.0, 0.0, 0.5) is False  # p(x) = 0 never accepts, even at u = 0
    assert accepts(0.0, 0.0, 0.0) is False
    assert accepts(0.5, 0.25, 0.5) is False  # u * q == p exactly: reject
    assert accepts(np.nextafter(0.5, 0), 0.25, 0.5) is True
    assert accepts(LARGEST_BELOW_ONE, 0.5, 0.5) is True  # p >= q always accepts
    assert accepts(LARGEST_BELOW_ONE, 1e-300, 0.0) is True  # q = 0 < p accepts
    assert accepts(0.5, F(1, 4), F(1, 2)) is False


@pytest.mark.parametrize("name", ["standard", "specinfer", "rsd"])
def test_zero_target_token_rejected_at_u_zero(name):
    """Draft token 1 has p = 0 < q: rejected with u = 0, and the correction is never token 1."""
    target, draft = np.array([0.5, 0.0, 0.5]), np.array([0.2, 0.6, 0.2])
    pair = Stationary(target, draft)
    tree = DraftTree.chain([1], law="iid")
    for u_sample in (0.0, 0.3, 0.5, LARGEST_BELOW_ONE):
        verdict = ss.SCHEMES[name].verify(tree, *tables(pair, tree), _noise([0, 0], [u_sample] * 2))
        assert verdict.node == 0
        assert verdict.token in (0, 2)


@pytest.mark.parametrize("name", ["standard", "specinfer", "rsd"])
def test_accept_boundary_through_verify(name):
    pair = Stationary([F(1, 4), F(3, 4)], [F(1, 2), F(1, 2)])
    tree = DraftTree.chain([0], law="iid")
    tp, dp = tables(pair, tree)
    scheme = ss.SCHEMES[name]
    assert scheme.verify(tree, tp, dp, _noise([0, 0.5], [0, 0])).node == 0  # 0.5 * 1/2 == 1/4
    assert scheme.verify(tree, tp, dp, _noise([0, np.nextafter(0.5, 0)], [0, 0])).node == 1


def test_categorical_half_open_cdf_intervals():
    probs = np.array([0.25, 0.25, 0.5])
    assert [categorical(probs, u) for u in (0.0, 0.2499, 0.25, 0.4999, 0.5)] == [0, 0, 1, 1, 2]
    assert categorical(probs, LARGEST_BELOW_ONE) == 2
    gap = np.array([0.5, 0.0, 0.0, 0.5])
    assert categorical(gap, 0.5) == 3  # the boundary skips zero-mass tokens
    exact = np.array([F(1, 3), F(0), F(2, 3)], dtype=object)
    assert [categorical(exact, u) for u in (0.0, 1 / 3 - 1e-12, 0.34, LARGEST_BELOW_ONE)] == [
        0,
        0,
        2,
        2,
    ]


@pytest.mark.parametrize(("name", "shape"), VERIFIED, ids=repr)
@pytest.mark.parametrize("value", [0.0, LARGEST_BELOW_ONE], ids=["u=0", "u=max"])
def test_constant_noise_gives_a_possible_verdict(name, shape, value):
    """At both ends of [0, 1) every verdict must be one the exact law gives positive mass."""
    scheme = ss.SCHEMES[name]
    pair = Random(3, seed=2, exact=True)
    for tree, _ in shape.enumerate(pair):
        tp, dp = tables(pair, tree)
        law = scheme.verdict_law(tree, tp, dp)
        verdict = scheme.verify(tree, tp, dp, Noise.constant(value, tree.num_nodes))
        assert law.get(verdict, 0) > 0, (tree, verdict)


# ------------------------------------------ vllm-project/vllm#44744, sgl-project/sglang#30822


@pytest.mark.parametrize("vocab_size", [8193, 10000, 151936])
def test_categorical_never_leaves_the_support(vocab_size):
    rng = np.random.default_rng(vocab_size)
    live = vocab_size - 37  # a zero tail that is not tile aligned
    probs = np.zeros(vocab_size)
    probs[:live] = rng.random(live) ** 4
    probs /= probs.sum()
    probs *= 1 - 1e-9  # mass slightly below one
    last_positive = int(np.flatnonzero(probs)[-1])
    for u in [0.0, 1e-300, 0.5, 1 - 1e-12, LARGEST_BELOW_ONE, *rng.random(50)]:
        token = categorical(probs, u)
        assert 0 <= token < vocab_size
        assert probs[token] > 0
    assert categorical(probs, LARGEST_BELOW_ONE) == last_positive


def test_categorical_clips_when_the_scaled_uniform_rounds_up_to_the_mass():
    """Subnormal mass: ``u * mass`` rounds to ``mass`` itself and searchsorted returns V."""
    probs = np.array([0.0, 5e-324, 0.0])
    assert categorical(probs, LARGEST_BELOW_ONE) == 1
    assert categorical(np.array([5e-324, 0.0]), LARGEST_BELOW_ONE) == 0


def test_categorical_single_live_token_at_the_end_and_start():
    for vocab_size in (8193, 151936):
        probs = np.zeros(vocab_size)
        probs[0] = 1.0
        assert categorical(probs, LARGEST_BELOW_ONE) == 0
        probs = np.zeros(vocab_size)
        probs[-1] = 1.0
        assert categorical(probs, 0.0) == vocab_size - 1


@pytest.mark.parametrize("vocab_size", [8193, 151936])
@pytest.mark.parametrize("name", SCHEMES)
def test_verify_on_large_vocabularies(name, vocab_size):
    rng = np.random.default_rng(1)
    target = np.zeros(vocab_size)
    target[: vocab_size // 2] = rng.random(vocab_size // 2)
    target /= target.sum()
    draft = rng.random(vocab_size)
    draft /= draft.sum()
    pair = Stationary(target, draft)
    drafted = vocab_size - 1  # in the target's zero tail: always rejected
    tree = DraftTree.chain([drafted], law="iid")
    tp, dp = tables(pair, tree)
    scheme = ss.SCHEMES[name]
    if name in KEYED:  # drafts come from the keyed race: the field's extremes and a real key
        for noise in (*(ConstantKeyedNoise(e) for e in BOUNDARY_EXPONENTIALS), KeyedNoise(3)):
            tree, verdict = scheme.sample_keyed(pair, Shape.chain(1), noise)
            assert 0 <= verdict.token < vocab_size and target[verdict.token] > 0
            assert all(draft[t] > 0 for t in tree.tokens[1:])
        return
    for value in (0.0, LARGEST_BELOW_ONE):
        verdict = scheme.verify(tree, tp, dp, Noise.constant(value, 2))
        assert 0 <= verdict.token < vocab_size
        assert verdict.node == 0 and target[verdict.token] > 0


# --------------------------------------------------------------------- zero-mass residual


def test_residual_of_equal_inputs_falls_back_to_the_target():
    target = np.array([0.7, 0.2, 0.1])
    out = residual(target, target.copy())
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, target)
    exact = np.array([F(1, 2), F(1, 2)], dtype=object)
    assert list(residual(exact, exact.copy())) == [F(1, 2), F(1, 2)]


def test_residual_with_tiny_differences():
    rng = np.random.default_rng(3)
    target = rng.random(1000)
    target /= target.sum()
    noisy = target * (1 + 1e-9 * rng.standard_normal(1000))
    out = residual(target, noisy)
    assert np.all(np.isfinite(out)) and np.all(out >= 0)
    assert abs(out.sum() - 1) < 1e-12
    assert np.all(out[target <= noisy] == 0)  # only tokens where p > q carry residual mass
    below = target * (1 - 1e-9)  # p < q everywhere: zero residual, fall back to p
    np.testing.assert_array_equal(residual(below, target), below)


NEAR_EQUAL = [
    ([0.7, 0.2, 0.1], [0.7, 0.2, 0.1]),
    ([0.7, 0.2, 0.1], [0.7 + 1e-9, 0.2 - 1e-9, 0.1]),
    ([0.7 + 1e-9, 0.2 - 1e-9, 0.1], [0.7, 0.2, 0.1]),
]


@pytest.mark.parametrize(("name", "shape"), SUPPORTED, ids=repr)
@pytest.mark.parametrize("rows", NEAR_EQUAL, ids=["equal", "draft-nudged", "target-nudged"])
def test_near_equal_inputs_stay_exact(name, shape, rows):
    pair = Stationary(*rows)
    for _, _, verdicts in ss.SCHEMES[name].outcomes(pair, shape, ()):
        assert all(np.isfinite(float(p)) and p >= 0 for p in verdicts.values())
    assert ss.lossless_error(name, pair, shape) < 1e-12


@pytest.mark.parametrize("name", SCHEMES)
def test_equal_exact_inputs_are_exactly_lossless(name):
    rows = [F(1, 2), F(1, 3), F(1, 6)]
    scheme = ss.SCHEMES[name]
    shape = scheme.single_shape(3) if scheme.supports(scheme.single_shape(3)) else Shape.chain(2)
    error = ss.lossless_error(name, Stationary(rows, rows), shape)
    assert error == 0 if scheme.rational else error < 1e-15
    if name in ("standard", "specinfer", "rsd"):  # NSS needs the target's own sample drafted
        assert ss.acceptance(name, rows, rows, 1 if name == "standard" else 2) == 1


# --------------------------------------------------------------- vllm-project/vllm-ascend#2881


def _snapshot(*arrays):
    return [
        (a.dtype, a.shape, a.tobytes() if a.dtype != object else list(a.ravel())) for a in arrays
    ]


@pytest.mark.parametrize(("name", "shape"), VERIFIED, ids=repr)
def test_verify_and_verdict_law_leave_inputs_untouched(name, shape):
    scheme = ss.SCHEMES[name]
    pair = Random(3, seed=2)
    rng = np.random.default_rng(0)
    for _ in range(10):
        tree = shape.draft(pair, rng)
        tp, dp = tables(pair, tree)
        noise = Noise.draw(rng, tree.num_nodes)
        before = _snapshot(tp, dp, noise.accept, noise.sample)
        scheme.verify(tree, tp, dp, noise)
        scheme.verdict_law(tree, tp, dp)
        assert _snapshot(tp, dp, noise.accept, noise.sample) == before


@pytest.mark.parametrize("exact", [False, True])
def test_single_position_calls_leave_inputs_untouched(exact):
    if exact:
        target = np.array([F(1, 2), F(1, 3), F(1, 6)], dtype=object)
        draft = np.array([F(1, 6), F(1, 3), F(1, 2)], dtype=object)
    else:
        target, draft = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    before = _snapshot(target, draft)
    for name, scheme in ss.SCHEMES.items():
        k = 2 if scheme.supports(scheme.single_shape(2)) else 1
        ss.acceptance(name, target, draft, k)
        ss.output_law(name, target, draft, k)
    calculators.standard_acceptance(target, draft)
    calculators.nss_acceptance(target, draft, 3)
    calculators.specinfer_acceptance(target, draft, 3)
    pair = Stationary(target, draft)
    calculators.chain_expected_accepted(pair, 2)
    ss.expected_emitted("specinfer", pair, Shape.paths(2, 2))
    ss.generate("specinfer", pair, Shape.star(2), 20, np.random.default_rng(0))
    assert _snapshot(target, draft) == before


# ----------------------------------------------------------------- FasterDecoding/Medusa API


@pytest.mark.parametrize("name", SCHEMES)
def test_every_scheme_method_is_callable(name):
    scheme = ss.SCHEMES[name]
    assert isinstance(scheme, ss.Scheme)
    assert scheme.name == name and ss.get_scheme(scheme) is scheme
    assert isinstance(scheme.reference, str) and scheme.reference
    assert isinstance(scheme.rational, bool)
    pair = Random(3, seed=2)
    for num_drafts in (1, 2, 3):
        single = scheme.single_shape(num_drafts)
        assert isinstance(single, Shape)
        closed = scheme.closed_acceptance(pair.target(()), pair.draft(()), num_drafts)
        assert closed is None or 0 <= closed <= 1 + 1e-12
        if scheme.supports(single):
            assert 0 <= ss.acceptance(scheme, pair.target(()), pair.draft(()), num_drafts) <= 1
        else:  # no multi-draft law (standard): refused, never silently run
            assert num_drafts > 1 and closed is None
            with pytest.raises(ss.UnsupportedShape):
                ss.acceptance(scheme, pair.target(()), pair.draft(()), num_drafts)
    for shape in SHAPES:
        assert isinstance(scheme.supports(shape), bool)
    shape = [s for n, s in SUPPORTED if n == name][-1]  # the widest supported shape
    rng = np.random.default_rng(0)
    tree, verdict = scheme.sample(pair, shape, rng, (1,))
    assert isinstance(tree, DraftTree) and isinstance(verdict, ss.Verdict)
    assert isinstance(verdict.node, int) and isinstance(verdict.token, int)
    tp, dp = tables(pair, tree, (1,))
    # Exactly one of the two families; a keyed coupling has no per-tree verify at all.
    assert isinstance(scheme, ss.schemes.TreeVerifier) != isinstance(
        scheme, ss.schemes.KeyedCoupling
    )
    if name in KEYED:
        assert not hasattr(scheme, "verify") and not hasattr(scheme, "verdict_law")
        assert isinstance(scheme.strong_invariance, bool) and scheme.rows(shape) >= 1
        keyed_tree, keyed_verdict = scheme.sample_keyed(pair, shape, ss.keyed.KeyedNoise(7), (1,))
        assert isinstance(keyed_tree, DraftTree) and isinstance(keyed_verdict, ss.Verdict)
    else:
        noise = Noise.draw(rng, tree.num_nodes)
        assert scheme.verify(tree, tp, dp, noise) in scheme.verdict_law(tree, tp, dp)
        assert abs(sum(scheme.verdict_law(tree, tp, dp).values()) - 1) < 1e-12
    outcomes = list(scheme.outcomes(pair, shape, (1,)))
    assert all(len(o) == 3 for o in outcomes)
    assert abs(sum(weight for _, weight, _ in outcomes) - 1) < 1e-12
    round_ = ss.speculate(scheme, pair, shape, rng, (1,))
    assert round_.tokens == (*round_.tree.prefix(round_.verdict.node), round_.verdict.token)


# ----------------------------------------------------------------------------- generate


@pytest.mark.parametrize(("name", "shape"), SUPPORTED, ids=repr)
def test_generate_lengths_and_determinism(name, shape):
    pair = Random(4, seed=9)
    for length in (1, 2, 7, 25):
        run = ss.generate(name, pair, shape, length, np.random.default_rng(42))
        again = ss.generate(name, pair, shape, length, np.random.default_rng(42))
        assert len(run.tokens) == length
        assert run == again
        joined = tuple(t for r in run.rounds for t in r.tokens)
        assert joined[:length] == run.tokens
        assert len(joined) - len(run.rounds[-1].tokens) < length  # stops after the first round
        assert all(1 <= len(r.tokens) <= shape.depth + 1 for r in run.rounds)
        assert 1 <= run.block_efficiency <= shape.depth + 1
    longer = ss.generate(name, pair, shape, 60, np.random.default_rng(42))
    other = ss.generate(name, pair, shape, 60, np.random.default_rng(43))
    assert longer.tokens[:25] == run.tokens
    assert longer.tokens != other.tokens


def test_generate_rounds_continue_from_the_emitted_prefix():
    pair = Random(4, seed=9)
    shape = Shape.paths(2, 2)
    run = ss.generate("specinfer", pair, shape, 30, np.random.default_rng(5), prefix=(3,))
    context = (3,)
    for round_ in run.rounds:
        support = {t for t, w in shape.enumerate(pair, context) if w > 0}
        assert round_.tree in support
        context += round_.tokens


def test_generate_nss_with_a_deterministic_top_tree():
    pair = Random(4, seed=9)
    shape = Shape.top((2, 2))
    run = ss.generate("nss", pair, shape, 40, np.random.default_rng(8))
    assert len(run.tokens) == 40
    context = ()
    for round_ in run.rounds:
        ((expected_tree, weight),) = shape.enumerate(pair, context)
        assert weight == 1 and round_.tree == expected_tree
        context += round_.tokens
    assert context[:40] == run.tokens
    assert ss.lossless_error("nss", pair, shape) < 1e-12
    with pytest.raises(ss.UnsupportedShape):
        ss.generate("specinfer", pair, shape, 5, np.random.default_rng(8))


@pytest.mark.parametrize("name", ["spectr", "resispec", "specinfer"])
def test_a_rejection_by_rounding_at_acceptance_one_reuses_a_zero_uniform(name):
    """p(x) = q(x) subnormal: u q(x) rounds up to p(x), so the token is rejected although its
    acceptance is 1; the duplicate's rescaled uniform (u - 1) / 0 divided by zero. It is now 0
    (u - 1 < 0, clipped), as the torch lowering's guarded division gives: verdicts equal."""
    import specsampling.gpu as ssg

    p = np.array([1e-320, 0.5, 0.5])
    for draws in ([(0, 0), (0, 1)], [(0, 0), (0, 0)]):  # the second reads the reused uniform
        tree = DraftTree.from_draws(draws, law="iid")
        rows = np.tile(p, (tree.num_nodes, 1))
        noise = Noise(np.full(tree.num_nodes, LARGEST_BELOW_ONE), np.full(tree.num_nodes, 0.3))
        verdict = tuple(ss.SCHEMES[name].verify(tree, rows, rows, noise))
        target, draft = ssg.tables_batch([rows], [rows])
        out = ssg.verify(
            name, ssg.TreeBatch.from_trees([tree]), target, draft, ssg.Noise.from_reference([noise])
        )
        assert verdict == (int(out.node[0]), int(out.token[0]))
