"""Mutants of the sequence-level schemes (block and traversal verification).

Each changes one rule named in the Pitfalls of ``docs/schemes/block.md`` and
``docs/schemes/traversal.md`` in the sampled decision and in the exact law alike, and must be
caught by the losslessness oracle on its case while the registered scheme is exact there. They
join the catalogue of ``mutants.py`` in ``test_mutants.py``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import specsampling as ss
from proofs_tests.mutants import Case, Mutant
from specsampling.ops import positive_part, total
from specsampling.schemes.block import Block
from specsampling.schemes.traversal import Traversal, TraversalState
from specsampling.tree import DraftTree

F = Fraction
Probs = Any


class BlockFirstFailure(Block):
    """Stops at the first failed block test instead of taking the last success
    (vllm-project/vllm-ascend#7807)."""

    name = "mutant-block-first-failure"

    def choose_tau(self, etas: list[float], accept: list[Any]) -> int:
        tau = 0
        for i in range(1, len(accept)):
            if not etas[i] < accept[i]:
                break
            tau = i
        return tau

    def tau_law(self, accept: list[Any]) -> list[Any]:
        law: list[Any] = [0] * len(accept)
        reach: Any = 1
        for i in range(1, len(accept)):
            law[i - 1] = reach * (1 - accept[i])
            reach = reach * accept[i]
        law[-1] = reach
        return law


class BlockPlainResidual(Block):
    """Emits from the plain ``norm((p - q)_+)`` instead of the w-weighted residual
    (vllm-project/vllm-ascend#7807)."""

    name = "mutant-block-plain-residual"

    def emit(
        self,
        path: list[int],
        tau: int,
        weights: list[Any],
        target_probs: Probs,
        draft_probs: Probs,
    ) -> Probs:
        return super().emit(path, tau, [1] * len(weights), target_probs, draft_probs)


class BlockNoDenominatorGuard(Block):
    """Divides ``S / (S + 1 - w)`` without the guard for ``w = 1, S = 0``: NaN or 0/0."""

    name = "mutant-block-no-guard"

    def block_probabilities(
        self, tree: DraftTree, path: list[int], target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[Any], list[Any]]:
        weights, accept = super().block_probabilities(tree, path, target_probs, draft_probs)
        for i in range(1, len(path) - 1):
            node = path[i]
            mass = total(positive_part(weights[i] * target_probs[node] - draft_probs[node]))
            accept[i] = mass / (mass + (1 - weights[i]))
        return weights, accept


class TraversalOriginalBonus(Traversal):
    """Draws the accepted node's bonus from its original target, not its current residual."""

    name = "mutant-traversal-original-bonus"

    def bonus(self, state: TraversalState, leaf: int) -> Probs:
        original: Probs = state.initial_target[leaf]
        return original


class TraversalNoDraftRenormalisation(Traversal):
    """Deletes the rejected child's token from the parent's draft without renormalising."""

    name = "mutant-traversal-no-renormalisation"

    def reject(self, state: TraversalState, leaf: int) -> None:
        parent = state.tree.parents[leaf]
        before = state.draft[parent]
        super().reject(state, leaf)
        state.draft[parent] = _zeroed(before, state.tree.tokens[leaf])
        state.reweigh(parent)


class TraversalNoWeightUpdate(Traversal):
    """Keeps the parent's weight after a rejection instead of ``S / (S + 1 - w)``."""

    name = "mutant-traversal-no-weight-update"

    def reject(self, state: TraversalState, leaf: int) -> None:
        parent = state.tree.parents[leaf]
        weight = state.weight[parent]
        super().reject(state, leaf)
        state.weight[parent] = weight
        state.reweigh(parent)


def _zeroed(probs: Probs, token: int) -> Probs:
    out = probs.copy()
    out[token] = 0 * out[token]
    return out


SPIKE = ((F(0), F(1, 4), F(3, 4)), (F(0), F(0), F(1)))  # the draft is sure, the target is not
MIXED_WO = ((F(0), F(2, 5), F(3, 5)), (F(3, 4), F(1, 4), F(0)))
CHAIN2 = ss.Shape.chain(2)

SEQUENCE_MUTANTS: dict[str, Mutant] = {
    m.scheme.name: m
    for m in (
        Mutant(
            BlockFirstFailure(),
            "block verification stopping at the first failed test (vllm-project/vllm-ascend#7807)",
            Case((SPIKE,), CHAIN2, "block"),
            (CHAIN2, ss.Shape.chain(3)),
        ),
        Mutant(
            BlockPlainResidual(),
            "block verification with the plain residual (vllm-project/vllm-ascend#7807)",
            Case((((F(1, 6), F(1, 3), F(1, 2)), (F(0), F(3, 4), F(1, 4))),), CHAIN2, "block"),
            (CHAIN2, ss.Shape.chain(3)),
        ),
        Mutant(
            TraversalOriginalBonus(),
            "traversal bonus from the original target (docs/schemes/traversal.md, first pitfall)",
            Case((SPIKE,), CHAIN2, "traversal"),
            (CHAIN2, ss.Shape.paths(2, 2)),
        ),
        Mutant(
            TraversalNoDraftRenormalisation(),
            "traversal without renormalising the parent's draft (pitfall 2)",
            Case((MIXED_WO,), ss.Shape.star(2, replacement=False), "traversal"),
            (ss.Shape.star(2, replacement=False), ss.Shape.branching((2, 1))),
            sweep_vocab=4,
        ),
        Mutant(
            TraversalNoWeightUpdate(),
            "traversal without the parent weight update (pitfall 3)",
            Case(
                (((F(0), F(1, 3), F(2, 3)), (F(0), F(3, 4), F(1, 4))),),
                ss.Shape.paths(2, 2),
                "traversal",
            ),
            (CHAIN2, ss.Shape.paths(2, 2)),
        ),
    )
}
