"""Deprecated alias of :mod:`specsampling.keyed.gls_law`, removed in the next release."""

from __future__ import annotations

import warnings

from .keyed.gls_law import *  # noqa: F403
from .keyed.gls_law import __all__ as __all__

warnings.warn(
    "specsampling.gls is deprecated and will be removed in the next release; "
    "import specsampling.keyed.gls_law instead",
    DeprecationWarning,
    stacklevel=2,
)
