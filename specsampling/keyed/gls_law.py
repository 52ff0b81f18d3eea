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

Integrating ``s`` gives ``P(Y = j, M = m)`` (:func:`match_law`); the outer integral is the
trapezoid rule in ``log s``, like :func:`specsampling.keyed.laws.poisson_hits`. With one row it
reduces to the Gumbel closed form ``c_j``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ..validation import check_positive_int
from .laws import as_floats, log_grid

Floats = npt.NDArray[np.float64]

#: Spacing of the trapezoid rule in ``log s``.
STEP = 0.05


def _pair(target_probs: Any, draft_probs: Any) -> tuple[Floats, Floats]:
    p = as_floats(target_probs, "target")
    return p, as_floats(draft_probs, "draft", p.shape[0])


def _other_row_match(p: Floats, q: Floats, j: int, s: Floats) -> Floats:
    """``a(s)``: probability that a non-winning row drafts ``j``, for every ``s`` in the grid."""
    c = q / q[j]
    slope_gap = c * p[j] - p  # the term of token i is (c_i x + s * slope_gap_i)_+
    keep = (c > 0) & (np.arange(p.shape[0]) != j)
    c, gap = c[keep], slope_gap[keep]
    starts = np.maximum(0.0, -gap / c)  # in units of s: token i activates at x = s * starts_i
    order = np.argsort(starts, kind="stable")
    starts, c, gap = starts[order], c[order], gap[order]
    # Segment k spans [starts_k, starts_{k+1}) with tokens 0..k active (segment -1: none).
    bounds = np.concatenate(([0.0], starts, [np.inf]))
    slopes = 1.0 + np.concatenate(([0.0], np.cumsum(c)))
    # g(u) at each segment start: u + sum_{active} (c_i u + gap_i), continuous in u.
    g_start = bounds[:-1] * slopes + np.concatenate(([0.0], np.cumsum(gap)))
    # The first segment starts at 0 with no token active yet only if starts_0 > 0.
    g_start[0] = 0.0
    widths = np.diff(bounds)
    total = np.zeros_like(s)
    for g0, slope, width in zip(g_start, slopes, widths, strict=True):
        head = np.exp(-s * g0)
        if np.isinf(width):
            total += head / slope
        elif width > 0:
            total += head * -np.expm1(-slope * s * width) / slope
    out: Floats = np.clip(total, 0.0, 1.0)
    return out


def _binomial(trials: int, success: Floats, counts: Any) -> Floats:
    """``P[Binomial(trials, success) = m]`` for ``m`` in ``counts`` (rows) and each
    ``success`` (columns); direct products, stable for tiny and near-one ``success``."""
    m = np.asarray(counts)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        hit = np.where(m > 0, success[None, :] ** m, 1.0)
        stay = np.where(m < trials, np.exp((trials - m) * np.log1p(-success[None, :])), 1.0)
    choose = np.array([math.comb(trials, int(k)) if 0 <= k <= trials else 0 for k in m[:, 0]])
    out: Floats = np.nan_to_num(choose[:, None] * hit * stay)
    return out


def match_law(target_probs: Any, draft_probs: Any, active: int, rows: int | None = None) -> Floats:
    """``law[j, m] = P(Y = j, m of the active rows drafted j)`` at one position.

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
        Rows sum to ``p`` exactly (the ``m = 0`` column is ``p_j`` minus the others).

    Examples
    --------
    >>> from specsampling.keyed.laws import gumbel_hits
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
    counts = np.arange(n + 1)
    for j in np.flatnonzero(p > 0):
        if q[j] == 0:
            law[j, 0] = p[j]
            continue
        gaps = np.maximum(q * (p[j] / q[j]) - p, 0.0)
        gaps[j] = 0.0
        spread = float(gaps.sum())
        scale = total_rows + spread + float(np.sum(q / q[j])) + float(np.sum(p)) / float(q[j])
        s, weights = log_grid(-np.log(scale) - 40.0, np.log(40.0 / total_rows), STEP)
        winner = np.exp(-s * spread)  # b(s)
        other = _other_row_match(p, q, int(j), s)  # a(s)
        mass = np.zeros((n + 1, s.shape[0]))
        if n > 1 or total_rows > n:
            others_if_active = _binomial(n - 1, other, counts)
            shifted = np.vstack([np.zeros((1, s.shape[0])), others_if_active[:-1]])
            mass += n * (winner * shifted + (1 - winner) * others_if_active)
            if total_rows > n:
                mass += (total_rows - n) * _binomial(n, other, counts)
        else:
            mass[1] = winner
            mass[0] = 1 - winner
        integrand = np.exp(-total_rows * s) * mass
        hits = np.clip(p[j] * (integrand[1:] @ weights), 0.0, None)
        if hits.sum() > p[j]:
            hits *= p[j] / hits.sum()
        law[j, 1:] = hits
        law[j, 0] = max(p[j] - hits.sum(), 0.0)
    return law


def gls_acceptance(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    r"""Exact ``P(Y in {X_1..X_K})`` of GLS at one position (both variants agree there).

    .. math:: \sum_j \sum_{m \ge 1} P(Y = j, M = m)

    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> a1, a2 = gls_acceptance(p, q, 1), gls_acceptance(p, q, 2)
    >>> a1 < a2 <= 1, round(a1, 6)
    (True, 0.630769)
    """
    k = check_positive_int(num_drafts, "num_drafts")
    return float(match_law(target_probs, draft_probs, k)[:, 1:].sum())


def list_matching_bound(target_probs: Any, draft_probs: Any, num_drafts: int) -> float:
    r"""The list-matching lower bound on GLS acceptance (specs §C.4, reconstructed form).

    .. math::

        \sum_j p_j \Big/ \Big[ 1 - \tfrac1K + \tfrac1K \sum_i \max(p_i,\ q_i p_j / q_j) \Big]

    It is the probability that the row winning the target's race also drafted ``Y``; at
    ``K = 1`` it is the exact Gumbel acceptance.

    >>> round(list_matching_bound([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 1), 6)
    0.630769
    """
    p, q = _pair(target_probs, draft_probs)
    k = check_positive_int(num_drafts, "num_drafts")
    both = np.flatnonzero((p > 0) & (q > 0))
    total = 0.0
    for j in both:
        spread = float(np.maximum(p, q * (p[j] / q[j])).sum())
        total += float(p[j]) / (1 - 1 / k + spread / k)
    return total


__all__ = ["gls_acceptance", "list_matching_bound", "match_law"]
