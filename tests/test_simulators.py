"""The Monte-Carlo simulators: synthetic pairs, node laws, and estimators checked against the
exact engine.

Statistical checks: each compares an estimate with an exact value at 4.5 standard errors, fixed
seeds; 14 such checks, so the false-positive budget is below 14 * 7e-6 = 1e-4 (and with fixed
seeds a pass is reproducible).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from specsampling import simulators as sim
from specsampling.schemes import tables
from specsampling.schemes.base import KeyedCoupling, TreeVerifier

TREE_SCHEMES = [
    name
    for name, obj in sorted(ss.SCHEMES.items())
    if isinstance(obj, TreeVerifier) and not isinstance(obj, KeyedCoupling)
]
ROOT = (1, 2, 0, 3)


def within(est: sim.Estimate, exact: float, sigmas: float = 4.5) -> bool:
    return abs(est.mean - exact) <= sigmas * est.stderr


# --------------------------------------------------------------------------- synthetic pairs
def test_synthetic_is_a_deterministic_model_pair() -> None:
    pair = sim.pairs.Synthetic(vocab_size=50, seed=3)
    again = sim.pairs.Synthetic(vocab_size=50, seed=3)
    other = sim.pairs.Synthetic(vocab_size=50, seed=4)
    for prefix in [(), (1,), ROOT, (*ROOT, 7, 7)]:
        p, q = pair.target(prefix), pair.draft(prefix)
        assert p.dtype == np.float64 and p.shape == (50,)
        assert abs(p.sum() - 1) < 1e-12 and abs(q.sum() - 1) < 1e-12
        assert (p >= 0).all() and (q >= 0).all()
        assert np.array_equal(p, again.target(prefix)) and np.array_equal(q, again.draft(prefix))
        assert not np.array_equal(p, other.target(prefix))
    assert not np.array_equal(pair.target(ROOT), pair.target((*ROOT, 0)))  # context-dependent
    assert isinstance(pair, ss.pairs.ModelPair)


def test_synthetic_batched_face_equals_the_model_pair_face() -> None:
    pair = sim.pairs.Synthetic(vocab_size=300, seed=1, depth_growth=0.5)
    prefixes = [(), ROOT, (*ROOT, 5), (*ROOT, 5, 299), (9, 9, 9, 9, 9, 9)]
    hashes = pair.hash_prefixes(prefixes)
    target, draft = pair.node_probs(hashes, torch.tensor([len(p) for p in prefixes]))
    fresh = sim.pairs.Synthetic(vocab_size=300, seed=1, depth_growth=0.5)  # no cache
    for row, prefix in enumerate(prefixes):
        assert np.array_equal(target[row].numpy(), fresh.target(prefix))
        assert np.array_equal(draft[row].numpy(), fresh.draft(prefix))
    # Extending a hash by a token is hashing the longer prefix.
    longer = pair.extend(hashes[1:2], torch.tensor([5]))
    assert torch.equal(longer, pair.hash_prefixes([(*ROOT, 5)]))


@pytest.mark.parametrize(
    "pair",
    [
        sim.pairs.Synthetic(vocab_size=300, seed=1, depth_growth=0.5),
        sim.pairs.Synthetic(vocab_size=40, seed=2, top_k=3),  # i.i.d. duplicates, exhausted rows
        sim.pairs.Synthetic(vocab_size=40, seed=3, temperature=0.0),
        sim.pairs.Synthetic(vocab_size=40, seed=4, top_p=0.8, temperature=0.7),
    ],
    ids=repr,
)
def test_synthetic_batches_reuse_the_drafting_distributions_bit_for_bit(pair) -> None:
    """The tables of a drafted batch reuse the distributions drafting computed at the expanded
    nodes: bit-equal to computing every node afresh, with fewer rows evaluated, and the trees
    are the per-node drafter's."""
    calls: list[int] = []
    node_probs = pair.node_probs

    def counted(hashes, lengths, *args):  # type: ignore[no-untyped-def]
        calls.append(int(hashes.shape[0]))
        return node_probs(hashes, lengths, *args)

    shapes = [ss.Shape.paths(2, 3), ss.Shape.star(3, replacement=False), ss.Shape.chain(3)]
    shapes += [ss.Shape.delayed(2, trunk=1, branch=2), ss.Shape.branching((2, 2))]
    shapes += [ss.Shape.greedy((2, 1)), ss.Shape.hub(2)]
    roots = pair.roots(6, np.random.default_rng(0))
    root_hash = pair.hash_prefixes(roots)
    root_len = torch.tensor([len(r) for r in roots])
    for shape in shapes:
        noise = torch.from_numpy(np.random.default_rng(1).random((6, len(shape.steps))))
        pair.node_probs = counted  # type: ignore[method-assign]
        calls.clear()
        try:
            batch = sim.sources._synthetic_batch(pair, shape, roots, noise)
        finally:
            del pair.node_probs
        target, draft = sim.sources.node_tables(pair, batch.trees, root_hash, root_len)
        assert torch.equal(batch.target, target) and torch.equal(batch.draft, draft), shape
        real = int(batch.trees.real_nodes().sum())
        expanded = sum(
            bool(tree.candidates[n])
            for tree in batch.trees.to_trees()
            for n in range(tree.num_nodes)
        )
        assert calls[-1] == real - expanded, shape  # the tables compute the leaves alone
        trees = ss.gpu.drafting.draft(shape, pair, noise, prefix=roots)
        assert batch.trees.to_trees() == trees.to_trees(), shape


