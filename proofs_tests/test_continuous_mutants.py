"""Every continuous mutant is caught by a check that its registered twin passes.

The mutants (``continuous_mutants.py``) are the pitfalls of ``docs/continuous/*.md``:
scanning D-GRS children by likelihood ratio, the wrong child's :math:`z_\\perp`, reused draft
noise in block verification's residual, an inclusive accept test, forming :math:`\\tau` before
the degenerate-:math:`\\delta` check, a rule that never accepts (passes KS, fails acceptance) and
a block scan that stops at the first failure. Each test runs the same check on the registered
scheme (must pass) and on the mutant (must fail), with fixed seeds.

False-positive budget: ``FALSE_POSITIVE_BUDGET = 1e-3`` for the file, spent only by checks that
must *pass* (on twins, and on the two contract mutants whose output law is exact). The
``NUM_Z_CHECKS`` acceptance checks at 4 standard errors spend ``6.3e-5`` each; the rest is split
evenly (Bonferroni) over ``NUM_PASSING_TESTS`` KS and correlation tests at ``ALPHA`` (a
correlation passes when ``|r| sqrt(n) < z_{ALPHA/2}``). Checks that must fail spend nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import specsampling.continuous as sc
from proofs_tests import continuous_mutants as cm

SIZE = 20_000
SEED = 7
FALSE_POSITIVE_BUDGET = 1e-3
NUM_Z_CHECKS = 3
NUM_PASSING_TESTS = 2 + 1 + 2 + 1 + 8 + 2 + 2 + 8
ALPHA = (FALSE_POSITIVE_BUDGET - NUM_Z_CHECKS * 2 * stats.norm.sf(4)) / NUM_PASSING_TESTS
Z_ALPHA = float(stats.norm.isf(ALPHA / 2))

MUTANTS = [
    cm.DGRSScannedByRatio(),
    cm.DGRSLastChildZperp(),
    cm.BlockReusedDraftNoise(),
    cm.DGRSInclusive(),
    cm.DGRSTauBeforeDegenerateCheck(),
    cm.BlockAlwaysResidual(),
    cm.BlockFirstFailure(),
]


def _twin(mutant: object) -> sc.ContinuousScheme:
    registered = {type(s): s for s in sc.SCHEMES.values()}
    return next(registered[c] for c in type(mutant).__mro__ if c in registered)


def test_mutants_are_unregistered_variants_of_registered_schemes() -> None:
    for mutant in MUTANTS:
        assert isinstance(mutant, sc.ContinuousScheme)
        assert mutant.name not in sc.SCHEMES and type(mutant) not in map(type, sc.SCHEMES.values())
        assert _twin(mutant).name in sc.SCHEMES


def test_scanning_by_likelihood_ratio_is_caught_by_the_node_law() -> None:
    """Pitfall 1: order matters; the sorted scan favours large s (biased law, more accepts)."""
    twin = cm.node_law(sc.SCHEMES["dgrs"], 4, 1.0, SIZE, SEED)
    assert min(twin.p_along, twin.p_across) > ALPHA and twin.acceptance_z <= 4
    mutant = cm.node_law(cm.DGRSScannedByRatio(), 4, 1.0, SIZE, SEED)
    assert mutant.p_along < ALPHA and mutant.acceptance_z > 4


def test_child_zero_is_pinned_when_it_sits_right_of_the_midpoint() -> None:
    """s_0 > delta/2 means rho_0 > 1 = beta_0: child 0 is accepted whatever the noise."""
    rng = np.random.default_rng(SEED)
    case = cm.node_case(1.0, 4, 2000, rng)
    s, _ = sc.Frame.of(case.target, case.draft, np.full(2000, cm.STD)).project(case.children)
    noise = sc.NodeNoise.draw(rng, 2000, 4, cm.DIM)
    for scheme, must_pin in ((sc.SCHEMES["dgrs"], True), (cm.DGRSScannedByRatio(), False)):
        out = sc.verify_with_noise(scheme, case.target, case.draft, cm.STD, case.children, noise)
        pinned = bool(np.all(out.index[s[:, 0] > 0.5] == 0))
        assert pinned is must_pin


def test_last_child_zperp_is_caught_by_the_joint_law_with_the_children() -> None:
    """Pitfall 2 (a coupling contract; the output law alone cannot see it)."""
    first, last, n = cm.zperp_correlations(sc.SCHEMES["dgrs"], 4, SIZE, SEED)
    assert first > 1 - 1e-12 and abs(last) * np.sqrt(n) < Z_ALPHA
    first, last, n = cm.zperp_correlations(cm.DGRSLastChildZperp(), 4, SIZE, SEED)
    assert not (first > 1 - 1e-12 and abs(last) * np.sqrt(n) < Z_ALPHA)
    law = cm.node_law(cm.DGRSLastChildZperp(), 4, 1.0, SIZE, SEED)
    assert min(law.p_along, law.p_across) > ALPHA  # why a joint check is needed


def test_reused_draft_noise_in_the_block_residual_is_caught() -> None:
    """Block verification: the residual's z_perp must be fresh, independent of the drafted
    child's."""
    r, n = cm.fresh_noise_correlation(sc.SCHEMES["block"], SIZE, SEED)
    assert abs(r) * np.sqrt(n) < Z_ALPHA
    r, n = cm.fresh_noise_correlation(cm.BlockReusedDraftNoise(), SIZE, SEED)
    assert abs(r) * np.sqrt(n) >= Z_ALPHA
    pvalues, _ = cm.chain_law(cm.BlockReusedDraftNoise(), SIZE, SEED)
    assert min(pvalues) > ALPHA  # lossless in law (module docstring): a contract check is needed


def test_inclusive_accept_is_caught_by_boundary_noise() -> None:
    assert cm.boundary_violations(sc.SCHEMES["dgrs"]) == []
    assert cm.boundary_violations(cm.DGRSInclusive()) == ["u = 0 accepted child 1 whose beta is 0"]


def test_tau_before_the_degenerate_check_is_caught() -> None:
    """Pitfall 3: delta = 1e-12 must still be degenerate (accept child 0, acceptance 1)."""
    assert cm.degenerate_violations(sc.SCHEMES["dgrs"]) == []
    problems = cm.degenerate_violations(cm.DGRSTauBeforeDegenerateCheck())
    assert any("1e-12" in p and "child 0" in p for p in problems), problems


def test_always_resampling_passes_ks_but_fails_the_acceptance_check() -> None:
    twin = cm.node_law(sc.SCHEMES["block"], 1, 1.0, SIZE, SEED)
    assert min(twin.p_along, twin.p_across) > ALPHA and twin.acceptance_z <= 4
    mutant = cm.node_law(cm.BlockAlwaysResidual(), 1, 1.0, SIZE, SEED)
    assert min(mutant.p_along, mutant.p_across) > ALPHA  # KS alone is a smoke test
    assert mutant.acceptance_z > 4


def test_block_first_failure_is_caught_by_the_chain_law() -> None:
    pvalues, z = cm.chain_law(sc.SCHEMES["block"], SIZE, SEED)
    assert min(pvalues) > ALPHA and z <= 4
    pvalues, z = cm.chain_law(cm.BlockFirstFailure(), SIZE, SEED)
    assert min(pvalues) < ALPHA and z > 4


@pytest.mark.parametrize("name", ["reflection", "block"])
def test_single_draft_schemes_pass_the_degenerate_check(name: str) -> None:
    assert cm.degenerate_violations(sc.SCHEMES[name], num_drafts=1) == []
