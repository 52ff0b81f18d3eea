r"""Without-replacement drafts at large vocabularies: :math:`W(H)` on sorted prefixes.

:math:`W(H) = \Pr(\text{all } k \text{ draws without replacement from } q \text{ lie in } H)`,
for many prefixes :math:`H_j` (the first :math:`j` tokens of a fixed order) at once, by the
**exponential race**. Give token :math:`x` an arrival time :math:`T_x = E_x / q(x)` with
:math:`E_x \sim \mathrm{Exp}(1)` independent: the order of arrivals is a sequential
without-replacement sample from :math:`q` (the Gumbel-top-k trick). With :math:`A = H^c`,
:math:`T_A = \min_{a \in A} T_a \sim \mathrm{Exp}(q(A))` is independent of the arrivals in
:math:`H`; let :math:`N_H(t)` count the :math:`H` tokens arrived by time :math:`t` (a
Poisson-binomial with success probabilities :math:`1 - e^{-q(x) t}`) and
:math:`C_H(t) = \Pr(N_H(t) \le k - 1)`. All :math:`k` first arrivals are in :math:`H` iff
:math:`N_H(T_A) \ge k`, so

.. math:: W(H) = 1 - \int_0^\infty q(A)\, e^{-q(A) t}\, C_H(t)\, dt
          = \frac{q(H)}{q(H) + q(A)}
            - \int_0^\infty q(A)\, e^{-q(A) t}\, \bigl(C_H(t) - e^{-q(H) t}\bigr)\, dt,

subtracting the :math:`k = 1` case :math:`C_H = e^{-q(H) t}` in closed form. The remaining
integrand is non-negative, of order :math:`q(A)\, q(H)\, t^2` as :math:`t \to 0` and decays once
:math:`e^{-q(A) t}` or :math:`C_H(t)` does.

**Quadrature.** Trapezoid rule in :math:`v = \log t` with step :data:`STEP` from
:data:`START` (the part below is at most :math:`t^2/8`) upward until every prefix's remaining
tail, bounded by :math:`e^{-q(A) t} \max(C_H(t), e^{-q(H) t})` because :math:`C_H` is
non-increasing, is below :data:`TAIL_TOLERANCE`. The integrand is analytic in a strip around
the real :math:`v` axis and decays at both ends, so the error falls like :math:`e^{-c/h}`
(measured: step 0.5, 0.35, 0.25 give worst errors about 5e-6, 3e-9, 6e-14 on :math:`W`).

**Poisson-binomial on every prefix at once.** At each node, tokens with :math:`q(x)\,t \le
\log 2` ("small", odds :math:`\rho = e^{q t} - 1 \le 1`) enter through prefix power sums
:math:`s_i = \sum \rho^i` and Newton's identities for the elementary symmetric polynomials,
:math:`\Pr(N_\text{small} = m) = e^{-\sum q t}\, e_m(\rho)`, :math:`m < k`; with
:math:`\rho \le 1` the terms stay bounded, so the identities keep their absolute accuracy. While
:math:`t \max q \le 1/(2(k-1))` the power sums come from prefix moments :math:`\sum q^n` and
the series of :math:`(e^u - 1)^i` (no pass over the vocabulary). The "large" tokens
(:math:`q(x)\,t > \log 2`, fewer than :math:`t/\log 2`) are convolved directly in prefix
order until fewer than :math:`k` of them arriving has probability below :data:`NEGLIGIBLE`;
longer prefixes then have :math:`C_H(t) <` :data:`NEGLIGIBLE` and are set to 0.

Accuracy: absolute error on :math:`W` below ``1e-13`` (worst measured against exact
enumeration, 3,000 random drafts of 3-10 tokens: about ``6e-14``; tests/test_optimal.py
asserts ``1e-12``, benchmarks/optimal.py records the figure).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]

#: Step of the trapezoid rule in log-time.
STEP = 0.25
#: First node; the neglected part of the integral below it is at most ``START**2 / 8``.
START = 1e-9
#: Bound on each prefix's neglected upper tail.
TAIL_TOLERANCE = 1e-18
#: Probability below which the large-token convolution stops (longer prefixes get C = 0).
NEGLIGIBLE = 1e-30
#: Tokens with ``q * t`` above this are convolved directly (odds above 1).
LARGE = math.log(2.0)
#: Terms of the moment series beyond the leading one.
SERIES_TERMS = 16
#: Largest node, as ``log t``: beyond every positive float64 mass (``log 5e-324 = -744``).
MAX_LOG_TIME = 1500.0


def prefix_masses(draft_sorted: FloatArray, num_drafts: int, lengths: Any) -> FloatArray:
    r""":math:`W(H_j)` for each prefix length ``j`` in ``lengths`` of ``draft_sorted``.

    ``draft_sorted`` holds positive draft masses in prefix order (need not sum to one);
    ``lengths`` is strictly increasing with ``num_drafts <= j < len(draft_sorted)``;
    ``num_drafts >= 2``.
    """
    q = np.asarray(draft_sorted, dtype=np.float64)
    k = int(num_drafts)
    lengths = np.asarray(lengths, dtype=np.intp)
    if lengths.size == 0:
        return np.zeros(0)
    rest = np.cumsum(q[::-1])[::-1][lengths]  # q(A_j) as suffix sums: no cancellation
    inside = _prefix_sums(q, lengths)  # q(H_j)
    log_q, log_rest, log_inside = np.log(q), np.log(rest), np.log(inside)
    series_limit = math.log(0.5 / (k - 1) / float(q.max()))
    moments: FloatArray | None = None
    integral = np.zeros(lengths.size)
    log_t = math.log(START)
    while True:
        if log_t <= series_limit:
            if moments is None:
                moments = _moments(q, lengths, k)
            t = math.exp(log_t)
            below = _small_cdf(t * moments[0], _series_power_sums(moments, k, t), k)[k - 1]
        else:
            below = _at_most(q, log_q, k, log_t, lengths)  # C_j(t), non-increasing in t
        with np.errstate(over="ignore"):  # q t = inf gives e^{-q t} = 0
            rest_t, inside_t = np.exp(log_rest + log_t), np.exp(log_inside + log_t)
        none = np.exp(-inside_t)  # P(no arrival in H_j by t) <= C_j(t)
        weight = np.exp(log_rest + log_t - rest_t)  # q(A) t e^{-q(A) t}
        integral += STEP * weight * (below - none)
        tails = np.exp(np.maximum(0.0, log_rest + log_t) - rest_t) * np.maximum(below, none)
        if float(tails.max()) <= TAIL_TOLERANCE:
            break
        log_t += STEP
        if log_t > MAX_LOG_TIME:  # unreachable for positive float64 masses
            raise ValueError("draft: the exponential-race integral did not converge")
    out: FloatArray = inside / (inside + rest) - integral
    return np.clip(out, 0.0, 1.0)


def _at_most(
    q: FloatArray, log_q: FloatArray, k: int, log_t: float, lengths: IndexArray
) -> FloatArray:
    r""":math:`C_j(t) = \Pr(N_{H_j}(t) \le k - 1)` for the prefixes of the given lengths.

    Products :math:`q\,t` go through logarithms once :math:`t` nears the float64 range, so
    masses down to the smallest subnormal are resolved.
    """
    # Large tokens, in prefix order: direct truncated convolution until negligible.
    positions = np.flatnonzero(log_q > math.log(LARGE) - log_t)
    states = [np.eye(1, k)[0]]
    for x in positions:
        exponent = float(log_q[x]) + log_t
        arrived = 1.0 if exponent > 40.0 else -math.expm1(-math.exp(exponent))
        state = states[-1] * (1.0 - arrived)
        state[1:] += states[-1][:-1] * arrived
        states.append(state)
        if state.sum() < NEGLIGIBLE:
            break
    count = np.searchsorted(positions, lengths, side="left")  # large tokens in each prefix
    known = count < len(states)  # longer prefixes have C_j(t) < NEGLIGIBLE: left at 0
    result = np.zeros(lengths.size)
    used = lengths[known]
    if used.size == 0:
        return result
    # Small tokens: prefix power sums of the odds rho = e^{qt} - 1 <= 1.
    end = int(used[-1])
    with np.errstate(over="ignore"):  # overflowing tokens are large: zeroed below
        small = q[:end] * math.exp(log_t) if log_t < 700 else np.exp(log_q[:end] + log_t)
    small[positions[positions < end]] = 0.0
    hazard = _prefix_sums(small, used)
    odds = np.expm1(small, out=small)
    sums = []
    power = odds
    for i in range(1, k):
        if i > 1:
            power = power * odds
        sums.append(_prefix_sums(power, used))
    small_cdf = _small_cdf(hazard, sums, k)  # rows m < k: P(N_small <= m)
    table = np.array(states)[count[known]]  # (n, k): P(a large arrivals), a < k
    result[known] = np.einsum("na,na->n", table, small_cdf[::-1].T)
    return np.clip(result, 0.0, 1.0)


def _small_cdf(hazard: FloatArray, sums: list[FloatArray], k: int) -> FloatArray:
    r"""Rows :math:`m < k` of :math:`\Pr(N \le m)`, from :math:`\sum q t` and power sums.

    Newton's identities :math:`m\,e_m = \sum_{i=1}^m (-1)^{i-1} e_{m-i} s_i` on the odds
    divided by :math:`c = \max(s_1, 1)` (no overflow), then
    :math:`\Pr(N = m) = e_m\, c^m e^{-\sum q t}`.
    """
    scale = np.maximum(sums[0], 1.0)
    scaled = [s / scale ** (i + 1) for i, s in enumerate(sums)]
    elementary = [np.ones(hazard.size)]
    for m in range(1, k):
        acc = np.zeros(hazard.size)
        for i in range(1, m + 1):
            term = elementary[m - i] * scaled[i - 1]
            acc = acc + term if i % 2 == 1 else acc - term
        elementary.append(acc / m)
    log_scale = np.log(scale)
    pmf = [e * np.exp(m * log_scale - hazard) for m, e in enumerate(elementary)]
    cdf: FloatArray = np.cumsum(pmf, axis=0)
    return cdf


def _moments(q: FloatArray, lengths: IndexArray, k: int) -> FloatArray:
    """Rows ``n - 1``: prefix sums of ``q ** n``, ``n = 1 .. k - 1 + SERIES_TERMS``."""
    rows = []
    power = q
    for n in range(1, k + SERIES_TERMS):
        if n > 1:
            power = power * q
        rows.append(_prefix_sums(power, lengths))
    return np.array(rows)


def _series_power_sums(moments: FloatArray, k: int, t: float) -> list[FloatArray]:
    r""":math:`s_i = \sum_x (e^{q_x t} - 1)^i = \sum_n a_{i,n}\, t^n M_n`, :math:`i < k`.

    Valid for :math:`t \max q \le 1/(2(k-1))`: the coefficients of
    :math:`((e^u - 1)/u)^i` are dominated by those of :math:`e^{iu}`, so the series cut after
    :data:`SERIES_TERMS` terms has relative error below :math:`0.5^{17}/17! \approx 2e-20`.
    """
    coefficients = _series_coefficients(k)
    powers = t ** np.arange(1, coefficients.shape[1] + 1)
    return [(coefficients[i - 1] * powers) @ moments for i in range(1, k)]


@lru_cache(maxsize=64)
def _series_coefficients(k: int) -> FloatArray:
    """``[i - 1, n - 1]``: coefficient of ``u**n`` in ``(e**u - 1)**i`` (``i! S(n, i) / n!``)."""
    size = k - 1 + SERIES_TERMS
    stirling = [[0] * (size + 1) for _ in range(size + 1)]  # stirling[n][i] = S(n, i)
    stirling[0][0] = 1
    for n in range(1, size + 1):
        for i in range(1, n + 1):
            stirling[n][i] = i * stirling[n - 1][i] + stirling[n - 1][i - 1]
    out = np.zeros((max(k - 1, 1), size))
    for i in range(1, k):
        for n in range(i, min(i + SERIES_TERMS, size) + 1):
            out[i - 1, n - 1] = math.factorial(i) * stirling[n][i] / math.factorial(n)
    return out


def _prefix_sums(values: FloatArray, lengths: IndexArray) -> FloatArray:
    """``values[:j].sum()`` for each ``j`` in ``lengths`` (strictly increasing, ``j >= 1``)."""
    segments = np.add.reduceat(values[: lengths[-1]], np.concatenate([[0], lengths[:-1]]))
    out: FloatArray = np.cumsum(segments)
    return out
