r"""Closed-form acceptance calculators, vectorised over the vocabulary.

Each takes processed distributions (float64 or ``Fraction``) and runs in :math:`O(kV)` numpy
operations, so vocabularies of 150k+ tokens take milliseconds. The exact engine
(:mod:`specsampling.exact`) checks every formula here by enumeration in the test suite.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._types import Prefix, Probs
from .ops import positive_part, residual, total
from .pairs import ModelPair, Stationary
from .tree import DraftTree
from .validation import check_pair, check_positive_int


def standard_acceptance(target: Any, draft: Any) -> Any:
    r"""Single-draft acceptance :math:`\beta = \sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)`.

    >>> round(float(standard_acceptance([1/2, 1/3, 1/6], [1/3, 1/3, 1/3])), 6)
    0.833333
    """
    target, draft = check_pair(target, draft)
    return total(np.minimum(target, draft))


def nss_acceptance(target: Any, draft: Any, num_drafts: int) -> Any:
    r"""NSS with :math:`k` i.i.d. candidates: :math:`\sum_t p(t)\,(1 - (1 - q(t))^k)`.

    >>> from fractions import Fraction as F
    >>> nss_acceptance([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(5, 9)
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    return total(target * (1 - (1 - draft) ** k))


def specinfer_acceptance(target: Any, draft: Any, num_drafts: int) -> Any:
    r"""Recursive rejection sampling with replacement, :math:`k` i.i.d. candidates.

    The recursion of Thomas et al. (2026, Alg. 9): with :math:`p_0 = p`,
    :math:`r_i = \sum \min(p_{i-1}, q)`, :math:`P_\text{rej} = \prod_i (1 - r_i)`,
    :math:`m = \prod_i \bigl(1 - (q - p_{i-1})_+ / (1 - r_i)\bigr)` and
    :math:`p_i = \mathrm{norm}((p_{i-1} - q)_+)`,

    .. math:: \alpha = (1 - P_\text{rej}) + P_\text{rej} \sum_t p_k(t)\,(1 - m(t)),

    using the **final** residual :math:`p_k` (the original :math:`p` is wrong by up to 0.25).

    >>> from fractions import Fraction as F
    >>> specinfer_acceptance([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(8, 9)
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    current = target
    rejected: Any = 1
    missing: Any = np.ones_like(target) if target.dtype != object else target * 0 + 1
    for _ in range(k):
        step = total(np.minimum(current, draft))
        if not step < 1:
            return 1 - rejected + rejected * step
        rejected = rejected * (1 - step)
        missing = missing * (1 - positive_part(draft - current) / (1 - step))
        current = residual(current, draft)
    return 1 - rejected + rejected * total(current * (1 - missing))


def chain_expected_accepted(pair: ModelPair, length: int, prefix: Prefix = ()) -> Any:
    r"""Standard speculative sampling on a chain: exact :math:`E[\tau]` for any model pair.

    .. math:: E[\tau] = \sum_{i=1}^{\gamma} \sum_{x_{1:i}} \prod_{j \le i}
              \min(p_j(x_j), q_j(x_j)).

    Enumerates the contexts with positive overlap (``vocab ** (length - 1)`` at most); for a
    :class:`~specsampling.pairs.Stationary` pair it is :math:`\sum_{i \le \gamma} \beta^i`.

    >>> from fractions import Fraction as F
    >>> from specsampling.pairs import Stationary
    >>> chain_expected_accepted(Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]), 2)
    Fraction(10, 9)
    """
    length = check_positive_int(length, "length", minimum=0)
    if isinstance(pair, Stationary):
        beta = total(np.minimum(pair.target(()), pair.draft(())))
        return sum((beta**i for i in range(1, length + 1)), 0 * beta)
    if length == 0:
        return 0
    overlap = np.minimum(pair.target(tuple(prefix)), pair.draft(tuple(prefix)))
    result: Any = total(overlap)
    if length > 1:
        for token in np.flatnonzero(np.asarray(overlap > 0, dtype=bool)):
            deeper = chain_expected_accepted(pair, length - 1, (*prefix, int(token)))
            result = result + overlap[token] * deeper
    return result


def nss_expected_accepted(tree: DraftTree, target_probs: Probs) -> Any:
    r"""NSS (or greedy matching) on a given tree, deterministic ones included.

    .. math:: E[\tau] = \sum_{v \ne \text{root}} \prod_{u \in \text{path}(v)} p(u \mid
              \text{parent}(u)),

    with ``target_probs[n]`` the target after node ``n`` (specs, section 7).

    >>> import numpy as np
    >>> tree = DraftTree.chain([1, 0])
    >>> float(nss_expected_accepted(tree, np.array([[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])))
    0.625
    """
    reach: list[Any] = [1] * tree.num_nodes
    result: Any = 0 * target_probs[0][0]
    for node in range(1, tree.num_nodes):
        parent = tree.parents[node]
        reach[node] = reach[parent] * target_probs[parent][tree.tokens[node]]
        result = result + reach[node]
    return result


def block_expected_accepted(pair: ModelPair, length: int, prefix: Prefix = ()) -> Any:
    r"""Block verification on a chain: exact :math:`E[\tau] = \sum_{i \le \gamma} E_q[w_i]`.

    :math:`w_i = \min(1, w_{i-1} p_i(x_i) / q_i(x_i))` is the capped cumulative likelihood
    ratio (Sun et al. 2024). Enumerates drafted prefixes (``vocab ** (length - 1)`` at most).

    >>> from fractions import Fraction as F
    >>> from specsampling.pairs import Stationary
    >>> block_expected_accepted(Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]), 2)
    Fraction(11, 9)
    """
    length = check_positive_int(length, "length", minimum=0)
    return _block_sum(pair, length, tuple(prefix), 1)


def _block_sum(pair: ModelPair, length: int, prefix: Prefix, weight: Any) -> Any:
    if length == 0:
        return 0
    target, draft = pair.target(prefix), pair.draft(prefix)
    drafted = np.flatnonzero(np.asarray(draft > 0, dtype=bool))
    scaled = weight * target[drafted]
    weights = np.where(scaled >= draft[drafted], 1, 0 * scaled)
    below = scaled < draft[drafted]
    weights[below] = scaled[below] / draft[drafted][below]
    result: Any = total(draft[drafted] * weights)
    if length > 1:
        for token, w in zip(drafted, weights, strict=True):
            deeper = _block_sum(pair, length - 1, (*prefix, int(token)), w)
            result = result + draft[token] * deeper
    return result
