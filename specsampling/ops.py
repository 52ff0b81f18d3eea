r"""The small pieces every ratio-based scheme is assembled from.

All functions work on float64 arrays and, unchanged, on ``Fraction`` object arrays, so a scheme
written with them is exact with rational inputs.

* :func:`accepts` -- the division-free accept test :math:`u\,q(x) < p(x)`.
* :func:`accept_probability` -- its exact probability over :math:`u \sim U[0, 1)`.
* :func:`residual` -- :math:`\mathrm{norm}((p - q)_+)` with the zero-mass rule.
* :func:`categorical` -- a draw by inverse CDF that never returns a zero-mass token.
* :func:`remove_token` -- a distribution with one token deleted and the rest renormalised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._types import Probs, Scalar


def accepts(u: float, target_x: Scalar, draft_x: Scalar) -> bool:
    r"""Accept test without a division: ``u * draft_x < target_x``.

    Strict, so a token with ``target_x == 0`` is never accepted, even when ``u == 0``; a token
    with ``target_x >= draft_x`` is always accepted because ``u < 1``.

    >>> accepts(0.0, 0.0, 0.5), accepts(0.999, 0.5, 0.5), accepts(0.5, 0.1, 0.0)
    (False, True, True)
    """
    return bool(u * draft_x < target_x)


def accept_probability(target_x: Scalar, draft_x: Scalar) -> Scalar:
    r"""Exact :math:`P_{u \sim U[0,1)}(u\,q(x) < p(x)) = \min(1, p(x)/q(x))`, 0 when ``p(x) = 0``.

    >>> from fractions import Fraction
    >>> accept_probability(Fraction(1, 3), Fraction(2, 3))
    Fraction(1, 2)
    >>> accept_probability(0.2, 0.0)
    1
    """
    if target_x <= 0:
        return 0
    if target_x >= draft_x:
        return 1
    return target_x / draft_x


def total(probs: Probs) -> Scalar:
    """Sum of a float or exact array, as a Python scalar."""
    result: Scalar = probs.sum()
    return result


def normalise(weights: Probs) -> Probs:
    """``weights / weights.sum()``; the caller guarantees a positive mass."""
    return weights / total(weights)


def positive_part(values: Probs) -> Probs:
    r"""Elementwise :math:`(v)_+ = \max(v, 0)` (dtype preserved)."""
    out: Probs = np.maximum(values, 0)
    return out


def residual(target_probs: Probs, draft_probs: Probs) -> Probs:
    r"""The standard residual :math:`\mathrm{norm}((p - q)_+)`.

    When the residual has zero mass (``p == q`` on every token where ``p > q`` could hold, a
    rejection branch of probability 0 in exact arithmetic) the target is returned instead of
    dividing by zero.

    >>> import numpy as np
    >>> residual(np.array([0.5, 0.5]), np.array([0.25, 0.75]))
    array([1., 0.])
    >>> residual(np.array([0.5, 0.5]), np.array([0.5, 0.5]))
    array([0.5, 0.5])
    """
    weights = positive_part(target_probs - draft_probs)
    if not total(weights) > 0:
        return target_probs
    return normalise(weights)


def remove_token(probs: Probs, token: int) -> Probs:
    """``probs`` with ``token`` set to zero and renormalised; all zeros if nothing remains.

    >>> import numpy as np
    >>> remove_token(np.array([0.5, 0.25, 0.25]), 0)
    array([0. , 0.5, 0.5])
    """
    out = probs.copy()
    out[token] = 0 * out[token]
    mass = total(out)
    if not mass > 0:
        return out
    return out / mass


def categorical(probs: Probs, u: float) -> int:
    r"""Draw a token by inverse CDF from a uniform ``u`` in ``[0, 1)``.

    Returns the first token whose cumulative mass exceeds ``u * sum(probs)``. Zero-mass tokens
    are never returned, also when rounding pushes ``u * sum`` past the last cumulative value: the
    index is clipped to the last token with positive mass.

    >>> import numpy as np
    >>> categorical(np.array([0.5, 0.0, 0.5]), 0.5), categorical(np.array([0.5, 0.0, 0.5]), 0.0)
    (2, 0)
    """
    cdf = np.cumsum(probs)
    mass = cdf[-1]
    index = int(np.searchsorted(cdf, u * mass, side="right"))
    positive = np.flatnonzero(np.asarray(probs > 0, dtype=bool))
    if positive.size == 0:
        raise ValueError("categorical: the distribution has no positive mass")
    return min(index, int(positive[-1]))


def support(probs: Probs) -> Any:
    """Indices of the tokens with positive mass, in increasing order."""
    return np.flatnonzero(np.asarray(probs > 0, dtype=bool))
