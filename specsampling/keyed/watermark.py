r"""Watermark detection for text decoded by a keyed coupling (``ss.generate(..., key=...)``).

Embedding (derived in this project; ``docs/watermark.md``): the token at position ``t`` is the
keyed race winner ``argmin_z min_k E[k, z] / p_z`` over ``rows`` rows of exponentials
``E[k, z] = -log1p(-U(key, c_t, k, z))``, where ``c_t`` is the absolute position
(``window=None``) or the hash of the previous ``window`` tokens; a hashed context already used
earlier in the text falls back to the position and is not watermarked
(:class:`~specsampling.keyed.KeyedNoise`). One row for ``gumbel`` and ``poisson``, ``K`` rows
for ``gls`` and ``gls_strong``.

Detection needs no model. For each scored position, ``W_t = min_k E[k, y_t]`` is ``Exp(K)``
under H0 (text independent of the key: distinct contexts give independent uniforms), so

.. math::

    T = \sum_t -\log(1 - e^{-K W_t}) \sim \mathrm{Gamma}(n, 1)
    \quad\text{(for } K = 1:\ -\log(1 - e^{-E}) = -\log U\text{)}.

A winner's exponential is small, so watermarked text has a large ``T``: the p-value is the Gamma
upper tail. Positions with a repeated context are skipped, exactly as in the embedding, so a
repeated ``(context, token)`` pair is never scored twice. For the active-set ``gls`` the
all-rows ``W`` still has an exact null (the null law does not depend on the active set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..validation import check_positive_int, check_token
from . import field as keyed


@dataclass(frozen=True)
class Detection:
    """``statistic`` = T, ``num_scored`` = n, ``p_value`` = P[Gamma(n, 1) >= T]."""

    statistic: float
    num_scored: int
    p_value: float


def scored_positions(tokens: Any, window: int | None, start: int = 0) -> tuple[Any, Any]:
    """Positions ``t >= start`` that carry the watermark, and their context words.

    ``window=None``: every position, keyed by its absolute position. Otherwise the positions
    whose context (previous ``window`` tokens) is new since ``start``, as in
    :class:`~specsampling.keyed.KeyedNoise`.
    """
    if window is None:
        index = np.arange(start, len(tokens), dtype=np.int64)
        return index, keyed.position_context(index.astype(np.uint64))
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


def detect(
    tokens: Any,
    key: int,
    *,
    vocab_size: int,
    window: int | None = None,
    start: int = 0,
    rows: int = 1,
) -> Detection:
    """Test text for the keyed watermark; needs only the tokens and the key.

    Parameters
    ----------
    tokens : sequence of int
        The text, prompt included (the prompt gives the first contexts).
    key : int
        The watermark key (the ``key`` given to :func:`specsampling.generate`).
    vocab_size : int
        Vocabulary size (validates the token ids).
    window : int, optional
        Context length ``h`` used at generation; ``None`` for position-keyed noise.
    start : int
        First generated position (the prompt length): earlier positions are not scored.
    rows : int
        Rows of noise per position: ``1`` for ``gumbel``/``poisson``, ``K`` for GLS.

    Returns
    -------
    Detection
        ``statistic`` ``T``, ``num_scored`` ``n`` and the one-sided ``p_value``.

    Examples
    --------
    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Random(50, seed=3)
    >>> text = ss.generate("gumbel", pair, ss.Shape.chain(3), 80, np.random.default_rng(0),
    ...                    key=11, window=2)
    >>> detect(text, 11, window=2, vocab_size=50).p_value < 1e-3
    True
    >>> detect(text, 12, window=2, vocab_size=50).p_value > 1e-3  # another key: no signal
    True
    """
    size = check_positive_int(vocab_size, "vocab_size")
    seq = [check_token(t, f"tokens[{i}]", size) for i, t in enumerate(tokens)]
    first = check_positive_int(start, "start", minimum=0)
    num_rows = check_positive_int(rows, "rows")
    if window is not None:
        check_positive_int(window, "window")
    positions, contexts = scored_positions(seq, window, first)
    n = int(positions.shape[0])
    if n == 0:
        return Detection(0.0, 0, 1.0)
    chosen = np.array(seq, dtype=np.int64)[positions]
    exps = keyed.exponentials(
        key, np.asarray(contexts)[:, None], np.arange(num_rows)[None, :], chosen[:, None]
    )
    arrival = exps.min(axis=1)
    with np.errstate(divide="ignore"):
        statistic = float(np.sum(-np.log(-np.expm1(-num_rows * arrival))))
    from scipy.special import gammaincc  # imported here: scipy.special is slow to import

    # The p-value: the Gamma(n, 1) survival function at the statistic, Q(n, statistic).
    return Detection(statistic, n, float(gammaincc(n, statistic)))


__all__ = ["Detection", "detect", "scored_positions"]
