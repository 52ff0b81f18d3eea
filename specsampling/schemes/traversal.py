r"""Traversal verification (Weng, Hu, Chen, Liu, Mei, Qiu, Tian, Shi; NeurIPS 2025).

Algorithm. Each node :math:`v` carries a current target :math:`P[v] = p(\cdot|v)`, draft
:math:`Q[v] = q(\cdot|v)` and weight :math:`w`, with :math:`w[\text{root}] = 1` and, top-down,
:math:`w[c] = \min(1, w[v] P[v](x) / Q[v](x))` for the child :math:`c` holding token :math:`x`
(0 if :math:`Q[v](x) = 0`). Children are distinct (i.i.d. duplicates merged, first-drafted order).
Repeat:

1. take the first leaf :math:`\ell` in depth-first order (the first live child, repeatedly);
2. if :math:`\ell` is the root, emit :math:`y \sim P[\text{root}]`; otherwise accept with
   :math:`u < w[\ell]` and emit the path to :math:`\ell` and a bonus :math:`y \sim P[\ell]` --
   the node's *current* distribution, a residual if its children were deleted;
3. on rejection delete :math:`\ell`; for its parent :math:`\pi` set
   :math:`r = (w[\pi] P[\pi] - Q[\pi])_+`, :math:`S = \sum r`; if :math:`S > 0`,
   :math:`P[\pi] \leftarrow r / S` and :math:`w[\pi] \leftarrow S / (S + 1 - w[\pi])`, else
   :math:`w[\pi] \leftarrow 0`; then remove :math:`x` from :math:`Q[\pi]` and renormalise, and
   recompute the weights of :math:`\pi`'s remaining descendants.

Theorem (Weng et al.). Lossless on trees whose children are random draws from :math:`q`: without
replacement trees, i.i.d. path tries and delayed trees; on a chain it is block verification
exactly, hence optimal there. It is *not* exact on deterministic (top-k) trees.

Acceptance. No closed form; the exact engine follows the single reject-...-accept chain of
tests, :math:`O(|T|^2)` per tree.

Reference: Weng et al., "Traversal Verification for Speculative Tree Decoding", arXiv 2505.12398.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .._types import Probs
from ..noise import Noise
from ..ops import categorical, positive_part, remove_token, total
from ..tree import DraftTree, DrawLaw
from .base import NodeLaw, TreeScheme, Verdict, VerdictLaw
from .standard import standard_acceptance


class TraversalState:
    """Mutable per-node state of one traversal: live children, ``P``, ``Q`` and ``w``."""

    def __init__(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> None:
        self.tree = tree
        self.live = [list(tree.children(node)) for node in range(tree.num_nodes)]
        self.initial_target = target_probs
        self.target = list(target_probs)
        self.draft = list(draft_probs)
        self.weight: list[Any] = [1] * tree.num_nodes
        self.reweigh(0)

    def first_leaf(self) -> int:
        """The first live leaf in depth-first order."""
        node = 0
        while self.live[node]:
            node = self.live[node][0]
        return node

    def reweigh(self, node: int) -> None:
        """Recompute the weights of every live descendant of ``node``, top-down."""
        stack = [node]
        while stack:
            parent = stack.pop()
            for child in self.live[parent]:
                token = self.tree.tokens[child]
                draft_x = self.draft[parent][token]
                scaled = self.weight[parent] * self.target[parent][token]
                if not draft_x > 0:
                    self.weight[child] = 0
                else:
                    self.weight[child] = 1 if scaled >= draft_x else scaled / draft_x
                stack.append(child)


class Traversal(TreeScheme):
    """Traversal verification; exact on sampled trees (i.i.d. or without replacement).

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> pair = ss.pairs.Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> ss.expected_emitted("traversal", pair, ss.Shape.paths(2, 2)) - 1
    Fraction(115, 81)
    """

    name = "traversal"
    reference = "Weng et al. 2025, traversal verification (arXiv 2505.12398)"

    laws = frozenset({DrawLaw.IID, DrawLaw.WITHOUT})

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        """One candidate is a chain of one token: standard acceptance, :math:`\\sum \\min(p, q)`."""
        return standard_acceptance(target, draft) if num_drafts == 1 else None

    def verify(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Verdict:
        self.check_round(tree, target_probs, draft_probs, noise)
        state = TraversalState(tree, target_probs, draft_probs)
        while True:
            leaf = state.first_leaf()
            if leaf == 0 or noise.accept[leaf] < state.weight[leaf]:
                return Verdict(leaf, categorical(self.bonus(state, leaf), noise.sample[leaf]))
            self.reject(state, leaf)

    def verdict_law(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> VerdictLaw:
        law: VerdictLaw = {}
        for leaf, weight, state in self.accepted_leaves(tree, target_probs, draft_probs):
            for token, mass in enumerate(self.bonus(state, leaf)):
                if mass > 0:
                    law[Verdict(leaf, token)] = weight * mass
        return law

    def verdict_nodes(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> NodeLaw:
        """The law of :meth:`verdict_law` by node: the same leaf sequence, no token lists."""
        law: NodeLaw = {}
        for leaf, weight, _ in self.accepted_leaves(tree, target_probs, draft_probs):
            law[leaf] = law.get(leaf, 0) + weight
        return law

    def accepted_leaves(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs
    ) -> Iterator[tuple[int, Any, TraversalState]]:
        """The single reject-...-accept chain of tests, exactly: ``(leaf, P(the round accepts
        at this leaf), state)`` for every leaf tested with a positive acceptance, in order.

        ``state`` holds the leaf's current distributions (its bonus is
        :meth:`bonus` of it) until the next item, when the leaf is rejected and deleted.
        """
        self.check_round(tree, target_probs, draft_probs)
        state = TraversalState(tree, target_probs, draft_probs)
        remaining: Any = 1
        while remaining > 0:
            leaf = state.first_leaf()
            accept = 1 if leaf == 0 else min(max(state.weight[leaf], 0), 1)
            if accept > 0:
                yield leaf, remaining * accept, state
            remaining = remaining * (1 - accept)
            if leaf == 0:
                break
            self.reject(state, leaf)

    # Hooks the mutant catalogue overrides.
    def bonus(self, state: TraversalState, leaf: int) -> Probs:
        """The current distribution of the accepted node."""
        current: Probs = state.target[leaf]
        return current

    def reject(self, state: TraversalState, leaf: int) -> None:
        """Delete ``leaf`` and update its parent's distributions and weight, then reweigh."""
        parent = state.tree.parents[leaf]
        state.live[parent].remove(leaf)
        leftover = positive_part(state.weight[parent] * state.target[parent] - state.draft[parent])
        mass = total(leftover)
        if mass > 0:
            state.target[parent] = leftover / mass
            state.weight[parent] = mass / (mass + (1 - state.weight[parent]))
        else:
            state.weight[parent] = 0 * mass
        state.draft[parent] = remove_token(state.draft[parent], state.tree.tokens[leaf])
        state.reweigh(parent)


SCHEME = Traversal()
