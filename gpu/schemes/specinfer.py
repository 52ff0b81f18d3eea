r"""SpecInfer recursive rejection sampling with replacement, lowered (reference:
:mod:`specsampling.schemes.specinfer`).

Per row, with :math:`p' = p`: for each candidate slot in drafting order (a loop over the ``C``
slots), accept :math:`x_i` iff :math:`u_\text{accept}[x_i]\,q(x_i) < p'(x_i)`; after each
rejection :math:`p' \leftarrow \mathrm{norm}((p' - q)_+)`. Stop with :math:`p'` when all are
rejected. A duplicate of a rejected token has :math:`p'(x) = 0`, so reading its own uniform
again is exact (no reuse). :class:`RecursiveRejection` is shared with ``rsd``.
"""

from __future__ import annotations

import torch

from .. import ops
from ..tree import PAD
from .base import NodeLowering, NodeStep


class RecursiveRejection(NodeLowering):
    """Recursive rejection sampling per node over the candidate slots; subclasses choose
    :meth:`update` (the running target and draft after a rejection)."""

    def update(
        self, target: torch.Tensor, draft: torch.Tensor, token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target, draft)`` ``[B, V]`` each after rejecting ``token [B]``: new tensors, which
        :meth:`node_step` overwrites, or ``draft`` itself when the draft does not change."""
        return ops.residual(target, draft), draft

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        current = target  # [B, V]
        accepted = torch.full_like(candidate_tokens[:, 0], PAD)  # [B]
        for slot in range(candidate_tokens.shape[1]):
            token = candidate_tokens[:, slot]  # [B]
            testing = candidate_valid[:, slot] & (accepted == PAD)  # [B]
            passes = self.accepts(
                accept_uniforms[:, slot],
                ops.gather_tokens(current, token),
                ops.gather_tokens(draft, token),
            )  # [B]
            accepted = torch.where(testing & passes, slot, accepted)
            rejected = (testing & ~passes)[:, None]  # [B, 1]
            next_current, next_draft = self.update(current, draft, token)  # new rows each
            current = torch.where(rejected, next_current, current, out=next_current)  # [B, V]
            if next_draft is not draft:  # static: specinfer keeps its draft
                draft = torch.where(rejected, next_draft, draft, out=next_draft)  # [B, V]
        return NodeStep(accepted, current)


class SpecInfer(RecursiveRejection):
    """Recursive rejection sampling with replacement, batched; exact on i.i.d. drafts."""

    name = "specinfer"


LOWERING = SpecInfer()
LOWERINGS = (LOWERING,)
