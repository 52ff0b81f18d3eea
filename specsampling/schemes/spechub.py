r"""SpecHub (Sun, Zhou, Chen, Sun 2024): an exact transport plan for a sparse two-draft law.

Draft law (:meth:`Shape.hub <specsampling.shapes.Shape.hub>`). With the hub
:math:`a = \arg\max q` (ties: lowest id), :math:`x_1 \sim q`; then :math:`x_2 = a` if
:math:`x_1 \ne a`, else :math:`x_2 \sim \mathrm{norm}(q \text{ without } a)`. The ordered pairs are
:math:`(i, a)` with :math:`P(i, a) = q(i)` and :math:`(a, i)` with
:math:`P(a, i) = q(a)\,q(i) / (1 - q(a))`, for :math:`i \ne a`. If :math:`q = \delta_a` the node
has the single candidate :math:`a`.

Algorithm (the plan of SpecHub, arXiv 2411.05289). Per node, with :math:`p' = p`:

1. pairs :math:`(i, a)` send :math:`m_1(i) = \min(P(i, a), p(i))` to :math:`i`;
2. :math:`p'(i) = p(i) - m_1(i)`; pairs :math:`(a, i)` send :math:`m_2(i) = \min(P(a, i), p'(i))`
   to :math:`i`;
3. with :math:`A = \sum_i (P(a, i) - m_2(i))`, the leftover of every :math:`(a, i)` sends a
   fraction :math:`\min(1, p(a)/A)` to :math:`a`;
4. :math:`p'(a) = p(a) - \min(A, p(a))` and :math:`B = \sum_i (P(i, a) - m_1(i))`; the leftover of
   every :math:`(i, a)` sends a fraction :math:`\min(1, p'(a)/B)` to :math:`a`;
5. all remaining mass draws from :math:`\mathrm{norm}(p'')`, the target not yet transported.

Given the drafted pair the verifier realises that pair's row of the plan with two accept tests:
the non-hub draft :math:`i` with probability (its step 1 or 2 mass) / :math:`P(\text{pair})`
(uniform of :math:`i`'s node), then the hub with the step 3 or 4 fraction (uniform of :math:`a`'s
node), then :math:`y \sim \mathrm{norm}(p'')` (the node's sample uniform). A node with one
candidate (:math:`q = \delta_a` under the hub law, or any node of a chain, where the candidate is
drawn from :math:`q`) runs standard speculative sampling; so chains are supported too.

Theorem. Lossless on hub trees (and chains), and the plan attains the LP (optimal-transport)
optimum for this draft law. Proof idea: every step moves at most the pair mass still free and at
most the target mass not yet covered, so step 5's residual is exactly :math:`p''` and the output
has law :math:`p`; the tree follows by induction on depth. Step 5 never fires on a pair holding a
token with :math:`p''` mass, so there are no residual hits. Optimality: steps 1-2 send
:math:`\min(p(i), q(i)/(1 - q(a)))` to each :math:`i` and steps 3-4 send :math:`p(a)` to the
hub, as greedy multi-draft with :math:`k = 2` does (:mod:`~specsampling.schemes.greedy`): the
unordered pair law is the same, so are the LP and the round law.

Acceptance. :math:`\alpha = \sum_{i \ne a} (m_1(i) + m_2(i)) + \min(A, p(a)) + \min(B, p'(a))
= 1 - \sum p''`: :func:`spechub_acceptance`.

Letters: the authors' code (MasterGodzilla/Speculative_decoding_OT) swaps them, with ``q`` the
target and ``p`` the draft; here :math:`p` is the target and :math:`q` the draft.

Reference: Sun, Zhou, Chen, Sun, "SpecHub: Provable Acceleration to Multi-Draft Speculative
Decoding", arXiv 2411.05289 (EMNLP 2024).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._types import Probs
from ..noise import Noise
from ..ops import (
    accept_probability,
    accepts,
    categorical,
    normalise,
    standard_step,
    standard_step_law,
    total,
)
from ..shapes import Shape
from ..tree import DraftTree, DrawLaw
from ..validation import check_pair, check_positive_int
from .base import NodeScheme, Step


class Plan(NamedTuple):
    """SpecHub's transport plan at one node (arrays over the vocabulary, 0 at the hub)."""

    hub: int
    #: :math:`P(i, a) = q(i)` and :math:`P(a, i)`.
    pair_first: Probs
    pair_second: Probs
    #: :math:`m_1(i)` (step 1) and :math:`m_2(i)` (step 2).
    sent_first: Probs
    sent_second: Probs
    #: Step 4 and step 3 as ``(numerator, denominator)``: the hub fractions
    #: :math:`\min(1, p'(a)/B)` for pairs :math:`(i, a)` and :math:`\min(1, p(a)/A)` for
    #: pairs :math:`(a, i)`.
    hub_first: tuple[Any, Any]
    hub_second: tuple[Any, Any]
    #: :math:`p''`, unnormalised: its mass is the probability of step 5.
    leftover: Probs


