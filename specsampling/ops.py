r"""The small pieces every ratio-based scheme is assembled from.

All functions work on float64 arrays and, unchanged, on ``Fraction`` object arrays, so a scheme
written with them is exact with rational inputs.

* :func:`accepts` -- the division-free accept test :math:`u\,q(x) < p(x)`.
* :func:`accept_probability` -- its exact probability over :math:`u \sim U[0, 1)`.
* :func:`residual` -- :math:`\mathrm{norm}((p - q)_+)` with the zero-mass rule.
* :func:`categorical` -- a draw by inverse CDF that never returns a zero-mass token.
* :func:`remove_token` -- a distribution with one token deleted and the rest renormalised.
* :func:`reuse_uniform` -- the rejected uniform rescaled for a duplicate candidate.
* :func:`standard_step` / :func:`standard_step_law` -- one accept-or-residual step and its law.
* :func:`memo_by_distribution` -- memoise a per-node computation by the distributions' contents.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ._types import Probs, Scalar
from .noise import LARGEST_BELOW_ONE


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
    # A zero-mass token is never the first to exceed u * mass (its cdf equals the previous
    # one), so only an index past the last positive token needs the clip: skip that pass.
    if index < len(probs) and probs[index] > 0:
        return index
    positive = np.flatnonzero(np.asarray(probs > 0, dtype=bool))
    if positive.size == 0:
        raise ValueError("categorical: the distribution has no positive mass")
    return min(index, int(positive[-1]))


def support(probs: Probs) -> Any:
    """Indices of the tokens with positive mass, in increasing order."""
    return np.flatnonzero(np.asarray(probs > 0, dtype=bool))


def reuse_uniform(u: float, accept: Scalar) -> float:
    """A rejected accept-test uniform, rescaled to a fresh uniform for the next copy of a token.

    Given ``u >= accept`` (the test was rejected), ``(u - accept) / (1 - accept)`` is uniform on
    ``[0, 1)`` and independent of the rejection; it is clipped into ``[0, 1)`` against rounding
    (see :class:`~specsampling.Noise` for which schemes use it). ``accept = 1`` is rejected by
    rounding only (``u q(x)`` rounded up to ``p(x) = q(x)``, a subnormal mass): ``u - 1 < 0``,
    clipped to 0, with no division.

    >>> reuse_uniform(0.75, 0.5), reuse_uniform(0.5, 0.5), reuse_uniform(0.5, 1)
    (0.5, 0.0, 0.0)
    """
    if not 1 - accept > 0:  # accept = 1: a rejection by rounding; the rescaled value is < 0
        return 0.0
    rescaled = float((u - accept) / (1 - accept))
    return min(max(rescaled, 0.0), LARGEST_BELOW_ONE)


def standard_step(
    target: Probs, draft: Probs, token: int, u_accept: float, u_sample: float
) -> int | None:
    """One standard step on a single candidate: ``None`` when ``token`` is accepted
    (``u_accept * q(token) < p(token)``), else the residual draw by inverse CDF.

    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    >>> standard_step(p, q, 0, 0.5, 0.3), standard_step(p, q, 0, 0.6, 0.3)
    (None, 1)
    """
    if accepts(u_accept, target[token], draft[token]):
        return None
    return categorical(residual(target, draft), u_sample)


def standard_step_law(target: Probs, draft: Probs, token: int) -> tuple[Scalar, Probs]:
    """The exact law of :func:`standard_step`: ``(P(accept), P(emit t) for every t)``.

    >>> from fractions import Fraction as F
    >>> import numpy as np
    >>> p, q = np.array([F(1, 2), F(1, 2)]), np.array([F(3, 4), F(1, 4)])
    >>> standard_step_law(p, q, 0)
    (Fraction(2, 3), array([Fraction(0, 1), Fraction(1, 3)], dtype=object))
    """
    accept = accept_probability(target[token], draft[token])
    return accept, (1 - accept) * residual(target, draft)


def clip_probability(value: Any) -> Any:
    """A float probability clipped into ``[0, 1]`` against rounding; exact values unchanged.

    >>> clip_probability(-2.2e-16), clip_probability(1 + 2e-16), clip_probability(0.25)
    (0.0, 1.0, 0.25)
    """
    if isinstance(value, (float, np.floating)):
        return float(min(max(value, 0.0), 1.0))
    return value


#: :func:`memo_by_distribution` caches vocabularies up to this size (larger ones are recomputed).
MEMO_VOCAB = 1024
_Result = TypeVar("_Result")


def memo_by_distribution(
    function: Callable[..., _Result],
) -> Callable[..., _Result]:
    """Memoise ``function(target, draft, *args)`` by the contents of the two distributions.

    Exact enumeration revisits the same node distributions in every tree it drafts, so per-node
    work (SpecTr's :math:`\\rho^*`, ResiSpec's optimised policy) is computed once per
    distinct ``(target, draft, *args)``; float rows are keyed by their bytes, ``Fraction`` rows
    by their values. Vocabularies above ``MEMO_VOCAB`` are not cached.

    >>> calls = []
    >>> @memo_by_distribution
    ... def mass(target, draft, scale):
    ...     calls.append(scale)
    ...     return scale * float(target @ draft)
    >>> p = np.array([0.5, 0.5])
    >>> mass(p, p, 2), mass(p.copy(), p.copy(), 2), calls
    (1.0, 1.0, [2])
    """

    @functools.lru_cache(maxsize=4096)
    def cached(target: Any, draft: Any, *args: Any) -> _Result:
        return function(_unkey(target), _unkey(draft), *args)

    @functools.wraps(function)
    def memoised(target: Probs, draft: Probs, *args: Any) -> _Result:
        if target.shape[-1] > MEMO_VOCAB:
            return function(target, draft, *args)
        return cached(_key(target), _key(draft), *args)

    return memoised


def _key(probs: Probs) -> Any:
    if probs.dtype == object:
        return tuple(probs)
    return np.asarray(probs, dtype=np.float64).tobytes()


def _unkey(key: Any) -> Probs:
    if isinstance(key, bytes):
        return np.frombuffer(key)
    return np.array(key, dtype=object)
