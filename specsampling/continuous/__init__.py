r"""Exact speculative couplings for continuous diffusion models (Gaussian denoising kernels).

One denoising step has a target kernel :math:`P = N(m_t, \sigma^2 I)` and a draft kernel
:math:`Q = N(m_d, \sigma^2 I)` with the same :math:`\sigma`. Three schemes turn drafts from
:math:`Q` into exact draws from :math:`P`:

* ``"reflection"``: reflection maximal coupling, one draft per node, chains verified level by
  level (arXiv 2501.05370);
* ``"dgrs"``: greedy rejection sampling over ``K`` i.i.d. drafts with an exact residual, the node
  rule of draft trees (arXiv 2609.17691);
* ``"block"``: block verification of a drafted chain with a one-step residual sampler
  (arXiv 2606.13426).

>>> import specsampling.continuous as sc
>>> sorted(sc.SCHEMES)
['block', 'dgrs', 'reflection']
>>> round(sc.acceptance("dgrs", 0.5, num_drafts=4), 4)
0.9182
"""

from __future__ import annotations

from .._registry import Registry
from .api import (
    acceptance,
    sample,
    verify,
    verify_block,
    verify_chain,
    verify_chain_with_noise,
    verify_with_noise,
)
from .base import (
    BlockVerified,
    ChainLevels,
    ChainNoise,
    ChainOutcome,
    ChainScheme,
    ContinuousScheme,
    NodeNoise,
    NodeOutcome,
    Verified,
)
from .dgrs import dgrs_masses
from .frame import DEGENERATE_DELTA, Frame
from .registry import SCHEMES, get_scheme
from .residual import (
    residual_cdf,
    residual_log_mass,
    residual_mass,
    residual_threshold,
    sample_residual,
    sample_residual_log_lam,
)

__all__ = [
    "DEGENERATE_DELTA",
    "SCHEMES",
    "BlockVerified",
    "ChainLevels",
    "ChainNoise",
    "ChainOutcome",
    "ChainScheme",
    "ContinuousScheme",
    "Frame",
    "NodeNoise",
    "NodeOutcome",
    "Registry",
    "Verified",
    "acceptance",
    "dgrs_masses",
    "get_scheme",
    "residual_cdf",
    "residual_log_mass",
    "residual_mass",
    "residual_threshold",
    "sample",
    "sample_residual",
    "sample_residual_log_lam",
    "verify",
    "verify_block",
    "verify_chain",
    "verify_chain_with_noise",
    "verify_with_noise",
]
