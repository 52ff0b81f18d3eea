"""The keyed-noise family: the counter-based noise field, the couplings' laws and the watermark.

Keyed couplings (``gumbel``, ``poisson``, ``gls``, ``gls_strong``) do not consume per-node
:class:`~specsampling.Noise`: drafter and verifier read the *same* keyed exponentials, a pure
function of (key, context, row, token). This package holds everything of that family that is
not a scheme object (those live in :mod:`specsampling.schemes`):

* :mod:`~specsampling.keyed.field`: the splitmix64 noise field and :class:`KeyedNoise`
  (re-exported here, so ``specsampling.keyed.exponentials`` works);
* :mod:`~specsampling.keyed.laws`: Gumbel and Poisson selections, their exact hit laws and
  acceptance, the drafter-invariant reference decoder;
* :mod:`~specsampling.keyed.gls_law`: the GLS match law and acceptance;
* :mod:`~specsampling.keyed.watermark`: detection of keyed text.
"""

from __future__ import annotations

from . import field, gls_law, laws, watermark
from .field import (
    LARGEST_UNIFORM,
    RESOLUTION,
    KeyedNoise,
    context_hash,
    context_hashes,
    exponentials,
    hash_bits,
    position_context,
    to_unit,
    uniforms,
)

__all__ = [
    "LARGEST_UNIFORM",
    "RESOLUTION",
    "KeyedNoise",
    "context_hash",
    "context_hashes",
    "exponentials",
    "field",
    "gls_law",
    "hash_bits",
    "laws",
    "position_context",
    "to_unit",
    "uniforms",
    "watermark",
]
