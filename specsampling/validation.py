"""Input validation: every public entry point checks its distributions here.

Floats are checked to a mass tolerance (``MASS_TOLERANCE = 1e-6`` unless the caller states
another) and renormalised; exact inputs (``Fraction`` entries) must sum to exactly one. Entries
must be real numbers: strings, booleans and complex numbers are refused, never coerced.

Probabilities computed in low precision (a float32, fp16 or bf16 softmax over 32k-150k tokens
sums to 1 only within about 1e-6 to 3e-3) pass with a stated ``tolerance``, e.g.
``Stationary(target, draft, tolerance=1e-2)``: they are then renormalised in float64.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from numbers import Complex, Integral, Real
from pathlib import Path
from typing import Any

import numpy as np

from ._types import Probs
from .errors import InvalidDistribution

#: Default mass tolerance for float distributions: ``|sum - 1| <= MASS_TOLERANCE``.
MASS_TOLERANCE = 1e-6

#: Deviations up to this size get the low-precision hint in the mass error.
_LOW_PRECISION = 0.05


def is_exact(probs: Probs) -> bool:
    """Whether ``probs`` holds exact rationals (an object array)."""
    return bool(np.asarray(probs).dtype == object)


def check_distribution(
    probs: Any, name: str, vocab_size: int | None = None, *, tolerance: float = MASS_TOLERANCE
) -> Probs:
    r"""Validate a 1-D distribution and return it as float64 or as a ``Fraction`` object array.

    Float inputs whose mass is within ``tolerance`` of one are renormalised to sum to one (to
    rounding), so no derived probability exceeds one; exact inputs are returned unchanged.

    .. math:: |\textstyle\sum_x p(x) - 1| \le \text{tolerance}

    Parameters
    ----------
    probs : array_like, shape (vocab_size,)
        Probabilities: real numbers. ``Fraction`` (or ``int``) entries keep the result exact;
        strings, booleans and complex numbers are refused.
    name : str
        Argument name used in error messages.
    vocab_size : int, optional
        Required length.
    tolerance : float, default ``MASS_TOLERANCE`` (1e-6)
        Largest accepted ``|mass - 1|`` for float input; raise it (e.g. to ``1e-2``) for
        probabilities computed in float32, fp16 or bf16. Exact input must sum to exactly one.

    Raises
    ------
    InvalidDistribution
        On a wrong shape, a non-real entry, NaN or inf, a negative entry, mass not one, or a
        length mismatch.

    Examples
    --------
    >>> from fractions import Fraction
    >>> check_distribution([Fraction(1, 2), Fraction(1, 2)], "target")
    array([Fraction(1, 2), Fraction(1, 2)], dtype=object)
    >>> check_distribution([0.5, 0.6], "draft")
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: draft: mass is 1.1, not 1 (tolerance 1e-06)
    >>> float(check_distribution([0.5, 0.5 + 2e-4], "target", tolerance=1e-3).sum())
    1.0
    """
    tol = _check_tolerance(tolerance)
    arr, exact = as_real_array(probs, name)
    if arr.ndim != 1 or arr.shape[0] == 0:
        got = _what(probs) if arr.ndim == 0 else f"shape {arr.shape}"
        raise InvalidDistribution(f"{name}: expected a non-empty 1-D array, got {got}")
    if vocab_size is not None and arr.shape[0] != vocab_size:
        raise InvalidDistribution(
            f"{name}: vocabulary mismatch, length {arr.shape[0]} but vocab_size is {vocab_size}"
        )
    if exact:
        if any(x < 0 for x in arr):
            raise InvalidDistribution(f"{name}: negative entry at index {_first(arr < 0)}")
        total = sum(arr, Fraction(0))
        if total != 1:
            raise InvalidDistribution(f"{name}: exact mass is {total}, not 1")
        return arr
    if not np.all(np.isfinite(arr)):
        raise InvalidDistribution(f"{name}: NaN or inf at index {_first(~np.isfinite(arr))}")
    if np.any(arr < 0):
        raise InvalidDistribution(f"{name}: negative entry at index {_first(arr < 0)}{_LOGITS}")
    total = float(arr.sum())
    if not (total > 0 and abs(total - 1.0) <= tol):
        raise InvalidDistribution(mass_error(name, total, tol))
    out: Probs = arr / total
    return out


def check_pair(
    target: Any, draft: Any, *, tolerance: float = MASS_TOLERANCE
) -> tuple[Probs, Probs]:
    """Validate a target and a draft distribution over one vocabulary, both float or both exact.

    ``tolerance`` is the float mass tolerance of :func:`check_distribution`.

    >>> check_pair([0.5, 0.5], [0.25, 0.75])[1]
    array([0.25, 0.75])
    """
    target_probs = check_distribution(target, "target", tolerance=tolerance)
    draft_probs = check_distribution(draft, "draft", target_probs.shape[0], tolerance=tolerance)
    if is_exact(target_probs) != is_exact(draft_probs):
        raise ValueError("target, draft: both exact (Fraction) or both float, not mixed")
    return target_probs, draft_probs


def check_rows(
    table: Any, name: str, vocab_size: int | None = None, *, tolerance: float = MASS_TOLERANCE
) -> None:
    """Validate a stack of distributions, one per row, without copying or renormalising it.

    Cheap for float tables (a row sum and a minimum, vectorised); exact tables (``Fraction``
    object arrays) must have rows summing to exactly one. Meant for per-call checks such as a
    verifier's round tables, which come from already validated pairs.

    Parameters
    ----------
    table : array_like, shape (num_rows, vocab_size)
        Float or ``Fraction`` rows.
    name : str
        Argument name used in error messages; a bad row is named ``name[i]``.
    vocab_size : int, optional
        Required row length.
    tolerance : float, default ``MASS_TOLERANCE``
        Largest accepted ``|row mass - 1|`` for float rows.

    Raises
    ------
    InvalidDistribution
        On a wrong shape, a non-real entry, NaN or inf, a negative entry or a row mass not one.

    Examples
    --------
    >>> check_rows(np.array([[0.5, 0.5], [1.0, 0.0]]), "target_probs")
    >>> check_rows(np.array([[0.5, 0.5], [2.0, -1.0]]), "draft_probs")
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: draft_probs[1]: negative entry at index 1 (raw logits? apply specsampling.process first)
    """  # noqa: E501
    tol = _check_tolerance(tolerance)
    if isinstance(table, np.ndarray) and table.dtype.kind in "fiu":
        arr = table
    else:
        arr, exact = as_real_array(table, name)
        if exact:
            _check_exact_rows(arr, name, vocab_size)
            return
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise InvalidDistribution(
            f"{name}: expected shape (num_rows, vocab_size), got shape {arr.shape}"
        )
    if vocab_size is not None and arr.shape[1] != vocab_size:
        raise InvalidDistribution(
            f"{name}: vocabulary mismatch, {arr.shape[1]} columns but vocab_size is {vocab_size}"
        )
    if arr.shape[0] == 0:
        return
    # NaN or inf in a row makes its sum NaN or inf, so these two passes catch every defect.
    with np.errstate(over="ignore", invalid="ignore"):
        sums = arr.sum(axis=1, dtype=np.float64)
        mass_ok = np.abs(sums - 1.0) <= tol
    if bool(mass_ok.all()) and not arr.min() < 0:
        return
    finite: Probs = np.asarray(np.isfinite(arr).all(axis=1))
    bad = ~finite | (arr < 0).any(axis=1) | ~mass_ok
    row = _first(bad)
    label = f"{name}[{row}]"
    if not finite[row]:
        raise InvalidDistribution(f"{label}: NaN or inf at index {_first(~np.isfinite(arr[row]))}")
    if np.any(arr[row] < 0):
        raise InvalidDistribution(
            f"{label}: negative entry at index {_first(arr[row] < 0)}{_LOGITS}"
        )
    raise InvalidDistribution(mass_error(label, float(sums[row]), tol))


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


def check_prefix(prefix: Any, vocab_size: int, name: str = "prefix") -> tuple[int, ...]:
    """Validate a context of token ids: a sequence (not a string) of ids in ``[0, vocab_size)``.

    The one check of a prefix for the numpy reference, ``specsampling.gpu`` and the simulators.

    >>> check_prefix([1, 0], 4)
    (1, 0)
    >>> check_prefix([1, 7], 4)
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: prefix[1]: id 7 out of range [0, 4)
    >>> check_prefix("ab", 4)
    Traceback (most recent call last):
    ...
    TypeError: prefix: expected a sequence of token ids, got a string 'ab'
    """
    if isinstance(prefix, (str, bytes)):
        raise TypeError(f"{name}: expected a sequence of token ids, got a string {prefix!r}")
    if hasattr(prefix, "tolist") and not isinstance(prefix, (list, tuple)):
        prefix = prefix.tolist()  # a numpy array or torch tensor
    try:
        items = list(prefix)
    except TypeError:
        raise TypeError(
            f"{name}: expected a sequence of token ids, got {type(prefix).__name__}"
        ) from None
    return tuple(check_token(t, f"{name}[{i}]", vocab_size) for i, t in enumerate(items))


def check_names(value: Any, name: str) -> tuple[Any, ...]:
    """One name or several: a single string (or any non-sequence object) is one item, never
    iterated per character; a list or tuple is its items (at least one).

    >>> check_names("traversal", "schemes"), check_names(["nss", "spectr"], "schemes")
    (('traversal',), ('nss', 'spectr'))
    >>> check_names([], "schemes")
    Traceback (most recent call last):
    ...
    ValueError: schemes: expected at least one, got an empty list
    """
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name}: expected at least one, got an empty {type(value).__name__}")
        return tuple(value)
    if isinstance(value, (set, frozenset)):
        raise TypeError(f"{name}: expected a list or tuple (in order), got {type(value).__name__}")
    return (value,)


def check_flag(value: Any, name: str, optional: bool = False) -> bool | None:
    """Validate a ``True``/``False`` argument (also ``None`` when ``optional``): a string such
    as ``"no"`` is truthy and would otherwise switch the option on.

    >>> check_flag(None, "progress", optional=True) is None
    True
    >>> check_flag("no", "progress", optional=True)
    Traceback (most recent call last):
    ...
    ValueError: progress: expected True, False or None, got 'no'
    """
    if optional and value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        allowed = "True, False or None" if optional else "True or False"
        raise ValueError(f"{name}: expected {allowed}, got {value!r}")
    return bool(value)


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Validate an integer argument ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value}")
    return int(value)


def check_output_dir(folder: Any, name: str, create: bool = False) -> Path:
    """Validate a folder that files will be written into, before any work: it exists (made,
    parents included, when ``create``), is a folder, and a file can be created in it. Every
    refusal is a ``ValueError`` naming the argument.

    >>> check_output_dir("/no/such/folder", "--plots")
    Traceback (most recent call last):
    ...
    ValueError: --plots: no directory '/no/such/folder' to write into
    """
    if isinstance(folder, bytes) or not isinstance(folder, (str, os.PathLike)):
        raise ValueError(f"{name}: expected a path, got {_what(folder)}")
    path = Path(folder)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(
                f"{name}: cannot make the directory {str(path)!r}: {err.strerror or err}"
            ) from None
    if not path.is_dir():
        raise ValueError(f"{name}: no directory {str(path)!r} to write into")
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(
            f"{name}: cannot write into {str(path)!r}: {err.strerror or err}"
        ) from None
    return path


def check_output_file(target: Any, name: str) -> Path:
    """Validate the path of a file to be written, before any work: not a folder, in a folder
    that exists and can be written into (:func:`check_output_dir`). Returns it as a ``Path``.

    >>> check_output_file(".", "--json")
    Traceback (most recent call last):
    ...
    ValueError: --json: '.' is a directory
    """
    if isinstance(target, bytes) or not isinstance(target, (str, os.PathLike)):
        raise ValueError(f"{name}: expected a path, got {_what(target)}")
    path = Path(target)
    if path.is_dir():
        raise ValueError(f"{name}: {str(target)!r} is a directory")
    check_output_dir(path.parent, name)
    return path


def as_real_array(values: Any, name: str) -> tuple[Probs, bool]:
    """``values`` as a float64 array, or as a ``Fraction`` object array when any entry is one.

    Returns ``(array, exact)``. Refuses, naming ``name``, what is not an array of real numbers:
    strings, booleans, complex numbers (whose imaginary part would be dropped), ``None``,
    mappings, ragged lists, and floats mixed with ``Fraction`` entries. The shape is not checked.

    >>> as_real_array([1, 2.5], "logits")
    (array([1. , 2.5]), False)
    >>> as_real_array([0.5, 0.5j], "target")
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: target: entries must be real numbers, got a complex number (index 1)
    """  # noqa: E501
    if isinstance(values, np.ndarray) and values.dtype != object:
        kind = values.dtype.kind
        if kind in "fiu":
            return values.astype(np.float64, copy=False), False
        raise InvalidDistribution(
            f"{name}: entries must be real numbers, got an array of {_KINDS.get(kind, 'dtype')} "
            f"(dtype {values.dtype})"
        )
    if isinstance(values, (str, bytes, Mapping)) or values is None:
        raise InvalidDistribution(f"{name}: expected an array of real numbers, got {_what(values)}")
    if not isinstance(values, (list, tuple, np.ndarray)) and hasattr(values, "__array__"):
        try:  # torch tensors, array-likes
            converted = np.asarray(values)
        except (TypeError, ValueError, RuntimeError) as err:
            raise InvalidDistribution(
                f"{name}: cannot convert {type(values).__name__} to a numpy array ({err}); "
                "for a bf16 tensor use tensor.float().cpu()"
            ) from None
        return as_real_array(converted, name)
    try:
        arr = np.array(values, dtype=object)
    except (TypeError, ValueError) as err:  # pragma: no cover - object arrays take anything
        raise InvalidDistribution(f"{name}: not numeric ({err})") from None
    flat = arr.ravel()
    types = set(map(type, flat))
    for kind in types:
        problem = _entry_problem(kind)
        if problem is not None and arr.ndim == 0:
            raise InvalidDistribution(
                f"{name}: expected an array of real numbers, got {_what(values)}"
            )
        if problem is not None:
            index = next(i for i, x in enumerate(flat) if type(x) is kind)
            raise InvalidDistribution(
                f"{name}: entries must be real numbers, got {problem} (index {index})"
            )
    if any(issubclass(kind, Fraction) for kind in types):
        inexact = [kind for kind in types if not issubclass(kind, (Fraction, Integral))]
        if inexact:
            raise InvalidDistribution(
                f"{name}: mixes exact Fraction entries with {inexact[0].__name__} entries; "
                "use one or the other"
            )
        exact = np.empty(arr.shape, dtype=object)
        exact.ravel()[:] = [x if isinstance(x, Fraction) else Fraction(int(x)) for x in flat]
        return exact, True
    try:
        return arr.astype(np.float64), False
    except (OverflowError, TypeError, ValueError) as err:
        raise InvalidDistribution(f"{name}: not representable as float64 ({err})") from None


def mass_error(
    name: str,
    total: float,
    tolerance: float,
    *,
    process: str = "specsampling.process first (CLI --logits)",
    tolerance_hint: str | None = "tolerance={} (CLI --tolerance {})",
) -> str:
    """The message for a float mass outside the tolerance, with enough digits to be true.

    >>> mass_error("target", 1 + 2e-6, 1e-6)  # doctest: +NORMALIZE_WHITESPACE
    'target: mass is 1.000002, not 1 (off by 2e-06, tolerance 1e-06); low-precision
    (float32/fp16/bf16) probabilities pass with a stated tolerance, e.g. tolerance=1e-05
    (CLI --tolerance 1e-05), and are renormalised'

    ``process`` names what turns logits into probabilities and ``tolerance_hint`` how a
    tolerance is stated (its ``{}`` filled with the suggested value; ``None``: the caller
    takes none), for entry points other than the reference's functions and CLI.
    """
    deviation = abs(total - 1.0)
    if math.isfinite(total) and 0 < deviation <= _LOW_PRECISION:
        digits = min(17, max(6, 2 - math.floor(math.log10(deviation))))
        shown, off = f"{total:.{digits}g}", f"off by {deviation:.2g}, "
    else:
        shown, off = f"{total:.6g}", ""
    text = f"{name}: mass is {shown}, not 1 ({off}tolerance {tolerance:g})"
    if off and deviation > tolerance and tolerance_hint is not None:
        suggest = f"{10.0 ** math.ceil(math.log10(deviation)):g}"
        stated = tolerance_hint.format(suggest, suggest)
        text += (
            "; low-precision (float32/fp16/bf16) probabilities pass with a stated tolerance, "
            f"e.g. {stated}, and are renormalised"
        )
    elif total >= 1.5:
        text += f"; raw logits or counts? apply {process}"
    return text


_LOGITS = " (raw logits? apply specsampling.process first)"

_KINDS = {"b": "booleans", "c": "complex numbers", "U": "strings", "S": "bytes", "O": "objects"}


def _entry_problem(kind: type) -> str | None:
    """Why entries of this type are not real numbers, or ``None`` if they are."""
    if issubclass(kind, (bool, np.bool_)):
        return "a bool"
    if issubclass(kind, (str, bytes)):
        return "a string"
    if issubclass(kind, (list, tuple, np.ndarray)):
        return "a nested sequence (ragged rows?)"
    if issubclass(kind, Complex) and not issubclass(kind, Real):
        return "a complex number"
    if issubclass(kind, (Real, Decimal)):
        return None
    return f"a {kind.__name__}"


def _check_tolerance(tolerance: Any) -> float:
    if isinstance(tolerance, (bool, np.bool_)) or not isinstance(tolerance, Real):
        raise ValueError(f"tolerance: expected a number >= 0, got {tolerance!r}")
    value = float(tolerance)
    if not value >= 0:
        raise ValueError(f"tolerance: expected a number >= 0, got {tolerance!r}")
    return value


def _check_exact_rows(arr: Probs, name: str, vocab_size: int | None) -> None:
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise InvalidDistribution(
            f"{name}: expected shape (num_rows, vocab_size), got shape {arr.shape}"
        )
    if vocab_size is not None and arr.shape[1] != vocab_size:
        raise InvalidDistribution(
            f"{name}: vocabulary mismatch, {arr.shape[1]} columns but vocab_size is {vocab_size}"
        )
    for row, values in enumerate(arr):
        if any(x < 0 for x in values):
            raise InvalidDistribution(
                f"{name}[{row}]: negative entry at index {_first(values < 0)}"
            )
        total = sum(values, Fraction(0))
        if total != 1:
            raise InvalidDistribution(f"{name}[{row}]: exact mass is {total}, not 1")


def _what(value: Any) -> str:
    """A short description of a value for error messages."""
    if isinstance(value, np.ndarray):
        return f"shape {value.shape}"
    if value is None:
        return "None"
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _first(mask: Any) -> int:
    return int(np.flatnonzero(np.asarray(mask, dtype=bool))[0])
