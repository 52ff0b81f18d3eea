r"""Gumbel and Poisson list couplings, lowered: the target's walk on keyed exponentials.

Lowers :mod:`specsampling.schemes.gumbel`. One row of keyed exponentials ``E[t, z]`` per
position. The drafter's candidates at a node are its first arrivals, the smallest
``E[t, z] / q(z)`` (one per node for ``gumbel``; the ``L`` first, Gumbel-top-L, for
``poisson``: :meth:`~specsampling.gpu.schemes.coupled.KeyedLowering.draft_step`, row 0). The
target's token at the node reached so far is

.. math:: Y_t = \arg\min_{z:\ p(z) > 0} \log E[t, z] - \log p(z),

and every row descends while ``Y_t`` is a drafted child of its node, then stops with ``Y_t``:
no residual, deeper drafts are discarded. Batched over rows, one iteration per depth
(``depth + 1``, a static bound; stopped rows keep their verdict).

Theorem (the reference's): the emitted stream is seeded target-only decoding whatever the
drafter (strong drafter invariance), since the race winner is an exact draw from ``p`` and the
noise depends on the position's context alone.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..tree import PAD
from .base import Verified
from .coupled import Drafted, DraftPlan, KeyedLowering


class Poisson(KeyedLowering):
    """Poisson list coupling (``poisson``): chains and level-uniform trees without replacement.

    >>> import specsampling as ss
    >>> Poisson().plan(ss.Shape.star(3, replacement=False)).rows
    (0, 0, 0)
    """

    name: ClassVar[str] = "poisson"

    def walk(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        keys: torch.Tensor,  # [B]
        target_probs: torch.Tensor,  # [B, M, V] float64
    ) -> Verified:
        """Descend while the target's race winner is a drafted child; emit it."""
        batch_size, _, vocab_size = target_probs.shape
        device = target_probs.device
        rows = torch.arange(batch_size, device=device)  # [B]
        node = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        done = torch.zeros(batch_size, dtype=torch.bool, device=device)  # [B]
        token = torch.full((batch_size,), PAD, dtype=torch.long, device=device)  # [B]
        emitted = torch.full((batch_size, plan.depth + 1), PAD, dtype=torch.long, device=device)
        raced = torch.ones((batch_size, 1), dtype=torch.bool, device=device)  # [B, 1]
        for depth in range(plan.depth + 1):
            exps = self.node_exponentials(keys, drafted.contexts[rows, node], 1, vocab_size)
            drawn = self.select(target_probs[rows, node], exps, raced)  # [B]
            descend, child = self.child_with_token(drafted, node, drawn)  # [B], [B]
            live = ~done  # [B]
            stops = live & ~descend  # [B]
            emitted[:, depth] = torch.where(live, drawn, emitted[:, depth])
            token = torch.where(stops, drawn, token)
            node = torch.where(live & descend, child, node)
            done = done | stops
        num_emitted = drafted.depth[rows, node] + 1  # [B]
        return Verified(node, token, emitted, num_emitted)


class Gumbel(Poisson):
    """Single-draft Gumbel coupling (``gumbel``): the Poisson list of size one, on chains.

    >>> import specsampling as ss
    >>> Gumbel().plan(ss.Shape.chain(2)).depth
    2
    """

    name: ClassVar[str] = "gumbel"


POISSON = Poisson()
GUMBEL = Gumbel()
LOWERINGS = (POISSON, GUMBEL)
