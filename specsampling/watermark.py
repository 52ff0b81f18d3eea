"""Deprecated alias of :mod:`specsampling.keyed.watermark`, removed in the next release."""

from __future__ import annotations

import warnings

from .keyed.watermark import *  # noqa: F403
from .keyed.watermark import __all__ as __all__

warnings.warn(
    "specsampling.watermark is deprecated and will be removed in the next release; "
    "import specsampling.keyed.watermark instead",
    DeprecationWarning,
    stacklevel=2,
)
