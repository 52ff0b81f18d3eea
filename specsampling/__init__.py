"""specsampling: exact (lossless) speculative-sampling schemes, proven by exact computation.

Notation: p = target, q = draft (Leviathan et al.). See ``docs/notation.md``.
"""

from __future__ import annotations

from . import calculators, couplings, exact, gls, keyed, ops, pairs, schemes, watermark
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
from .tree import DraftTree

__version__ = "0.1.0"

__all__ = [
    "SCHEMES",
    "DraftTree",
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
    "couplings",
    "exact",
    "expected_emitted",
    "generate",
    "get_scheme",
    "gls",
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
    "watermark",
]
