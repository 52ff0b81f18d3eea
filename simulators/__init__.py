"""Monte-Carlo engines and synthetic model pairs (installed as ``specsampling.simulators``).

This release ships :func:`estimate_emitted`, a Monte-Carlo estimate of block efficiency that
agrees with the exact engine within its standard error, and :mod:`.diffusion`, toy diffusions
with a closed-form drift that run the continuous couplings of :mod:`specsampling.continuous`
end to end and count target calls. Sweeps over LLM-like synthetic pairs arrive later.
"""

from __future__ import annotations

from .monte_carlo import Estimate, estimate_emitted

__all__ = ["Estimate", "estimate_emitted"]