def hub_token(draft: Probs) -> int:
    """The hub :math:`a = \\arg\\max q`: lowest id on ties, compared in float64 as
    :meth:`Shape.hub <specsampling.shapes.Shape.hub>` drafts it.

    >>> import numpy as np
    >>> hub_token(np.array([0.25, 0.375, 0.375]))
    1
    """
    values = np.asarray([float(x) for x in draft]) if draft.dtype == object else draft
    return int(np.argmax(values))


def hub_plan(target: Probs, draft: Probs) -> Plan:
    """The plan of steps 1-5 for ``(target, draft)``; needs mass off the hub (two drafts exist)."""
    hub = hub_token(draft)
    if not _off_hub_mass(draft, hub) > 0:
        raise ValueError("hub_plan: the draft is one-hot, so there is no second draft to plan for")
    zero = 0 * draft
    others = np.arange(draft.shape[0]) != hub
    pair_first = np.where(others, draft, zero)
    # q(a) q(i) / (1 - q(a)), with 1 - q(a) summed as the drafting step normalises it.
    pair_second = draft[hub] * normalise(pair_first)
    sent_first = np.where(others, np.minimum(pair_first, target), zero)
    sent_second = np.where(others, np.minimum(pair_second, target - sent_first), zero)
    free_second = total(pair_second - sent_second)  # A
    to_hub_second = min(free_second, target[hub])
    hub_left = target[hub] - to_hub_second  # p'(a)
    free_first = total(pair_first - sent_first)  # B
    to_hub_first = min(free_first, hub_left)
    leftover = np.where(others, target - sent_first - sent_second, zero)
    leftover[hub] = hub_left - to_hub_first
    return Plan(
        hub,
        pair_first,
        pair_second,
        sent_first,
        sent_second,
        (hub_left, free_first),
        (target[hub], free_second),
        leftover,
    )


class Roles(NamedTuple):
    """One hub node's pair: which child holds the hub, and the non-hub draft's row of the plan."""

    own_child: int
    hub_child: int
    #: ``(plan mass sent to the non-hub draft, pair probability)``.
    own: tuple[Any, Any]
    #: ``(numerator, denominator)`` of the hub fraction for this pair type.
    to_hub: tuple[Any, Any]