def test_synthetic_knobs() -> None:
    same = sim.pairs.Synthetic(vocab_size=64, seed=0, divergence=0.0)
    assert np.array_equal(same.target(ROOT), same.draft(ROOT))
    greedy = sim.pairs.Synthetic(vocab_size=64, seed=0, temperature=0.0)
    p = greedy.target(ROOT)
    assert sorted(np.unique(p).tolist()) == [0.0, 1.0]
    top = sim.pairs.Synthetic(vocab_size=64, seed=0, top_k=3)
    assert np.count_nonzero(top.target(ROOT)) == 3 and np.count_nonzero(top.draft(ROOT)) == 3
    # Divergence grows with depth when asked: mean L1 over contexts at depth 0 vs depth 4.
    rng = np.random.default_rng(0)
    grow = sim.pairs.Synthetic(vocab_size=500, seed=0, depth_growth=1.0)
    roots = grow.roots(64, rng)

    def l1(extra: tuple[int, ...]) -> float:
        return float(
            np.mean([np.abs(grow.target(r + extra) - grow.draft(r + extra)).sum() for r in roots])
        )

    assert l1((1, 2, 3, 4)) > 1.5 * l1(())

    # Heavier Zipf heads have lower entropy.
    def entropy(pair: sim.pairs.Synthetic) -> float:
        ps = [pair.target(r) for r in roots]
        return float(np.mean([-(x[x > 0] * np.log(x[x > 0])).sum() for x in ps]))

    assert entropy(sim.pairs.Synthetic(vocab_size=500, zipf=2.5)) < entropy(
        sim.pairs.Synthetic(vocab_size=500, zipf=1.0)
    )
    assert "zipf=2.5" in repr(sim.pairs.Synthetic(vocab_size=8, zipf=2.5))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"vocab_size": 1}, ValueError, "vocab_size"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"divergence": float("nan")}, ValueError, "divergence"),
        ({"zipf": "big"}, TypeError, "zipf"),
        ({"seed": -1}, ValueError, "seed"),
        ({"top_p": 1.5}, ValueError, "top_p"),
        ({"context_length": -1}, ValueError, "context_length"),
    ],
)
def test_synthetic_bad_input(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        sim.pairs.Synthetic(**kwargs)


def test_synthetic_roots_take_a_generator_as_the_estimators_do() -> None:
    """``roots`` takes what ``estimate``'s ``generator`` takes: ``None``, a seed or a Generator."""
    pair = sim.pairs.Synthetic(vocab_size=6)
    assert pair.roots(3, 5) == pair.roots(3, np.random.default_rng(5))
    assert len(pair.roots(2, None)) == 2 and all(len(r) == 4 for r in pair.roots(2, None))
    with pytest.raises(TypeError, match=r"^generator: expected None, an integer seed"):
        pair.roots(2, "x")
    with pytest.raises(ValueError, match=r"^generator: expected a seed >= 0, got -1"):
        pair.roots(2, -1)


def test_synthetic_bad_prefix() -> None:
    with pytest.raises(ValueError, match="prefix"):
        sim.pairs.Synthetic(vocab_size=4).target((4,))


def test_synthetic_is_lossless_under_the_exact_engine() -> None:
    pair = sim.pairs.Synthetic(vocab_size=3, seed=2, divergence=1.0)
    for scheme, shape in [("standard", ss.Shape.chain(2)), ("traversal", ss.Shape.paths(2, 2))]:
        assert ss.lossless_error(scheme, pair, shape, 2) <= 1e-12


# --------------------------------------------------------------------------- node laws
def _marginal(law: dict) -> dict:
    out: dict = {}
    for verdict, prob in law.items():
        out[verdict.node] = out.get(verdict.node, 0) + prob
    return out


@pytest.mark.parametrize("name", TREE_SCHEMES)
def test_verdict_nodes_is_the_marginal_of_verdict_law(name: str) -> None:
    scheme = ss.SCHEMES[name]
    shapes = [s for s in LAW_SHAPES if scheme.supports(s)]
    assert shapes, name
    exact = ss.pairs.Stationary(
        [Fraction(1, 6), Fraction(1, 2), Fraction(1, 3)],
        [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)],
    )
    checked = 0
    for pair in [ss.pairs.Random(vocab_size=4, seed=5), exact]:
        if pair is exact and not scheme.rational:
            continue  # float-only schemes (their plans solve in floats)
        for shape in shapes:
            for tree, _ in shape.enumerate(pair, ()):
                target, draft = tables(pair, tree, ())
                want = {
                    n: p
                    for n, p in _marginal(scheme.verdict_law(tree, target, draft)).items()
                    if p != 0
                }
                got = {n: p for n, p in scheme.verdict_nodes(tree, target, draft).items() if p != 0}
                if pair is exact:
                    assert got == want, (name, shape, tree)
                else:
                    nodes = set(got) | set(want)
                    assert all(abs(got.get(n, 0) - want.get(n, 0)) <= 1e-12 for n in nodes)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("name", ["standard", "specinfer", "traversal", "block", "rsd", "nss"])
