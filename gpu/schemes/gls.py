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

from .coupled import Drafted, DraftPlan, KeyedLowering, Selection


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

    def follow(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        position: int,
        node: torch.Tensor,  # [B]
        target: torch.Tensor,  # [B, V] float64
        exps: torch.Tensor,  # [B, K, V] float64
        active: torch.Tensor,  # [B, K] bool: the rows whose draft matched so far
    ) -> Selection:
        """Race the active (or all) rows, keep the rows whose draft matched, descend while one
        is left."""
        drawn = self.select(target, exps, active | self.strong)  # [B]: all rows for gls_strong
        column = min(position, plan.depth - 1)  # at the bonus the walk stops every row
        active = active & (drafted.draft_tokens[:, :, column] == drawn[:, None])  # [B, K]
        _, child = self.child_with_token(drafted, node, drawn)  # [B]
        return Selection(drawn, active.any(-1), child, active)


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
