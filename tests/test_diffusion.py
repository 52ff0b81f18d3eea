"""Toy diffusions (`specsampling.simulators.diffusion`): the exact score, end-to-end losslessness
of speculative sampling for every continuous scheme and draft, target-call counts, mutants.

False-positive budget: every statistical comparison below runs at level ``LEVEL = 1e-5``, with
fixed seeds. There are 53 of them (forward marginals 2 times x 3 projections = 6; losslessness
10 scheme/draft configurations x 4 projections = 40, a configuration failing when any of its
projections does; acceptance z-tests 7), so a correct implementation fails this file with
probability at most 5.3e-4 under a fresh seed (declared budget 1e-3). The negative controls
must be caught by the very same losslessness test.
Exactness is relative to plain Euler-Maruyama with the same N (not to the data law, which the
discretisation only approximates).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pytest
from scipy import integrate, stats

from specsampling import continuous
from specsampling.simulators import diffusion as df

LEVEL = 1e-5
Z_LEVEL = float(stats.norm.isf(LEVEL / 2))  # two-sided z threshold at LEVEL
PROJECTIONS = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]]) / np.array(
    [[1.0], [1.0], [math.sqrt(2)], [math.sqrt(2)]]
)

DATA = df.GaussianMixture([[-2.0, 0.0], [1.5, 1.5], [1.0, -2.0]], [0.3, 0.4, 0.3], std=0.2)
PROCESS = df.VPDiffusion(DATA, num_steps=30)
NUM_SPECULATIVE = 2000


@pytest.fixture(scope="module")
def plain_reference() -> np.ndarray:
    """A large sample of plain Euler-Maruyama with the same N (cheap: fully vectorised)."""
    return np.asarray(df.plain_sample(PROCESS, 40_000, np.random.default_rng(12345)).samples)


def min_pvalue(samples: np.ndarray, reference: np.ndarray) -> float:
    """Smallest two-sample KS p-value over the coordinate and diagonal projections."""
    return min(float(stats.ks_2samp(samples @ e, reference @ e).pvalue) for e in PROJECTIONS)


def lossless_pvalue_ok(samples: np.ndarray, reference: np.ndarray) -> bool:
    """The declared test: reject when any projection's p-value is below ``LEVEL``."""
    return min_pvalue(samples, reference) >= LEVEL


# ------------------------------------------------------------------------- the process


