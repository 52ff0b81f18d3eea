r"""SpecInfer recursive rejection sampling with replacement, lowered (reference:
:mod:`specsampling.schemes.specinfer`).

Per row, with :math:`p' = p`: for each candidate slot in drafting order (a loop over the ``C``
slots), accept :math:`x_i` iff :math:`u_\text{accept}[x_i]\,q(x_i) < p'(x_i)`; after each
rejection :math:`p' \leftarrow \mathrm{norm}((p' - q)_+)`. Stop with :math:`p'` when all are
rejected. A duplicate of a rejected token has :math:`p'(x) = 0`, so reading its own uniform
again is exact (no reuse). :class:`RecursiveRejection` is shared with ``rsd``.

Grafted trees (:attr:`TreeBatch.guesses <specsampling.gpu.TreeBatch.guesses>`): a node's guess
is its last candidate slot, tested as a point mass, :math:`u < p'(x)`, and removed from
:math:`p'` when rejected (the per-node flag comes from :meth:`node_extras`; batches without
guesses run the loop unchanged).
"""

from __future__ import annotations

import torch

from .. import ops
from ..tree import PAD, TreeBatch
from .base import NodeLowering, NodeStep


class RecursiveRejection(NodeLowering):
    """Recursive rejection sampling per node over the candidate slots; subclasses choose
    :meth:`update` (the running target and draft after a rejection)."""

    hot_path = (*NodeLowering.hot_path, "slot_passes")

    def update(
        self, target: torch.Tensor, draft: torch.Tensor, token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target, draft)`` ``[B, V]`` each after rejecting ``token [B]``: new tensors, which
        :meth:`node_step` overwrites, or ``draft`` itself when the draft does not change."""
        return ops.residual(target, draft), draft

    def node_extras(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
    ) -> torch.Tensor:
        """``[B, N, 1]``: 1 where the node's last candidate is a guess; ``[B, N, 0]`` (no
        extras, the plain loop) for batches without guesses."""
        if batch.guesses is None:  # static: host metadata
            return super().node_extras(batch, target_probs, draft_probs)
        return (batch.guesses >= 0)[..., None].to(draft_probs.dtype)  # [B, N, 1]

    def step(
        self,
        extras: torch.Tensor,  # [B, P]
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C] bool
        accept_uniforms: torch.Tensor,  # [B, C] float64
        owned: bool = False,
    ) -> NodeStep:
        if extras.shape[-1] == 0:  # static: no guesses in the batch
            return self.node_step(target, draft, candidate_tokens, candidate_valid, accept_uniforms)
        slots = torch.arange(candidate_valid.shape[1], device=candidate_valid.device)  # [C]
        last = candidate_valid.sum(-1, keepdim=True) - 1  # [B, 1]
        guessed = (extras[:, :1] > 0) & (slots[None, :] == last)  # [B, C]
        return self.node_step(
            target, draft, candidate_tokens, candidate_valid, accept_uniforms, guessed
        )

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
        guessed: torch.Tensor | None = None,  # [B, C] bool: the slot is a guess
    ) -> NodeStep:
        if self.rejecting_rows_only(target):  # static: the CPU outside torch.compile
            return self.host_node_step(
                target, draft, candidate_tokens, candidate_valid, accept_uniforms, guessed
            )
        current = target  # [B, V]
        accepted = torch.full_like(candidate_tokens[:, 0], PAD)  # [B]
        for slot in range(candidate_tokens.shape[1]):
            token = candidate_tokens[:, slot]  # [B]
            testing = candidate_valid[:, slot] & (accepted == PAD)  # [B]
            passes = self.slot_passes(slot, current, draft, token, accept_uniforms, guessed)
            accepted = torch.where(testing & passes, slot, accepted)
            rejected = (testing & ~passes)[:, None]  # [B, 1]
            next_current, next_draft = self.update(current, draft, token)  # new rows each
            if guessed is not None:  # static: a rejected guess leaves p' without its token
                # (only specinfer takes grafted rows, so the draft stays: rsd refuses them)
                removed = ops.remove_token(current, token)  # [B, V]
                next_current = torch.where(
                    guessed[:, slot, None], removed, next_current, out=removed
                )
            current = torch.where(rejected, next_current, current, out=next_current)  # [B, V]
            if next_draft is not draft:  # static: specinfer keeps its draft
                draft = torch.where(rejected, next_draft, draft, out=next_draft)  # [B, V]
        return NodeStep(accepted, current)

    def slot_passes(
        self,
        slot: int,
        current: torch.Tensor,  # [B, V]: p'
        draft: torch.Tensor,  # [B, V]: q'
        token: torch.Tensor,  # [B]: the slot's token
        accept_uniforms: torch.Tensor,  # [B, C]
        guessed: torch.Tensor | None,  # [B, C] bool
    ) -> torch.Tensor:
        """Whether each row's slot would be accepted, ``u q'(x) < p'(x)`` (``[B]`` bool; a guess
        is a point mass at its token, ``q'(x) = 1``)."""
        draft_x = ops.gather_tokens(draft, token)  # [B]
        if guessed is not None:  # static: a guess is a point mass at its token
            draft_x = torch.where(guessed[:, slot], torch.ones_like(draft_x), draft_x)
        return self.accepts(accept_uniforms[:, slot], ops.gather_tokens(current, token), draft_x)

    def rejecting_rows_only(self, target: torch.Tensor) -> bool:
        """Whether :meth:`node_step` updates only the rows that reject (:meth:`host_node_step`):
        on the CPU outside ``torch.compile``, where reading which rows those are is free."""
        return ops.host_reads_free(target)

    def host_node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
        guessed: torch.Tensor | None = None,  # [B, C] bool
    ) -> NodeStep:
        """:meth:`node_step` with each slot's update (:meth:`update`, a guess's removal) formed
        for the rows that reject it only, read on the host, and written over copies of the
        running rows: a row that accepted, or is not tested, costs no pass over ``V`` (the
        sync-free loop forms every row's update at every slot and selects). The same values:
        each row's update is computed from the same row by the same operations."""
        current, running = target, draft  # [B, V] each; copied before the first write
        accepted = torch.full_like(candidate_tokens[:, 0], PAD)  # [B]
        current_copied = running_copied = False
        for slot in range(candidate_tokens.shape[1]):
            token = candidate_tokens[:, slot]  # [B]
            testing = candidate_valid[:, slot] & (accepted == PAD)  # [B]
            passes = self.slot_passes(slot, current, running, token, accept_uniforms, guessed)
            accepted = torch.where(testing & passes, slot, accepted)
            rows = (testing & ~passes).nonzero()[:, 0]  # [R], the host read
            if rows.shape[0] == 0:
                continue
            rows_current, rows_draft = ops.take_rows(current, rows), ops.take_rows(running, rows)
            rows_token = token[rows]  # [R]
            next_current, next_draft = self.update(rows_current, rows_draft, rows_token)
            if guessed is not None:  # a rejected guess leaves p' without its token
                removed = ops.remove_token(rows_current, rows_token)  # [R, V]
                next_current = torch.where(guessed[rows, slot, None], removed, next_current)
            if not current_copied:
                current, current_copied = current.clone(), True
            current[rows] = next_current
            if next_draft is not rows_draft:  # rsd: the draft loses the rejected token
                if not running_copied:
                    running, running_copied = running.clone(), True
                running[rows] = next_draft
        return NodeStep(accepted, current)


class SpecInfer(RecursiveRejection):
    """Recursive rejection sampling with replacement, batched; exact on i.i.d. drafts."""

    name = "specinfer"


LOWERING = SpecInfer()
LOWERINGS = (LOWERING,)
