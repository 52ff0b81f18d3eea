"""Watermark detection for text decoded by a keyed coupling (``couple(..., window=h)``).

Embedding (§C.5 of ``specs/residual-diffusion-poisson.md``): the token at position ``t`` is the
keyed race winner ``argmin_z E_z / p_z`` with ``E_z = -log1p(-U(key, c_t, 0, z))`` and
``c_t`` the hash of the previous ``window`` tokens; a context already used earlier in the text
falls back to position-keyed noise and is not watermarked.

Detection needs no model. For each position whose context is new, ``U_t = U(key, c_t, 0, y_t)``
is the uniform of the emitted token, and

.. math::

    T = \\sum_t -\\log(1 - e^{-E_{t, y_t}}) = \\sum_t -\\log U_t \\sim \\mathrm{Gamma}(n, 1)

under H0 (text independent of the key: distinct contexts give independent uniforms). A winner's
exponential is small, so watermarked text has a large ``T``: the p-value is the Gamma upper tail.
Positions with a repeated context are skipped, exactly as in the embedding, so a repeated
``(context, token)`` pair is never scored twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from . import keyed
from .validation import check_positive_int, check_token


@dataclass(frozen=True)
class Detection:
    """``statistic`` = T, ``num_scored`` = n, ``p_value`` = P[Gamma(n, 1) >= T]."""

    statistic: float
    num_scored: int
    p_value: float


def scored_positions(tokens: Any, window: int, start: int = 0) -> tuple[Any, Any]:
    """Positions ``t >= start`` whose context (previous ``window`` tokens) is new, and those
    contexts. A context counts as seen from ``start`` on, as in :func:`.couplings.couple`."""
    contexts = keyed.context_hashes(tokens, window)[:-1]
    seen: set[int] = set()
    positions: list[int] = []
    for t in range(start, contexts.shape[0]):
        word = int(contexts[t])
        if word not in seen:
            seen.add(word)
            positions.append(t)
    index = np.array(positions, dtype=np.int64)
    return index, contexts[index]


def detect(tokens: Any, key: int, *, window: int, vocab_size: int, start: int = 0) -> Detection:
    """Test text for the keyed watermark; needs only the tokens and the key.

    Parameters
    ----------
    tokens : sequence of int
        The text, prompt included (the prompt gives the first contexts).
    key : int
        The watermark key.
    window : int
        Context length ``h`` used at generation.
    vocab_size : int
        Vocabulary size (validates the token ids).
    start : int
        First generated position (the prompt length): earlier positions are not scored.

    Examples
    --------
    >>> from specsampling.couplings import couple
    >>> from specsampling.pairs import Random
    >>> text = couple(Random(50, seed=3), 80, key=11, window=2).tokens
    >>> detect(text, 11, window=2, vocab_size=50).p_value < 1e-3
    True
    """
    size = check_positive_int(vocab_size, "vocab_size")
    seq = [check_token(t, f"tokens[{i}]", size) for i, t in enumerate(tokens)]
    first = check_positive_int(start, "start", minimum=0)
    positions, contexts = scored_positions(seq, window, first)
    n = int(positions.shape[0])
    if n == 0:
        return Detection(0.0, 0, 1.0)
    chosen = np.array(seq, dtype=np.int64)[positions]
    u = keyed.uniforms(key, contexts, 0, chosen)
    with np.errstate(divide="ignore"):
        statistic = float(np.sum(-np.log(u)))
    return Detection(statistic, n, float(stats.gamma.sf(statistic, n)))
