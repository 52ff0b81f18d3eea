r"""OT-binned verification: ``ot_optimal`` on groups of tokens, with an accuracy knob :math:`\tau`.

Derived in this project (``docs/schemes/ot_binned.md``). Exactly lossless for
every :math:`\tau`, and within :math:`\sum_g \ell_g` of the optimum :math:`\alpha^*`.

Algorithm. The plan of :mod:`~specsampling.schemes.ot_optimal` with **groups** as cells: the
:math:`A^*`/:math:`H^*` cut stays at token level; each part's tokens (by descending
:math:`\rho = p/q`) are split left to right into maximal runs whose loss bound stays at most
:math:`\tau`,

.. math:: \ell_g = p_g - \rho_{\min}(g)\,q_g \ \text{on } A^*, \qquad
          \ell_g = \rho_{\max}(g)\,q_g - p_g \ \text{on } H^*.

With :math:`\rho_g = p_g/q_g` the group targets are :math:`t_g = \min(\rho_g, c_G)` on
:math:`A^*` and :math:`\max(\rho_g, d_G)` on :math:`H^*`, the levels of step 2 solved over the
groups; the split trees are built over the group cells, so the token law is
:math:`r(y) = t_{g(y)} q(y)`. A query walks at group level and picks uniformly over the
**draws** of the stop block; stage 2 runs against the realised law. Each group is a
block-rule cell, so the tree has at most twice as many nodes as groups: the plan costs
:math:`O(V \log V + G h)` instead of :math:`O(m h)` for :math:`m` supported tokens.

Theorem. Lossless on i.i.d. draft trees for every :math:`\tau` (the realised selection law is
exact; prefix optimality holds at group boundaries, so the profile bound holds there), and
:math:`\alpha \ge \alpha^* - \sum_g \ell_g` (residual hits only add). :math:`\tau = 0` merges only
equal ratios (the optimum); :math:`\tau = \infty` is one block per part.

Reference: derived in this project (``docs/schemes/ot_binned.md``, "Reference").
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from .._types import Probs
from .ot_optimal import OTOptimal, plan

#: The default loss bound per group: a few 1e-4 of acceptance at V = 150,000.
DEFAULT_TAU = 1e-6


class OTBinned(OTOptimal):
    """``ot_optimal`` on groups of tokens: lossless for every ``tau``, within ``sum l_g`` of the
    optimum.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> p, q = [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3
    >>> ss.acceptance(OTBinned(tau=float("inf")), p, q, 2)
    Fraction(8, 9)
    >>> ss.acceptance(OTBinned(tau=0), p, q, 2)
    Fraction(1, 1)
    """

    name = "ot_binned"
    reference = (
        "derived in this project (docs/schemes/ot_binned.md): ot_optimal on groups of tokens"
    )

    def __init__(self, tau: Any = DEFAULT_TAU) -> None:
        self.tau = _check_tau(tau)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return None  # residual hits are possible; ss.acceptance enumerates

    def loss_bound(self, target: Any, draft: Any, num_drafts: int) -> Any:
        r""":math:`\sum_g \ell_g` at one position: the acceptance is at least
        :math:`\alpha^*` minus this.

        >>> from fractions import Fraction as F
        >>> OTBinned(tau=F(1, 5)).loss_bound([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
        Fraction(1, 6)
        """
        return plan(target, draft, num_drafts, self.tau).loss_bound

    def __repr__(self) -> str:
        return f"<scheme {self.name!r} tau={self.tau!r}>"


def _check_tau(tau: Any) -> Any:
    if isinstance(tau, bool) or not isinstance(tau, (int, float, Fraction)):
        raise ValueError(f"tau: expected a number >= 0, got {tau!r}")
    if math.isnan(tau) or tau < 0:
        raise ValueError(f"tau: expected a number >= 0 (inf: one group per part), got {tau!r}")
    return tau


SCHEME = OTBinned()
