r"""Toy diffusion models with an exact drift, and end-to-end speculative samplers for them.

The data law is a Gaussian mixture :math:`\pi_0 = \sum_m w_m N(\mu_m, s^2 I)` in a few
dimensions. The forward process is the variance-preserving (VP, Ornstein-Uhlenbeck) SDE
:math:`dX = -\tfrac12 \beta(t) X\,dt + \sqrt{\beta(t)}\,dW` on :math:`[0, 1]` with the linear
schedule :math:`\beta(t) = \beta_{\min} + t(\beta_{\max} - \beta_{\min})`. Given :math:`X_0`,
:math:`X_t = \alpha_t X_0 + \sqrt{1 - \alpha_t^2}\,\varepsilon` with
:math:`\alpha_t = \exp(-\tfrac12 \int_0^t \beta)`, so every marginal is again a Gaussian
mixture, with means :math:`\alpha_t \mu_m` and isotropic variance
:math:`s_t^2 = \alpha_t^2 s^2 + 1 - \alpha_t^2`, and its score is exact in closed form:

.. math::

    \nabla \log \pi_t(y) = \sum_m r_m(y, t)\,\frac{\alpha_t \mu_m - y}{s_t^2},
    \qquad r_m \propto w_m N(y; \alpha_t \mu_m, s_t^2 I).

Sampling runs the reverse-time SDE, discretised by Euler-Maruyama on the uniform grid
:math:`t_n = 1 - n\gamma`, :math:`\gamma = (1 - t_{\min})/N`, from :math:`Y_0 \sim N(0, I)`.
Step :math:`n` is the Gaussian kernel (P = target)

.. math::

    P_n(\cdot \mid y) = N\bigl(m^t_n(y), \sigma_n^2 I\bigr), \quad
    m^t_n(y) = y + \gamma\, b^t(y, t_n), \quad
    b^t(y, t) = \beta(t)\bigl(\tfrac12 y + \nabla \log \pi_t(y)\bigr), \quad
    \sigma_n = \sqrt{\gamma \beta(t_n)} > 0,

so every step can be speculated (no deterministic last step). A draft Q_n has the same
:math:`\sigma_n` and its own mean :math:`m^d_n`:

* ``"frozen"`` (:class:`FrozenDraft`, De Bortoli et al. 2025, training free):
  :math:`m^d(y) = y + (m^t(\tilde Y) - \tilde Y)`, the target increment last computed at a
  verified state :math:`\tilde Y` (the parent of the last committed state), reused as is
  (root-drift prefetching: no target call beyond the verification pass; one warm-up pass at
  :math:`n = 0`, which is the first plain step);
* ``"gaussian"`` (:class:`GaussianDraft`): the exact reverse drift of the single Gaussian
  moment-matched to the data mixture (a linear drift, no target call at all);
* ``"exact"`` (:class:`ExactDraft`): the target itself, an oracle for tests (every draft is
  accepted).

One speculative **round** drafts a chain (:func:`reflection_chain`, :func:`block_chain`) or a
tree (:func:`dgrs_tree`) from the committed state, makes **one** target pass (one batched
network call, one NFE) over every node that needs the target mean, and verifies with
:mod:`specsampling.continuous`. A chain of length L evaluates L + 1 rows and commits up to L + 1
states; a uniform tree of K children per node and depth L evaluates its
:math:`1 + K + \dots + K^{L-1}` internal nodes and commits up to L states (the walk stops at a
leaf). Near the horizon the lookahead is truncated. Plain sampling makes N target passes.
The samplers return a :class:`Run` with the final states and, per sample path, the target
passes, the rows evaluated and the states drafted.

References: De Bortoli, Galashov, Gretton, Doucet, arXiv 2501.05370 (reflection coupling);
Soen, Husain, De Bortoli, Doucet, arXiv 2606.13426 (block verification); Bullo, Liu, Güner,
Mukherjee, Gündüz, arXiv 2609.17691 (draft trees, D-GRS). See ``docs/diffusion.md``.
"""

from __future__ import annotations

from .drafts import DRAFTS, Draft, ExactDraft, FrozenDraft, GaussianDraft, get_draft
from .lookahead import (
    Chain,
    Lookahead,
    Tree,
    block_chain,
    dgrs_tree,
    reflection_chain,
)
from .lookahead import ChainVerifier as ChainVerifier  # type alias, outside __all__
from .process import Array as Array  # type alias, outside __all__
from .process import GaussianMixture, VPDiffusion
from .sampler import Run, plain_sample, speculative_sample

__all__ = [
    "DRAFTS",
    "Chain",
    "Draft",
    "ExactDraft",
    "FrozenDraft",
    "GaussianDraft",
    "GaussianMixture",
    "Lookahead",
    "Run",
    "Tree",
    "VPDiffusion",
    "block_chain",
    "dgrs_tree",
    "get_draft",
    "plain_sample",
    "reflection_chain",
    "speculative_sample",
]
