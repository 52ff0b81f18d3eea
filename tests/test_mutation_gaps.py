"""Tests that kill the mutants which survived the whole suite, with proof.

Each gap has a ``_check_*`` function holding the assertions. ``test_*`` runs it on the real
code; ``test_*_kills_mutant`` applies the mutant for the test's duration (``monkeypatch``)
and demands that the same check fails. Expected values never come from the code under test:
they are hand-derived numbers, closed forms re-implemented here, or a different code path
(quadrature, sampled rounds, densities of the Gaussian kernels).

1. ``poisson``'s exact transitions reading the root's list size at every depth.
2. Continuous block verification drawing the residual with ``lambda = w`` instead of ``1/w``.
3. ``lossless_error`` maximising only over sequences the target can emit.
4. ``check_distribution`` no longer renormalising float input within tolerance.

Plus the regression test of a live bug: ``acceptance`` below 0 (``spectr``, disjoint supports,
draft mass ``1 + 2**-52``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import integrate, stats

import specsampling as ss
import specsampling.continuous as sc
from specsampling import exact, ops, validation
from specsampling._types import Probs
from specsampling.continuous import block as block_module
from specsampling.keyed import KeyedNoise
from specsampling.noise import Noise
from specsampling.ops import support
from specsampling.schemes import gumbel as gumbel_module
from specsampling.schemes import spectr as spectr_module
from specsampling.schemes.base import Step
from specsampling.schemes.gumbel import POISSON, Poisson
from specsampling.schemes.standard import Standard
from specsampling.tree import DraftTree

F = Fraction

# ---------------------------------------------------------------- 1. Poisson on uneven widths

#: Full-support pairs over four tokens (every list size below 4 leaves a miss possible).
POISSON_PAIRS = [
    ([0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]),
    ([0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]),
    ([0.05, 0.15, 0.3, 0.5], [0.6, 0.2, 0.1, 0.1]),
]


def _gumbel_acceptance(target: Iterable[float], draft: Iterable[float]) -> float:
    r"""Daliri et al.'s closed form :math:`\sum_j 1 / \sum_i \max(p_i/p_j, q_i/q_j)`."""
    p, q = np.asarray(list(target), float), np.asarray(list(draft), float)
    both = np.flatnonzero((p > 0) & (q > 0))
    return float(sum(1.0 / np.maximum(p / p[j], q / q[j]).sum() for j in both))


def _poisson_acceptance(target: Iterable[float], draft: Iterable[float], size: int) -> float:
    r"""Poisson-list acceptance by adaptive quadrature, derived here from the race.

    ``Y = j`` at time ``x = E_j / p_j`` has density ``p_j e^{-x}``; given it, token ``i`` is an
    earlier ``q``-arrival than ``j`` with probability ``1 - exp(-x r_i)``,
    ``r_i = (q_i p_j / q_j - p_i)_+``, independently over ``i``. ``j`` is in the list of the
    ``size`` first arrivals iff at most ``size - 1`` tokens came before it.
    """
    p, q = np.asarray(list(target), float), np.asarray(list(draft), float)
    total = 0.0
    for j in np.flatnonzero((p > 0) & (q > 0)):
        rates = [max(q[i] * p[j] / q[j] - p[i], 0.0) for i in range(len(p)) if i != j]

        def integrand(x: float, rates: list[float] = rates) -> float:
            before = np.zeros(len(rates) + 1)  # law of the number of earlier arrivals
            before[0] = 1.0
            for rate in rates:
                earlier = -np.expm1(-x * rate)
                before[1:] = before[1:] * (1 - earlier) + before[:-1] * earlier
                before[0] *= 1 - earlier
            return float(np.exp(-x) * before[:size].sum())

        value, _ = integrate.quad(integrand, 0, np.inf, epsabs=1e-13, epsrel=1e-12, limit=200)
        total += p[j] * value
    return total


