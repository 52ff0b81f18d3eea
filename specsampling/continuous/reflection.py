r"""Reflection maximal coupling (RMC) of two Gaussian kernels (De Bortoli et al. 2025).

Algorithm. One child :math:`Y = m_d + \sigma Z` is drafted from :math:`Q = N(m_d, \sigma^2 I)`.
In the rank-1 frame, :math:`\hat s = e \cdot Z`. Accept :math:`Y` iff

.. math::

    \log(1 - u) < \delta(\hat s - \delta/2) = \log\rho(\hat s), \qquad u \sim U[0, 1),

otherwise output the **reflection** :math:`m_t + \sigma(Z - 2(e\cdot Z)e)`, i.e.
:math:`\hat s \mapsto \delta - \hat s` with :math:`z_\perp` kept. On a drafted chain the levels are
verified in order and the round ends at the first reflection (every level examined commits one
state; a fully accepted chain adds a target sample).

Theorem. The output is distributed as :math:`P = N(m_t, \sigma^2 I)`. Proof idea: the accepted
part has density :math:`\min(\varphi(s), \varphi(s-\delta))`; the reflection
:math:`s \mapsto \delta - s` maps the rejected part :math:`(\varphi(s) - \varphi(s-\delta))_+`
(left of :math:`\delta/2`) onto :math:`(\varphi(s-\delta) - \varphi(s))_+`, and :math:`z_\perp`
is untouched and independent of :math:`s`.

Acceptance. :math:`1 - \operatorname{TV}(P, Q) = 2\Phi(-\delta/2)`, the maximum over all
couplings of :math:`P` with one draft.

Reference: De Bortoli, Galashov, Gretton, Doucet, "Accelerated Diffusion Models via Speculative
Sampling", ICML 2025, arXiv 2501.05370.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .base import Array, ChainLevels, ChainOutcome, NodeNoise, NodeOutcome
from .frame import Frame, maximal_coupling_acceptance


class Reflection:
    """Reflection maximal coupling; one draft per node, chains verified level by level.

    >>> import specsampling.continuous as sc
    >>> round(sc.acceptance("reflection", 1.0), 4)
    0.6171
    """

    name = "reflection"
    reference = (
        "arXiv 2501.05370: De Bortoli, Galashov, Gretton, Doucet, "
        "Accelerated Diffusion Models via Speculative Sampling (ICML 2025)"
    )
    max_drafts: int | None = 1

    def acceptance(self, delta: Array, num_drafts: int) -> Array:
        r""":math:`2\Phi(-\delta/2)`; 1 on degenerate :math:`\delta \le 10^{-10}`."""
        return np.asarray(maximal_coupling_acceptance(delta))

    def accepts(self, u: Array, log_ratio: Array) -> npt.NDArray[np.bool_]:
        r"""Strict test :math:`\log(1-u) < \log\rho`: probability :math:`\min(1, \rho)`."""
        return np.asarray(np.log1p(-u) < log_ratio)

    def verify_node(self, frame: Frame, s: Array, zperp: Array, noise: NodeNoise) -> NodeOutcome:
        """Accept child 0, or reflect it (``s -> delta - s``, same ``zperp``)."""
        first = s[:, 0]
        accept = frame.degenerate | self.accepts(noise.accept[:, 0], frame.log_ratio(first))
        index = np.where(accept, 0, -1).astype(np.intp)
        return NodeOutcome(index, frame.delta - first, zperp[:, 0])

    def verify_chain(self, levels: ChainLevels, noise: NodeNoise) -> ChainOutcome:
        """Verify levels in order; stop at the first reflection, else add a target sample."""
        batch, length = levels.s.shape
        committed = np.zeros(batch, dtype=np.intp)
        active = np.ones(batch, dtype=bool)
        state = levels.final_mean + levels.final_std[:, None] * noise.gaussian
        for i in range(length):
            frame = levels.frames.select(np.full(batch, i, dtype=np.intp))
            node_noise = NodeNoise(noise.accept[:, i : i + 1], noise.residual, noise.gaussian)
            node = self.verify_node(
                frame, levels.s[:, i : i + 1], levels.zperp[:, i : i + 1], node_noise
            )
            rejected = active & (node.child < 0)
            state[rejected] = frame.reconstruct(node.s, node.zperp)[rejected]
            active &= node.child >= 0
            committed += active
        return ChainOutcome(committed, state)


SCHEME = Reflection()
