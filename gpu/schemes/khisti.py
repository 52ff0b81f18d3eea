r"""Khisti et al.'s importance-sampling verifier, lowered with a host-built plan (reference:
:mod:`specsampling.schemes.khisti`).

Per row at a node with :math:`n_v \ge 2` candidates the reference plays the tournament of
s-truncated pairwise LPs (HiGHS), giving the winner law :math:`r_n`, and makes **one**
inverse-CDF draw over :math:`(\mathrm{sel}(c \mid \bar x) \min(1, p(c)/r_n(c))` for the distinct
children, :math:`\pi_\text{rej})` with ``noise.accept[first child]``; a reject draws from
:math:`\mathrm{norm}((p - r_n)_+)` with the node's ``sample`` uniform. One candidate: standard
speculative sampling.

**Host-planned**, as :mod:`.ot_optimal`: the LPs run on the host (HiGHS has no device solver),
once per verify call for every node with two or more candidates (one host synchronisation, a
loop over those nodes, memoised per node distribution); the categorical draws, the standard rule
and the walk run batched on the device (:class:`~specsampling.gpu.schemes.base.HostPlanned`).
Cost per node: ``benchmarks/ot_verifiers.py``.
"""

from __future__ import annotations

from specsampling.schemes.khisti import SCHEME as KHISTI

from .base import HostPlanned

LOWERING = HostPlanned(KHISTI)
LOWERINGS = (LOWERING,)
