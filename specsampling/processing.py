"""One processing function for target and draft alike: temperature, then top-k, then top-p."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np

from ._types import Probs
from .errors import InvalidDistribution
from .validation import as_real_array


def process(
    logits: Any,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Probs:
    r"""Turn logits of shape ``(..., vocab_size)`` into the probabilities actually sampled from.

    Softmax of ``logits / temperature``, then keep the ``top_k`` most probable tokens, then the
    smallest set of most probable tokens whose mass reaches ``top_p``, renormalising each time.
    Temperature 0 is greedy decoding: a one-hot on the argmax (lowest id on ties), handled by the
    same verification code as any other target. Ties at the top-k / top-p boundary keep the lower
    token ids. ``-inf`` logits mark banned tokens; batched rows are processed independently and
    give the same result as one row at a time.

    Verification must use exactly these distributions for both models (peers that
    did not: huggingface/transformers#32867, #47932; vllm-project/vllm#10198):
    apply this function to target and draft logits with the same arguments where the draft is
    meant to follow the same sampling rule.

    Examples
    --------
    >>> process([0.0, 1.0, 2.0], temperature=0)
    array([0., 0., 1.])
    >>> process([0.0, 0.0, 0.0, 0.0], top_k=2)
    array([0.5, 0.5, 0. , 0. ])
    >>> process([1.0, float("nan")])
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: logits: NaN or +inf entries
    """
    arr = as_real_array(logits, "logits")[0].astype(np.float64, copy=False)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise InvalidDistribution(f"logits: expected shape (..., vocab_size), got {arr.shape}")
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise InvalidDistribution("logits: NaN or +inf entries")
    if np.isneginf(arr).all(axis=-1).any():
        raise InvalidDistribution("logits: a row has every entry -inf")
    given = temperature
    temperature = _real(temperature, "temperature", "a finite number >= 0")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite number >= 0, got {given!r}")
    vocab_size = arr.shape[-1]
    if top_k is not None:
        top_k = _count(top_k)
    if top_p is not None:
        given = top_p
        top_p = _real(top_p, "top_p", "a number with 0 < top_p <= 1, or None")
        if not 0 < top_p <= 1:
            raise ValueError(
                f"top_p: expected a number with 0 < top_p <= 1, or None, got {given!r}"
            )

    if temperature == 0:
        probs = np.zeros_like(arr)
        np.put_along_axis(probs, np.argmax(arr, axis=-1)[..., None], 1.0, axis=-1)
        return probs
    # Subtract the row maximum before dividing: a tiny temperature must not overflow to inf - inf.
    with np.errstate(over="ignore"):
        scaled = (arr - arr.max(axis=-1, keepdims=True)) / temperature
    probs = np.exp(scaled)
    probs /= probs.sum(axis=-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=-1)
    keep = np.ones_like(ranked, dtype=bool)
    if top_k is not None and top_k < vocab_size:
        keep[..., top_k:] = False
    if top_p is not None and top_p < 1:
        kept = np.where(keep, ranked, 0.0)
        mass_before = np.cumsum(kept, axis=-1) - kept
        keep &= mass_before < top_p * kept.sum(axis=-1, keepdims=True)
    mask = np.zeros_like(keep)
    np.put_along_axis(mask, order, keep, axis=-1)
    probs = np.where(mask, probs, 0.0)
    out: Probs = probs / probs.sum(axis=-1, keepdims=True)
    return out


def _real(value: Any, name: str, expected: str) -> float:
    """``value`` as a float if it is a real number (not a bool, string or array), else raise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        raise ValueError(f"{name}: expected {expected}, got {type(value).__name__} {value!r}")
    return float(value)


def _count(top_k: Any) -> int:
    """``top_k`` as an int: an integer (or an integral float) >= 1."""
    expected = "an integer >= 1 or None"
    if isinstance(top_k, Integral) and not isinstance(top_k, (bool, np.bool_)):
        value = int(top_k)
    else:
        number = _real(top_k, "top_k", expected)
        if not (math.isfinite(number) and number == int(number)):
            raise ValueError(f"top_k: expected {expected}, got {top_k!r}")
        value = int(number)
    if value < 1:
        raise ValueError(f"top_k: expected {expected}, got {top_k!r}")
    return value
