r"""Greedy multi-draft verification, lowered (reference: :mod:`specsampling.schemes.greedy`).

Per row at a node with candidates :math:`x_1..x_c` in drafting order (the walk gathers them),
:math:`T = \{x_1..x_{c-1}\}` and :math:`X = x_c` (the last real slot), read from the tree as the
reference does: the tree's own drafting (``Shape.greedy``: top :math:`k-1` of :math:`q`, ties to
the lowest id, then one draw off them) decides which tokens are deterministic. With
:math:`q' = \mathrm{norm}(q\,\mathbf 1_{V \setminus T})`:

* if the candidates cover :math:`\mathrm{supp}\,q`, stop with :math:`p`;
* else accept :math:`X` iff :math:`u_\text{accept}[X]\,q'(X) < p(X)` (strict), and otherwise stop
  with

.. math:: \mathrm{norm}\bigl(p\,\mathbf 1_T + (p - q')_+\,\mathbf 1_{V \setminus T}\bigr)

  (:math:`p` when that has zero mass). The walk draws the stop token with the node's ``sample``
  uniform; a drawn token in :math:`T` is a residual hit and descends.

Float64 equality. :math:`q'(X)` meets :math:`p(X)` exactly when :math:`p = q`, so the mass that
normalises :math:`q'` must round as the reference's does: every normalising sum here is
:func:`specsampling.gpu.ops.numpy_sum`, numpy's own pairwise summation order replayed on
tensors (torch's ``sum`` rounds differently from five tokens on).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .. import ops
from ..tree import PAD
from .base import NodeLowering, NodeStep


def token_mask(tokens: torch.Tensor, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B, V]`` bool: ``True`` at ``tokens[b, c]`` for every slot with ``keep[b, c]``.

    One boolean scatter: dropped slots write a spare column ``V``, sliced off (no ``[B, V]``
    float temporary).

    >>> token_mask(torch.tensor([[2, 0, 2]]), torch.tensor([[True, False, True]]),
    ...            torch.zeros(1, 4)).tolist()
    [[False, False, True, False]]
    """
    vocab_size = like.shape[-1]
    index = torch.where(keep, tokens, vocab_size)  # [B, C]
    mask = torch.zeros(like.shape[0], vocab_size + 1, dtype=torch.bool, device=like.device)
    return mask.scatter_(1, index, True)[:, :vocab_size]  # [B, V]


class Greedy(NodeLowering):
    """Hu et al.'s verifier for greedy drafts (top :math:`k-1` plus one draw), batched."""

    name = "greedy"
    hot_path: ClassVar[tuple[str, ...]] = ("walk", "node_step", "split", "residual")

    def split(
        self,
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(deterministic [B, V], random slot [B], rest [B, V], covered [B])``: the mask of
        :math:`T`, the slot of :math:`X`, :math:`q'` and whether the drafts cover supp q."""
        slots = torch.arange(candidate_tokens.shape[1], device=draft.device)  # [C]
        last = (candidate_valid.sum(-1) - 1).clamp_min(0)  # [B]
        drafted = token_mask(candidate_tokens, candidate_valid, draft)  # [B, V]
        fixed = candidate_valid & (slots[None, :] != last[:, None])  # [B, C]
        deterministic = token_mask(candidate_tokens, fixed, draft)  # [B, V]
        covered = ~((draft > 0) & ~drafted).any(-1)  # [B]
        rest, _ = ops.normalise(torch.where(deterministic, torch.zeros_like(draft), draft))
        return deterministic, last, rest, covered

    def residual(
        self, target: torch.Tensor, deterministic: torch.Tensor, rest: torch.Tensor
    ) -> torch.Tensor:
        r""":math:`\mathrm{norm}(p\,\mathbf 1_T + (p - q')_+\,\mathbf 1_{V \setminus T})`, or
        :math:`p` where that has zero mass (``[B, V]``)."""
        weights = torch.where(deterministic, target, (target - rest).clamp_min(0))  # [B, V]
        normalised, has_mass = ops.normalise(weights)
        return torch.where(has_mass, normalised, target)

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        deterministic, last, rest, covered = self.split(draft, candidate_tokens, candidate_valid)
        token = candidate_tokens.gather(1, last[:, None]).squeeze(-1)  # [B]
        passes = self.accepts(
            accept_uniforms.gather(1, last[:, None]).squeeze(-1),
            ops.gather_tokens(target, token),
            ops.gather_tokens(rest, token),
        )  # [B]
        accepted = torch.where(candidate_valid.any(-1) & ~covered & passes, last, PAD)  # [B]
        stop = self.residual(target, deterministic, rest)  # [B, V]
        return NodeStep(accepted, torch.where(covered[:, None], target, stop))


LOWERING = Greedy()
LOWERINGS = (LOWERING,)
