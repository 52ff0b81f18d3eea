"""specsampling.continuous: exact laws of the Gaussian-kernel schemes, goldens, bad input.

Statistical tests compare sampled outputs with the target kernel by Kolmogorov-Smirnov
(``scipy.stats.kstest``) on the standardised output along the mismatch direction and across it,
and measured acceptances / committed lengths with their closed forms within ``Z = 4`` standard
errors. Seeds are fixed, so the suite is deterministic; the budget states how often a correct
implementation would fail over random seeds.

False-positive budget: ``FALSE_POSITIVE_BUDGET = 5e-3`` for the whole file. The ``NUM_Z_CHECKS``
checks at 4 standard errors spend ``P(|N(0,1)| > 4) = 6.3e-5`` each; the rest is split evenly
(Bonferroni) over the ``NUM_KS_TESTS`` KS tests, each at ``ALPHA``.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import numpy as np
import pytest
from scipy import integrate, stats

import specsampling.continuous as sc
from proofs_tests import continuous_mutants as cm
from specsampling.continuous import Frame, NodeNoise, verify_chain_with_noise, verify_with_noise

SEED = 20260917
SIZE = 20_000
DIM = 4
DELTAS = [0.0, 1e-9, 0.1, 1.0, 3.0]
NODE_CASES = [
    (name, k, delta)
    for name, scheme in sc.SCHEMES.items()
    for k in ((1, 2, 4, 8) if scheme.max_drafts is None else (1,))
    for delta in DELTAS
]
RESIDUAL_CASES = [(1.0, 1.0), (0.5, 2.0), (2.0, 5.0), (0.1, 1.5), (3.0, 1.0)]
CHAIN_LENGTH = 3

Z = 4.0
FALSE_POSITIVE_BUDGET = 5e-3
NUM_Z_CHECKS = len(NODE_CASES) + len(sc.SCHEMES) + 3
NUM_KS_TESTS = (
    2 * len(NODE_CASES) + 4 * len(sc.SCHEMES) + len(RESIDUAL_CASES) + 4 * 2 * (CHAIN_LENGTH + 1)
)
ALPHA = (FALSE_POSITIVE_BUDGET - NUM_Z_CHECKS * 2 * stats.norm.sf(Z)) / NUM_KS_TESTS

ALONG = np.array([1.0, -2.0, 0.5, 1.0]) / np.sqrt(6.25)
ACROSS = np.array([2.0, 1.0, 0.0, 0.0]) / np.sqrt(5.0)
DRAFT = np.array([0.3, -1.0, 2.0, 0.5])


def test_the_budget_adds_up() -> None:
    assert 0 < ALPHA < 1e-4
    assert NUM_Z_CHECKS * 2 * stats.norm.sf(Z) + NUM_KS_TESTS * ALPHA <= FALSE_POSITIVE_BUDGET
    assert abs(ALONG @ ACROSS) < 1e-15 and abs(np.linalg.norm(ALONG) - 1) < 1e-15


def _node(delta: float, k: int, size: int, rng: Any, std: Any = 0.7, dtype: Any = np.float64):
    std_rows = np.broadcast_to(np.asarray(std, dtype=np.float64), (size,))
    draft = np.broadcast_to(DRAFT, (size, DIM)).astype(dtype)
    target = (draft + (std_rows * delta)[:, None] * ALONG).astype(dtype)
    children = draft[:, None] + std_rows[:, None, None] * rng.standard_normal((size, k, DIM))
    return target, draft, children.astype(dtype)


def _ks(x: Any, loc: float = 0.0) -> float:
    return float(stats.kstest(np.asarray(x, dtype=np.float64), "norm", args=(loc, 1.0)).pvalue)


def _check_acceptance(index: Any, expected: float) -> None:
    measured = float(np.mean(index >= 0))
    se = np.sqrt(expected * (1 - expected) / index.size)
    assert abs(measured - expected) <= Z * se, (measured, expected, se)


# ----------------------------------------------------------------------------- one node


@pytest.mark.parametrize(("name", "k", "delta"), NODE_CASES)
def test_node_output_is_the_target_kernel(name: str, k: int, delta: float) -> None:
    rng = np.random.default_rng([SEED, k, int(delta * 1e9)])
    target, draft, children = _node(delta, k, SIZE, rng)
    out = sc.verify(name, target, draft, 0.7, children, rng)
    assert out.states.shape == (SIZE, DIM) and out.index.shape == (SIZE,)
    assert out.states.dtype == np.float64 and np.all((-1 <= out.index) & (out.index < k))
    accepted = np.flatnonzero(out.index >= 0)
    assert np.array_equal(out.states[accepted], children[accepted, out.index[accepted]])
    standard = (out.states - target) / 0.7
    assert _ks(standard @ ALONG) > ALPHA
    assert _ks(standard @ ACROSS) > ALPHA
    _check_acceptance(out.index, sc.acceptance(name, delta, k))


@pytest.mark.parametrize("name", sorted(sc.SCHEMES))
def test_sample_drafts_and_verifies(name: str) -> None:
    k = 3 if sc.SCHEMES[name].max_drafts is None else 1
    rng = np.random.default_rng(SEED + 1)
    target = DRAFT + 1.3 * ALONG
    out = sc.sample(name, target, DRAFT, 1.0, k, rng, SIZE)
    assert out.states.shape == (SIZE, DIM) and out.index.dtype.kind == "i"
    assert _ks((out.states - target) @ ALONG) > ALPHA
    _check_acceptance(out.index, sc.acceptance(name, 1.3, k))


@pytest.mark.parametrize("name", sorted(sc.SCHEMES))
def test_float32_states(name: str) -> None:
    k = 4 if sc.SCHEMES[name].max_drafts is None else 1
    rng = np.random.default_rng(SEED + 2)
    target, draft, children = _node(1.0, k, SIZE, rng, dtype=np.float32)
    out = sc.verify(name, target, draft, np.float32(0.7), children, rng)
    assert out.states.dtype == np.float32
    assert _ks((out.states.astype(np.float64) - target) @ ALONG / 0.7) > ALPHA
    frame = Frame.of(target[:1], draft[:1], [0.7])
    assert frame.delta.dtype == np.float64 and abs(frame.delta[0] - 1.0) < 1e-6


@pytest.mark.parametrize("name", sorted(sc.SCHEMES))
def test_rows_with_different_sigma_follow_their_own_kernel(name: str) -> None:
    k = 2 if sc.SCHEMES[name].max_drafts is None else 1
    rng = np.random.default_rng(SEED + 3)
    std = np.where(np.arange(SIZE) % 2 == 0, 0.3, 2.0)
    target, draft, children = _node(0.8, k, SIZE, rng, std=std)
    target[1::2] += 5.0  # other means too
    draft[1::2] += 5.0
    children[1::2] += 5.0
    out = sc.verify(name, target, draft, std, children, rng)
    for rows in (slice(0, None, 2), slice(1, None, 2)):
        standard = (out.states[rows] - target[rows]) / std[rows, None]
        assert _ks(standard @ ALONG) > ALPHA
        assert _ks(standard @ ACROSS) > ALPHA
    # Row independence, path by path: the batch equals its rows verified one at a time.
    noise = NodeNoise.draw(rng, 50, k, DIM)
    batch = verify_with_noise(name, target[:50], draft[:50], std[:50], children[:50], noise)
    for b in range(50):
        row = NodeNoise(*(a[b : b + 1] for a in noise))
        one = verify_with_noise(
            name, target[b : b + 1], draft[b : b + 1], std[b], children[b : b + 1], row
        )
        assert one.index[0] == batch.index[b]
        np.testing.assert_allclose(one.states[0], batch.states[b], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(sc.SCHEMES))
@pytest.mark.parametrize("delta", [0.0, 1e-12, 5e-11])
def test_degenerate_delta_accepts_the_first_child(name: str, delta: float) -> None:
    k = 4 if sc.SCHEMES[name].max_drafts is None else 1
    rng = np.random.default_rng(SEED + 4)
    target, draft, children = _node(delta, k, 500, rng)
    noise = NodeNoise(np.full((500, k), 1 - 2**-53), rng.random(500), rng.random((500, DIM)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = verify_with_noise(name, target, draft, 0.7, children, noise)
        assert sc.acceptance(name, delta, k) == 1.0
    assert np.all(out.index == 0) and np.array_equal(out.states, children[:, 0])


@pytest.mark.parametrize("name", sorted(sc.SCHEMES))
def test_boundary_noise_never_accepts_an_impossible_child(name: str) -> None:
    """u = 0 and a likelihood ratio that underflows to 0 (delta = 40, s = -30): rejected."""
    target, draft = np.zeros((1, DIM)), np.zeros((1, DIM))
    target[0, 0] = 40.0
    children = np.zeros((1, 1, DIM))
    children[0, 0, 0] = -30.0
    noise = NodeNoise(np.zeros((1, 1)), np.zeros(1), np.zeros((1, DIM)))
    out = verify_with_noise(name, target, draft, 1.0, children, noise)
    assert out.index[0] == -1 and np.all(np.isfinite(out.states))


# ----------------------------------------------------------------------------- goldens

DGRS_TABLE = {
    0.25: (0.9005, 0.9379, 0.9643, 0.9807),
    0.5: (0.8026, 0.8682, 0.9182, 0.9521),
    1.0: (0.6171, 0.7136, 0.7978, 0.8643),
}


@pytest.mark.parametrize("delta", sorted(DGRS_TABLE))
def test_dgrs_golden_table(delta: float) -> None:
    got = [sc.acceptance("dgrs", delta, k) for k in (1, 2, 4, 8)]
    np.testing.assert_allclose(got, DGRS_TABLE[delta], atol=5e-5)
    assert [round(a, 4) for a in got] == list(DGRS_TABLE[delta])


@pytest.mark.parametrize("delta", [1e-9, 0.1, 0.25, 1.0, 2.824, 3.0, 6.0])
def test_single_draft_acceptance_is_one_minus_tv(delta: float) -> None:
    expected = 2 * stats.norm.cdf(-delta / 2)
    for name in sc.SCHEMES:
        assert sc.acceptance(name, delta) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert round(sc.acceptance("reflection", 2.824), 4) == 0.1579


@pytest.mark.parametrize("delta", [0.1, 0.5, 1.0, 2.0, 3.0, 5.0])
def test_dgrs_acceptance_increases_in_k_below_the_upper_bound(delta: float) -> None:
    accept = [sc.acceptance("dgrs", delta, k) for k in range(1, 13)]
    assert all(a < b for a, b in itertools.pairwise(accept))
    for k, a in enumerate(accept, start=1):
        crossing = np.log(k) / delta + delta / 2

        def integrand(x: float, k: int = k) -> float:
            return float(min(_pdf(x - delta), k * _pdf(x)))

        bound = sum(
            integrate.quad(integrand, lo, hi, epsabs=1e-13)[0]
            for lo, hi in ((-np.inf, crossing), (crossing, np.inf))
        )
        assert a <= bound + 1e-10, (k, a, bound)


def test_acceptance_types_and_shapes() -> None:
    assert isinstance(sc.acceptance("reflection", 1.0), float)
    out = sc.acceptance("dgrs", np.array([[0.25, 0.5], [1.0, 0.0]]), 2)
    assert isinstance(out, np.ndarray) and out.shape == (2, 2)
    np.testing.assert_allclose(out, [[0.9379, 0.8682], [0.7136, 1.0]], atol=5e-5)
    np.testing.assert_allclose(sc.dgrs_masses([0.5], 2)[0], [1, 1 - 0.8026, 1 - 0.8682], atol=5e-5)


# ----------------------------------------------------------------------------- residual


def _pdf(x: Any) -> Any:
    return np.exp(-np.square(x) / 2) / np.sqrt(2 * np.pi)


def _residual_density(s: Any, delta: float, lam: float) -> Any:
    return np.maximum(_pdf(s - delta) - lam * _pdf(s), 0.0)


@pytest.mark.parametrize(("delta", "lam"), RESIDUAL_CASES)
def test_residual_sampler_matches_quadrature(delta: float, lam: float) -> None:
    t = np.log(lam) / delta + delta / 2
    mass, _ = integrate.quad(_residual_density, t, np.inf, args=(delta, lam), epsabs=1e-14)
    assert float(sc.residual_mass(delta, lam)) == pytest.approx(mass, rel=1e-8)
    assert float(sc.residual_threshold(delta, lam)) == pytest.approx(t, rel=1e-14)
    grid = t + np.linspace(0.0, 12.0, 1201)  # CDF by Gauss-Legendre quadrature per interval
    nodes, weights = np.polynomial.legendre.leggauss(10)
    lo, hi = grid[:-1, None], grid[1:, None]
    points = (lo + hi) / 2 + (hi - lo) / 2 * nodes
    pieces = (_residual_density(points, delta, lam) * weights).sum(axis=1) * (hi - lo)[:, 0] / 2
    cdf_grid = np.concatenate([[0.0], np.cumsum(pieces)]) / mass
    np.testing.assert_allclose(sc.residual_cdf(grid, delta, lam), cdf_grid, atol=1e-8)
    draws = sc.sample_residual(delta, lam, np.random.default_rng(SEED + 5).random(SIZE))
    assert draws.min() >= t
    pvalue = stats.kstest(draws, lambda x: np.interp(x, grid, cdf_grid)).pvalue
    assert pvalue > ALPHA


def test_residual_edge_cases() -> None:
    # u = 0 is the threshold; the CDF is flat (quadratic) there, so s is good to ~sqrt(eps).
    assert float(sc.sample_residual(2.0, 5.0, 0.0)) == pytest.approx(np.log(5) / 2 + 1, abs=1e-7)
    far = sc.sample_residual(1.0, 1e300, np.array([0.0, 0.5, 1 - 2**-53]))
    t = np.log(1e300) + 0.5
    assert np.all(np.isfinite(far)) and np.all(far >= t) and np.all(np.diff(far) > 0)
    assert float(sc.residual_mass(1.0, 1e300)) == 0.0  # underflows, yet still sampled exactly
    assert float(sc.residual_mass(0.0, 1.0)) == 0.0  # degenerate: the threshold point
    assert float(sc.sample_residual(0.0, 1.0, 0.7)) == 0.0
    assert sc.sample_residual([0.5, 1.0], 1.0, np.full((3, 2), 0.5)).shape == (3, 2)
    with pytest.raises(ValueError, match="lam"):
        sc.residual_mass(1.0, 0.5)
    with pytest.raises(ValueError, match="delta"):
        sc.residual_mass(-1.0, 1.0)


def test_frame_round_trip() -> None:
    rng = np.random.default_rng(SEED + 6)
    target, draft = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    frame = Frame.of(target, draft, np.full(5, 0.5))
    y = rng.standard_normal((5, 2, 3))
    s, zperp = frame.project(y)
    assert s.shape == (5, 2) and zperp.shape == (5, 2, 3)
    assert np.allclose(np.einsum("bkd,bd->bk", zperp, frame.direction), 0.0)
    np.testing.assert_allclose(frame.reconstruct(s[:, 1], zperp[:, 1]), y[:, 1], atol=1e-13)
    np.testing.assert_allclose(frame.delta, np.linalg.norm(target - draft, axis=1) / 0.5)
    same = Frame.of(draft, draft, np.ones(5))
    assert np.all(same.delta == 0) and np.all(same.direction[:, 0] == 1) and same.degenerate.all()


# ----------------------------------------------------------------------------- chains

# The drafted chains and their weights are the mutant checks' (proofs_tests/continuous_mutants.py).


def _chains(size: int, rng: Any) -> cm.Chains:
    return cm.draft_chains(size, CHAIN_LENGTH, rng)


def _weights(chains: cm.Chains) -> tuple[Any, Any]:
    """Per chain: sum_i w_i (block) and sum_i prod_{j<=i} min(1, rho_j) (reflection)."""
    return cm.block_weights(chains).sum(axis=1), cm.block_weights(chains, reflection=True).sum(1)


@pytest.mark.parametrize("verify", [sc.verify_block, sc.verify_chain], ids=["block", "reflection"])
def test_chain_output_is_a_target_markov_chain(verify: Any) -> None:
    """Committed prefix + extra state + target samples: each innovation is N(0, I) along and
    across the mismatch at its parent; E[#committed] matches the weights of the drafted chains."""
    rng = np.random.default_rng(SEED + 7)
    chains = _chains(SIZE, rng)
    roots, children, target_means, draft_means, std = chains
    out = verify(target_means, draft_means, std, children, rng)
    assert out.num_committed.shape == (SIZE,) and out.states.shape == (SIZE, 2)
    previous = roots
    for j in range(CHAIN_LENGTH + 1):
        state = cm.target_mean(previous) + cm.CHAIN_STD[j] * rng.standard_normal((SIZE, 2))
        state = np.where((out.num_committed == j)[:, None], out.states, state)
        if j < CHAIN_LENGTH:
            state = np.where((out.num_committed > j)[:, None], children[:, j], state)
        gap = cm.target_mean(previous) - cm.draft_mean(previous)
        along = gap / np.linalg.norm(gap, axis=1, keepdims=True)
        innovation = (state - cm.target_mean(previous)) / cm.CHAIN_STD[j]
        assert _ks(np.sum(innovation * along, 1)) > ALPHA
        assert _ks(innovation[:, 0] * along[:, 1] - innovation[:, 1] * along[:, 0]) > ALPHA
        previous = state
    block, reflection = _weights(chains)
    expected = block if verify is sc.verify_block else reflection
    diff = out.num_committed - expected
    assert abs(diff.mean()) <= Z * diff.std() / np.sqrt(SIZE)


def test_block_never_commits_fewer_than_reflection() -> None:
    rng = np.random.default_rng(SEED + 8)
    chains = _chains(SIZE, rng)
    _, children, target_means, draft_means, std = chains
    block, reflection = _weights(chains)
    assert np.all(block >= reflection - 1e-12) and block.mean() > reflection.mean()
    by_block = sc.verify_block(target_means, draft_means, std, children, rng).num_committed
    by_reflection = sc.verify_chain(target_means, draft_means, std, children, rng).num_committed
    diff = by_block - by_reflection
    assert diff.mean() >= -Z * diff.std() / np.sqrt(SIZE)


def test_chain_edge_cases_and_consistency() -> None:
    rng = np.random.default_rng(SEED + 9)
    _, children, target_means, draft_means, std = _chains(200, rng)
    same = np.concatenate([draft_means, target_means[:, -1:]], axis=1)  # target == draft
    noise = NodeNoise(
        np.full((200, CHAIN_LENGTH), 1 - 2**-53), rng.random(200), rng.standard_normal((200, 2))
    )
    for scheme in (sc.SCHEMES["block"], sc.SCHEMES["reflection"]):
        out = verify_chain_with_noise(scheme, same, draft_means, std, children, noise)
        assert np.all(out.num_committed == CHAIN_LENGTH)
        np.testing.assert_allclose(out.states, same[:, -1] + cm.CHAIN_STD[-1] * noise.gaussian)
    # A one-level block round accepts exactly when the single-node rule does (same uniforms).
    node_noise = NodeNoise(rng.random((200, 1)), rng.random(200), rng.standard_normal((200, 2)))
    node = verify_with_noise(
        "block", target_means[:, 0], draft_means[:, 0], std[:, 0], children[:, :1], node_noise
    )
    chain = verify_chain_with_noise(
        sc.SCHEMES["block"],
        target_means[:, :2],
        draft_means[:, :1],
        std[:, :2],
        children[:, :1],
        node_noise,
    )
    assert np.array_equal(chain.num_committed == 1, node.index == 0)
    rejected = node.index < 0
    np.testing.assert_allclose(chain.states[rejected], node.states[rejected])


# ----------------------------------------------------------------------------- contract

GOOD = {"target_mean": np.ones((3, 2)), "draft_mean": np.zeros((3, 2)), "std": 1.0}
KIDS = np.zeros((3, 1, 2))
RNG = np.random.default_rng(0)
BAD_CALLS = [
    ("scheme", ValueError, lambda: sc.verify("rmc", *GOOD.values(), KIDS, RNG)),
    ("registered", ValueError, lambda: sc.acceptance("nope", 1.0)),
    ("scheme", TypeError, lambda: sc.acceptance(3, 1.0)),
    (
        "target_mean",
        ValueError,
        lambda: sc.verify("dgrs", np.ones((2, 2)), GOOD["draft_mean"], 1.0, KIDS, RNG),
    ),
    (
        "draft_mean",
        ValueError,
        lambda: sc.verify("dgrs", GOOD["target_mean"], np.full((3, 2), np.nan), 1.0, KIDS, RNG),
    ),
    ("std", ValueError, lambda: sc.verify("dgrs", *list(GOOD.values())[:2], 0.0, KIDS, RNG)),
    ("std", ValueError, lambda: sc.verify("dgrs", *list(GOOD.values())[:2], np.inf, KIDS, RNG)),
    ("std", ValueError, lambda: sc.verify("dgrs", *list(GOOD.values())[:2], np.ones(2), KIDS, RNG)),
    ("children", ValueError, lambda: sc.verify("dgrs", *GOOD.values(), np.zeros((3, 2)), RNG)),
    (
        "children",
        ValueError,
        lambda: sc.verify("dgrs", *GOOD.values(), np.full((3, 1, 2), np.nan), RNG),
    ),
    ("children", ValueError, lambda: sc.verify("dgrs", *GOOD.values(), np.zeros((3, 0, 2)), RNG)),
    (
        "num_drafts",
        ValueError,
        lambda: sc.verify("reflection", *GOOD.values(), np.zeros((3, 2, 2)), RNG),
    ),
    (
        "num_drafts",
        ValueError,
        lambda: sc.verify("block", *GOOD.values(), np.zeros((3, 2, 2)), RNG),
    ),
    ("rng", TypeError, lambda: sc.verify("dgrs", *GOOD.values(), KIDS, 0)),
    ("delta", ValueError, lambda: sc.acceptance("dgrs", -0.1)),
    ("delta", ValueError, lambda: sc.acceptance("dgrs", [0.5, np.nan])),
    ("num_drafts", ValueError, lambda: sc.acceptance("dgrs", 1.0, 0)),
    ("num_drafts", ValueError, lambda: sc.acceptance("dgrs", 1.0, 2.5)),  # type: ignore[arg-type]
    ("num_drafts", ValueError, lambda: sc.acceptance("dgrs", 1.0, True)),
    ("num_drafts", ValueError, lambda: sc.acceptance("reflection", 1.0, 2)),
    ("size", ValueError, lambda: sc.sample("dgrs", [0.0], [0.0], 1.0, 1, RNG, 0)),
    ("draft_mean", ValueError, lambda: sc.sample("dgrs", [0.0, 1.0], [0.0], 1.0, 1, RNG, 5)),
    ("target_mean", ValueError, lambda: sc.sample("dgrs", np.zeros((4, 1)), [0.0], 1.0, 1, RNG, 5)),
    (
        "rng",
        TypeError,
        lambda: sc.sample("dgrs", [0.0], [0.0], 1.0, 1, np.random.RandomState(0), 5),
    ),
    (
        "target_means",
        ValueError,
        lambda: sc.verify_block(
            np.zeros((3, 2, 2)), np.zeros((3, 2, 2)), 1.0, np.zeros((3, 2, 2)), RNG
        ),
    ),
    (
        "draft_means",
        ValueError,
        lambda: sc.verify_chain(
            np.zeros((3, 3, 2)), np.zeros((3, 3, 2)), 1.0, np.zeros((3, 2, 2)), RNG
        ),
    ),
    (
        "std",
        ValueError,
        lambda: sc.verify_block(
            np.zeros((3, 3, 2)), np.zeros((3, 2, 2)), np.ones((3, 2)), np.zeros((3, 2, 2)), RNG
        ),
    ),
]


@pytest.mark.parametrize(
    ("word", "error", "call"), BAD_CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(BAD_CALLS)]
)
def test_bad_input_names_the_argument(word: str, error: type, call: Any) -> None:
    with pytest.raises(error, match=word):
        call()


def test_registry() -> None:
    assert set(sc.SCHEMES) == {"reflection", "dgrs", "block"}
    for name, scheme in sc.SCHEMES.items():
        assert scheme.name == name and "arXiv" in scheme.reference
        assert isinstance(scheme, sc.ContinuousScheme) and sc.get_scheme(scheme) is scheme
    assert isinstance(sc.SCHEMES["block"], sc.ChainScheme)
    assert isinstance(sc.SCHEMES["reflection"], sc.ChainScheme)
    with pytest.raises(TypeError):
        sc.SCHEMES["x"] = sc.SCHEMES["dgrs"]  # type: ignore[index]
    with pytest.raises(KeyError, match="registered"):
        sc.SCHEMES["x"]
    with pytest.raises(ValueError, match=r"\['block', 'dgrs', 'reflection'\]"):
        sc.get_scheme("x")
