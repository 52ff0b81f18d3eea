"""Input validation: every public entry point checks its distributions here.

Floats are checked to a mass tolerance of ``1e-6``; exact inputs (``Fraction`` entries) must sum
to exactly one.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ._types import Probs
from .errors import InvalidDistribution

MASS_TOLERANCE = 1e-6


def is_exact(probs: Probs) -> bool:
    """Whether ``probs`` holds exact rationals (an object array)."""
    return bool(np.asarray(probs).dtype == object)


def check_distribution(probs: Any, name: str, vocab_size: int | None = None) -> Probs:
    """Validate a 1-D distribution and return it as float64 or as a ``Fraction`` object array.

    Float inputs within the mass tolerance are renormalised to sum to one (to rounding), so no
    derived probability exceeds one; exact inputs are returned unchanged.

    Parameters
    ----------
    probs : array_like, shape (vocab_size,)
        Probabilities; ``Fraction`` (or ``int``) entries keep the result exact.
    name : str
        Argument name used in error messages.
    vocab_size : int, optional
        Required length.

    Raises
    ------
    InvalidDistribution
        On a wrong shape, NaN or inf, a negative entry, mass not one, or a length mismatch.

    Examples
    --------
    >>> from fractions import Fraction
    >>> check_distribution([Fraction(1, 2), Fraction(1, 2)], "target")
    array([Fraction(1, 2), Fraction(1, 2)], dtype=object)
    >>> check_distribution([0.5, 0.6], "draft")
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: draft: mass is 1.1, not 1 (tolerance 1e-06)
    """
    exact = _has_fractions(probs)
    if exact:
        arr = np.array(probs, dtype=object)
    else:
        try:
            arr = np.asarray(probs, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InvalidDistribution(f"{name}: not numeric ({err})") from None
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise InvalidDistribution(f"{name}: expected a non-empty 1-D array, got shape {arr.shape}")
    if vocab_size is not None and arr.shape[0] != vocab_size:
        raise InvalidDistribution(
            f"{name}: vocabulary mismatch, length {arr.shape[0]} but vocab_size is {vocab_size}"
        )
    if exact:
        if not all(isinstance(x, (Fraction, int, np.integer)) for x in arr):
            raise InvalidDistribution(
                f"{name}: mixes exact Fraction entries with floats; use one or the other"
            )
        arr = np.array(
            [Fraction(int(x)) if not isinstance(x, Fraction) else x for x in arr], dtype=object
        )
        if any(x < 0 for x in arr):
            raise InvalidDistribution(f"{name}: negative entry at index {_first(arr < 0)}")
        total = sum(arr, Fraction(0))
        if total != 1:
            raise InvalidDistribution(f"{name}: exact mass is {total}, not 1")
        return arr
    if not np.all(np.isfinite(arr)):
        raise InvalidDistribution(f"{name}: NaN or inf at index {_first(~np.isfinite(arr))}")
    if np.any(arr < 0):
        raise InvalidDistribution(f"{name}: negative entry at index {_first(arr < 0)}")
    total = float(arr.sum())
    if abs(total - 1.0) > MASS_TOLERANCE:
        raise InvalidDistribution(
            f"{name}: mass is {total:.6g}, not 1 (tolerance {MASS_TOLERANCE:g})"
        )
    out: Probs = arr / total
    return out


def check_pair(target: Any, draft: Any) -> tuple[Probs, Probs]:
    """Validate a target and a draft distribution over one vocabulary, both float or both exact.

    >>> check_pair([0.5, 0.5], [0.25, 0.75])[1]
    array([0.25, 0.75])
    """
    target_probs = check_distribution(target, "target")
    draft_probs = check_distribution(draft, "draft", target_probs.shape[0])
    if is_exact(target_probs) != is_exact(draft_probs):
        raise ValueError("target, draft: both exact (Fraction) or both float, not mixed")
    return target_probs, draft_probs


def check_token(token: Any, name: str, vocab_size: int) -> int:
    """Validate a token id in ``[0, vocab_size)``.

    >>> check_token(5, "token", 4)
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: token: id 5 out of range [0, 4)
    """
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
        raise InvalidDistribution(f"{name}: token ids are integers, got {token!r}")
    if not 0 <= int(token) < vocab_size:
        raise InvalidDistribution(f"{name}: id {token} out of range [0, {vocab_size})")
    return int(token)


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Validate an integer argument ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value}")
    return int(value)


def _has_fractions(probs: Any) -> bool:
    if isinstance(probs, np.ndarray) and probs.dtype != object:
        return False
    try:
        return any(isinstance(x, Fraction) for x in np.asarray(probs, dtype=object).ravel())
    except (TypeError, ValueError):
        return False


def _first(mask: Any) -> int:
    return int(np.flatnonzero(np.asarray(mask, dtype=bool))[0])
