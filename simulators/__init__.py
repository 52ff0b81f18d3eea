"""Monte-Carlo engines and synthetic model pairs (installed as ``specsampling.simulators``).

This release ships :func:`estimate_emitted`, a Monte-Carlo estimate of block efficiency that
agrees with the exact engine within its standard error; sweeps, toy diffusion processes and
plots arrive with later releases.
"""

from __future__ import annotations

from .monte_carlo import Estimate, estimate_emitted

__all__ = ["Estimate", "estimate_emitted"]