def test_conditional_emitted_averages_to_the_exact_block_efficiency(name: str) -> None:
    pair = ss.pairs.Random(vocab_size=4, seed=2)
    scheme = ss.SCHEMES[name]
    for shape in [s for s in LAW_SHAPES if scheme.supports(s)]:
        total = sum(
            weight * sim.conditional_emitted(name, tree, *tables(pair, tree, ()))
            for tree, weight in shape.enumerate(pair, ())
        )
        assert abs(total - ss.expected_emitted(name, pair, shape)) <= 1e-12, shape


def test_conditional_emitted_is_exact_with_fractions() -> None:
    pair = ss.pairs.Stationary([Fraction(1, 3), Fraction(2, 3)], [Fraction(2, 3), Fraction(1, 3)])
    shape = ss.Shape.paths(2, 2)
    total = sum(
        weight * sim.conditional_emitted("traversal", tree, *tables(pair, tree, ()))
        for tree, weight in shape.enumerate(pair, ())
    )
    assert total == Fraction(115, 81) + 1


# --------------------------------------------------------------------------- estimators
CASES = [
    ("standard", ss.Shape.chain(3)),
    ("traversal", ss.Shape.paths(2, 2)),
    ("specinfer", ss.Shape.delayed(2, trunk=1, branch=1)),
    ("rsd", ss.Shape.branching((2, 1))),
    ("block", ss.Shape.chain(2)),
    ("spectr", ss.Shape.paths(2, 2)),
]


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_estimates_agree_with_the_exact_engine(name: str, shape: ss.Shape) -> None:
    pair = sim.pairs.Synthetic(vocab_size=5, seed=7, divergence=1.0)
    exact = float(ss.expected_emitted(name, pair, shape, prefix=ROOT))
    rb = sim.estimate(name, pair, shape, 600, generator=1, prefix=ROOT)
    plain = sim.estimate(name, pair, shape, 600, method="plain", generator=1, prefix=ROOT)
    assert rb.method == "rao-blackwell" and plain.method == "plain"
    assert within(rb, exact) and within(plain, exact), (rb, plain, exact)
    assert rb.num_trees == plain.num_trees == 600
    assert rb.variance_ratio is not None and rb.variance_ratio >= 1
    low, high = rb.ci
    assert low < rb.mean < high


