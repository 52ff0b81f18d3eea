"""Input validation for the continuous entry points; every error names the argument."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..validation import check_positive_int
from .base import Array, ContinuousScheme


def check_rng(rng: Any) -> np.random.Generator:
    """``rng`` must be a :class:`numpy.random.Generator`."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_num_drafts(scheme: ContinuousScheme, num_drafts: Any) -> int:
    """``num_drafts`` is an integer >= 1 that the scheme supports."""
    k = check_positive_int(num_drafts, "num_drafts")
    if scheme.max_drafts is not None and k > scheme.max_drafts:
        raise ValueError(
            f"num_drafts: scheme {scheme.name!r} verifies at most {scheme.max_drafts} "
            f"draft(s) per node, got {k} (use 'dgrs' for several drafts)"
        )
    return k


def check_array(value: Any, name: str, ndim: int) -> npt.NDArray[Any]:
    """A finite real array with ``ndim`` dimensions (float dtype kept, others made float64)."""
    try:
        arr = np.asarray(value)
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a real numeric array, got {value!r:.80}") from None
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {arr.shape}")
    if 0 in arr.shape:
        raise ValueError(f"{name}: empty array of shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or inf")
    return arr


def check_shape(arr: npt.NDArray[Any], name: str, shape: tuple[int, ...]) -> None:
    """``arr.shape == shape`` or a message naming ``name`` and both shapes."""
    if arr.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {arr.shape}")


def check_std(std: Any, shape: tuple[int, ...], name: str = "std") -> Array:
    """A positive finite scalar or an array of ``shape``; returned broadcast to ``shape``."""
    try:
        arr = np.asarray(std, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a positive number or array, got {std!r:.80}") from None
    if arr.ndim and arr.shape != shape:
        raise ValueError(f"{name}: expected a scalar or shape {shape}, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or not np.all(arr > 0):
        raise ValueError(f"{name}: must be finite and > 0")
    return np.broadcast_to(arr, shape).astype(np.float64)


def check_delta(delta: Any) -> Array:
    """Finite mismatches ``>= 0``."""
    try:
        arr = np.asarray(delta, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"delta: expected a number or array, got {delta!r:.80}") from None
    if not np.all(np.isfinite(arr)) or not np.all(arr >= 0):
        raise ValueError("delta: must be finite and >= 0")
    return arr


def state_dtype(*arrays: npt.NDArray[Any]) -> np.dtype[Any]:
    """The float dtype of the states: the common float type of the inputs."""
    return np.dtype(np.result_type(*arrays))
