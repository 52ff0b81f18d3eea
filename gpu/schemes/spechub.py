r"""SpecHub's hub coupling, lowered (reference: :mod:`specsampling.schemes.spechub`).

Per row, with the hub :math:`a = \arg\max q` (ties: the lowest id, as ``torch.argmax`` and
``numpy.argmax`` both break them), pair laws :math:`P(i, a) = q(i)` and
:math:`P(a, i) = q(a)\,q(i) / \sum_{j \ne a} q(j)` for :math:`i \ne a`, and :math:`p' = p`, the
plan is computed for every row at once (a few ``[B, V]`` operations):

1. :math:`m_1(i) = \min(P(i, a), p(i))`;
2. :math:`m_2(i) = \min(P(a, i), p(i) - m_1(i))`;
3. :math:`A = \sum_i (P(a, i) - m_2(i))`, :math:`p'(a) = p(a) - \min(A, p(a))`;
4. :math:`B = \sum_i (P(i, a) - m_1(i))`;
5. :math:`p''(i) = p(i) - m_1(i) - m_2(i)` off the hub, :math:`p''(a) = p'(a) - \min(B, p'(a))`.

A node with the drafted pair :math:`(x_1, x_2)` reads its row of the plan: for
:math:`(i, a)` accept :math:`i` iff :math:`u_\text{accept}[x_1]\,P(i, a) < m_1(i)`, then the hub
iff :math:`u_\text{accept}[x_2]\,B < p'(a)`; for :math:`(a, i)` accept :math:`i` iff
:math:`u_\text{accept}[x_2]\,P(a, i) < m_2(i)`, then the hub iff
:math:`u_\text{accept}[x_1]\,A < p(a)`; else stop with :math:`\mathrm{norm}(p'')` (:math:`p` when
it has no mass). A node with one candidate (a one-hot draft, or a chain) runs standard
speculative sampling: accept iff :math:`u\,q(x) < p(x)`, else :math:`\mathrm{norm}((p - q)_+)`.
Every sum is :func:`~specsampling.gpu.ops.numpy_sum` (numpy's rounding order), so
the float64 thresholds are the reference's bit for bit.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F

from .. import ops
from ..tree import PAD
from .base import NodeLowering, NodeStep


class Plan(NamedTuple):
    """SpecHub's transport plan for every row (``[B, V]`` arrays are 0 at the hub)."""

    hub: torch.Tensor  # [B]
    pair_first: torch.Tensor  # [B, V] P(i, a)
    pair_second: torch.Tensor  # [B, V] P(a, i)
    sent_first: torch.Tensor  # [B, V] m_1
    sent_second: torch.Tensor  # [B, V] m_2
    hub_left: torch.Tensor  # [B] p'(a), numerator of the (i, a) hub test
    free_first: torch.Tensor  # [B] B, its denominator
    hub_target: torch.Tensor  # [B] p(a), numerator of the (a, i) hub test
    free_second: torch.Tensor  # [B] A, its denominator
    leftover: torch.Tensor  # [B, V] p'', unnormalised


def hub_token(draft: torch.Tensor) -> torch.Tensor:
    """The hub :math:`\\arg\\max q` of every row of ``draft [B, V]``, the lowest id on ties
    (``torch.argmax`` returns the first maximum) -> ``[B]``.

    >>> hub_token(torch.tensor([[0.25, 0.375, 0.375]], dtype=torch.float64)).tolist()
    [1]
    """
    return draft.argmax(-1)  # [B]