def test_estimate_over_random_roots_is_the_average_over_roots() -> None:
    """Without ``prefix`` every tree drafts after a fresh root: the estimate is the mean of the
    exact values over those roots (checked with the roots the same generator draws)."""
    pair = sim.pairs.Synthetic(vocab_size=4, seed=1, divergence=1.0)
    shape = ss.Shape.chain(2)
    est = sim.estimate("standard", pair, shape, 400, generator=np.random.default_rng(3))
    roots = pair.roots(400, np.random.default_rng(3).spawn(2)[0])  # the estimator's root stream
    exact = np.mean([float(ss.expected_emitted("standard", pair, shape, prefix=r)) for r in roots])
    # RB over these very roots: only drafting noise is left, so the match is tight.
    assert within(est, float(exact))


def test_generic_model_pairs_and_fractions_free_paths() -> None:
    pair = ss.pairs.Random(vocab_size=4, seed=0)
    shape = ss.Shape.paths(2, 2)
    exact = float(ss.expected_emitted("traversal", pair, shape))
    est = sim.estimate("traversal", pair, shape, 500, generator=0)
    assert within(est, exact)


def test_compare_pairs_schemes_on_the_same_trees() -> None:
    pair = sim.pairs.Synthetic(vocab_size=5, seed=7, divergence=1.0)
    shape = ss.Shape.paths(2, 2)
    names = ["traversal", "specinfer", "nss"]
    out = sim.compare(names, pair, shape, 800, generator=2, prefix=ROOT)
    exact = {n: float(ss.expected_emitted(n, pair, shape, prefix=ROOT)) for n in names}
    assert list(out.estimates) == names and out.num_trees == 800
    for a, b in [("traversal", "specinfer"), ("traversal", "nss"), ("specinfer", "nss")]:
        d = out.differences[(a, b)]
        assert abs(d.mean - (out[a].mean - out[b].mean)) < 1e-12
        assert within(d, exact[a] - exact[b]), (a, b, d)
    # Pairing: the difference is far tighter than the schemes' own errors combined.
    d = out.differences[("traversal", "specinfer")]
    assert d.stderr < 0.5 * np.hypot(out["traversal"].stderr, out["specinfer"].stderr)
    assert "traversal - specinfer" in out.table()


def test_plain_compare_uses_common_noise() -> None:
    """Plain Monte Carlo of one scheme twice on the same trees and noise differs by exactly 0."""
    pair = sim.pairs.Synthetic(vocab_size=6, seed=0)
    out = sim.compare(["standard", "block"], pair, ss.Shape.chain(1), 50, "plain", generator=0)
    # On one-token chains block and standard verification are the same rule, path by path.
    d = out.differences[("standard", "block")]
    assert d.mean == 0 and d.stderr == 0