class SpecHub(NodeScheme):
    """SpecHub's hub plan per node; exact, and optimal for its own two-draft law.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> from specsampling.schemes.spechub import SCHEME
    >>> ss.acceptance(SCHEME, [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, num_drafts=2)
    Fraction(1, 1)
    """

    name = "spechub"
    reference = "Sun, Zhou, Chen, Sun 2024, SpecHub (arXiv 2411.05289)"

    laws = frozenset({DrawLaw.HUB})

    def support_text(self) -> str:
        return (
            "exactly two candidates per node drawn by its own law (Shape.hub(depth), law 'hub') "
            "and sampled chains"
        )

    def single_shape(self, num_drafts: int) -> Shape:
        """``Shape.hub()`` for two drafts; otherwise ``Shape.star(k)``: a chain for ``k = 1``,
        refused by :meth:`check` for ``k >= 3`` (SpecHub has no law for three or more drafts)."""
        k = check_positive_int(num_drafts, "num_drafts")
        return Shape.hub() if k == 2 else Shape.star(k)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        if num_drafts == 2:
            return spechub_acceptance(target, draft)
        if num_drafts == 1:
            return total(np.minimum(target, draft))  # a chain: standard speculative sampling
        return None

    def plan(self, target: Probs, draft: Probs) -> Plan:
        """The node's transport plan (a method, so variants can override it)."""
        return hub_plan(target, draft)

    def roles(self, tree: DraftTree, node: int, plan: Plan) -> Roles:
        """Read the drafted pair ``(x1, x2)`` of a two-candidate node against the plan."""
        if len(tree.candidates[node]) != 2:
            raise ValueError(
                f"spechub: node {node} has {len(tree.candidates[node])} candidates; the hub law "
                f"drafts two (one when the draft is one-hot); draft it with Shape.hub"
            )
        first, second = tree.candidates[node]
        x1, x2 = tree.tokens[first], tree.tokens[second]
        if x1 != plan.hub and x2 == plan.hub:
            own = (plan.sent_first[x1], plan.pair_first[x1])
            return Roles(first, second, own, plan.hub_first)
        if x1 == plan.hub and x2 != plan.hub:
            own = (plan.sent_second[x2], plan.pair_second[x2])
            return Roles(second, first, own, plan.hub_second)
        raise ValueError(
            f"spechub: node {node} drafted ({x1}, {x2}), which does not hold the hub "
            f"{plan.hub} exactly once; draft it with Shape.hub"
        )

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        target, draft = target_probs[node], draft_probs[node]
        if len(tree.candidates[node]) == 1:
            (child,) = tree.candidates[node]
            u_accept, u_sample = noise.accept[child], noise.sample[node]
            drawn = standard_step(target, draft, tree.tokens[child], u_accept, u_sample)
            return (child, None) if drawn is None else (None, drawn)
        plan = self.plan(target, draft)
        roles = self.roles(tree, node, plan)
        if accepts(noise.accept[roles.own_child], roles.own[0], roles.own[1]):
            return roles.own_child, None
        if accepts(noise.accept[roles.hub_child], roles.to_hub[0], roles.to_hub[1]):
            return roles.hub_child, None
        return None, categorical(_leftover(plan, target), noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        target, draft = target_probs[node], draft_probs[node]
        if len(tree.candidates[node]) == 1:
            (child,) = tree.candidates[node]
            accept, stop = standard_step_law(target, draft, tree.tokens[child])
            return [(child, accept)], stop
        plan = self.plan(target, draft)
        roles = self.roles(tree, node, plan)
        own = accept_probability(*roles.own)
        to_hub = (1 - own) * accept_probability(*roles.to_hub)
        stop = (1 - own - to_hub) * _leftover(plan, target)
        return [(roles.own_child, own), (roles.hub_child, to_hub)], stop


def _leftover(plan: Plan, target: Probs) -> Probs:
    """:math:`\\mathrm{norm}(p'')`, or :math:`p` when nothing is left (a probability-0 branch)."""
    if not total(plan.leftover) > 0:
        return target
    return normalise(plan.leftover)


def spechub_acceptance(target: Any, draft: Any) -> Any:
    r"""SpecHub's acceptance :math:`P(Y \in \{x_1, x_2\})` at one position.

    .. math:: \alpha_\text{SpecHub} = \sum_{i \ne a} \bigl(m_1(i) + m_2(i)\bigr)
              + \min(A, p(a)) + \min(B, p'(a)) = 1 - \textstyle\sum p'',

    in the notation of the module docstring; :math:`p(a)` when :math:`q = \delta_a`. Vectorised:
    a few array operations over the vocabulary.

    Parameters
    ----------
    target, draft : array_like, shape (vocab_size,)
        Processed distributions, both float or both ``Fraction``.

    Examples
    --------
    >>> from fractions import Fraction as F
    >>> spechub_acceptance([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3)
    Fraction(1, 1)
    >>> round(float(spechub_acceptance([0.7, 0.2, 0.1], [0.1, 0.2, 0.7])), 6)
    0.633333
    """
    target, draft = check_pair(target, draft)
    hub = hub_token(draft)
    if not _off_hub_mass(draft, hub) > 0:
        return target[hub]
    plan = hub_plan(target, draft)
    to_hub = target[hub] - plan.leftover[hub]  # min(A, p(a)) + min(B, p'(a))
    return total(plan.sent_first) + total(plan.sent_second) + to_hub


def _off_hub_mass(draft: Probs, hub: int) -> Any:
    """Draft mass off the hub, summed as ``Shape.hub`` normalises its second draw (not
    ``1 - q(a)``, which rounds to 0 when ``q(a)`` rounds to 1 while other tokens keep mass)."""
    return total(np.where(np.arange(draft.shape[0]) != hub, draft, 0 * draft))


SCHEME = SpecHub()
