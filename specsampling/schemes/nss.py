r"""Naive speculative sampling (NSS; SpecInfer's "naive" rule, MCSD's MCNS).

Algorithm. At node :math:`v` draw :math:`y \sim p(\cdot \mid v)`; if :math:`y` is a child of
:math:`v`, descend into it, otherwise emit :math:`y` and stop. At a leaf the draw is the bonus.

Theorem. Lossless for **any** draft tree, deterministic ones included (EAGLE-2, DDTree, OPT-Tree):
every emitted token is the target's own sample, drawn with fresh noise independent of the tree.

Acceptance. :math:`E[\tau] = \sum_{v \neq \text{root}} \prod_{u \in \text{path}(v)} p(u \mid
\text{parent}(u))`; for :math:`k` i.i.d. candidates at one position
:math:`P(\text{accept}) = \sum_t p(t)\,(1 - (1 - q(t))^k)`.

Reference: Miao et al., SpecInfer, arXiv 2305.09781; Yang et al., MCSD, arXiv 2401.06706.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import Probs
from ..errors import InvalidDistribution
from ..noise import Noise
from ..ops import categorical, total
from ..tree import DraftTree, DrawLaw
from ..validation import as_real_array, check_pair, check_positive_int, check_rows
from .base import NodeScheme, Step


class NSS(NodeScheme):
    """Accept iff the target's own sample is a drafted child; exact on every shape.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> ss.acceptance("nss", [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, num_drafts=2)
    Fraction(5, 9)
    """

    name = "nss"
    reference = (
        "Miao et al. 2024, SpecInfer (arXiv 2305.09781); Yang et al. 2024 (arXiv 2401.06706)"
    )

    #: Every law, unknown included: the emitted token is the target's own draw with fresh
    #: noise, so any tree drawn independently of the verifier's noise is verified exactly.
    laws = frozenset(DrawLaw)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return nss_acceptance(target, draft, num_drafts)

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        token = categorical(target_probs[node], noise.sample[node])
        child = tree.child_with_token(node, token)
        return (child, None) if child is not None else (None, token)

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        target = target_probs[node]
        stop = target.copy()
        descend = []
        for child in tree.children(node):
            token = tree.tokens[child]
            descend.append((child, target[token]))
            stop[token] = 0 * target[token]
        return descend, stop


def nss_acceptance(target: Any, draft: Any, num_drafts: int) -> Any:
    r"""NSS with :math:`k` i.i.d. candidates: :math:`\sum_t p(t)\,(1 - (1 - q(t))^k)`.

    >>> from fractions import Fraction as F
    >>> nss_acceptance([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(5, 9)
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    return total(target * (1 - (1 - draft) ** k))


def nss_expected_accepted(tree: DraftTree, target_probs: Probs) -> Any:
    r"""NSS (or greedy matching) on a given tree, deterministic ones included.

    .. math:: E[\tau] = \sum_{v \ne \text{root}} \prod_{u \in \text{path}(v)} p(u \mid
              \text{parent}(u)),

    with ``target_probs[n]`` the target after node ``n``: one row per node, float or
    ``Fraction``, checked as the verifiers check their tables
    (:func:`~specsampling.validation.check_rows`: NaN or inf, a negative entry, mass not one;
    not renormalised), and every drafted token in range; ``tree`` must be a
    :class:`~specsampling.DraftTree`. Each refusal names its argument.

    >>> import numpy as np
    >>> tree = DraftTree.chain([1, 0])
    >>> float(nss_expected_accepted(tree, np.array([[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])))
    0.625
    >>> nss_expected_accepted(tree, np.full((3, 2), np.nan))
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: target_probs[0]: NaN or inf at index 0
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"tree: expected a DraftTree, got {type(tree).__name__}")
    table = target_probs
    if not isinstance(table, np.ndarray):
        table = as_real_array(table, "target_probs")[0]
    if table.ndim != 2 or len(table) != tree.num_nodes:
        raise InvalidDistribution(
            f"target_probs: expected an array of shape ({tree.num_nodes}, vocab_size), got "
            f"shape {table.shape}"
        )
    check_rows(table, "target_probs")
    vocab_size = table.shape[1]
    if max(tree.tokens) >= vocab_size:
        raise InvalidDistribution(f"tree: token id {max(tree.tokens)} >= vocab_size {vocab_size}")
    target_probs = table
    reach: list[Any] = [1] * tree.num_nodes
    result: Any = 0 * target_probs[0][0]
    for node in range(1, tree.num_nodes):
        parent = tree.parents[node]
        reach[node] = reach[parent] * target_probs[parent][tree.tokens[node]]
        result = result + reach[node]
    return result


SCHEME = NSS()
