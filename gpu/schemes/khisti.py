r"""Khisti et al.'s importance-sampling verifier, lowered with a host-built plan (reference:
:mod:`specsampling.schemes.khisti`).

Per row at a node with :math:`n_v \ge 2` candidates the reference plays the tournament of
s-truncated pairwise LPs (HiGHS), giving the winner law :math:`r_n`, and makes **one**
inverse-CDF draw over :math:`(\mathrm{sel}(c \mid \bar x) \min(1, p(c)/r_n(c))` for the distinct
children, :math:`\pi_\text{rej})` with ``noise.accept[first child]``; a reject draws from
:math:`\mathrm{norm}((p - r_n)_+)` with the node's ``sample`` uniform. One candidate: standard
speculative sampling.

**Host-planned**, as :mod:`.ot_optimal`: the LPs run on the host (HiGHS has no device solver), for
every node with two or more candidates that the walk reaches, level by level (one host read per
depth holding such a node; memoised per node distribution); the categorical draws, the standard rule
and the walk run batched on the device (:class:`~specsampling.gpu.schemes.base.HostPlanned`). Cost
per node: ``benchmarks/ot_verifiers.py``.

**Cost per node.** One tournament of LPs per reached node with two or more candidates, every call
(the reference pays the same per node it visits): measured 2026-12-02 at :math:`V = 32{,}000` on a
loaded 2-core CPU (``Shape.branching((2, 3, 4), replacement=True)``, 8 trees, 71 planned nodes)
about 0.1 s per planned node, against well under 0.1 s for the whole batched walk. Not
``torch.compile``-able with ``fullgraph=True``: HiGHS runs on the host (a graph break by
construction).
"""

from __future__ import annotations

from specsampling.schemes.khisti import SCHEME as KHISTI

from .base import HostPlanned

LOWERING = HostPlanned(KHISTI)
LOWERINGS = (LOWERING,)
