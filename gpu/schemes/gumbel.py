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

from .coupled import Drafted, DraftPlan, KeyedLowering, Selection


class Poisson(KeyedLowering):
    """Poisson list coupling (``poisson``): chains and level-uniform trees without replacement.

    >>> import specsampling as ss
    >>> Poisson().plan(ss.Shape.star(3, replacement=False)).rows
    (0, 0, 0)
    """

    name: ClassVar[str] = "poisson"

    def follow(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        position: int,
        node: torch.Tensor,  # [B]
        target: torch.Tensor,  # [B, V] float64
        exps: torch.Tensor,  # [B, 1, V] float64
        active: torch.Tensor,  # [B, 1] bool, all True
    ) -> Selection:
        """Descend while the target's race winner is a drafted child; emit it."""
        drawn = self.select(target, exps, active)  # [B]
        descend, child = self.child_with_token(drafted, node, drawn)  # [B], [B]
        return Selection(drawn, descend, child, active)


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