def _check_poisson_uneven_widths() -> None:
    for target, draft in POISSON_PAIRS:
        pair = ss.pairs.Stationary(target, draft)
        a_1 = _gumbel_acceptance(target, draft)
        for size in (2, 3):
            a_size = _poisson_acceptance(target, draft, size)
            # Positions carry independent keyed noise; each level is its own Poisson list.
            expected = 1 + a_size * (1 + a_1)
            got = ss.expected_emitted("poisson", pair, ss.Shape.branching((size, 1)))
            assert got == pytest.approx(expected, abs=1e-9), (target, draft, size)
            # The acceptance entry point agrees with the quadrature (a third code path).
            assert ss.acceptance("poisson", target, draft, size) == pytest.approx(a_size, abs=1e-9)


def _emitted_lengths(law: dict[tuple[int, ...], Any], depth: int) -> np.ndarray:
    lengths = np.zeros(depth + 1)
    for emitted, prob in law.items():
        lengths[len(emitted) - 1] += prob
    return lengths


#: Sampled keyed rounds per shape; the declared false-positive budget is split over the shapes.
KEYED_ROUNDS = 3000
KEYED_ALPHA = 1e-3


def _check_poisson_keyed_rounds() -> None:
    """The exact round law's length law against ``sample_keyed`` rounds (chi-square on counts)."""
    target, draft = POISSON_PAIRS[0]
    pair = ss.pairs.Stationary(target, draft)
    shapes = [ss.Shape.branching((2, 1)), ss.Shape.branching((3, 1))]
    for index, shape in enumerate(shapes):
        law = ss.round_law("poisson", pair, shape)
        expected = _emitted_lengths(law, shape.depth) * KEYED_ROUNDS
        assert expected.min() >= 5  # no bin to merge
        counts = np.zeros(shape.depth + 1)
        for key in range(KEYED_ROUNDS):
            tree, verdict = POISSON.sample_keyed(pair, shape, KeyedNoise(1000 * index + key))
            counts[len(tree.prefix(verdict.node))] += 1
        pvalue = stats.chisquare(counts, expected * counts.sum() / expected.sum()).pvalue
        assert pvalue > KEYED_ALPHA / len(shapes), (shape, counts, expected)


def _root_width_transitions(
    self: Poisson, target: Any, draft: Any, shape: ss.Shape, depth: int, state: Any
) -> Iterator[tuple[int, Any, Any]]:
    """The surviving mutant: ``state[0]`` (the root's list size) at every depth."""
    hits = self.hits(target, draft, state[0])
    for token in support(target):
        yield int(token), hits[token], state
        yield int(token), target[token] - hits[token], None


def test_poisson_uneven_widths_expected_emitted() -> None:
    _check_poisson_uneven_widths()


def test_poisson_uneven_widths_kills_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Poisson, "transitions", _root_width_transitions)
    with pytest.raises(AssertionError):
        _check_poisson_uneven_widths()


def test_poisson_uneven_widths_keyed_rounds() -> None:
    _check_poisson_keyed_rounds()


def test_poisson_keyed_rounds_kill_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Poisson, "transitions", _root_width_transitions)
    with pytest.raises(AssertionError):
        _check_poisson_keyed_rounds()


def test_poisson_mutant_is_the_mutant_and_the_formula_is_not_vacuous() -> None:
    """The uneven widths matter: ``a_2``, ``a_3`` and ``a_1`` differ on every pair used."""
    assert gumbel_module.POISSON is POISSON
    for target, draft in POISSON_PAIRS:
        a_1 = _gumbel_acceptance(target, draft)
        assert a_1 == pytest.approx(ss.acceptance("gumbel", target, draft, 1), abs=1e-12)
        for size in (2, 3):
            assert _poisson_acceptance(target, draft, size) - a_1 > 0.05


# ---------------------------------------------------------------- 2. block residual support


def _log_ratio(state: np.ndarray, target_mean: np.ndarray, draft_mean: np.ndarray, std: Any) -> Any:
    r""":math:`\log\rho = \log N(y; m_t, \sigma^2 I) - \log N(y; m_d, \sigma^2 I)`, per row."""
    far_draft = np.sum((state - draft_mean) ** 2, axis=-1)
    far_target = np.sum((state - target_mean) ** 2, axis=-1)
    return (far_draft - far_target) / (2 * np.asarray(std) ** 2)


