"""The chi-square test on counts every statistical test of the suite uses (bins merged).

Counts, never frequencies; outcomes the exact law gives probability 0 fail outright; bins are
merged to an expected count of at least :data:`MIN_EXPECTED` (numpyro's ``gof.py`` discipline).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats

#: Smallest expected count of a merged bin.
MIN_EXPECTED = 5.0


def chi_square_pvalue(counts: Mapping[Any, int], law: Mapping[Any, Any]) -> float:
    """P-value of observed ``counts`` under ``law`` ({outcome: probability}), bins merged.

    Outcomes are sorted by expected count and the smallest are pooled until each bin expects at
    least ``MIN_EXPECTED``; a remainder joins the last bin. Needs at least two bins.
    """
    num = sum(counts.values())
    support = {key for key, prob in law.items() if prob > 0}
    stray = [key for key in counts if key not in support]
    assert not stray, f"sampled outcomes the exact law gives probability 0: {stray[:5]}"
    total = float(sum(law.values()))
    assert abs(total - 1) < 1e-9, total
    bins = []
    expected_acc, observed_acc = 0.0, 0
    for key in sorted(support, key=lambda key: (float(law[key]), repr(key))):
        expected_acc += float(law[key]) / total * num
        observed_acc += counts.get(key, 0)
        if expected_acc >= MIN_EXPECTED:
            bins.append([expected_acc, observed_acc])
            expected_acc, observed_acc = 0.0, 0
    if bins and (expected_acc > 0 or observed_acc > 0):
        bins[-1][0] += expected_acc
        bins[-1][1] += observed_acc
    assert len(bins) >= 2, "test design: the law needs two bins to be tested"
    expected = np.array([b[0] for b in bins])
    observed = np.array([b[1] for b in bins])
    expected *= num / expected.sum()
    return float(stats.chisquare(observed, expected).pvalue)
