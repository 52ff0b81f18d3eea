r"""Naive speculative sampling, lowered (reference: :mod:`specsampling.schemes.nss`).

Per row: stop with the target :math:`p(\cdot \mid v)` itself; the walk's residual-hit rule then
descends when the drawn token is a drafted child, which is NSS's whole rule. Exact on every tree.
"""

from __future__ import annotations

import torch

from ..tree import PAD
from .base import NodeLowering, NodeStep


class NSS(NodeLowering):
    """Accept iff the target's own inverse-CDF draw is a drafted child, batched."""

    name = "nss"

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        none = torch.full_like(candidate_tokens[:, 0], PAD)  # [B]
        return NodeStep(none, target)


LOWERING = NSS()
LOWERINGS = (LOWERING,)
