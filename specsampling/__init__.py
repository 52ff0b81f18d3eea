"""specsampling: exact (lossless) speculative-sampling schemes, proven by exact computation.

Notation: p = target, q = draft (Leviathan et al.). See ``docs/notation.md``.
"""

from __future__ import annotations

from typing import Any

from . import calculators, exact, keyed, ops, pairs, schemes
from .errors import InvalidDistribution, UnsupportedShape
from .exact import (
    acceptance,
    expected_emitted,
    lossless_error,
    output_law,
    round_law,
    stream_law,
)
from .noise import Noise
from .optimal import lp_acceptance, optimal_acceptance
from .processing import process
from .sampling import Generation, Round, generate, speculate
from .schemes import SCHEMES, Scheme, Verdict, get_scheme
from .shapes import Shape
from .tree import DraftTree, DrawLaw

__version__ = "0.1.0"

#: Public modules that moved into :mod:`specsampling.keyed`; importing them warns.
_MOVED = {"couplings": "laws", "gls": "gls_law", "watermark": "watermark"}


def __getattr__(name: str) -> Any:
    """``ss.couplings``, ``ss.gls`` and ``ss.watermark`` still resolve, with a warning."""
    if name in _MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMES",
    "DraftTree",
    "DrawLaw",
    "Generation",
    "InvalidDistribution",
    "Noise",
    "Round",
    "Scheme",
    "Shape",
    "UnsupportedShape",
    "Verdict",
    "__version__",
    "acceptance",
    "calculators",
    "exact",
    "expected_emitted",
    "generate",
    "get_scheme",
    "keyed",
    "lossless_error",
    "lp_acceptance",
    "ops",
    "optimal_acceptance",
    "output_law",
    "pairs",
    "process",
    "round_law",
    "schemes",
    "speculate",
    "stream_law",
]
