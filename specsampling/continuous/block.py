r"""Block verification of a drafted chain of Gaussian kernels (Soen et al., arXiv 2606.13426).

Algorithm. Draft :math:`\tilde Y_1, \dots, \tilde Y_L` with the draft kernels, get the target
means at :math:`y_0, \tilde Y_1, \dots, \tilde Y_L` in one call. In the frame of parent
:math:`\tilde Y_{i-1}` the drafted child has coordinate :math:`\hat s_i` and mismatch
:math:`\delta_i`. With :math:`w_0 = 1`,

.. math::

    w_i = \min\big(1, w_{i-1}\, e^{\delta_i(\hat s_i - \delta_i/2)}\big), \qquad
    S_i = w_i\, G_{i+1}(1/w_i), \qquad
    h_i = \frac{S_i}{S_i + 1 - w_i}\ (i < L), \quad h_L = w_L,

with :math:`h_i = 1` when the denominator is 0 and :math:`G_{i+1}` the super-level residual
mass (:mod:`~specsampling.continuous.residual`) in the frame of :math:`\tilde Y_i`. Draw
:math:`\eta_i \sim U[0,1)` for every level and let :math:`\tau^* = \max\{i : \eta_i < h_i\}`
(0 if none), scanning **all** levels. Commit :math:`\tilde Y_{1..\tau^*}`, then one more state:
a target sample at :math:`\tilde Y_L` if :math:`\tau^* = L`, else :math:`s` from the residual with
:math:`\lambda = 1/w_{\tau^*}` in the frame of :math:`\tilde Y_{\tau^*}`, reconstructed with a
**fresh** orthogonal Gaussian. At a single node (``L = 1``) this is speculative sampling with an
exact residual: accept with probability :math:`\min(1, \rho)`, else draw from
:math:`(P - Q)_+`.

Theorem. The committed states followed by target samples form a Markov chain with the target
kernels. Proof idea: LLM block verification (Sun et al.) transcribed to densities; given the
first :math:`i` drafts, :math:`\Pr(\tau^* \ge i) = w_i` and the level-:math:`(i+1)` residual
:math:`(w_i P - Q)_+ = w_i(P - \lambda Q)_+` completes the accepted mass to :math:`w_i P`.

Acceptance. :math:`E[\tau^*] = \sum_{i=1}^{L} E[w_i]`, never below the reflection chain's
:math:`\sum_i E[\prod_{j \le i}\min(1, \rho_j)]` (pathwise :math:`w_i \ge \prod_{j\le i}
\min(1,\rho_j)`); per single node :math:`2\Phi(-\delta/2)`.

Reference: Soen, Husain, De Bortoli, Doucet, "Accelerating Speculative Diffusions via Block
Verification", arXiv 2606.13426.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .base import Array, ChainLevels, ChainOutcome, NodeNoise, NodeOutcome
from .frame import Frame, maximal_coupling_acceptance
from .residual import residual_log_mass, sample_residual_log_lam


class Block:
    """Block verification; a single node (one draft) or a drafted chain per round.

    >>> import specsampling.continuous as sc
    >>> round(sc.acceptance("block", 0.5), 4)
    0.8026
    """

    name = "block"
    reference = (
        "arXiv 2606.13426: Soen, Husain, De Bortoli, Doucet, "
        "Accelerating Speculative Diffusions via Block Verification"
    )
    max_drafts: int | None = 1

    def acceptance(self, delta: Array, num_drafts: int) -> Array:
        r"""Single node: :math:`2\Phi(-\delta/2)`; 1 on degenerate rows."""
        return np.asarray(maximal_coupling_acceptance(delta))

    def selects(self, eta: Array, h: Array) -> npt.NDArray[np.bool_]:
        r"""Strict :math:`\eta < h` (same law as :math:`\le`; :math:`h = 0` never selects)."""
        return np.asarray(eta < h)

    def residual_zperp(self, frame: Frame, gaussian: Array, child_zperp: Array) -> Array:
        r"""A **fresh** :math:`z_\perp`: the row's Gaussian projected on :math:`e^\perp`."""
        return frame.orthogonal(gaussian)

    def verify_node(self, frame: Frame, s: Array, zperp: Array, noise: NodeNoise) -> NodeOutcome:
        """Accept child 0 with probability min(1, rho), else the residual with fresh noise."""
        weight = np.exp(np.minimum(frame.log_ratio(s[:, 0]), 0.0))
        accept = frame.degenerate | self.selects(noise.accept[:, 0], weight)
        out = np.zeros(s.shape[0])
        out[~accept] = sample_residual_log_lam(
            frame.delta[~accept], np.zeros(int(np.sum(~accept))), noise.residual[~accept]
        )
        index = np.where(accept, 0, -1).astype(np.intp)
        return NodeOutcome(index, out, self.residual_zperp(frame, noise.gaussian, zperp[:, 0]))

    def verify_chain(self, levels: ChainLevels, noise: NodeNoise) -> ChainOutcome:
        r"""Block verification of ``(B, L)`` levels: :math:`\tau^*` and the extra state."""
        batch, length = levels.s.shape
        frames = levels.frames
        log_w = np.zeros((batch, length + 1))
        log_ratio = frames.log_ratio(levels.s)
        for i in range(1, length + 1):
            log_w[:, i] = np.minimum(0.0, log_w[:, i - 1] + log_ratio[:, i - 1])
        h = np.empty((batch, length))
        for i in range(1, length):
            mass = np.exp(log_w[:, i] + residual_log_mass(frames.delta[:, i], -log_w[:, i]))
            denominator = mass - np.expm1(log_w[:, i])
            positive = denominator > 0
            h[:, i - 1] = np.where(positive, mass / np.where(positive, denominator, 1.0), 1.0)
        h[:, length - 1] = np.exp(log_w[:, length])
        selected = self.selects(noise.accept, h)
        last = length - np.argmax(selected[:, ::-1], axis=1)
        committed = np.where(selected.any(axis=1), last, 0).astype(np.intp)
        state = levels.final_mean + levels.final_std[:, None] * noise.gaussian
        rows = np.flatnonzero(committed < length)
        if rows.size:
            level = committed[rows]
            frame = frames.select(level, rows)
            s = sample_residual_log_lam(frame.delta, -log_w[rows, level], noise.residual[rows])
            zperp = self.residual_zperp(frame, noise.gaussian[rows], levels.zperp[rows, level])
            state[rows] = frame.reconstruct(s, zperp)
        return ChainOutcome(committed, state)


SCHEME = Block()
