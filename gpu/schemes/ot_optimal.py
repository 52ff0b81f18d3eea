r"""OT-optimal and OT-binned verification, lowered with a host-built plan (references:
:mod:`specsampling.schemes.ot_optimal`, :mod:`specsampling.schemes.ot_binned`).

Per row at a node with :math:`n_v \ge 2` candidates the reference makes **one** inverse-CDF draw
over :math:`(\pi(c)` for the distinct children in first-drafted order, :math:`\pi_\text{rej})`
with ``noise.accept[first child]``, where :math:`\pi(c) = \mathrm{sel}(c \mid \bar x)
\min(1, p(c)/r_\text{real}(c))`, and a reject draws from :math:`\mathrm{norm}((p -
r_\text{real})_+)` with the node's ``sample`` uniform; with one candidate it is standard
speculative sampling (:math:`u\,q(x) < p(x)`, residual :math:`\mathrm{norm}((p - q)_+)`).

**Host-planned.** The plan (a sort of the draft's support by :math:`p/q`, the cut, the two
levels and the split trees built by peeling) is sequential and its float choices (the argmax of
:math:`D_j`, the argmin of the peel) decide the selection law, so
:meth:`~specsampling.gpu.schemes.base.HostPlanned.node_extras` runs the reference plan and selection
(:meth:`~specsampling.schemes.ot_optimal.OTOptimal.decision`, memoised per node) for every node
with two or more candidates **that the walk reaches**, on the host, level by level
(:class:`~specsampling.gpu.schemes.base.ReachedPlan`: one host read per depth holding such a node,
none at the root, then a loop over the live rows' nodes there), and hands the walk per-node
tensors: the categorical weights per candidate
slot (the first slot of each distinct child; 0 on repeats) and :math:`\pi_\text{rej}`, then the
residual row. Everything after (the categorical draws, the standard rule of one-candidate nodes,
the walk) is batched on the device. Plan cost at top-k drafting: ``benchmarks/ot_verifiers.py``.

**Cost per node.** The host plan dominates: every verify call pays one reference ``decision`` per
node with two or more candidates that a row's walk reaches, as the reference pays per node it visits
(planning every such node up front, as an earlier version did, planned 4.5x as many on the tests'
``Shape.branching((2, 3, 2))`` batches). Measured 2026-12-02 at :math:`V = 32{,}000` on a loaded
2-core CPU (``Shape.branching((2, 3, 4), replacement=True)``, 8 trees, 71 planned nodes): about 2.3
s per planned node for ``ot_optimal``, against well under 0.1 s for the whole batched walk; nodes
with one candidate cost nothing on the host. Not ``torch.compile``-able with ``fullgraph=True``: the
plan is numpy on the host (a graph break by construction), only the walk after it traces.
"""

from __future__ import annotations

from specsampling.schemes.ot_binned import SCHEME as BINNED
from specsampling.schemes.ot_optimal import SCHEME as OPTIMAL

from .base import HostPlanned

LOWERING = HostPlanned(OPTIMAL)
BINNED_LOWERING = HostPlanned(BINNED)
LOWERINGS = (LOWERING, BINNED_LOWERING)