def test_estimate_emitted_returns_the_shared_estimate() -> None:
    pair = ss.pairs.Stationary([1 / 3, 2 / 3], [2 / 3, 1 / 3])
    est = sim.estimate_emitted("standard", pair, ss.Shape.chain(2), 3000, np.random.default_rng(0))
    assert isinstance(est, sim.Estimate) and est.num_rounds == est.num_trees == 3000
    assert within(est, 19 / 9)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda p: sim.estimate("gumbel", p, ss.Shape.chain(2), 10), ss.UnsupportedShape, "keyed"),
        (lambda p: sim.estimate("rsd", p, ss.Shape.paths(2, 2), 10), ss.UnsupportedShape, "rsd"),
        (lambda p: sim.estimate("nope", p, ss.Shape.chain(2), 10), ValueError, "unknown scheme"),
        (lambda p: sim.estimate("standard", p, ss.Shape.chain(2), 1), ValueError, "num_trees"),
        (lambda p: sim.estimate("standard", p, ss.Shape.chain(2), 10.0), TypeError, "num_trees"),
        (lambda p: sim.estimate("standard", p, ss.Shape.chain(2), 10, "mc"), ValueError, "method"),
        (lambda p: sim.estimate("standard", p, None, 10), TypeError, "shape"),
        (
            lambda p: sim.estimate("standard", p, ss.Shape.chain(2), 10, generator="x"),
            TypeError,
            "generator",
        ),
        (
            lambda p: sim.estimate("standard", p, ss.Shape.chain(2), 10, generator=-1),
            ValueError,
            r"^generator: expected a seed >= 0, got -1",
        ),
        (lambda p: sim.compare([], p, ss.Shape.chain(2), 10), ValueError, "schemes"),
        (
            lambda p: sim.compare(["nss", "nss"], p, ss.Shape.chain(2), 10),
            ValueError,
            "each scheme once",
        ),
        (lambda p: sim.estimate("standard", "pair", ss.Shape.chain(2), 10), TypeError, "pair"),
    ],
)
def test_bad_input(call, error: type, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call(sim.pairs.Synthetic(vocab_size=4))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_estimate_of_refuses_non_finite_values(bad: float) -> None:
    """A NaN or infinite per-tree value would give a NaN mean or standard error: refused."""
    with pytest.raises(ss.InvalidDistribution, match=r"^values: NaN or inf at index 1"):
        sim.Estimate.of([1.0, bad, 2.0])
    assert sim.Estimate.of([1.0, 2.0]).mean == 1.5


def test_the_interval_is_the_normal_approximation() -> None:
    """Equal per-tree values give a standard error of 0 and a zero-width interval: the documented
    limit of the normal interval at few trees (docs/simulators.md, ``estimate``)."""
    est = sim.Estimate.of([2.0] * 20)
    assert est.stderr == 0 and est.ci == (2.0, 2.0)
    for text in (sim.estimate.__doc__ or "", sim.Estimate.ci.__doc__ or ""):
        assert "normal approximation" in " ".join(text.split())
        assert "Rao-Blackwell" in text


def test_estimate_at_a_real_vocabulary_size() -> None:
    """V = 32,000: RB and plain agree, RB is tighter, and traversal beats NSS on paths."""
    pair = sim.pairs.Synthetic(vocab_size=32000, seed=0)
    shape = ss.Shape.paths(2, 3)
    out = sim.compare(["traversal", "nss"], pair, shape, 96, generator=0)
    plain = sim.estimate("traversal", pair, shape, 96, method="plain", generator=0)
    rb = out["traversal"]
    assert abs(rb.mean - plain.mean) <= 4.5 * np.hypot(rb.stderr, plain.stderr)
    assert rb.variance_ratio is not None and rb.variance_ratio > 1
    assert out.differences[("traversal", "nss")].ci[0] > 0
