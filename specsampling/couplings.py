"""Gumbel and Poisson list couplings on keyed exponentials: drafter-invariant decoding.

Per position ``t`` both parties read the same keyed exponentials ``E_z`` (:mod:`.keyed`).

* **Gumbel** (Daliri, Musco, Suresh, arXiv 2408.07978): draft ``X = argmin_z E_z / q_z``,
  target ``Y = argmin_z E_z / p_z``. Each is exactly distributed as its own law (the
  exponential race), and the output is ``Y``, a function of (key, target) alone.
* **Poisson list** (C-I in ``specs/residual-diffusion-poisson.md`` §C.3): the drafter's list is
  its ``L`` first arrivals, the ``L`` smallest ``E_z / q_z`` (Gumbel-top-L, an exact sample of
  size ``L`` from ``q`` without replacement). The target accepts iff ``Y`` is in the list; the
  output is always ``Y``, so the emitted stream equals seeded target-only decoding bit for bit.

Acceptance, with ``r_i = (q_i p_j / q_j - p_i)_+``:

.. math::

    P(\\mathrm{acc}) = \\sum_j p_j \\int_0^\\infty e^{-x}
        P[\\mathrm{PoissonBinomial}(1 - e^{-x r}) \\le L - 1] \\, dx,
    \\qquad
    P_{L=1} = \\sum_j 1 \\Big/ \\sum_i \\max(p_i / p_j, q_i / q_j).

Proof idea: given ``Y = j`` with ``s = E_j / p_j``, the law of ``s`` is ``p_j e^{-s}`` and the
other ``E_i`` are ``p_i s + Exp(1)``, independent; token ``i`` beats ``j`` in the drafter's race
iff its extra ``Exp(1)`` is below ``s r_i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import keyed
from ._types import Prefix
from .errors import InvalidDistribution
from .pairs import ModelPair
from .validation import check_distribution, check_positive_int

Floats = npt.NDArray[np.float64]


def _floats(probs: Any, name: str, vocab_size: int | None = None) -> Floats:
    out: Floats = np.asarray(check_distribution(probs, name, vocab_size), dtype=np.float64)
    return out


def _scores(probs: Floats, exps: Any) -> Floats:
    """Log-domain race scores ``log E - log p``; ``+inf`` where ``p = 0`` (never selected)."""
    e = np.asarray(exps, dtype=np.float64)
    if e.shape[-1:] != probs.shape or np.any(np.isnan(e)) or np.any(e < 0):
        raise InvalidDistribution(
            f"exponentials: expected non-negative values of shape (..., {probs.shape[0]})"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        scores: Floats = np.log(e) - np.log(probs)
    scores[..., probs == 0] = np.inf
    return scores


def gumbel_target(target_probs: Any, exps: Any) -> Any:
    """The target's keyed selection ``argmin_{p_z > 0} E_z / p_z`` (ties: lowest index).

    Parameters
    ----------
    target_probs : array_like, shape (vocab_size,)
    exps : array_like, shape (..., vocab_size)
        Exponentials, e.g. :func:`.keyed.exponentials`.

    Returns
    -------
    int, or ndarray of int with shape (...)

    >>> gumbel_target([0.0, 0.5, 0.5], [0.0, 0.2, 0.1])
    2
    """
    probs = _floats(target_probs, "target")
    out = np.argmin(_scores(probs, exps), axis=-1)
    return int(out) if out.ndim == 0 else out


def gumbel_draft(draft_probs: Any, exps: Any) -> Any:
    """The drafter's keyed selection ``argmin_{q_z > 0} E_z / q_z`` (same race, its own law).

    >>> gumbel_draft([0.5, 0.5, 0.0], [0.3, 0.2, 0.0])
    1
    """
    probs = _floats(draft_probs, "draft")
    out = np.argmin(_scores(probs, exps), axis=-1)
    return int(out) if out.ndim == 0 else out


def poisson_list(draft_probs: Any, exps: Any, list_size: int) -> tuple[int, ...]:
    """The drafter's ``list_size`` first arrivals: Gumbel-top-L, in arrival order.

    Tokens with ``q = 0`` never arrive, so the list is shorter when the support is.

    >>> poisson_list([0.25, 0.25, 0.5, 0.0], [0.3, 0.2, 0.4, 0.0], 3)
    (1, 2, 0)
    """
    probs = _floats(draft_probs, "draft")
    size = check_positive_int(list_size, "list_size")
    scores = _scores(probs, exps)
    if scores.ndim != 1:
        raise InvalidDistribution("exponentials: poisson_list takes one position, shape (V,)")
    order = np.argsort(scores, kind="stable")[: min(size, int(np.count_nonzero(probs)))]
    return tuple(int(t) for t in order)


def gumbel_acceptance(target_probs: Any, draft_probs: Any) -> float:
    """Exact ``P(X = Y)`` of the single-draft Gumbel coupling.

    .. math:: \\sum_{j:\\, p_j q_j > 0} 1 \\Big/ \\sum_i \\max(p_i / p_j,\\ q_i / q_j)

    Blocked over ``j`` so memory stays ``O(V)`` per block.

    >>> round(gumbel_acceptance([0.5, 0.5], [0.5, 0.5]), 12)
    1.0
    """
    p = _floats(target_probs, "target")
    q = _floats(draft_probs, "draft", p.shape[0])
    both = np.flatnonzero((p > 0) & (q > 0))
    total = 0.0
    block = max(1, 2**22 // p.shape[0])
    for start in range(0, both.shape[0], block):
        j = both[start : start + block]
        # p_j * sum_i max(p_i / p_j, q_i / q_j) = sum_i max(p_i, q_i * (p_j / q_j)): no overflow.
        denom = np.maximum(p[None, :], q[None, :] * (p[j] / q[j])[:, None]).sum(axis=1)
        total += float(np.sum(p[j] / denom))
    return total


def poisson_acceptance(
    target_probs: Any, draft_probs: Any, list_size: int, *, step: float = 0.05
) -> float:
    """Exact ``P(Y in list)`` of the Poisson list coupling, by the integral of the module doc.

    The integral is taken in ``y = log x`` by the trapezoid rule with spacing ``step``; the
    integrand is analytic and decays doubly exponentially at both ends, so the rule converges
    geometrically (``step = 0.05`` is accurate to rounding). The grid for token ``j`` starts
    far below ``1 / (1 + sum_i r_i)``, the smallest scale on which the integrand moves, so tiny
    probabilities lose no mass. Poisson-binomial tails use a truncated recursion on
    ``1 - pi = exp(-x r)`` and ``pi = -expm1(-x r)``, with no cancellation.

    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> abs(poisson_acceptance(p, q, 1) - gumbel_acceptance(p, q)) < 1e-12
    True
    """
    p = _floats(target_probs, "target")
    q = _floats(draft_probs, "draft", p.shape[0])
    size = check_positive_int(list_size, "list_size")
    total = 0.0
    for j in np.flatnonzero((p > 0) & (q > 0)):
        rates = np.maximum(q * (p[j] / q[j]) - p, 0.0)
        rates[j] = 0.0
        rates = rates[rates > 0]
        if rates.shape[0] < size:
            total += float(p[j])
            continue
        low = -np.log1p(float(rates.sum())) - 40.0
        y = np.arange(low, np.log(40.0) + step, step)
        x = np.exp(y)
        tail = np.zeros((size, x.shape[0]))  # tail[k] = P[k of the tokens seen so far beat j]
        tail[0] = 1.0
        for rate in rates:
            stay = np.exp(-x * rate)
            move = -np.expm1(-x * rate)
            tail[1:] = tail[1:] * stay + tail[:-1] * move
            tail[0] = tail[0] * stay
        integrand = x * np.exp(-x) * tail.sum(axis=0)
        total += float(p[j]) * float(step * (integrand.sum() - 0.5 * integrand[[0, -1]].sum()))
    return min(total, 1.0)


def poisson_acceptance_bound(target_probs: Any, draft_probs: Any, list_size: int) -> float:
    """Candidate lower bound ``sum_j p_j L q_j / (L q_j + p_j)`` (the PML bound at ``L = 1``).

    Not proven (§C.3); the tests hold it as an inequality only.

    >>> round(poisson_acceptance_bound([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 1), 6)
    0.435714
    """
    p = _floats(target_probs, "target")
    q = _floats(draft_probs, "draft", p.shape[0])
    size = check_positive_int(list_size, "list_size")
    keep = p > 0
    return float(np.sum(p[keep] * size * q[keep] / (size * q[keep] + p[keep])))


@dataclass(frozen=True)
class Coupled:
    """A coupled decode: ``tokens`` emitted, ``hits[i]`` whether ``tokens[i]`` was in the
    drafter's list at that prefix, ``rounds`` the target passes with ``draft_length`` drafts."""

    tokens: tuple[int, ...]
    hits: tuple[bool, ...]
    rounds: int


def noise_context(sequence: Prefix, window: int | None, seen: set[int]) -> int:
    """The context word for the next position of ``sequence``, updating ``seen``.

    ``window=None``: the absolute position. Otherwise the hash of the previous ``window`` tokens
    (watermark); a context already in ``seen`` falls back to the absolute position, so repeated
    contexts are not watermarked and every position still gets fresh noise (§C.5).
    """
    if window is None:
        return int(keyed.position_context(len(sequence)))
    context = keyed.context_hash(sequence, window)
    if context in seen:
        return int(keyed.position_context(len(sequence)))
    seen.add(context)
    return context


def couple(
    pair: ModelPair,
    length: int,
    key: int,
    list_size: int = 1,
    prefix: Prefix = (),
    *,
    window: int | None = None,
    draft_length: int = 4,
) -> Coupled:
    """Decode ``length`` tokens with the Poisson list coupling (Gumbel at ``list_size=1``).

    Each position emits the target's keyed selection, so ``tokens`` depends on (key, target,
    prefix, window) only and never on the drafter, ``list_size`` or ``draft_length``: noise is
    keyed by absolute position or context hash, never by round. ``hits`` measures acceptance;
    ``rounds`` counts target passes when each round drafts up to ``draft_length`` positions.

    >>> from specsampling.pairs import Stationary
    >>> a = couple(Stationary([0.5, 0.5], [0.9, 0.1]), 6, key=1)
    >>> b = couple(Stationary([0.5, 0.5], [0.1, 0.9]), 6, key=1)
    >>> a.tokens == b.tokens
    True
    """
    count = check_positive_int(length, "length", minimum=0)
    size = check_positive_int(list_size, "list_size")
    gamma = check_positive_int(draft_length, "draft_length")
    sequence: Prefix = tuple(int(t) for t in prefix)
    vocab = np.arange(pair.vocab_size)
    seen: set[int] = set()
    tokens: list[int] = []
    hits: list[bool] = []
    for _ in range(count):
        context = noise_context(sequence, window, seen)
        exps = keyed.exponentials(key, context, 0, vocab)
        token = gumbel_target(pair.target(sequence), exps)
        hits.append(token in poisson_list(pair.draft(sequence), exps, size))
        tokens.append(token)
        sequence = (*sequence, token)
    return Coupled(tuple(tokens), tuple(hits), count_rounds(hits, gamma))


def count_rounds(hits: Any, draft_length: int) -> int:
    """Target passes needed to emit ``len(hits)`` tokens: a round takes up to ``draft_length``
    consecutive hits, then one more token (the correction on a miss, else the bonus).

    >>> count_rounds([True, True, False, True], 4)
    2
    """
    rounds, run, emitted = 0, 0, 0
    for hit in hits:
        if emitted == 0:
            rounds += 1
        emitted += 1
        if hit and run < draft_length:
            run += 1
        else:
            run, emitted = 0, 0
    return rounds


__all__ = [
    "Coupled",
    "count_rounds",
    "couple",
    "gumbel_acceptance",
    "gumbel_draft",
    "gumbel_target",
    "noise_context",
    "poisson_acceptance",
    "poisson_acceptance_bound",
    "poisson_list",
]
