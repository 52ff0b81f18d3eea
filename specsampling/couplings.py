"""Deprecated alias of :mod:`specsampling.keyed.laws`, removed in the next release."""

from __future__ import annotations

import warnings

from .keyed.laws import *  # noqa: F403
from .keyed.laws import __all__ as __all__

warnings.warn(
    "specsampling.couplings is deprecated and will be removed in the next release; "
    "import specsampling.keyed.laws instead",
    DeprecationWarning,
    stacklevel=2,
)
