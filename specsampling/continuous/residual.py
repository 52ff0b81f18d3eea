r"""One-shot sampler of the super-level residual of a Gaussian mean shift (D-GRS, arXiv 2609.17691).

In the rank-1 frame (:mod:`specsampling.continuous.frame`) the target and draft laws of the
coordinate :math:`s` are :math:`N(\delta, 1)` and :math:`N(0, 1)`. For :math:`\lambda \ge 1` the
residual "target minus :math:`\lambda` draft" has the unnormalised density

.. math::

    r_\lambda(s) = \big(\varphi(s - \delta) - \lambda\varphi(s)\big)_+ ,

supported on :math:`[t, \infty)` with :math:`t = \ln\lambda/\delta + \delta/2` (the likelihood
ratio :math:`e^{\delta(s - \delta/2)}` is increasing, so the super-level set is a half-line), mass

.. math::

    G(\lambda) = \bar\Phi(t - \delta) - \lambda\bar\Phi(t),

and tail mass :math:`R(s) = \bar\Phi(s - \delta) - \lambda\bar\Phi(s)` for :math:`s \ge t`, so the
CDF is :math:`F(s) = 1 - R(s)/G(\lambda)`. :math:`\lambda = 1` is the standard residual
:math:`(P - Q)_+` with mass :math:`\operatorname{TV} = 2\Phi(\delta/2) - 1`.

Numerics: :math:`R` is evaluated in log space as
:math:`\log R = \log\lambda + \log\bar\Phi(s) + \log\operatorname{expm1}(\log\bar\Phi(s-\delta)
- \log\bar\Phi(s) - \log\lambda)` with ``scipy.special.log_ndtr``, which stays accurate far in
the tail (masses like :math:`e^{-10^5}` are still sampled correctly). Sampling inverts :math:`F`
by bisection on :math:`\log R`, vectorised over rows. Rows whose mass is exactly zero
(degenerate :math:`\delta \le 10^{-10}`, or an empty super-level set) return the threshold
point. Paper: the D-GRS residual of Bullo et al., arXiv 2609.17691
(code: ``marcellobullo/tree-specdiff``, ``specdiff/verifiers/dgrs.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr

from .frame import DEGENERATE_DELTA

Array = npt.NDArray[np.float64]

_MAX_BISECTIONS = 400


def residual_threshold(delta: Any, lam: Any) -> Array:
    r"""Left end :math:`t = \ln\lambda/\delta + \delta/2` of the residual's support.

    Parameters
    ----------
    delta : array_like
        Mismatch :math:`\delta \ge 0`.
    lam : array_like
        :math:`\lambda \ge 1`, broadcast against ``delta``.

    Returns
    -------
    ndarray
        :math:`t`; :math:`\delta/2` on degenerate rows (:math:`\delta \le 10^{-10}`).

    Examples
    --------
    >>> float(residual_threshold(2.0, 1.0))
    1.0
    """
    delta, log_lam = _prepare(delta, lam)
    return _threshold(delta, log_lam)


def residual_mass(delta: Any, lam: Any) -> Array:
    r"""Mass :math:`G(\lambda) = \bar\Phi(t - \delta) - \lambda\bar\Phi(t)` of the residual.

    .. math::

        G(\lambda) = \int \big(\varphi(s - \delta) - \lambda\varphi(s)\big)_+ \, ds

    Parameters
    ----------
    delta : array_like
        Mismatch :math:`\delta \ge 0`.
    lam : array_like
        :math:`\lambda \ge 1`, broadcast against ``delta``.

    Returns
    -------
    ndarray
        :math:`G \in [0, 1]`; 0 on degenerate rows.

    Examples
    --------
    >>> from scipy.stats import norm
    >>> float(residual_mass(1.0, 1.0)), float(2 * norm.cdf(0.5) - 1)  # lambda = 1: TV
    (0.3829249225480262, 0.3829249225480262)
    """
    delta, log_lam = _prepare(delta, lam)
    return np.exp(residual_log_mass(delta, log_lam))


def residual_cdf(s: Any, delta: Any, lam: Any) -> Array:
    r"""CDF :math:`F(s) = 1 - R(s)/G(\lambda)` of the normalised residual.

    .. math::

        F(s) = \frac{[\bar\Phi(t-\delta) - \bar\Phi(s-\delta)]
        - \lambda[\bar\Phi(t) - \bar\Phi(s)]}{G(\lambda)}, \quad s \ge t.

    Parameters
    ----------
    s : array_like
        Points, broadcast against ``delta`` and ``lam``.
    delta, lam : array_like
        As in :func:`residual_mass`.

    Returns
    -------
    ndarray
        Values in :math:`[0, 1]`; 0 below :math:`t`; on zero-mass rows a step at :math:`t`.

    Examples
    --------
    >>> float(residual_cdf(1.0, 2.0, 1.0)), float(residual_cdf(50.0, 2.0, 1.0))
    (0.0, 1.0)
    """
    delta, log_lam = _prepare(delta, lam)
    s = np.asarray(s, dtype=np.float64)
    t = _threshold(delta, log_lam)
    log_mass = _log_mass(delta, log_lam)
    with np.errstate(invalid="ignore"):
        ratio = np.exp(np.minimum(_log_tail(np.maximum(s, t), delta, log_lam) - log_mass, 0.0))
    cdf = np.where(np.isneginf(log_mass), 1.0, 1.0 - ratio)
    return np.where(s < t, 0.0, cdf)


def sample_residual(delta: Any, lam: Any, u: Any) -> Array:
    r"""Inverse-CDF draw :math:`s = F^{-1}(u)` from the normalised residual.

    Bisection on :math:`\log R(s) = \log(1 - u) + \log G(\lambda)` over :math:`[t, \infty)`,
    vectorised over rows (the bracket is widened until it holds every row).

    Parameters
    ----------
    delta : array_like, shape (n,) or broadcastable
        Mismatch :math:`\delta \ge 0`.
    lam : array_like
        :math:`\lambda \ge 1`.
    u : array_like
        Uniforms in :math:`[0, 1)`; ``u = 0`` gives the threshold :math:`t`.

    Returns
    -------
    ndarray
        Draws :math:`s \ge t`; the threshold point where the mass is exactly 0.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.stats import norm
    >>> s = sample_residual(1.0, 1.0, np.random.default_rng(0).random(20_000))
    >>> exact_mean = float(norm.cdf(0.5) / residual_mass(1.0, 1.0))  # delta Phibar(t-delta) / G
    >>> bool(s.min() >= 0.5), round(float(np.mean(s)), 2), round(exact_mean, 2)
    (True, 1.81, 1.81)
    """
    delta, log_lam = _prepare(delta, lam)
    return sample_residual_log_lam(delta, log_lam, u)


# --- log-lambda forms, unchecked: what the schemes call -------------------------------------


def residual_log_mass(delta: Any, log_lam: Any) -> Array:
    r"""Log mass :math:`\log G(\lambda)` of the residual, given :math:`\log\lambda`.

    The form the schemes use: they track :math:`\log\lambda` (block's
    :math:`\lambda = 1/w` can exceed the float range). The arguments are not validated
    (:func:`residual_mass` is the checked form).

    Parameters
    ----------
    delta : array_like
        Mismatch :math:`\delta \ge 0`.
    log_lam : array_like
        :math:`\log\lambda \ge 0`, broadcast against ``delta``.

    Returns
    -------
    ndarray
        :math:`\log G`; :math:`-\infty` for a zero mass or a degenerate :math:`\delta`.

    Examples
    --------
    >>> import numpy as np
    >>> float(np.exp(residual_log_mass(1.0, 0.0))) == float(residual_mass(1.0, 1.0))
    True
    >>> round(float(residual_log_mass(2.0, 800.0)), 2), float(residual_log_mass(0.0, 0.0))
    (-79612.71, -inf)
    """
    return _log_mass(np.asarray(delta, dtype=np.float64), np.asarray(log_lam, dtype=np.float64))


def sample_residual_log_lam(delta: Any, log_lam: Any, u: Any) -> Array:
    r"""Inverse-CDF draw from the normalised residual, given :math:`\log\lambda`.

    :func:`sample_residual` with :math:`\log\lambda` in place of :math:`\lambda`, and without
    validation; the form the schemes use.

    Parameters
    ----------
    delta : array_like
        Mismatch :math:`\delta \ge 0`.
    log_lam : array_like
        :math:`\log\lambda \ge 0`.
    u : array_like
        Uniforms in :math:`[0, 1)`; all three are broadcast together.

    Returns
    -------
    ndarray
        Draws :math:`s \ge t`; the threshold point where the mass is exactly 0.

    Examples
    --------
    >>> float(sample_residual_log_lam(1.0, 0.0, 0.0))  # lambda = 1, u = 0: the threshold
    0.5
    >>> s = sample_residual_log_lam(2.0, 800.0, [0.0, 0.5])  # lambda = e^800 overflows a float
    >>> float(residual_threshold(2.0, 1.0)) + 400.0, [round(float(v), 4) for v in s]
    (401.0, [401.0, 401.0042])
    """
    delta, log_lam, u = np.broadcast_arrays(
        np.asarray(delta, dtype=np.float64),
        np.asarray(log_lam, dtype=np.float64),
        np.asarray(u, dtype=np.float64),
    )
    return _sample(delta, log_lam, u)


# --- log-space internals ----------------------------------------------------------------------


def _prepare(delta: Any, lam: Any) -> tuple[Array, Array]:
    delta = np.asarray(delta, dtype=np.float64)
    lam = np.asarray(lam, dtype=np.float64)
    if np.any(~(delta >= 0)) or np.any(~np.isfinite(delta)):
        raise ValueError("delta: must be finite and >= 0")
    if np.any(~(lam >= 1)):
        raise ValueError("lam: must be >= 1")
    return delta, np.log(lam)


def _threshold(delta: Array, log_lam: Array) -> Array:
    """:math:`t = \\log\\lambda/\\delta + \\delta/2`; :math:`\\delta/2` on degenerate rows."""
    degenerate = delta <= DEGENERATE_DELTA
    safe = np.where(degenerate, 1.0, delta)
    return np.where(degenerate, delta / 2, log_lam / safe + delta / 2)


def _log_tail(s: Array, delta: Array, log_lam: Array) -> Array:
    r"""Log tail mass :math:`\log R(s)`, :math:`R(s) = \bar\Phi(s-\delta) - \lambda\bar\Phi(s)`.

    Valid for :math:`s \ge t`; :math:`-\infty` where the tail is empty or :math:`\delta` degenerate.
    """
    upper = log_ndtr(delta - s)  # log Phibar(s - delta)
    lower = log_lam + log_ndtr(-s)  # log(lambda Phibar(s))
    gap = np.maximum(upper - lower, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # log(expm1(gap)), stable for large gaps: gap + log1p(-exp(-gap)).
        log_expm1 = np.where(gap > 1.0, gap + np.log1p(-np.exp(-gap)), np.log(np.expm1(gap)))
        out = lower + log_expm1
    bad = (delta <= DEGENERATE_DELTA) | np.isneginf(lower) | ~(gap > 0)
    return np.where(bad, -np.inf, out)


def _log_mass(delta: Array, log_lam: Array) -> Array:
    r""":math:`\log G(\lambda)`; :math:`-\infty` for a zero mass or a degenerate :math:`\delta`."""
    return _log_tail(_threshold(delta, log_lam), delta, log_lam)


def _sample(delta: Array, log_lam: Array, u: Array) -> Array:
    """Bisection for :func:`sample_residual` on broadcast, same-shape float64 arrays."""
    t = _threshold(delta, log_lam)
    log_mass = _log_mass(delta, log_lam)
    live = np.isfinite(log_mass) & np.isfinite(t)
    out = t.copy()
    if not np.any(live):
        return out
    d, ll, lo = delta[live], log_lam[live], t[live]
    goal = np.log1p(-u[live]) + log_mass[live]
    step = np.ones_like(lo)
    hi = lo + step
    for _ in range(_MAX_BISECTIONS):  # widen until log R(hi) <= goal on every row
        short = _log_tail(hi, d, ll) > goal
        if not np.any(short):
            break
        step = np.where(short, 2 * step, step)
        hi = lo + step
    for _ in range(_MAX_BISECTIONS):
        mid = lo + (hi - lo) / 2
        if np.all((mid <= lo) | (mid >= hi)):  # adjacent floats on every row
            break
        above = _log_tail(mid, d, ll) > goal
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    out[live] = hi
    return out
