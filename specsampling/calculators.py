r"""Every closed-form acceptance calculator, in one place to look them up.

Each formula lives in its scheme's module (one home per formula); this module re-exports them.
The single-position functions (``*_acceptance``) take processed distributions (float64 or
``Fraction``) and are vectorised over the vocabulary: :math:`O(kV)` numpy operations, or
:math:`O(V \log V)` and vectorised quadratures for the keyed couplings, so vocabularies of
150k+ tokens answer in well under a second. The expected-length functions enumerate contexts
(``chain_expected_accepted`` and ``block_expected_accepted``: up to ``vocab ** (length - 1)``
of them) or walk a given tree (``nss_expected_accepted``). The test suite checks every formula
against the exact engine (:mod:`specsampling.exact`).
"""

from __future__ import annotations

from .keyed.gls_law import gls_acceptance
from .keyed.laws import gumbel_acceptance, poisson_acceptance
from .schemes.block import block_expected_accepted
from .schemes.greedy import greedy_acceptance
from .schemes.nss import nss_acceptance, nss_expected_accepted
from .schemes.resispec import resispec_acceptance
from .schemes.spechub import spechub_acceptance
from .schemes.specinfer import specinfer_acceptance
from .schemes.spectr import spectr_acceptance
from .schemes.standard import chain_expected_accepted, standard_acceptance

__all__ = [
    "block_expected_accepted",
    "chain_expected_accepted",
    "gls_acceptance",
    "greedy_acceptance",
    "gumbel_acceptance",
    "nss_acceptance",
    "nss_expected_accepted",
    "poisson_acceptance",
    "resispec_acceptance",
    "spechub_acceptance",
    "specinfer_acceptance",
    "spectr_acceptance",
    "standard_acceptance",
]
