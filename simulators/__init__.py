"""Monte-Carlo calculators and simulators (installed as ``specsampling.simulators``).

* :mod:`.pairs`: :class:`~.pairs.Synthetic`, LLM-like model pairs at real vocabulary sizes;
* :func:`estimate` and :func:`compare`: block efficiency with error bars, plain or
  Rao-Blackwellised, paired across schemes on the same drafted trees (:mod:`.estimators`);
* :func:`search_shape`: the best draft tree under a node budget, verifier-aware or by the
  DDTree / OPT-Tree policies (:mod:`.search`, :mod:`.policies`), priced by a
  :class:`~.cost.CostModel` when tokens/s is the goal;
* :func:`record` and :class:`RecordedTrees`: drafted trees recorded from real models, replayed
  for any scheme without them (:mod:`.recorded`);
* :func:`estimate_emitted`: the small numpy-only Monte Carlo over the reference sampler;
* :mod:`.diffusion`: toy diffusions with a closed-form drift for the continuous couplings.

Everything but :func:`estimate_emitted`, :class:`Estimate` and :mod:`.diffusion` runs on the
batched torch backend and needs torch (``pip install "specsampling[torch]"``); those names load
on first use, so ``import specsampling.simulators`` works without it.
"""

from __future__ import annotations

import importlib
from typing import Any

from .monte_carlo import estimate_emitted
from .stats import Comparison, Estimate

#: Names served lazily from torch-backed modules: name -> module.
_LAZY = {
    "pairs": "pairs",
    "sources": "sources",
    "estimators": "estimators",
    "estimate": "estimators",
    "compare": "estimators",
    "conditional_emitted": "estimators",
    "recorded": "recorded",
    "RecordedTrees": "recorded",
    "record": "recorded",
    "cost": "cost",
    "CostModel": "cost",
    "policies": "policies",
    "HeapTree": "policies",
    "OptTree": "policies",
    "search": "search",
    "SearchResult": "search",
    "search_shape": "search",
    "sweep": "search",
    "delayed_grid": "search",
    "candidate_shapes": "search",
    "depth": "depth",
    "DepthProfile": "depth",
    "depth_profile": "depth",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specsampling.simulators' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(f".{module}", __name__)
    except ImportError as error:  # pragma: no cover - exercised only without torch
        if getattr(error, "name", None) not in ("torch",):
            raise
        raise ImportError(
            f'specsampling.simulators.{name} needs torch: pip install "specsampling[torch]"'
        ) from error
    value = loaded if name == module else getattr(loaded, name)
    globals()[name] = value
    return value


__all__ = [
    "Comparison",
    "CostModel",
    "DepthProfile",
    "Estimate",
    "HeapTree",
    "OptTree",
    "RecordedTrees",
    "SearchResult",
    "candidate_shapes",
    "compare",
    "conditional_emitted",
    "cost",
    "delayed_grid",
    "depth",
    "depth_profile",
    "estimate",
    "estimate_emitted",
    "estimators",
    "pairs",
    "policies",
    "record",
    "recorded",
    "search",
    "search_shape",
    "sources",
    "sweep",
]
