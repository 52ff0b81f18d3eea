r"""Gumbel-max list sampling (GLS), lowered: ``K`` keyed rows, one draft path per row.

Lowers :mod:`specsampling.schemes.gls`. Draft path ``k`` is drafted from its own row of keyed
exponentials, ``X^k_j = argmin_i S[j, k, i] / q(i | X^k_{<j})`` (draw step ``s`` races row
``s // L``, :meth:`GLS.step_row`). With the active rows ``A = {1..K}``, for positions
``j = 0..L``:

.. math::

    Y_j = \arg\min_i \min_{k \in R} \log S[j, k, i] - \log p(i \mid Y_{<j}),

with ``R = A`` (``gls``) or all ``K`` rows (``gls_strong``); at ``j = L`` the round ends with
the bonus ``Y_L``; otherwise every ``k`` with ``X^k_j != Y_j`` leaves ``A`` and the round ends
with ``Y_j`` when ``A`` is empty, else descends to the child holding ``Y_j``. Batched over
rows: ``A`` is a ``[B, K]`` mask, one iteration per position (``L + 1``, a static bound).

Theorem (the reference's): every ``Y_j`` is an exact draw from ``p(. | Y_{<j})``;
``gls_strong`` emits seeded target-only decoding with ``K`` rows whatever the drafter.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..tree import PAD
from .base import Verified
from .coupled import Drafted, DraftPlan, KeyedLowering


class GLS(KeyedLowering):
    """GLS on chains, ``star(K)`` and ``paths(K, L)``; ``strong`` races all ``K`` rows.

    >>> import specsampling as ss
    >>> GLS_ACTIVE.plan(ss.Shape.paths(2, 3)).rows
    (0, 0, 0, 1, 1, 1)
    """

    strong: ClassVar[bool] = False

    def step_row(self, step: int, depth: int) -> int:
        """Step ``s`` belongs to draft path ``s // depth`` and races that row."""
        return step // depth

    def walk(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        keys: torch.Tensor,  # [B]
        target_probs: torch.Tensor,  # [B, M, V] float64
    ) -> Verified:
        """Race the active (or all) rows, keep the rows whose draft matched, descend."""
        batch_size, _, vocab_size = target_probs.shape
        device = target_probs.device
        num_rows = plan.num_rows
        rows = torch.arange(batch_size, device=device)  # [B]
        node = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        done = torch.zeros(batch_size, dtype=torch.bool, device=device)  # [B]
        token = torch.full((batch_size,), PAD, dtype=torch.long, device=device)  # [B]
        emitted = torch.full((batch_size, plan.depth + 1), PAD, dtype=torch.long, device=device)
        active = torch.ones((batch_size, num_rows), dtype=torch.bool, device=device)  # [B, K]
        for position in range(plan.depth):
            exps = self.node_exponentials(keys, drafted.contexts[rows, node], num_rows, vocab_size)
            raced = active | self.strong  # [B, K]: all rows for gls_strong
            drawn = self.select(target_probs[rows, node], exps, raced)  # [B]
            drafted_here = drafted.draft_tokens[:, :, position]  # [B, K]
            active = active & (drafted_here == drawn[:, None])  # [B, K]
            _, child = self.child_with_token(drafted, node, drawn)  # [B]
            live = ~done  # [B]
            descend = active.any(-1)  # [B]
            stops = live & ~descend  # [B]
            emitted[:, position] = torch.where(live, drawn, emitted[:, position])
            token = torch.where(stops, drawn, token)
            node = torch.where(live & descend, child, node)
            done = done | stops
        # Every draft survived all positions: the bonus, selected the same way.
        exps = self.node_exponentials(keys, drafted.contexts[rows, node], num_rows, vocab_size)
        raced = active | self.strong  # [B, K]: all rows for gls_strong
        drawn = self.select(target_probs[rows, node], exps, raced)  # [B]
        live = ~done  # [B]
        emitted[:, plan.depth] = torch.where(live, drawn, emitted[:, plan.depth])
        token = torch.where(live, drawn, token)
        num_emitted = drafted.depth[rows, node] + 1  # [B]
        return Verified(node, token, emitted, num_emitted)


class GLSStrong(GLS):
    """``gls_strong``: the target races all ``K`` rows (seeded target-only decoding)."""

    name: ClassVar[str] = "gls_strong"
    strong: ClassVar[bool] = True


class GLSActive(GLS):
    """``gls``: the target races the active rows (the paper's verifier)."""

    name: ClassVar[str] = "gls"


GLS_ACTIVE = GLSActive()
GLS_STRONG = GLSStrong()
LOWERINGS = (GLS_ACTIVE, GLS_STRONG)
