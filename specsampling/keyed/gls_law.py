r"""Gumbel-max list sampling (GLS): exact match laws, acceptance and the list-matching bound.

GLS (Rowan, Phan, Khisti, arXiv 2506.05632) keeps ``K`` independent rows of keyed exponentials
``E[k, i]`` per position. Draft ``k`` is ``X_k = argmin_i E[k, i] / q_i`` (its own row); the
target selects over a set of rows ``R``,

.. math:: Y = \arg\min_i \min_{k \in R} E[k, i] / p_i ,

which is an exact draw from ``p`` because ``min_k E[k, i]`` is ``Exp(|R|)`` for every ``i``.
The paper's verifier uses the *active* rows (drafts that matched every earlier target token);
the strong variant uses all ``K`` rows, so its output is seeded target-only decoding.

Law of one position. Let ``n`` rows be active among ``|R|`` rows raced by the target (``n`` of
them, or ``K`` in the strong variant); all active rows share the prefix, so they share ``q``.
Given that the race is won by row ``k*`` at token ``j`` with value ``s`` (density
``p_j e^{-|R| s}`` per row), every other ``E[k, i]`` is ``p_i s`` plus a fresh ``Exp(1)``:

* the winning row drafts ``j`` iff each ``i != j`` exceeds ``s r_i`` with
  ``r_i = (q_i p_j / q_j - p_i)_+``: probability ``b(s) = exp(-s sum_i r_i)``;
* another row drafts ``j`` with probability
  ``a(s) = int_0^inf e^{-x} exp(-sum_i (c_i x + s (c_i p_j - p_i))_+) dx``, ``c_i = q_i / q_j``,
  a piecewise-exponential integral in closed form (breakpoints ``s * u_i``);
* rows draft independently given ``s``, so the number ``M`` of active rows that drafted ``j``
  is ``[k* active] * Bernoulli(b) + Binomial(n - [k* active], a)``.

Integrating ``s`` gives ``P(Y = j, M = m)`` (:func:`match_law`). With one row it reduces to
the Gumbel closed form ``c_j``.

Fast form. Substituting ``x = s q_j (tau - rho_j)`` (``rho_j = p_j / q_j``) turns the exponent of
``a(s)`` into ``s Phi(tau)``, with ``Phi(tau) = sum_i q_i (tau - t_i)_+`` the one convex
piecewise-linear function of :class:`~specsampling.keyed.laws.RatioProfile` (``t_i = p_i / q_i``;
the ``x`` term is token ``j``'s own):

.. math::

    b_j(s) = e^{-s \Phi(\rho_j)}, \qquad
    a_j(s) = s\, q_j \int_{\rho_j}^\infty e^{-s \Phi(\tau)}\, d\tau .

The integral is a sum of exponential pieces over the breakpoints above ``rho_j``: for every
``s`` one reverse prefix sum over the sorted ratios gives ``a_j(s)`` for all ``j`` at once, so a
position costs one sort plus ``O(V)`` per quadrature node (about 100 nodes), not ``O(V^2)``.
The outer integral is the trapezoid rule in ``log s`` on one shared grid (:func:`s_grid`), after
subtracting the ``s -> 0`` limit of the integrand so that both tails vanish.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..validation import check_positive_int
from .laws import RatioProfile, as_floats, gumbel_hits, ratio_profile

Floats = npt.NDArray[np.float64]

#: Spacing of the trapezoid rule in ``log s``; the tests hold the error below ``ERROR_BOUND``
#: against a rule with a quarter of this step and against a direct double integral.
STEP = 0.3
#: Stated absolute error of :func:`gls_acceptance` and of each entry of :func:`match_law`.
ERROR_BOUND = 1e-10
#: Truncation budget of each tail of the ``log s`` grid.
TAIL = 1e-16
#: Grid nodes per block: bounds the memory to ``BLOCK * V`` floats per array.
BLOCK = 16


class Grid(NamedTuple):
    """Nodes ``s`` and trapezoid weights (``weights @ f(s) ~ int f(s) ds``) of :func:`s_grid`."""

    s: Floats
    weights: Floats


def _pair(target_probs: Any, draft_probs: Any) -> tuple[Floats, Floats]:
    p = as_floats(target_probs, "target")
    return p, as_floats(draft_probs, "draft", p.shape[0])


def s_grid(profile: RatioProfile, rows: int, active: int, *, low: float | None = None) -> Grid:
    """The shared ``log s`` grid: from far below every scale of the profile to ``-log(TAIL)/rows``.

    The integrands used here are ``rows e^{-rows s}`` times a difference that vanishes like
    ``s (active + 1) (1 + Phi_max + t_max)`` as ``s -> 0``; the grid starts where that tail is
    below ``TAIL`` (or at ``low``) and ends where ``e^{-rows s} < TAIL``.

    >>> prof = ratio_profile(np.array([0.5, 0.5]), np.array([0.5, 0.5]))
    >>> grid = s_grid(prof, 2, 2)
    >>> round(float(grid.weights @ (2 * np.exp(-2 * grid.s))), 9)  # int_0^inf 2 e^{-2s} ds
    1.0
    """
    if low is None:
        scale = (active + 1) * rows * (1.0 + float(profile.phi[-1]) + float(profile.ratios[-1]))
        low = math.sqrt(2 * TAIL / scale)
    high = math.log(-math.log(TAIL) / rows)
    y = np.arange(math.log(low), high + STEP, STEP)
    s: Floats = np.exp(y)
    weights: Floats = np.full(y.shape[0], STEP) * s
    weights[[0, -1]] /= 2
    return Grid(s, weights)


class Segments(NamedTuple):
    """The pieces of ``Phi`` in *descending* ratio order, ready for :func:`match_rates`."""

    tokens: npt.NDArray[np.intp]  #: token ids, ratios descending
    phi: Floats  #: ``Phi`` at each token's ratio
    inverse_slopes: Floats  #: ``1 / A_m``, ``A_m`` the slope of ``Phi`` just above ``t_m``
    steps: Floats  #: ``q_m / (A_m A_{m-1})`` (``A_{-1}``: below the lowest ratio, ``q_m`` there)
    draft: Floats  #: ``q`` of each token


def segments(profile: RatioProfile, draft: Floats) -> Segments:
    """:class:`Segments` of a :class:`~specsampling.keyed.laws.RatioProfile`."""
    slopes = profile.slopes
    below = np.concatenate(([1.0], slopes[:-1]))  # the lowest token's step is never used
    weights = draft[profile.order]
    return Segments(
        profile.order[::-1].copy(),
        profile.phi[::-1].copy(),
        (1.0 / slopes)[::-1].copy(),
        (weights / (slopes * below))[::-1].copy(),
        weights[::-1].copy(),
    )


def match_rates(pieces: Segments, s: Floats) -> tuple[Floats, Floats]:
    r"""``(b, a)``, each of shape ``(n, len(s))``: rows are ``pieces.tokens``, columns nodes.

    ``b[m, k] = d_m = exp(-s_k Phi(t_m))`` (the winning row drafts its token) and
    ``a[m, k] = s_k q_m int_{t_m}^inf exp(-s_k Phi)`` (another row does). The integral over the
    segments above ``t_r`` is ``sum_{m >= r} (d_m - d_{m+1}) / A_m``; summed by parts,

    .. math:: a_r = q_r \Big[ d_r / A_r - \sum_{m > r} d_m\, q_m / (A_m A_{m-1}) \Big],

    one exponential and one prefix sum of non-negative terms per node; the bracket is at most
    ``d_r / A_r`` and ``q_r <= A_r``, so ``a`` has absolute error below ``(2 + 2 sqrt(V))``
    units of rounding.
    """
    decay = np.exp(pieces.phi[:, None] * -s)
    terms = decay[:-1] * pieces.steps[:-1, None]
    above = np.zeros_like(decay)  # exclusive prefix sums: only the tokens of higher ratio
    np.cumsum(terms, axis=0, out=above[1:])  # along tokens: vectorised over the nodes
    other: Floats = decay * pieces.inverse_slopes[:, None]
    other -= above
    other *= pieces.draft[:, None]
    np.clip(other, 0.0, 1.0, out=other)
    return decay, other


def _power(base: Floats, exponent: int) -> Floats:
    """``base ** exponent`` by repeated products for small exponents (faster than ``pow``)."""
    if exponent > 8:
        out: Floats = np.power(base, exponent)
        return out
    out = np.ones_like(base)
    for _ in range(exponent):
        out *= base
    return out


def _binomial(trials: int, success: Floats, count: int) -> Floats:
    """``P[Binomial(trials, success) = count]`` elementwise, in log space (any ``trials``)."""
    if count < 0 or count > trials:
        return np.zeros_like(success)
    log_choose = math.lgamma(trials + 1) - math.lgamma(count + 1) - math.lgamma(trials - count + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        hit = count * np.log(success) if count > 0 else np.zeros_like(success)
        miss = (trials - count) * np.log1p(-success) if count < trials else np.zeros_like(success)
    out: Floats = np.nan_to_num(np.exp(log_choose + hit + miss), nan=0.0)
    return out


def _masses(winner: Floats, other: Floats, active: int, rows: int) -> list[Floats]:
    """``rows * P(M = m | s)`` for ``m = 0..active`` (the integrand without ``p_j e^{-rows s}``)."""
    out = []
    for count in range(active + 1):
        mass = active * (
            winner * _binomial(active - 1, other, count - 1)
            + (1 - winner) * _binomial(active - 1, other, count)
        )
        if rows > active:
            mass = mass + (rows - active) * _binomial(active, other, count)
        out.append(mass)
    return out


def match_law(target_probs: Any, draft_probs: Any, active: int, rows: int | None = None) -> Floats:
    """``law[j, m] = P(Y = j, m of the active rows drafted j)`` at one position.

    Computed by the fast form of the module docstring: one sort, then ``O(V * active)`` work per
    node of the shared ``log s`` grid (about 100 nodes). Each entry has absolute error below
    ``ERROR_BOUND`` (``1e-10``; the tests check it against a direct double integral). Any
    ``active`` works (binomials in log space).

    Parameters
    ----------
    target_probs, draft_probs : array_like, shape (vocab_size,)
    active : int
        Active rows ``n`` (they share the prefix, hence ``q``).
    rows : int, optional
        Rows the target races, ``>= active`` (default ``active``: the paper's verifier; ``K``
        for the strong all-rows variant).

    Returns
    -------
    ndarray, shape (vocab_size, active + 1)
        Rows sum to ``p`` exactly (the ``m = 0`` column is ``p_j`` minus the others); every entry
        is in ``[0, p_j]``.

    Examples
    --------
    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> law = match_law(p, q, 1)
    >>> bool(np.allclose(law[:, 1], gumbel_hits(p, q), atol=1e-12))
    True
    >>> law.sum(axis=1).round(12).tolist()
    [0.5, 0.3, 0.2]
    """
    p, q = _pair(target_probs, draft_probs)
    n = check_positive_int(active, "active")
    total_rows = n if rows is None else check_positive_int(rows, "rows")
    if total_rows < n:
        raise ValueError(f"rows: expected at least active = {n} rows, got {total_rows}")
    law: Floats = np.zeros((p.shape[0], n + 1))
    law[:, 0] = p
    profile = ratio_profile(p, q)
    if profile.order.shape[0] == 0:
        return law
    pieces = segments(profile, q)
    tokens = pieces.tokens
    grid = s_grid(profile, total_rows, n)
    # The s -> 0 limit (b = 1, a = q_j), integrated exactly: int rows e^{-rows s} ds = 1.
    start = _masses(np.ones(tokens.shape[0]), q[tokens], n, total_rows)
    hits = np.array([mass / total_rows for mass in start[1:]])  # (n, tokens)
    for first in range(0, grid.s.shape[0], BLOCK):
        s, weights = grid.s[first : first + BLOCK], grid.weights[first : first + BLOCK]
        winner, other = match_rates(pieces, s)
        kernel = np.exp(-total_rows * s) * weights
        masses = _masses(winner, other, n, total_rows)
        for count in range(1, n + 1):
            hits[count - 1] += (masses[count] - start[count][:, None]) @ kernel
    hits = np.clip(hits * p[tokens], 0.0, None)
    totals = hits.sum(axis=0)
    over = totals > p[tokens]
    hits[:, over] *= p[tokens][over] / totals[over]
    law[tokens, 1:] = hits.T
    law[tokens, 0] = np.maximum(p[tokens] - hits.sum(axis=0), 0.0)
    return law


def gls_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    r"""``P(Y in {X_1..X_K})`` of GLS at one position (both variants agree there).

    .. math::

        \sum_j p_j \Big[ 1 - \int_0^\infty K e^{-K s}\,
            \big(1 - b_j(s)\big) \big(1 - a_j(s)\big)^{K-1} ds \Big]

    with ``a_j, b_j`` of the module docstring: one sort and ``O(V)`` per grid node, any ``K``.
    Absolute error below ``ERROR_BOUND`` (``1e-10``); exactly the Gumbel closed form at
    ``K = 1``; clipped to ``[0, 1]``.

    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> a1, a2 = gls_acceptance(p, q, 1), gls_acceptance(p, q, 2)
    >>> a1 < a2 <= 1, round(a1, 6)
    (True, 0.630769)
    """
    k = check_positive_int(num_drafts, "num_drafts")
    p, q = _pair(target_probs, draft_probs)
    if k == 1:
        return min(max(float(gumbel_hits(p, q).sum()), 0.0), 1.0)
    profile = ratio_profile(p, q)
    if profile.order.shape[0] == 0:
        return 0.0
    pieces = segments(profile, q)
    target = p[pieces.tokens]
    # The integrand is below K s Phi_j (1 - b <= s Phi): the part below s_0 is under TAIL.
    spread = max(float(target @ pieces.phi), 1e-300)
    low = min(math.sqrt(2 * TAIL / (k * spread)), -math.log(TAIL) / k / 1e3)
    grid = s_grid(profile, k, k, low=low)
    misses = np.zeros(pieces.tokens.shape[0])  # int K e^{-Ks} (1 - b)(1 - a)^{K-1} ds
    for first in range(0, grid.s.shape[0], BLOCK):
        s, weights = grid.s[first : first + BLOCK], grid.weights[first : first + BLOCK]
        winner, other = match_rates(pieces, s)
        np.subtract(1.0, other, out=other)
        survive = _power(other, k - 1)
        np.subtract(1.0, winner, out=winner)
        survive *= winner
        misses += survive @ (k * np.exp(-k * s) * weights)
    total = float(target @ (1 - np.clip(misses, 0.0, 1.0)))
    return min(max(total, 0.0), 1.0)


def list_matching_bound(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    r"""The list-matching lower bound on GLS acceptance (reconstructed; ``docs/schemes/gls.md``).

    .. math::

        \sum_j p_j \Big/ \Big[ 1 - \tfrac1K + \tfrac1K \sum_i \max(p_i,\ q_i p_j / q_j) \Big]

    It is the probability that the row winning the target's race also drafted ``Y``; at
    ``K = 1`` it is the exact Gumbel acceptance. O(V log V) (the bracket is
    ``1 + Phi(rho_j) / K``, :class:`~specsampling.keyed.laws.RatioProfile`).

    >>> round(list_matching_bound([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 1), 6)
    0.630769
    """
    p, q = _pair(target_probs, draft_probs)
    k = check_positive_int(num_drafts, "num_drafts")
    profile = ratio_profile(p, q)
    target = p[profile.order]
    total = float(np.sum(target / (1 - 1 / k + (float(p.sum()) + profile.phi) / k)))
    return min(max(total, 0.0), 1.0)


__all__ = [
    "ERROR_BOUND",
    "STEP",
    "Grid",
    "Segments",
    "gls_acceptance",
    "list_matching_bound",
    "match_law",
    "match_rates",
    "s_grid",
    "segments",
]
