r"""Standard speculative sampling, lowered (reference: :mod:`specsampling.schemes.standard`).

Per row at a node with its single candidate :math:`x` (slot 0): accept iff
:math:`u_\text{accept}[x]\,q(x) < p(x)`, else stop with :math:`\mathrm{norm}((p - q)_+)`; the
walk draws the stop token with the node's ``sample`` uniform. Exact on sampled chains only.
"""

from __future__ import annotations

import torch

from .. import ops
from ..tree import PAD
from .base import NodeLowering, NodeStep


class Standard(NodeLowering):
    """Token-level speculative sampling on chains, batched."""

    name = "standard"

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        token = candidate_tokens[:, 0]  # [B]
        accepted = candidate_valid[:, 0] & self.accepts(
            accept_uniforms[:, 0], ops.gather_tokens(target, token), ops.gather_tokens(draft, token)
        )  # [B]
        slot = torch.where(accepted, 0, PAD)  # [B]
        return NodeStep(slot, ops.residual(target, draft))


LOWERING = Standard()
LOWERINGS = (LOWERING,)