def hub_plan(target: torch.Tensor, draft: torch.Tensor, hub: torch.Tensor) -> Plan:
    """The plan of steps 1-5 for every row of ``target, draft [B, V]`` around ``hub [B]`` (a
    row whose draft is one-hot gets an all-zero pair law; its plan is never read).

    >>> target = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    >>> plan = hub_plan(target, target.flip(-1), hub_token(target.flip(-1)))
    >>> plan.hub.tolist(), round(1 - float(plan.leftover.sum()), 6)
    ([2], 0.633333)
    """
    vocab = torch.arange(draft.shape[-1], device=draft.device)  # [V]
    others = vocab[None, :] != hub[:, None]  # [B, V]
    zero = torch.zeros_like(draft)  # [B, V]
    pair_first = torch.where(others, draft, zero)  # [B, V]
    draft_hub = ops.gather_tokens(draft, hub)  # [B]
    target_hub = ops.gather_tokens(target, hub)  # [B]
    pair_second = draft_hub[:, None] * ops.normalise(pair_first)[0]  # [B, V]
    sent_first = torch.where(others, torch.minimum(pair_first, target), zero)  # [B, V]
    sent_second = torch.where(
        others, torch.minimum(pair_second, target - sent_first), zero
    )  # [B, V]
    free_second = ops.numpy_sum(pair_second - sent_second)  # [B] A
    hub_left = target_hub - torch.minimum(free_second, target_hub)  # [B] p'(a)
    free_first = ops.numpy_sum(pair_first - sent_first)  # [B] B
    to_hub_first = torch.minimum(free_first, hub_left)  # [B]
    leftover = torch.where(others, target - sent_first - sent_second, zero)  # [B, V]
    leftover = leftover.scatter(-1, hub[:, None], (hub_left - to_hub_first)[:, None])
    return Plan(
        hub,
        pair_first,
        pair_second,
        sent_first,
        sent_second,
        hub_left,
        free_first,
        target_hub,
        free_second,
        leftover,
    )


class SpecHub(NodeLowering):
    """SpecHub's hub plan per node (two candidates; one runs standard sampling), batched."""

    name = "spechub"
    hot_path: ClassVar[tuple[str, ...]] = ("walk", "node_step", "hub", "plan")

    def hub(self, draft: torch.Tensor) -> torch.Tensor:
        """The rows' hubs ``[B]`` (a method, so variants can override it)."""
        return hub_token(draft)

    def plan(self, target: torch.Tensor, draft: torch.Tensor) -> Plan:
        """The rows' transport plans (a method, so variants can override it)."""
        return hub_plan(target, draft, self.hub(draft))

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        missing = max(0, 2 - candidate_tokens.shape[1])  # a batch of chains has one slot
        tokens = F.pad(candidate_tokens, (0, missing))  # [B, >= 2]
        uniforms = F.pad(accept_uniforms, (0, missing))  # [B, >= 2]
        paired = F.pad(candidate_valid, (0, missing))[:, 1]  # [B] two candidates

        # One candidate: standard speculative sampling.
        single = tokens[:, 0]  # [B]
        single_passes = self.accepts(
            uniforms[:, 0], ops.gather_tokens(target, single), ops.gather_tokens(draft, single)
        )  # [B]
        weights, has_mass = ops.normalise((target - draft).clamp_min(0))  # [B, V], [B, 1]
        single_stop = torch.where(has_mass, weights, target)  # [B, V]

        # Two candidates: the pair's row of the plan.
        plan = self.plan(target, draft)
        first, second = tokens[:, 0], tokens[:, 1]  # [B]
        hub_second = (first != plan.hub) & (second == plan.hub)  # [B] pair (i, a)
        own_slot = torch.where(hub_second, 0, 1)  # [B]
        own_token = torch.where(hub_second, first, second)  # [B]
        own_sent = torch.where(
            hub_second,
            ops.gather_tokens(plan.sent_first, own_token),
            ops.gather_tokens(plan.sent_second, own_token),
        )  # [B]
        own_pair = torch.where(
            hub_second,
            ops.gather_tokens(plan.pair_first, own_token),
            ops.gather_tokens(plan.pair_second, own_token),
        )  # [B]
        hub_numerator = torch.where(hub_second, plan.hub_left, plan.hub_target)  # [B]
        hub_denominator = torch.where(hub_second, plan.free_first, plan.free_second)  # [B]
        own_passes = self.accepts(
            uniforms.gather(1, own_slot[:, None]).squeeze(-1), own_sent, own_pair
        )  # [B]
        hub_passes = self.accepts(
            uniforms.gather(1, (1 - own_slot)[:, None]).squeeze(-1),
            hub_numerator,
            hub_denominator,
        )  # [B]
        pair_slot = torch.where(own_passes, own_slot, torch.where(hub_passes, 1 - own_slot, PAD))
        left, left_mass = ops.normalise(plan.leftover)  # [B, V], [B, 1]
        pair_stop = torch.where(left_mass, left, target)  # [B, V]

        accepted = torch.where(paired, pair_slot, torch.where(single_passes, 0, PAD))  # [B]
        return NodeStep(accepted, torch.where(paired[:, None], pair_stop, single_stop))


LOWERING = SpecHub()
LOWERINGS = (LOWERING,)