def _drafted_chains(rows: int, length: int, seed: int) -> tuple[np.ndarray, ...]:
    """Chains drafted by ``m_d(y) = 0.9 y`` against ``m_t(y) = y + (0.8, -0.3)``, sigma per step."""
    rng = np.random.default_rng(seed)
    std = rng.uniform(0.7, 1.3, (rows, length + 1))
    parents = [np.zeros((rows, 2))]
    for level in range(length):
        step = rng.standard_normal((rows, 2)) * std[:, level, None]
        parents.append(0.9 * parents[-1] + step)
    path = np.stack(parents, axis=1)  # y0, Y1 .. YL
    return path + np.array([0.8, -0.3]), 0.9 * path[:, :length], std, path[:, 1:]


def _residual_margins(residual_noise: Any) -> tuple[np.ndarray, np.ndarray]:
    r"""``log w_i + log rho_{i+1}(output)`` for the chains ending (rejected) at ``i < L``.

    ``w`` is recomputed here from the Gaussian densities: :math:`w_0 = 1`,
    :math:`w_i = \min(1, w_{i-1}\rho_i(\tilde Y_i))`, with :math:`\rho_i` the target/draft
    density ratio of the step leaving :math:`\tilde Y_{i-1}`. Returns the margins and ``w_i``.
    ``residual_noise``: ``None`` draws the noise from a generator through the public
    ``verify_block``; a number sets every residual uniform to it (explicit noise).
    """
    rows, length = 6000, 3
    target_means, draft_means, std, children = _drafted_chains(rows, length, seed=11)
    if residual_noise is None:
        out = sc.verify_block(target_means, draft_means, std, children, np.random.default_rng(5))
    else:
        noise = sc.NodeNoise.draw(np.random.default_rng(5), rows, length, 2)
        noise = noise._replace(residual=np.full(rows, float(residual_noise)))
        out = sc.verify_chain_with_noise("block", target_means, draft_means, std, children, noise)
    log_w = np.zeros((rows, length + 1))
    for level in range(1, length + 1):
        step = _log_ratio(
            children[:, level - 1],
            target_means[:, level - 1],
            draft_means[:, level - 1],
            std[:, level - 1],
        )
        log_w[:, level] = np.minimum(0.0, log_w[:, level - 1] + step)
    stopped = np.flatnonzero(out.num_committed < length)
    at = out.num_committed[stopped]  # the level i < L the chain ended at
    after = _log_ratio(
        out.states[stopped], target_means[stopped, at], draft_means[stopped, at], std[stopped, at]
    )
    return log_w[stopped, at] + after, log_w[stopped, at]


def _check_block_residual_support(residual_noise: Any) -> None:
    margins, log_w = _residual_margins(residual_noise)
    # The test bites only where w_i < 1: enough such rows must end the chain.
    assert np.sum(log_w < -0.1) > 200
    # Support of (w P - Q)_+ = w (P - Q / w)_+: w rho >= 1 (bisection returns the upper end).
    assert margins.min() >= -1e-9


