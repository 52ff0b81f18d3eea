r"""Standard speculative sampling, lowered (reference: :mod:`specsampling.schemes.standard`).

Per row at a node with its single candidate :math:`x` (slot 0): accept iff
:math:`u_\text{accept}[x]\,q(x) < p(x)`, else stop with :math:`\mathrm{norm}((p - q)_+)`; the
walk draws the stop token with the node's ``sample`` uniform. Exact on sampled chains only.
"""

from __future__ import annotations

import torch

from .base import NodeLowering, NodeStep, standard_step


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
        return standard_step(
            self.accepts, target, draft, candidate_tokens, candidate_valid, accept_uniforms
        )


LOWERING = Standard()
LOWERINGS = (LOWERING,)
