r"""Greedy rejection sampling over K i.i.d. drafts, with an exact residual (D-GRS).

Algorithm (Bullo et al., Algorithm 2). The ``K`` children of a node are projected in the parent's
rank-1 frame, in drafting order: :math:`(s_k, z_{\perp,k})`. With :math:`\lambda_0 = 0`,
:math:`G_1 = 1`, for :math:`k = 1..K`:

.. math::

    \rho_k = e^{\min(\delta(s_k - \delta/2),\,700)}, \quad
    \beta_k = \min\Big(1, \frac{(\rho_k - \lambda_{k-1})_+}{G_k}\Big), \quad
    \text{accept child } k \text{ iff } u_k < \beta_k,

    \lambda_k = \lambda_{k-1} + G_k, \qquad
    G_{k+1} = \operatorname{clamp}\big(\bar\Phi(t_k - \delta) - \lambda_k\bar\Phi(t_k),
    \ 0,\ G_k\big), \quad t_k = \ln\lambda_k/\delta + \delta/2 .

If all ``K`` are rejected, draw :math:`s` from the super-level residual with :math:`\lambda_K`
(:mod:`~specsampling.continuous.residual`) and return it with the **first** child's
:math:`z_\perp`. A degenerate :math:`\delta \le 10^{-10}` accepts child 0 before any :math:`t_k`
is formed.

Theorem. The output is distributed as :math:`P`. Proof idea: after :math:`k` rejections the
probability of having output the drafts so far has density :math:`\min(\varphi(s-\delta),
\lambda_k\varphi(s))`, so what is left to cover is exactly :math:`(\varphi(s-\delta) -
\lambda_k\varphi(s))_+` with mass :math:`G_{k+1}`; the next draft covers
:math:`\min(\ldots, G_{k+1}\varphi(s))` of it, and the residual covers the rest.
:math:`z_\perp` of any child is independent of all decisions.

Acceptance. :math:`1 - G_{K+1}`, strictly increasing in ``K``; :math:`2\Phi(-\delta/2)` at
``K = 1``.

Reference: Bullo, Liu, Güner, Mukherjee, Gündüz, "Accelerating Diffusion Sampling via
Speculative Draft Trees", arXiv 2609.17691.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from .base import Array, NodeNoise, NodeOutcome
from .frame import DEGENERATE_DELTA, Frame
from .residual import residual_log_mass, sample_residual_log_lam

#: Cap on the log likelihood ratio before exponentiating (Algorithm 2).
LOG_RATIO_CAP = 700.0


class Recursion(NamedTuple):
    r"""The D-GRS recursion for a batch of :math:`\delta` (shape ``(n,)``).

    Attributes
    ----------
    degenerate : ndarray of bool, shape (n,)
        Rows with :math:`\delta \le 10^{-10}` (accept child 0; no recursion computed).
    lam : ndarray, shape (n, K + 1)
        :math:`\lambda_0, \dots, \lambda_K`.
    log_lam : ndarray, shape (n,)
        :math:`\ln\lambda_K`, accurate near :math:`\lambda_K = 1`.
    mass : ndarray, shape (n, K + 1)
        :math:`G_1, \dots, G_{K+1}`.
    """

    degenerate: npt.NDArray[np.bool_]
    lam: Array
    log_lam: Array
    mass: Array


def dgrs_masses(delta: Any, num_drafts: int) -> Array:
    r"""Residual masses :math:`G_1 = 1, G_2, \dots, G_{K+1}` of the D-GRS recursion.

    .. math::

        \lambda_k = \lambda_{k-1} + G_k, \qquad
        G_{k+1} = \bar\Phi(t_k - \delta) - \lambda_k \bar\Phi(t_k), \quad
        t_k = \ln\lambda_k/\delta + \delta/2.

    Parameters
    ----------
    delta : array_like, shape (n,)
        Mismatches :math:`\delta \ge 0` (degenerate rows give :math:`G_{k \ge 2} = 0`).
    num_drafts : int
        ``K``.

    Returns
    -------
    ndarray, shape (n, K + 1)

    Examples
    --------
    >>> masses = dgrs_masses([0.5], 2)
    >>> [round(float(g), 4) for g in masses[0]]
    [1.0, 0.1974, 0.1318]
    """
    return SCHEME.recursion(np.atleast_1d(np.asarray(delta, dtype=np.float64)), num_drafts).mass


class DGRS:
    """Draft-tree greedy rejection sampling at one node; any number of i.i.d. children.

    >>> import specsampling.continuous as sc
    >>> [round(sc.acceptance("dgrs", 1.0, k), 4) for k in (1, 2, 4, 8)]
    [0.6171, 0.7136, 0.7978, 0.8643]
    """

    name = "dgrs"
    reference = (
        "arXiv 2609.17691: Bullo, Liu, Güner, Mukherjee, Gündüz, "
        "Accelerating Diffusion Sampling via Speculative Draft Trees"
    )
    max_drafts: int | None = None

    def acceptance(self, delta: Array, num_drafts: int) -> Array:
        """:math:`1 - G_{K+1}`; 1 on degenerate rows."""
        flat = np.asarray(delta, dtype=np.float64).reshape(-1)
        rec = self.recursion(flat, num_drafts)
        accept = np.where(rec.degenerate, 1.0, 1.0 - rec.mass[:, num_drafts])
        return accept.reshape(np.shape(delta))

    def recursion(self, delta: Array, num_drafts: int) -> Recursion:
        """The recursion; degenerate rows are set aside **before** any threshold is formed."""
        degenerate = delta <= DEGENERATE_DELTA
        n = delta.shape[0]
        lam = np.ones((n, num_drafts + 1))
        lam[:, 0] = 0.0
        mass = np.zeros((n, num_drafts + 1))
        mass[:, 0] = 1.0
        log_lam = np.zeros(n)
        regular = ~degenerate
        d = delta[regular]
        excess = np.zeros_like(d)  # lambda_k - 1 for k >= 1, kept apart for precision
        for k in range(1, num_drafts + 1):
            if k > 1:
                excess = excess + mass[regular, k - 1]
                lam[regular, k] = 1.0 + excess
            g = np.exp(residual_log_mass(d, np.log1p(excess)))
            mass[regular, k] = np.clip(g, 0.0, mass[regular, k - 1])
        log_lam[regular] = np.log1p(excess)
        return Recursion(degenerate, lam, log_lam, mass)

    def log_ratios(self, frame: Frame, s: Array, rec: Recursion) -> Array:
        r""":math:`\log\rho_k` of the ``(B, K)`` children (0 on degenerate rows)."""
        return frame.log_ratio(s)

    def order(self, s: Array) -> npt.NDArray[np.intp]:
        """Scan order of the children: drafting order."""
        return np.broadcast_to(np.arange(s.shape[1]), s.shape)

    def accepts(self, u: Array, beta: Array) -> npt.NDArray[np.bool_]:
        r"""Strict :math:`u < \beta`: a child with :math:`\beta = 0` is never accepted."""
        return np.asarray(u < beta)

    def residual_zperp(self, zperp: Array) -> Array:
        r"""The :math:`z_\perp` of the residual output: the **first** child's."""
        return zperp[:, 0]

    def verify_node(self, frame: Frame, s: Array, zperp: Array, noise: NodeNoise) -> NodeOutcome:
        """Scan the children in order; the first accepted one, else the residual."""
        num_drafts = s.shape[1]
        rec = self.recursion(frame.delta, num_drafts)
        order = self.order(s)
        scanned = np.take_along_axis(s, order, axis=1)
        rho = np.exp(np.minimum(self.log_ratios(frame, scanned, rec), LOG_RATIO_CAP))
        prev_lam, mass = rec.lam[:, :num_drafts], rec.mass[:, :num_drafts]
        positive = mass > 0
        beta = np.where(
            positive,
            np.minimum(1.0, np.maximum(rho - prev_lam, 0.0) / np.where(positive, mass, 1.0)),
            0.0,
        )
        accepted = self.accepts(noise.accept, beta)
        first = np.argmax(accepted, axis=1)
        chosen = np.take_along_axis(order, first[:, None], axis=1)[:, 0]
        index = np.where(rec.degenerate, 0, np.where(accepted.any(axis=1), chosen, -1))
        out = np.zeros(s.shape[0])
        rejected = index < 0
        out[rejected] = sample_residual_log_lam(
            frame.delta[rejected], rec.log_lam[rejected], noise.residual[rejected]
        )
        return NodeOutcome(index.astype(np.intp), out, self.residual_zperp(zperp))


SCHEME = DGRS()