def _residual_with_lambda_w(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apply the surviving mutant: the chain's residual drawn with ``lambda = w``, not ``1/w``.

    Block verification draws the residual through ``sample_residual_log_lam(delta, log_lam,
    u)`` with ``log_lam = -log w``; flipping the sign of ``log_lam`` there is exactly the
    mutant (single nodes pass ``log_lam = 0`` and are unchanged).
    """
    real = getattr(block_module, "sample_residual_log_lam")  # noqa: B009 (imported, not exported)

    def mutated(delta: Any, log_lam: Any, u: Any) -> Any:
        return real(delta, -np.asarray(log_lam), u)

    monkeypatch.setattr(block_module, "sample_residual_log_lam", mutated)


@pytest.mark.parametrize("residual_noise", [None, 0.0], ids=["generator", "threshold"])
def test_block_chain_residual_support(residual_noise: Any) -> None:
    _check_block_residual_support(residual_noise)


@pytest.mark.parametrize("residual_noise", [None, 0.0], ids=["generator", "threshold"])
def test_block_chain_residual_support_kills_mutant(
    monkeypatch: pytest.MonkeyPatch, residual_noise: Any
) -> None:
    _residual_with_lambda_w(monkeypatch)
    with pytest.raises(AssertionError):
        _check_block_residual_support(residual_noise)


def test_block_residual_at_threshold_sits_on_the_boundary() -> None:
    """With residual uniform 0 the output is the support's left end: ``w rho = 1``.

    Up to about ``sqrt(eps)`` in ``s``: the residual density vanishes at its left end, so the
    tail mass the bisection inverts is flat there to second order.
    """
    margins, _ = _residual_margins(0.0)
    assert np.abs(margins).max() <= 1e-6


# ---------------------------------------------------------------- 3. lossless_error self-test


class _AcceptEverything(Standard):
    """A broken scheme: the drafted child is always accepted (no ratio test, no residual)."""

    name = "accept-everything"

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        (child,) = tree.candidates[node]
        return child, None

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        (child,) = tree.candidates[node]
        return [(child, 1)], 0 * target_probs[node]


def _check_lossless_error_on_a_known_bad_law() -> None:
    r"""The draft always proposes token 2, which the target never emits.

    Accepting it, then a bonus from the target, emits ``(2, 0)`` and ``(2, 1)`` with 1/2
    each; the target joint puts 1/4 on each of ``(0, 0), (0, 1), (1, 0), (1, 1)``. The largest
    deviation is ``|1/2 - 0| = 1/2``, on sequences the target cannot emit.
    """
    pair = ss.pairs.Stationary([F(1, 2), F(1, 2), F(0)], [F(0), F(0), F(1)])
    scheme = _AcceptEverything()
    law = exact.round_law(scheme, pair, ss.Shape.chain(1))
    assert law == {(2, 0): F(1, 2), (2, 1): F(1, 2)}
    error = exact.lossless_error(scheme, pair, ss.Shape.chain(1))
    assert isinstance(error, Fraction)
    assert error == F(1, 2)
    # The real scheme is lossless on the same pair.
    assert exact.lossless_error("standard", pair, ss.Shape.chain(1)) == 0


def _lossless_error_on_target_support(
    scheme: Any, pair: Any, shape: ss.Shape, length: Any = None, prefix: Any = (), **kwargs: Any
) -> Any:
    """The surviving mutant: deviations only over sequences the target can emit."""
    length = shape.depth + 1 if length is None else length
    emitted = exact.extended_law(scheme, pair, shape, length, prefix)
    target = exact.target_joint(pair, length, prefix)
    return max(abs(emitted.get(seq, 0) - prob) for seq, prob in target.items())


def test_lossless_error_on_a_known_bad_law() -> None:
    _check_lossless_error_on_a_known_bad_law()


def test_lossless_error_kills_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exact, "lossless_error", _lossless_error_on_target_support)
    assert exact.lossless_error(
        _AcceptEverything(),
        ss.pairs.Stationary([F(1, 2), F(1, 2), F(0)], [F(0), F(0), F(1)]),
        ss.Shape.chain(1),
    ) == F(1, 4)  # the mutant's hand-derived error
    with pytest.raises(AssertionError):
        _check_lossless_error_on_a_known_bad_law()


# ---------------------------------------------------------------- 4. renormalised float input

#: Near-normalised float pairs: masses 1 +- 4e-7, inside the default tolerance 1e-6.
OFF = 4e-7
NEAR_PAIRS = [
    ([0.5 + OFF, 0.3, 0.2], [0.2, 0.3, 0.5 - OFF]),
    ([0.6, 0.4 - OFF], [0.3 + OFF / 2, 0.7 + OFF / 2]),
    ([0.25 + OFF / 4] * 4, [0.1, 0.2, 0.3, 0.4 - OFF]),
]
NEAR_CASES = [
    ("standard", ss.Shape.chain(2)),
    ("specinfer", ss.Shape.star(2)),
    ("nss", ss.Shape.paths(2, 2)),
    ("rsd", ss.Shape.branching((2, 1))),
    ("spectr", ss.Shape.star(2)),
    ("block", ss.Shape.chain(2)),
    ("gumbel", ss.Shape.chain(2)),
    ("poisson", ss.Shape.branching((2, 1))),
]


def _check_near_normalised_round_laws(cases: Iterable[tuple[str, ss.Shape]] = NEAR_CASES) -> None:
    for target, draft in NEAR_PAIRS:
        assert abs(sum(target) - 1) > 1e-7 or abs(sum(draft) - 1) > 1e-7  # really off
        pair = ss.pairs.Stationary(target, draft)
        for name, shape in cases:
            law = ss.round_law(name, pair, shape)
            assert abs(float(sum(law.values())) - 1) <= 1e-12, (name, shape, target, draft)


_REAL_CHECK_DISTRIBUTION = validation.check_distribution


def _check_distribution_without_renormalising(
    probs: Any, name: str, vocab_size: Any = None, *, tolerance: float = 1e-6
) -> Any:
    """The surviving mutant: every check, but float input comes back as given."""
    out = _REAL_CHECK_DISTRIBUTION(probs, name, vocab_size, tolerance=tolerance)
    if validation.is_exact(out):
        return out
    return np.asarray(validation.as_real_array(probs, name)[0], dtype=np.float64)


def test_near_normalised_round_laws_sum_to_one() -> None:
    _check_near_normalised_round_laws()


def test_near_normalised_round_laws_kill_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "check_distribution", _check_distribution_without_renormalising)
    for case in NEAR_CASES:  # every scheme and shape on its own sees the mutant
        with pytest.raises(AssertionError, match=case[0]):
            _check_near_normalised_round_laws([case])


# ---------------------------------------------------------------- live bug: acceptance in [0, 1]


def _disjoint_cases() -> list[tuple[list[float], list[float]]]:
    """Disjoint supports with masses an ulp off one (as given; ``Stationary`` renormalises).

    The first draft sums to ``1 + 2**-52`` in float64 and, renormalised twice (by the pair,
    then by ``spectr_acceptance``), still does: ``1 - (1 + 2**-52)**k`` was returned.
    """
    draft = [0.0, 0.0, 0.4, 0.15, 0.15, 0.3000000000000001]
    assert sum(draft) == 1 + 2**-52
    cases = [([0.5, 0.5, 0.0, 0.0, 0.0, 0.0], draft)]
    cases.append(
        (
            [0.0, 0.0, 0.0, 0.0, 0.5, 0.5],
            [0.3888888888888889, 0.4444444444444444, 0.16666666666666688, 0.0, 0.0, 0.0],
        )
    )
    cases.append(
        (
            [0.0, 0.6286963023755633, 0.3628044105020936, 0.008499287122343196],
            [1.0 + 2**-52, 0.0, 0.0, 0.0],
        )
    )
    cases.append(([1 / 3, 1 / 3, 1 / 3 + 2**-54, 0.0], [0.0, 0.0, 0.0, 1.0]))
    cases.append(([0.0, 0.0, 0.0, 1.0], [0.1, 0.2, 0.7 - 2**-53, 0.0]))
    return cases


def _check_acceptance_is_a_probability() -> None:
    checked = 0
    for target, draft in _disjoint_cases():
        for name, scheme in ss.SCHEMES.items():
            for k in (1, 2, 3):
                if not scheme.supports(scheme.single_shape(k)):
                    continue
                value = ss.acceptance(name, target, draft, k)
                assert 0 <= value <= 1, (name, k, value, target, draft)
                # Disjoint supports: no draft is ever the target's token.
                assert float(value) == pytest.approx(0.0, abs=1e-12), (name, k, value)
                checked += 1
    assert checked > 5 * len(ss.SCHEMES)


def test_acceptance_is_a_probability_on_disjoint_supports() -> None:
    _check_acceptance_is_a_probability()


def test_acceptance_check_catches_the_unclipped_spectr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the clips (the state before the fix) the check fails on ``spectr``."""

    def unclipped(value: Any) -> Any:
        return value

    for module in (spectr_module, exact, ops):
        for attribute in ("clip_probability", "_probability"):
            if hasattr(module, attribute):
                monkeypatch.setattr(module, attribute, unclipped)
    target, draft = _disjoint_cases()[0]
    assert ss.acceptance("spectr", target, draft, 1) < 0
    with pytest.raises(AssertionError, match="spectr"):
        _check_acceptance_is_a_probability()
