"""Type aliases shared by the core modules."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

#: A distribution or a stack of them: float64, or object arrays of :class:`fractions.Fraction`.
Probs: TypeAlias = npt.NDArray[Any]
#: A probability: a float, or an exact rational.
Scalar: TypeAlias = float | Fraction | int
#: A token context: the tuple of token ids emitted so far.
Prefix: TypeAlias = tuple[int, ...]
#: Law of emitted token tuples.
Law: TypeAlias = dict[tuple[int, ...], Any]

FLOAT = np.float64
