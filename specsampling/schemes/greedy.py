r"""Greedy multi-draft (Hu et al. 2025): the draft's top tokens plus one random draft per node.

Draft law (:meth:`Shape.greedy <specsampling.shapes.Shape.greedy>`). At node :math:`v` with
:math:`k` drafts, :math:`T` is the set of the :math:`k-1` most probable draft tokens (ties: lowest
id first; fewer when :math:`|\mathrm{supp}\,q| < k-1`), drafted deterministically, and the last
draft is :math:`X \sim q' = \mathrm{norm}(q\,\mathbf 1_{V \setminus T})`. When :math:`T` exhausts
:math:`\mathrm{supp}\,q` there is no random draft.

Algorithm. At a node with candidates :math:`x_1..x_c` in drafting order,
:math:`T = \{x_1..x_{c-1}\}` and :math:`X = x_c`. If the candidates cover
:math:`\mathrm{supp}\,q` (no random draft, or one whose :math:`q'` is a point mass) emit
:math:`y \sim p`. Otherwise accept :math:`X` iff
:math:`u\,q'(X) < p(X)` and descend; else emit

.. math:: y \sim \mathrm{norm}\bigl(p\,\mathbf 1_T + (p - q')_+\,\mathbf 1_{V \setminus T}\bigr).

An emitted token that lies in :math:`T` is a *hit* and descends into that child (base class). At a
leaf emit a bonus from :math:`p`. On a chain (:math:`c = 1`, :math:`T = \varnothing`,
:math:`q' = q`) this is standard speculative sampling, so chains are supported too.

Theorem. Lossless on greedy draft trees; more generally whenever :math:`T` is any deterministic
function of the context and :math:`X \sim q'`. Proof idea: :math:`P(Y = x) = \min(p, q')(x) +
(p - q')_+(x) = p(x)` off :math:`T` and :math:`p(x)` on :math:`T` (only the residual reaches
:math:`T`); the covering case emits :math:`p` directly, and the tree follows by induction on depth.

Acceptance. :math:`\alpha_\text{greedy} = p(T) + \sum_{x \notin T} \min(p(x), q'(x))`
(:math:`p(T)` when :math:`T` exhausts :math:`\mathrm{supp}\,q`), the LP optimum for this draft law:
:func:`greedy_acceptance`.

Reference: Hu, Zheng, Viswanathan, Chen, Rossi, Wu, Manocha, Huang, "Towards Optimal Multi-draft
Speculative Decoding", arXiv 2502.18779 (ICLR 2025).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._types import Probs
from ..noise import Noise
from ..ops import accept_probability, accepts, categorical, normalise, positive_part, total
from ..shapes import Shape
from ..tree import DraftTree, DrawLaw
from ..validation import check_pair, check_positive_int
from .base import NodeScheme, Step


class Split(NamedTuple):
    """The drafts of one node: the deterministic mask, the random child and its law."""

    #: ``True`` on the deterministic tokens :math:`T`.
    deterministic: Any
    #: The node of the random draft :math:`X`.
    child: int
    #: :math:`q' = \mathrm{norm}(q\,\mathbf 1_{V \setminus T})`.
    rest: Probs


class Greedy(NodeScheme):
    """Hu et al.'s verifier for greedy drafts; exact, and optimal for its own draft law.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> from specsampling.schemes.greedy import SCHEME
    >>> ss.acceptance(SCHEME, [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, num_drafts=2)
    Fraction(1, 1)
    """

    name = "greedy"
    reference = (
        "Hu et al. 2025, Towards Optimal Multi-draft Speculative Decoding (arXiv 2502.18779)"
    )

    laws = frozenset({DrawLaw.GREEDY})

    def single_shape(self, num_drafts: int) -> Shape:
        return Shape.greedy((num_drafts,))

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return greedy_acceptance(target, draft, num_drafts)

    def split(self, tree: DraftTree, node: int, draft: Probs) -> Split | None:
        """``T`` = every candidate but the last, ``X`` = the last; ``None`` if they cover supp q."""
        candidates = tree.candidates[node]
        drafted = np.zeros(draft.shape[0], dtype=bool)
        drafted[[tree.tokens[c] for c in candidates]] = True
        if not np.any(np.asarray(draft > 0, dtype=bool) & ~drafted):
            return None
        deterministic = np.zeros(draft.shape[0], dtype=bool)
        deterministic[[tree.tokens[c] for c in candidates[:-1]]] = True
        rest = np.where(deterministic, 0 * draft, draft)
        return Split(deterministic, candidates[-1], normalise(rest))

    def residual(self, target: Probs, split: Split) -> Probs:
        r""":math:`\mathrm{norm}(p\,\mathbf 1_T + (p - q')_+\,\mathbf 1_{V \setminus T})`, or
        :math:`p` when that has zero mass (a rejection of probability 0)."""
        weights = np.where(split.deterministic, target, positive_part(target - split.rest))
        if not total(weights) > 0:
            return target
        return normalise(weights)

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        target = target_probs[node]
        split = self.split(tree, node, draft_probs[node])
        if split is None:
            return None, categorical(target, noise.sample[node])
        token = tree.tokens[split.child]
        if accepts(noise.accept[split.child], target[token], split.rest[token]):
            return split.child, None
        return None, categorical(self.residual(target, split), noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        target = target_probs[node]
        split = self.split(tree, node, draft_probs[node])
        if split is None:
            return [], target
        token = tree.tokens[split.child]
        accept = accept_probability(target[token], split.rest[token])
        return [(split.child, accept)], (1 - accept) * self.residual(target, split)


def top_tokens(draft: Probs, count: int) -> Any:
    """Mask of the ``count`` most probable tokens of ``draft`` with positive mass.

    Ties go to the lowest id, compared in float64 exactly as :meth:`Shape.greedy
    <specsampling.shapes.Shape.greedy>` drafts them.

    >>> import numpy as np
    >>> top_tokens(np.array([0.25, 0.5, 0.25, 0.0]), 2)
    array([ True,  True, False, False])
    """
    values = np.asarray([float(x) for x in draft]) if draft.dtype == object else draft
    order = np.argsort(-values, kind="stable")
    count = min(count, int(np.count_nonzero(np.asarray(draft > 0, dtype=bool))))
    mask = np.zeros(draft.shape[0], dtype=bool)
    mask[order[:count]] = True
    return mask


def greedy_acceptance(target: Any, draft: Any, num_drafts: int) -> Any:
    r"""Greedy multi-draft acceptance :math:`P(Y \in T \cup \{X\})` with :math:`k` drafts.

    .. math:: \alpha_\text{greedy} = p(T) + \sum_{x \notin T} \min\bigl(p(x), q'(x)\bigr),
              \qquad q' = \mathrm{norm}(q\,\mathbf 1_{V \setminus T}),

    with :math:`T` the :math:`k-1` most probable draft tokens, and :math:`\alpha = p(T)` when
    :math:`T` exhausts :math:`\mathrm{supp}\,q`. Vectorised: one sort of the vocabulary.

    Parameters
    ----------
    target, draft : array_like, shape (vocab_size,)
        Processed distributions, both float or both ``Fraction``.
    num_drafts : int
        :math:`k \ge 1` (:math:`k = 1` is standard speculative sampling).

    Examples
    --------
    >>> from fractions import Fraction as F
    >>> greedy_acceptance([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(1, 1)
    >>> float(greedy_acceptance([0.0, 1.0], [1.0, 0.0], 2))  # T = {0} exhausts supp q
    0.0
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    deterministic = top_tokens(draft, k - 1)
    hits = total(np.where(deterministic, target, 0 * target))
    rest = np.where(deterministic, 0 * draft, draft)
    mass = total(rest)
    if not mass > 0:
        return hits
    return hits + total(np.where(deterministic, 0 * target, np.minimum(target, rest / mass)))


SCHEME = Greedy()
