"""Monte-Carlo estimates from sampled rounds, for shapes too large to enumerate."""

from __future__ import annotations

from typing import Any

import numpy as np

from specsampling.pairs import ModelPair
from specsampling.sampling import speculate
from specsampling.shapes import Shape
from specsampling.validation import check_positive_int

from .stats import Estimate


def estimate_emitted(
    scheme: Any,
    pair: ModelPair,
    shape: Shape,
    num_rounds: int,
    rng: np.random.Generator,
    prefix: tuple[int, ...] = (),
) -> Estimate:
    """Estimate the block efficiency ``E[tau + 1]`` from ``num_rounds`` sampled rounds.

    >>> import numpy as np, specsampling as ss
    >>> from specsampling.simulators import estimate_emitted
    >>> pair = ss.pairs.Stationary([1/3, 2/3], [2/3, 1/3])
    >>> est = estimate_emitted("standard", pair, ss.Shape.chain(2), 4000, np.random.default_rng(0))
    >>> abs(est.mean - 19 / 9) < 4 * est.stderr
    True
    """
    n = check_positive_int(num_rounds, "num_rounds", minimum=2)
    emitted = np.array([len(speculate(scheme, pair, shape, rng, prefix).tokens) for _ in range(n)])
    return Estimate.of(emitted, "plain")