@pytest.mark.parametrize("t", [0.0, 0.05, 0.3, 1.0])
def test_score_is_the_gradient_of_the_log_density(t: float) -> None:
    rng = np.random.default_rng(0)
    data = df.GaussianMixture(rng.standard_normal((4, 3)), [0.1, 0.2, 0.3, 0.4], std=0.4)
    process = df.VPDiffusion(data, num_steps=10)
    marginal = process.marginal(t)
    points = marginal.sample(20, rng)
    h = 1e-5
    numeric = np.stack(
        [
            (marginal.log_density(points + h * e) - marginal.log_density(points - h * e)) / (2 * h)
            for e in np.eye(3)
        ],
        axis=1,
    )
    np.testing.assert_allclose(process.score(points, t), numeric, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(marginal.score(points), numeric, rtol=1e-6, atol=1e-6)


def test_log_density_integrates_to_one() -> None:
    data = df.GaussianMixture([[-1.0], [2.0]], [0.25, 0.75], std=0.3)
    for t in (0.0, 0.4):
        marginal = df.VPDiffusion(data, num_steps=5).marginal(t)
        mass, _ = integrate.quad(
            lambda x, m=marginal: float(np.exp(m.log_density([[x]]))[0]), -10, 10, points=[-1, 2]
        )
        assert mass == pytest.approx(1.0, abs=1e-8)


@pytest.mark.parametrize("t", [0.2, 0.6])
def test_forward_samples_follow_the_closed_form_marginal(t: float) -> None:
    rng = np.random.default_rng(7)
    noisy = PROCESS.forward_sample(DATA.sample(20_000, rng), t, rng)
    marginal = PROCESS.marginal(t)
    for e in PROJECTIONS[[0, 1, 2]]:
        centres = marginal.means @ e

        def cdf(x: np.ndarray, centres: np.ndarray = centres) -> np.ndarray:
            z = (np.asarray(x)[:, None] - centres[None]) / marginal.std
            return np.asarray(stats.norm.cdf(z) @ marginal.weights)

        assert stats.kstest(noisy @ e, cdf).pvalue >= LEVEL


def test_time_zero_is_the_data_and_the_schedule_is_positive() -> None:
    points = DATA.sample(5, np.random.default_rng(1))
    np.testing.assert_allclose(PROCESS.score(points, 0.0), DATA.score(points), atol=1e-12)
    assert np.all(PROCESS.stds > 0)
    assert PROCESS.times[0] == 1.0 and PROCESS.times[-1] == pytest.approx(PROCESS.t_min)
    assert np.all(np.diff(PROCESS.times) < 0)


def test_gaussian_draft_is_exact_for_gaussian_data() -> None:
    """For one component the moment-matched Gaussian is the data, so the two means coincide."""
    data = df.GaussianMixture([[0.5, -1.0, 2.0]], [1.0], std=0.7)
    process = df.VPDiffusion(data, num_steps=20)
    points = np.random.default_rng(3).standard_normal((50, 3))
    steps = np.arange(50) % 20
    np.testing.assert_allclose(
        process.gaussian_mean(points, steps), process.target_mean(points, steps), atol=1e-12
    )


def test_plain_sampling_approaches_the_data_law() -> None:
    """A sanity check of the reverse SDE: with many steps the output is close to the data."""
    process = df.VPDiffusion(DATA, num_steps=400)
    samples = df.plain_sample(process, 20_000, np.random.default_rng(2)).samples
    np.testing.assert_allclose(samples.mean(axis=0), DATA.mean(), atol=0.05)
    np.testing.assert_allclose(np.cov(samples.T), DATA.covariance(), atol=0.12)
    nearest = np.argmin(((samples[:, None] - DATA.means[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_allclose(np.bincount(nearest) / nearest.size, DATA.weights, atol=0.02)


# ------------------------------------------------------------------------- losslessness

LOOKAHEADS = {
    "reflection-chain": df.reflection_chain(4),
    "block-chain": df.block_chain(4),
    "dgrs-tree": df.dgrs_tree(3, 3),
    "reflection-tree": df.Tree(1, 4, "reflection"),
}
LOSSLESS = [
    pytest.param(name, draft, id=f"{name}-{draft}")
    for name in ("reflection-chain", "block-chain", "dgrs-tree", "reflection-tree")
    for draft in ("frozen", "gaussian")
]
LOSSLESS += [
    pytest.param("block-chain-long", "gaussian", id="block-chain-L8-gaussian"),
    pytest.param("dgrs-tree-wide", "frozen", id="dgrs-tree-K4-L2-frozen"),
]
LOOKAHEADS["block-chain-long"] = df.block_chain(8)
LOOKAHEADS["dgrs-tree-wide"] = df.dgrs_tree(4, 2)


@pytest.mark.parametrize(("name", "draft"), LOSSLESS)
def test_speculative_sampling_is_lossless(name: str, draft: str, plain_reference: Any) -> None:
    seed = sum(map(ord, name + draft))
    run = df.speculative_sample(
        PROCESS, draft, LOOKAHEADS[name], NUM_SPECULATIVE, np.random.default_rng(seed)
    )
    assert run.samples.shape == (NUM_SPECULATIVE, 2)
    assert lossless_pvalue_ok(run.samples, plain_reference), min_pvalue(
        run.samples, plain_reference
    )
    # a decent draft saves target calls; every path still makes at least one
    assert run.mean_calls < 0.75 * PROCESS.num_steps
    assert run.target_calls.min() >= 1


class Committed(NamedTuple):
    num_committed: np.ndarray
    states: np.ndarray


def always_accept(target_means, draft_means, std, children, rng) -> Committed:  # type: ignore[no-untyped-def]
    """Mutant: keep every drafted state, then one exact target step."""
    rows, length, dim = children.shape
    std = np.broadcast_to(np.asarray(std, dtype=np.float64), (rows, length + 1))
    last = target_means[:, length] + std[:, length, None] * rng.standard_normal((rows, dim))
    return Committed(np.full(rows, length), last)


def redraw_on_rejection(target_means, draft_means, std, children, rng) -> Committed:  # type: ignore[no-untyped-def]
    """Mutant: the reflection chain, but a rejected level is redrawn from the draft (not P - Q)."""
    out = continuous.verify_chain(target_means, draft_means, std, children, rng)
    rows, length, dim = children.shape
    std = np.broadcast_to(np.asarray(std, dtype=np.float64), (rows, length + 1))
    tau = np.asarray(out.num_committed)
    states = np.array(out.states)
    rejected = np.flatnonzero(tau < length)
    fresh = rng.standard_normal((rejected.size, dim))
    at = tau[rejected]
    states[rejected] = draft_means[rejected, at] + std[rejected, at, None] * fresh
    return Committed(tau, states)


@pytest.mark.parametrize("mutant", [always_accept, redraw_on_rejection])
def test_the_same_test_catches_wrong_samplers(mutant: Any, plain_reference: Any) -> None:
    chain = df.Chain(4, mutant, label=mutant.__name__)
    run = df.speculative_sample(
        PROCESS, "gaussian", chain, NUM_SPECULATIVE, np.random.default_rng(99)
    )
    assert not lossless_pvalue_ok(run.samples, plain_reference)


# ------------------------------------------------------------------------- counts


def test_perfect_draft_commits_everything_chain() -> None:
    """N = 5, L = 2, draft = target: rounds commit 3 then 2 states, with 3 + 2 rows."""
    process = df.VPDiffusion(DATA, num_steps=5)
    for chain in (df.reflection_chain(2), df.block_chain(2)):
        run = df.speculative_sample(process, "exact", chain, 7, np.random.default_rng(0))
        assert run.target_calls.tolist() == [2] * 7
        assert run.target_rows.tolist() == [5] * 7
        assert run.drafted.tolist() == [3] * 7
        assert run.saved == pytest.approx(1 - 2 / 5)


def test_perfect_draft_commits_everything_tree() -> None:
    """N = 5, K = 2, depth 2: rounds commit 2, 2, 1 (truncated); rows 3 + 3 + 1."""
    process = df.VPDiffusion(DATA, num_steps=5)
    run = df.speculative_sample(process, "exact", df.dgrs_tree(2, 2), 4, np.random.default_rng(0))
    assert run.target_calls.tolist() == [3] * 4
    assert run.target_rows.tolist() == [7] * 4
    assert run.drafted.tolist() == [6 + 6 + 2] * 4
    assert run.batch_passes == 3


def test_frozen_draft_warm_up_pass_is_counted() -> None:
    """The warm-up pass is the first plain step; with N = 1 it is the whole run."""
    one = df.VPDiffusion(DATA, num_steps=1)
    run = df.speculative_sample(one, "frozen", df.block_chain(3), 3, np.random.default_rng(0))
    assert run.target_calls.tolist() == [1, 1, 1] and run.drafted.tolist() == [0, 0, 0]
    # N = 2: warm-up, then a truncated chain (L = 0) is a plain step
    two = df.VPDiffusion(DATA, num_steps=2)
    run = df.speculative_sample(two, "frozen", df.block_chain(3), 3, np.random.default_rng(0))
    assert run.target_calls.tolist() == [2, 2, 2]


def test_plain_sampling_makes_n_calls() -> None:
    run = df.plain_sample(PROCESS, 10, np.random.default_rng(0))
    assert run.target_calls.tolist() == [PROCESS.num_steps] * 10 and run.saved == 0.0


class ShiftedDraft:
    """Target mean shifted by ``delta * sigma_n`` along a fixed unit vector: constant delta."""

    name = "shifted"
    uses_anchor = False

    def __init__(self, delta: float) -> None:
        self.delta = delta

    def means(self, process: Any, states: Any, steps: Any, anchors: Any) -> np.ndarray:
        shift = self.delta * process.stds[steps][:, None] * np.array([0.6, 0.8])
        return np.asarray(process.target_mean(states, steps) + shift)


def block_expected(delta: float, length: int) -> float:
    """E[tau* + 1] = 1 + sum_i E[w_i] for block verification with a constant delta (MC, 2e6)."""
    shifts = np.random.default_rng(5).standard_normal((2_000_000, length))
    weights, total = np.ones(shifts.shape[0]), 1.0
    for level in range(length):
        weights = np.minimum(1.0, weights * np.exp(delta * (shifts[:, level] - delta / 2)))
        total += float(weights.mean())
    return total


@pytest.mark.parametrize(
    ("lookahead", "delta"),
    [
        (df.reflection_chain(3), 0.8),
        (df.Tree(1, 3, "reflection"), 0.8),
        (df.dgrs_tree(1, 3), 1.2),
        (df.dgrs_tree(3, 2), 1.2),
        (df.dgrs_tree(2, 4), 0.6),
        (df.block_chain(1), 1.0),
        (df.block_chain(3), 0.8),
    ],
    ids=lambda v: getattr(v, "label", str(v)),
)
def test_states_per_round_match_the_exact_acceptance(lookahead: Any, delta: float) -> None:
    """With a constant delta, committed states per round follow the library's acceptance."""
    rows = 20_000
    chain = isinstance(lookahead, df.Chain)
    depth = lookahead.length if chain else lookahead.depth
    rng = np.random.default_rng(11)
    steps = rng.integers(0, PROCESS.num_steps - depth, size=rows)
    states = rng.standard_normal((rows, 2))
    out = lookahead.advance(
        PROCESS, ShiftedDraft(delta), steps, states, np.zeros_like(states), depth, rng
    )
    if chain:
        alpha = float(continuous.acceptance("reflection", delta))
        expected = sum(alpha**i for i in range(depth + 1))  # a geometric prefix plus one state
        if lookahead.label.startswith("block"):
            expected = block_expected(delta, depth)
            if depth == 1:  # block verification at L = 1 is standard speculative sampling
                assert expected == pytest.approx(1 + alpha, abs=2e-3)
        assert (out.rows, out.drafted) == (depth + 1, depth)
    else:
        width = lookahead.num_children
        alpha = float(continuous.acceptance(lookahead.scheme, delta, num_drafts=width))
        expected = sum(alpha**i for i in range(depth))  # the walk stops at a leaf
        assert out.rows == sum(width**i for i in range(depth))
        assert out.drafted == sum(width**i for i in range(1, depth + 1))
    committed = out.committed.astype(float)
    z = (committed.mean() - expected) / (committed.std(ddof=1) / math.sqrt(rows))
    assert abs(z) < Z_LEVEL, (committed.mean(), expected)
    assert committed.min() >= 1 and committed.max() <= depth + chain


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: df.GaussianMixture([0.0, 1.0], [0.5, 0.5], 1.0), "means"),
        (lambda: df.GaussianMixture([[0.0], [1.0]], [1.0], 1.0), "weights"),
        (lambda: df.GaussianMixture([[0.0], [1.0]], [1.5, -0.5], 1.0), "weights"),
        (lambda: df.GaussianMixture([[0.0], [1.0]], [0.6, 0.6], 1.0), "weights"),
        (lambda: df.GaussianMixture([[0.0], [np.nan]], [0.5, 0.5], 1.0), "means"),
        (lambda: df.GaussianMixture([[0.0]], [1.0], 0.0), "std"),
        (lambda: df.VPDiffusion(DATA, num_steps=0), "num_steps"),
        (lambda: df.VPDiffusion(DATA, num_steps=2.5), "num_steps"),
        (lambda: df.VPDiffusion(DATA, 10, beta_min=5.0, beta_max=1.0), "beta_max"),
        (lambda: df.VPDiffusion(DATA, 10, beta_min=-1.0), "beta_min"),
        (lambda: df.VPDiffusion(DATA, 10, t_min=1.0), "t_min"),
        (lambda: PROCESS.target_mean(np.zeros((2, 3)), 0), "points"),
        (lambda: PROCESS.target_mean(np.zeros((2, 2)), 30), "steps"),
        (lambda: DATA.score(np.zeros(2)), "points"),
        (lambda: df.reflection_chain(0), "length"),
        (lambda: df.dgrs_tree(0, 2), "num_children"),
        (lambda: df.dgrs_tree(2, 0), "depth"),
        (lambda: df.Tree(2, 2, "reflection"), "num_children"),
        (lambda: df.Tree(2, 2, "spectr"), "scheme"),
        (lambda: df.get_draft("oracle"), "draft"),
        (lambda: df.plain_sample(PROCESS, 0, np.random.default_rng(0)), "num_samples"),
    ],
)
def test_bad_input_names_the_argument(build: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: df.VPDiffusion("data", 10), "data"),
        (lambda: df.plain_sample(PROCESS, 5, 0), "rng"),
        (lambda: df.plain_sample("process", 5, np.random.default_rng(0)), "process"),
        (lambda: df.get_draft(42), "draft"),
        (
            lambda: df.speculative_sample(PROCESS, "frozen", 3, 5, np.random.default_rng(0)),
            "lookahead",
        ),
    ],
)
def test_wrong_types_name_the_argument(build: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        build()
