"""Mutants of the optimal-transport verifiers (M1, M2, ...: ``docs/schemes/ot_optimal.md``).

Each subclasses a registered scheme and changes one rule of its plan or selection; the sampled
decision and the exact law share the plan, so both carry the bug. ``M8`` (no A*-priority) is
lossless by construction and is caught by the optimality check instead
(``tests/test_ot_optimal.py``).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction as F
from typing import Any

import numpy as np

import specsampling as ss
from proofs_tests.mutants import Case, Mutant
from specsampling.schemes.ot_optimal import OTOptimal, Plan, _plan, selection
from specsampling.tree import DrawLaw

Probs = Any

G2 = ((F(3, 5), F(3, 10), F(1, 10)), (F(1, 10), F(3, 10), F(3, 5)))
G6 = (
    (F(2, 5), F(1, 4), F(1, 5), F(3, 20), F(0)),
    (F(1, 20), F(1, 10), F(1, 4), F(3, 10), F(3, 10)),
)
G7 = (
    (F(3, 10), F(1, 5), F(1, 5), F(3, 20), F(1, 10), F(1, 20)),
    (F(0), F(1, 10), F(1, 5), F(3, 10), F(1, 4), F(3, 20)),
)
G8 = ((F(1, 4),) * 4, (F(1, 2), F(1, 4), F(1, 8), F(1, 8)))


class OTIntendedLaw(OTOptimal):
    """M1: selection weights perturbed by 10 % while stage 2 uses the intended ``r``."""

    name = "mutant-ot-intended-law"

    def node_plan(self, target: Probs, draft: Probs, num_drafts: int) -> Plan:
        node_plan = super().node_plan(target, draft, num_drafts)
        trees = tuple(
            dataclasses.replace(
                tree,
                stop=tuple(
                    s
                    if tree.left[i] < 0
                    else min(s * F(11, 10) if isinstance(s, F) else s * 1.1, 1)
                    for i, s in enumerate(tree.stop)
                ),
            )
            for tree in node_plan.trees
        )
        intended = node_plan.target_r
        excess = np.maximum(target - intended, 0 * target)
        residual = excess / excess.sum() if excess.sum() > 0 else target
        return dataclasses.replace(
            node_plan,
            trees=trees,
            support_realised_r=node_plan.support_target_r,
            residual=residual,
        )


class OTDistinctTokens(OTOptimal):
    """M2: uniform over the distinct tokens of the stop block, not over the draws."""

    name = "mutant-ot-distinct-tokens"

    def select(self, node_plan: Plan, draws: list[int]) -> dict[int, Any]:
        return selection(node_plan, list(dict.fromkeys(draws)))


class OTResidualFromTarget(OTOptimal):
    """M4: the residual drawn from the original ``p`` instead of ``norm((p - r)_+)``."""

    name = "mutant-ot-residual-from-target"

    def node_plan(self, target: Probs, draft: Probs, num_drafts: int) -> Plan:
        return dataclasses.replace(super().node_plan(target, draft, num_drafts), residual=target)


class OTOnWithoutReplacement(OTOptimal):
    """M6: ``ot_optimal`` claiming (and applied to) without-replacement drafts."""

    name = "mutant-ot-on-without-replacement"
    laws = frozenset({DrawLaw.IID, DrawLaw.WITHOUT})


class OTNoPriority(OTOptimal):
    """M8: no A*-priority: one block over the whole support (a uniform draw, r = q).

    Lossless (stage 2 runs against the rule's exact law) and below the optimum. Forcing the cut
    to 0 alone is not enough: the clip ``T <= psi`` then restores the tight point at the true
    cut, and the peel rebuilds the priority (stop 0, split at the cut).
    """

    name = "mutant-ot-no-priority"

    def node_plan(self, target: Probs, draft: Probs, num_drafts: int) -> Plan:
        return _plan(target, draft, num_drafts, float("inf"), cut=0)


STAR3, STAR4 = ss.Shape.star(3), ss.Shape.star(4)
OT_MUTANTS: dict[str, Mutant] = {
    m.scheme.name: m
    for m in (
        Mutant(
            OTIntendedLaw(),
            "M1: approximate selection weights, stage 2 against the intended r",
            Case((G6,), STAR4, "ot_optimal"),
            (ss.Shape.star(2), STAR3),
        ),
        Mutant(
            OTDistinctTokens(),
            "M2: uniform over distinct tokens instead of draws in the stop block",
            Case((G8,), STAR4, "ot_optimal"),
            (STAR3, ss.Shape.paths(3, 1)),
        ),
        Mutant(
            OTResidualFromTarget(),
            "M4: residual from the original p",
            Case((G7,), STAR3, "ot_optimal"),
            (ss.Shape.star(2), STAR3),
        ),
        Mutant(
            OTOnWithoutReplacement(),
            "M6: ot_optimal applied to without-replacement drafts",
            Case((G2,), ss.Shape.star(3, replacement=False), "rsd"),
            (ss.Shape.star(2, replacement=False), ss.Shape.star(3, replacement=False)),
            widens_support=True,
        ),
    )
}
