"""Noise as data: the uniforms a verifier consumes, passed in explicitly."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ._types import Probs
from .errors import InvalidDistribution


class Noise(NamedTuple):
    """Uniforms in ``[0, 1)`` for one round, one pair per tree node.

    ``accept[n]`` is the uniform of the accept test of the candidate held by node ``n``;
    ``sample[n]`` is the uniform of the categorical draw (residual, correction or bonus token)
    made at node ``n``, by inverse CDF (:func:`~specsampling.ops.categorical`). Both backends fed
    the same noise make the same decisions; this is the contract a lowering must follow.

    **Duplicate candidates.** An i.i.d. node can list one child several times
    (``tree.candidates[n] == (c, d, c)``). The ratio schemes that test every copy (``specinfer``,
    ``rsd``) read ``accept[c]`` as is each time: after a rejection the residual gives the token
    zero mass, so a later copy is rejected whatever its uniform. ``spectr`` and ``resispec``
    keep the token's mass, so they **reuse** the uniform: the first copy reads ``accept[c]``
    and, once rejected with accept probability ``a``, the next copy reads
    :func:`~specsampling.ops.reuse_uniform` ``(u, a) = (u - a) / (1 - a)``, which is again
    uniform on ``[0, 1)`` and independent of the first test's outcome. Every other entry is read
    at most once per round.

    >>> import numpy as np
    >>> noise = Noise.draw(np.random.default_rng(0), 3)
    >>> noise.accept.shape, noise.sample.shape
    ((3,), (3,))
    """

    accept: Probs
    sample: Probs

    @classmethod
    def draw(cls, rng: np.random.Generator, num_nodes: int) -> Noise:
        """Fresh independent uniforms for a tree of ``num_nodes`` nodes."""
        return cls(rng.random(num_nodes), rng.random(num_nodes))

    @classmethod
    def constant(cls, value: float, num_nodes: int) -> Noise:
        """Every uniform equal to ``value`` (boundary tests: ``0.0``, the largest float < 1)."""
        return cls.checked(np.full(num_nodes, value), np.full(num_nodes, value), num_nodes)

    @classmethod
    def checked(cls, accept: Any, sample: Any, num_nodes: int) -> Noise:
        """Validate both arrays: length ``num_nodes``, values in ``[0, 1)``."""
        arrays = []
        for name, values in (("accept", accept), ("sample", sample)):
            arr = np.asarray(values, dtype=np.float64)
            if arr.shape != (num_nodes,):
                raise InvalidDistribution(
                    f"noise.{name}: expected shape ({num_nodes},), got {arr.shape}"
                )
            if not np.all((arr >= 0) & (arr < 1)):
                raise InvalidDistribution(f"noise.{name}: uniforms must lie in [0, 1)")
            arrays.append(arr)
        return cls(arrays[0], arrays[1])


#: The largest float64 below one: the top boundary of a uniform in ``[0, 1)``.
LARGEST_BELOW_ONE = float(np.nextafter(1.0, 0.0))
