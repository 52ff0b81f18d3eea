"""Gumbel and Poisson list couplings on keyed exponentials: drafter-invariant decoding.

Per position ``t`` both parties read the same keyed exponentials ``E_z``
(:mod:`specsampling.keyed.field`).

* **Gumbel** (Daliri, Musco, Suresh, arXiv 2408.07978): draft ``X = argmin_z E_z / q_z``,
  target ``Y = argmin_z E_z / p_z``. Each is exactly distributed as its own law (the
  exponential race), and the output is ``Y``, a function of (key, target) alone.
* **Poisson list** (derived in this project; ``docs/schemes/poisson.md``): the drafter's list is
  its ``L`` first arrivals, the ``L`` smallest ``E_z / q_z`` (Gumbel-top-L, an exact sample of
  size ``L`` from ``q`` without replacement). The target accepts iff ``Y`` is in the list; the
  output is always ``Y``, so the emitted stream equals seeded target-only decoding bit for bit.

Acceptance, with ``r_i = (q_i p_j / q_j - p_i)_+``:

.. math::

    P(\\mathrm{acc}) = \\sum_j p_j \\int_0^\\infty e^{-x}
        P[\\mathrm{PoissonBinomial}(1 - e^{-x r}) \\le L - 1] \\, dx,
    \\qquad
    P_{L=1} = \\sum_j 1 \\Big/ \\sum_i \\max(p_i / p_j, q_i / q_j).

Proof idea: given ``Y = j`` with ``s = E_j / p_j``, the law of ``s`` is ``p_j e^{-s}`` and the
other ``E_i`` are ``p_i s + Exp(1)``, independent; token ``i`` beats ``j`` in the drafter's race
iff its extra ``Exp(1)`` is below ``s r_i``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from .._types import Prefix
from ..errors import InvalidDistribution
from ..validation import check_distribution, check_positive_int
from .field import KeyedNoise, log

Floats = npt.NDArray[np.float64]


def as_floats(probs: Any, name: str, vocab_size: int | None = None) -> Floats:
    """A validated distribution (:func:`~specsampling.validation.check_distribution`), float64."""
    out: Floats = np.asarray(check_distribution(probs, name, vocab_size), dtype=np.float64)
    return out


def _scores(probs: Floats, exps: Any) -> Floats:
    """Log-domain race scores ``log E - log p``; ``+inf`` where ``p = 0`` (never selected).

    The logarithm is the portable :func:`specsampling.keyed.field.log` (the same bits on every
    host and in the torch lowering), so race winners agree across backends even at near-ties."""
    e = np.asarray(exps, dtype=np.float64)
    if e.shape[-1:] != probs.shape or np.any(np.isnan(e)) or np.any(e < 0):
        raise InvalidDistribution(
            f"exponentials: expected non-negative values of shape (..., {probs.shape[0]})"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        scores: Floats = log(e) - log(probs)
    scores[..., probs == 0] = np.inf
    return scores


def race_winner(proposal: Floats, exps: Any) -> Any:
    """The exponential race ``argmin_{proposal_z > 0} E_z / proposal_z`` in the log domain (ties:
    lowest index): an exact draw from ``proposal``. The one race of the keyed family, used by the
    drafter's and the target's selections alike; ``proposal`` is a validated float distribution.

    >>> int(race_winner(np.array([0.5, 0.5, 0.0]), [0.3, 0.2, 0.0]))
    1
    """
    return np.argmin(_scores(proposal, exps), axis=-1)


def gumbel_target(target_probs: Any, exps: Any) -> Any:
    """The target's keyed selection ``argmin_{p_z > 0} E_z / p_z`` (ties: lowest index).

    Parameters
    ----------
    target_probs : array_like, shape (vocab_size,)
    exps : array_like, shape (..., vocab_size)
        Exponentials, e.g. :func:`specsampling.keyed.exponentials`.

    Returns
    -------
    int, or ndarray of int with shape (...)

    >>> gumbel_target([0.0, 0.5, 0.5], [0.0, 0.2, 0.1])
    2
    """
    out = race_winner(as_floats(target_probs, "target"), exps)
    return int(out) if out.ndim == 0 else out


def gumbel_draft(draft_probs: Any, exps: Any) -> Any:
    """The drafter's keyed selection ``argmin_{q_z > 0} E_z / q_z`` (same race, its own law).

    >>> gumbel_draft([0.5, 0.5, 0.0], [0.3, 0.2, 0.0])
    1
    """
    out = race_winner(as_floats(draft_probs, "draft"), exps)
    return int(out) if out.ndim == 0 else out


def poisson_list(draft_probs: Any, exps: Any, list_size: int) -> tuple[int, ...]:
    """The drafter's ``list_size`` first arrivals: Gumbel-top-L, in arrival order.

    Tokens with ``q = 0`` never arrive, so the list is shorter when the support is.

    >>> poisson_list([0.25, 0.25, 0.5, 0.0], [0.3, 0.2, 0.4, 0.0], 3)
    (1, 2, 0)
    """
    probs = as_floats(draft_probs, "draft")
    size = check_positive_int(list_size, "list_size")
    scores = _scores(probs, exps)
    if scores.ndim != 1:
        raise InvalidDistribution("exponentials: poisson_list takes one position, shape (V,)")
    order = np.argsort(scores, kind="stable")[: min(size, int(np.count_nonzero(probs)))]
    return tuple(int(t) for t in order)


class RatioProfile(NamedTuple):
    r"""The tokens with ``q > 0`` sorted by likelihood ratio, and the convex function ``Phi``.

    .. math:: \Phi(\tau) = \sum_i q_i (\tau - t_i)_+, \qquad t_i = p_i / q_i,

    piecewise linear with slope ``slopes[m] = sum_{i <= m} q_i`` on ``[t_m, t_{m+1}]``. For a
    token ``j`` with ratio ``rho_j = t_j``, ``Phi(rho_j) = sum_i (q_i p_j / q_j - p_i)_+`` is the
    total rate ``sum_i r_i`` of the module docstring, so
    ``sum_i max(p_i, q_i p_j / q_j) = 1 + Phi(rho_j)``.
    """

    order: npt.NDArray[np.intp]  #: token ids with ``q > 0``, ratios ascending (ties: by id)
    ratios: Floats  #: ``t`` in that order
    phi: Floats  #: ``Phi(t_m)``
    slopes: Floats  #: ``sum_{i <= m} q_i``


def cumulative(values: Floats) -> Floats:
    """Prefix sums of non-negative ``values`` in two levels (blocks of about ``sqrt(n)``):
    relative error at most ``2 sqrt(n)`` units of rounding, against ``n`` for ``np.cumsum``.

    >>> cumulative(np.array([1.0, 2.0, 3.0, 4.0, 5.0])).tolist()
    [1.0, 3.0, 6.0, 10.0, 15.0]
    """
    size = values.shape[0]
    width = max(1, math.isqrt(size))
    blocks = np.concatenate((values, np.zeros(-size % width))).reshape(-1, width)
    inner = np.cumsum(blocks, axis=1)
    offsets = np.concatenate(([0.0], np.cumsum(inner[:, -1])[:-1]))
    out: Floats = (inner + offsets[:, None]).ravel()[:size]
    return out


def finite_ratios(target: Floats, draft: Floats) -> npt.NDArray[np.bool_]:
    """The tokens whose ratio ``target / draft`` the float laws use: ``draft > 0`` and the ratio
    at most float64's largest value over ``4 V`` (so sums of ``V`` ratio-scaled terms stay
    finite). A token beyond it has a draft probability below ``4 V / 1.8e308`` of its target
    probability (subnormal in practice): it is drafted with probability under ``1e-300``, and is
    left out of the ratios (its hit mass, at most its draft mass, is dropped; ``inf`` ratios
    made NaN or ``log(0)`` in the integrals)."""
    cap = np.finfo(np.float64).max / (4 * max(1, draft.shape[0]))
    kept: npt.NDArray[np.bool_] = (draft > 0) & (target <= draft * cap)
    return kept


def ratio_profile(target: Floats, draft: Floats) -> RatioProfile:
    """:class:`RatioProfile` of validated float distributions: one sort and prefix sums, O(V log V).

    ``Phi`` is accumulated from the non-negative increments ``slopes[m] (t_{m+1} - t_m)``, so it
    carries no cancellation: relative error below ``3 sqrt(V)`` units of rounding.

    >>> prof = ratio_profile(np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5]))
    >>> prof.order.tolist(), prof.phi.round(12).tolist()
    ([2, 1, 0], [0.0, 0.3, 1.5])
    """
    order = np.flatnonzero(finite_ratios(target, draft))
    ratios = target[order] / draft[order]
    sort = np.argsort(ratios, kind="stable")
    order, ratios = order[sort], ratios[sort]
    slopes = cumulative(draft[order])
    phi = np.concatenate(([0.0], cumulative(slopes[:-1] * np.diff(ratios))))
    return RatioProfile(order, ratios, phi, slopes)


def _exact_gumbel_hits(p: Any, q: Any) -> Any:
    """The Fraction path of :func:`gumbel_hits`: the same sort and prefix sums, in rationals."""
    hits = np.array([0 * p[0]] * p.shape[0], dtype=object)
    order = sorted((i for i in range(p.shape[0]) if q[i] > 0), key=lambda i: (p[i] / q[i], i))
    mass = sum(p)
    phi, slope, previous = 0 * p[0], 0 * p[0], None
    for token in order:
        ratio = p[token] / q[token]
        if previous is not None:
            phi += slope * (ratio - previous)
        slope, previous = slope + q[token], ratio
        if p[token] > 0:
            hits[token] = p[token] / (mass + phi)
    return hits


def gumbel_hits(target_probs: Any, draft_probs: Any) -> Any:
    r"""``c_j = P(X = Y = j)`` of the single-draft Gumbel coupling, per token.

    .. math::

        c_j = p_j \Big/ \sum_i \max(p_i,\ q_i p_j / q_j) = p_j \big/ (1 + \Phi(p_j / q_j))

    and ``c_j = 0`` where ``p_j q_j = 0`` (``Phi``: :class:`RatioProfile`). One sort of the
    ratios ``p_i / q_i`` and prefix sums, O(V log V). Rational: ``Fraction`` inputs give exact
    values by the same algorithm (the exact engine's Gumbel round law). Float: each ``c_j`` has
    relative error below ``4 sqrt(V)`` units of rounding (``1.2e-13`` at V = 150,000).

    >>> from fractions import Fraction as F
    >>> gumbel_hits([F(1, 2), F(1, 2)], [F(1, 4), F(3, 4)]).tolist()
    [Fraction(1, 4), Fraction(1, 2)]
    """
    p = check_distribution(target_probs, "target")
    q = check_distribution(draft_probs, "draft", p.shape[0])
    if p.dtype == object:
        return _exact_gumbel_hits(p, q)
    profile = ratio_profile(p, q)
    out: Floats = np.zeros(p.shape[0])
    hits = p[profile.order] / (float(p.sum()) + profile.phi)
    out[profile.order] = np.minimum(hits, p[profile.order])
    return out


def gumbel_acceptance(target_probs: Any, draft_probs: Any) -> Any:
    r"""Exact ``P(X = Y)`` of the single-draft Gumbel coupling: the sum of :func:`gumbel_hits`.

    .. math:: \sum_{j:\, p_j q_j > 0} 1 \Big/ \sum_i \max(p_i / p_j,\ q_i / q_j)

    O(V log V); exact for ``Fraction`` input, absolute error below ``5 sqrt(V)`` units of
    rounding for floats (``2e-13`` at V = 150,000). Always in ``[0, 1]``.

    >>> round(gumbel_acceptance([0.5, 0.5], [0.5, 0.5]), 12)
    1.0
    """
    hits = gumbel_hits(target_probs, draft_probs)
    if hits.dtype == object:
        return hits.sum()
    return min(max(float(hits.sum()), 0.0), 1.0)


def log_grid(low: float, high: float, step: float) -> tuple[Floats, Floats]:
    """Points ``x = exp(y)`` for ``y`` in ``[low, high]`` spaced by ``step``, and weights with
    ``weights @ f(x) ~ int f(x) dx``: the trapezoid rule in ``y`` (Jacobian ``x`` included).

    For integrands over ``(0, inf)`` that decay fast at both ends of ``log x``; used by the
    Poisson and GLS laws.

    >>> x, weights = log_grid(-40.0, np.log(40.0), 0.05)
    >>> round(float(np.exp(-x) @ weights), 12)  # int_0^inf e^-x dx
    1.0
    """
    y = np.arange(low, high + step, step)
    x: Floats = np.exp(y)
    weights: Floats = np.full(y.shape[0], step) * x
    weights[[0, -1]] /= 2
    return x, weights


#: The list law with ``L >= 2`` costs O(V^2): above this many (token, token) pairs it refuses
#: (about a second here) and names the Monte-Carlo alternative.
POISSON_MAX_PAIRS = 250_000
#: Measured throughput of :func:`poisson_hits` (pairs per second, 2-core machine), for messages.
POISSON_PAIRS_PER_SECOND = 250_000


def poisson_hits(
    target_probs: Any, draft_probs: Any, list_size: int, *, step: float = 0.05
) -> Floats:
    """``P(Y = j, j in the drafter's list)`` of the Poisson list coupling, per token.

    The integral of the module docstring, per token ``j``, taken in ``y = log x`` by the
    trapezoid rule with spacing ``step``; the integrand is analytic and decays doubly
    exponentially at both ends, so the rule converges geometrically (``step = 0.05`` is
    accurate to rounding). The grid for token ``j`` starts far below ``1 / (1 + sum_i r_i)``,
    the smallest scale on which the integrand moves, so tiny probabilities lose no mass.
    Poisson-binomial tails use a truncated recursion on ``1 - pi = exp(-x r)`` and
    ``pi = -expm1(-x r)``, with no cancellation. Each value is clipped to ``[0, p_j]``.

    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> bool(np.allclose(poisson_hits(p, q, 1), gumbel_hits(p, q), rtol=0, atol=1e-13))
    True
    """
    p = as_floats(target_probs, "target")
    q = as_floats(draft_probs, "draft", p.shape[0])
    size = check_positive_int(list_size, "list_size")
    if size == 1:  # a list of one is the Gumbel coupling: its closed form, any vocabulary
        hits: Floats = np.asarray(gumbel_hits(p, q), dtype=np.float64)
        return hits
    tokens = np.flatnonzero((p > 0) & finite_ratios(p, q))
    pairs = tokens.shape[0] * int(np.count_nonzero(q))
    if pairs > POISSON_MAX_PAIRS:
        raise ValueError(
            f"list_size={size}: the Poisson list law integrates over {pairs} token pairs "
            f"({tokens.shape[0]} tokens with p, q > 0), about "
            f"{pairs / POISSON_PAIRS_PER_SECOND:.0f} s here, more than "
            f"POISSON_MAX_PAIRS={POISSON_MAX_PAIRS}; estimate it by Monte "
            "Carlo instead: specsampling.simulators.estimate_emitted('poisson', "
            "Stationary(target, draft), Shape.star(list_size, replacement=False), num_rounds, "
            "rng).mean - 1, or use list_size=1 (the Gumbel closed form, any vocabulary)"
        )
    out: Floats = np.zeros(p.shape[0])
    for j in tokens:
        rates = np.maximum(q * (p[j] / q[j]) - p, 0.0)
        rates[j] = 0.0
        rates = rates[rates > 0]
        if rates.shape[0] < size:
            out[j] = p[j]
            continue
        x, weights = log_grid(-np.log1p(float(rates.sum())) - 40.0, np.log(40.0), step)
        tail = np.zeros((size, x.shape[0]))  # tail[k] = P[k of the tokens seen so far beat j]
        tail[0] = 1.0
        for rate in rates:
            stay = np.exp(-x * rate)
            move = -np.expm1(-x * rate)
            tail[1:] = tail[1:] * stay + tail[:-1] * move
            tail[0] = tail[0] * stay
        integral = float((np.exp(-x) * tail.sum(axis=0)) @ weights)
        out[j] = p[j] * min(max(integral, 0.0), 1.0)
    return out


def poisson_acceptance(
    target_probs: Any, draft_probs: Any, list_size: int, *, step: float = 0.05
) -> float:
    """Exact ``P(Y in list)`` of the Poisson list coupling: the sum of :func:`poisson_hits`.

    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> abs(poisson_acceptance(p, q, 1) - gumbel_acceptance(p, q)) < 1e-12
    True
    """
    return min(float(poisson_hits(target_probs, draft_probs, list_size, step=step).sum()), 1.0)


def poisson_acceptance_bound(target_probs: Any, draft_probs: Any, list_size: int) -> float:
    """Candidate lower bound ``sum_j p_j L q_j / (L q_j + p_j)`` (the PML bound at ``L = 1``).

    Not proven; the tests hold it as an inequality only.

    >>> round(poisson_acceptance_bound([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 1), 6)
    0.435714
    """
    p = as_floats(target_probs, "target")
    q = as_floats(draft_probs, "draft", p.shape[0])
    size = check_positive_int(list_size, "list_size")
    keep = p > 0
    return float(np.sum(p[keep] * size * q[keep] / (size * q[keep] + p[keep])))


def keyed_select(target_probs: Any, exps: Any) -> int:
    """The target's keyed selection over rows: ``argmin_i min_k E[k, i] / p_i``.

    With one row this is :func:`gumbel_target`; with ``K`` rows ``min_k E[k, i]`` is
    ``Exp(K)``, so the selection is still an exact draw from ``p`` (GLS). Ties: lowest index.

    >>> keyed_select([0.5, 0.5], [[0.3, 0.2], [0.1, 0.9]])
    0
    """
    probs = as_floats(target_probs, "target")
    scores = _scores(probs, exps)
    return int(np.argmin(scores.reshape(-1, probs.shape[0]).min(axis=0)))


def decode(
    pair: Any, length: int, noise: KeyedNoise | int, *, rows: int = 1, prefix: Prefix = ()
) -> tuple[int, ...]:
    """Seeded target-only decoding: each token is the target's keyed selection.

    This is what the strong drafter-invariant couplings (``gumbel``, ``poisson``,
    ``gls_strong``) emit, whatever the drafter: ``ss.generate(..., key=key)`` equals
    ``decode(pair, length, key, rows=...)`` token for token. Only ``pair.target`` is read, so a
    target-only model works (no drafter at all).

    Parameters
    ----------
    pair : ModelPair or any object with ``vocab_size`` and ``target(prefix)``
    length : int
        Tokens to emit.
    noise : KeyedNoise or int
        The keyed noise, or a key (position-keyed, prompt length ``len(prefix)``).
    rows : int
        Rows of exponentials per position (``K`` for GLS; ``1`` for Gumbel and Poisson).
    prefix : tuple of int
        The prompt.

    Examples
    --------
    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Random(6, seed=2)
    >>> stream = ss.generate("gumbel", pair, ss.Shape.chain(3), 12, np.random.default_rng(0), key=4)
    >>> stream == decode(pair, 12, 4)
    True
    """
    count = check_positive_int(length, "length", minimum=0)
    size = check_positive_int(rows, "rows")
    sequence: Prefix = tuple(int(t) for t in prefix)
    if not isinstance(noise, KeyedNoise):
        noise = KeyedNoise(noise, start=len(sequence))
    start = len(sequence)
    for _ in range(count):
        exps = noise.exponentials(sequence, size, pair.vocab_size)
        sequence = (*sequence, keyed_select(pair.target(sequence), exps))
    return sequence[start:]


__all__ = [
    "RatioProfile",
    "as_floats",
    "cumulative",
    "decode",
    "gumbel_acceptance",
    "gumbel_draft",
    "gumbel_hits",
    "gumbel_target",
    "keyed_select",
    "log_grid",
    "poisson_acceptance",
    "poisson_acceptance_bound",
    "poisson_hits",
    "poisson_list",
    "race_winner",
    "ratio_profile",
]
