r"""Standard (token-level) speculative sampling on a chain (Leviathan et al.; Chen et al.).

Algorithm. For the drafted chain :math:`x_1..x_\gamma \sim q`, at position :math:`i` accept
:math:`x_i` iff :math:`u_i\,q_i(x_i) < p_i(x_i)`; at the first rejection emit
:math:`y \sim \mathrm{norm}((p_i - q_i)_+)` and stop; if all are accepted emit a bonus
:math:`y \sim p_{\gamma+1}`.

Theorem. Each emitted token is distributed as the target given the tokens before it. Proof idea:
the accepted mass of token :math:`x` is :math:`q(x)\min(1, p(x)/q(x)) = \min(p(x), q(x))` and
the rejection branch adds :math:`(1-\beta)\,\mathrm{norm}((p-q)_+)(x) = (p(x)-q(x))_+`; they sum
to :math:`p(x)`.

Acceptance. :math:`\beta = \sum_x \min(p(x), q(x))` per position; on a chain
:math:`E[\tau] = \sum_{i\le\gamma} \sum_{x_{1:i}} \prod_{j \le i} \min(p_j(x_j), q_j(x_j))`.

Reference: Leviathan, Kalman, Matias, arXiv 2211.17192; Chen et al., arXiv 2302.01318.
Star(1) is the single-step case.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import Prefix, Probs
from ..noise import Noise
from ..ops import standard_step, standard_step_law, total
from ..pairs import ModelPair, Stationary, check_model_pair
from ..tree import DraftTree
from ..validation import check_pair, check_positive_int, check_prefix
from .base import NodeScheme, Step


class Standard(NodeScheme):
    """Token-level speculative sampling; exact on sampled chains only.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> pair = ss.pairs.Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> ss.expected_emitted("standard", pair, ss.Shape.chain(2))
    Fraction(19, 9)
    """

    name = "standard"
    reference = "Leviathan et al. 2023 (arXiv 2211.17192); Chen et al. 2023 (arXiv 2302.01318)"

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return standard_acceptance(target, draft) if num_drafts == 1 else None

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        (child,) = tree.candidates[node]
        u_accept, u_sample = noise.accept[child], noise.sample[node]
        drawn = standard_step(
            target_probs[node], draft_probs[node], tree.tokens[child], u_accept, u_sample
        )
        return (child, None) if drawn is None else (None, drawn)

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        (child,) = tree.candidates[node]
        accept, stop = standard_step_law(target_probs[node], draft_probs[node], tree.tokens[child])
        return [(child, accept)], stop


def standard_acceptance(target: Any, draft: Any) -> Any:
    r"""Single-draft acceptance :math:`\beta = \sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)`.

    >>> round(float(standard_acceptance([1/2, 1/3, 1/6], [1/3, 1/3, 1/3])), 6)
    0.833333
    """
    target, draft = check_pair(target, draft)
    return total(np.minimum(target, draft))


def chain_expected_accepted(pair: ModelPair, length: int, prefix: Prefix = ()) -> Any:
    r"""Standard speculative sampling on a chain: exact :math:`E[\tau]` for any model pair.

    .. math:: E[\tau] = \sum_{i=1}^{\gamma} \sum_{x_{1:i}} \prod_{j \le i}
              \min(p_j(x_j), q_j(x_j)).

    Enumerates the contexts with positive overlap (``vocab ** (length - 1)`` at most); for a
    :class:`~specsampling.pairs.Stationary` pair it is :math:`\sum_{i \le \gamma} \beta^i`.
    ``pair``, ``length`` and ``prefix`` are checked as :func:`~specsampling.expected_emitted`
    checks them (:func:`check_chain_arguments`).

    >>> from fractions import Fraction as F
    >>> from specsampling.pairs import Random, Stationary
    >>> chain_expected_accepted(Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]), 2)
    Fraction(10, 9)
    >>> chain_expected_accepted(Random(3, seed=1), 2, (9,))
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: prefix[0]: id 9 out of range [0, 3)
    """
    pair, length, prefix = check_chain_arguments(pair, length, prefix)
    return _chain_expected(pair, length, prefix)


def check_chain_arguments(pair: Any, length: Any, prefix: Any) -> tuple[ModelPair, int, Prefix]:
    """The chain calculators' arguments, checked in :func:`~specsampling.expected_emitted`'s
    order: a model pair, a length >= 0, a prefix of token ids in range (each refusal names its
    argument)."""
    pair = check_model_pair(pair)
    length = check_positive_int(length, "length", minimum=0)
    return pair, length, check_prefix(prefix, pair.vocab_size)


def _chain_expected(pair: ModelPair, length: int, prefix: Prefix) -> Any:
    if isinstance(pair, Stationary):
        beta = total(np.minimum(pair.target(()), pair.draft(())))
        return sum((beta**i for i in range(1, length + 1)), 0 * beta)
    if length == 0:
        return 0
    overlap = np.minimum(pair.target(tuple(prefix)), pair.draft(tuple(prefix)))
    result: Any = total(overlap)
    if length > 1:
        for token in np.flatnonzero(np.asarray(overlap > 0, dtype=bool)):
            deeper = _chain_expected(pair, length - 1, (*prefix, int(token)))
            result = result + overlap[token] * deeper
    return result


SCHEME = Standard()
