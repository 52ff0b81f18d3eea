"""Every mutant in the catalogue is caught, and its correct twin passes the same case.

A test suite that passes a broken scheme is itself broken: each known-buggy variant must fail
the losslessness oracle (or, for the measure-zero inclusive test, the boundary-noise property),
on a fixed case, on a seeded sweep and in a hypothesis search.
"""

from __future__ import annotations

import zlib
from fractions import Fraction as F
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings

import specsampling as ss
from proofs_tests.controls import CONTROLS
from proofs_tests.mutants import MUTANTS as TOKEN_MUTANTS
from proofs_tests.mutants import Case
from proofs_tests.mutants_ot import OT_MUTANTS
from proofs_tests.mutants_sequence import SEQUENCE_MUTANTS, BlockNoDenominatorGuard
from proofs_tests.oracles import boundary_violations, chi_square_pvalue, sampled_counts
from proofs_tests.strategies import cases
from specsampling.pairs import Random
from specsampling.schemes import tables

MUTANTS = {**TOKEN_MUTANTS, **SEQUENCE_MUTANTS, **OT_MUTANTS}
NAMES = sorted(MUTANTS)
LAW_MUTANTS = [name for name in NAMES if MUTANTS[name].caught_by == "law"]
FLOAT_CAUGHT = 1e-6
SWEEP_SEEDS = range(8)
#: Chi-square level per sampler-vs-law check (deterministic seeds: a failure is reproducible).
ALPHA = 1e-4


def _registered_base(scheme: Any) -> Any:
    """The registered scheme whose class is the mutant's nearest registered ancestor."""
    by_type = {type(s): s for s in ss.SCHEMES.values()}
    bases = [by_type[cls] for cls in type(scheme).__mro__ if cls in by_type]
    assert bases, f"{scheme.name} is not a variant of a registered scheme"
    return bases[0]


def _lossless_error(scheme: Any, case: Case, exact: bool) -> Any:
    return ss.lossless_error(scheme, case.pair(exact), case.shape)


def test_mutants_are_variants_of_registered_schemes_and_never_registered() -> None:
    assert len(MUTANTS) >= 9
    registered = {type(s) for s in ss.SCHEMES.values()}
    for name, mutant in MUTANTS.items():
        assert name == mutant.scheme.name and name not in ss.SCHEMES
        assert type(mutant.scheme) not in registered
        _registered_base(mutant.scheme)
        assert isinstance(mutant.scheme, ss.Scheme)
    for scheme, _ in CONTROLS.values():
        assert scheme.name not in ss.SCHEMES and type(scheme) not in registered


@pytest.mark.parametrize("exact", [True, False], ids=["fraction", "float"])
@pytest.mark.parametrize("name", LAW_MUTANTS)
def test_mutant_is_caught_on_its_case_and_its_twin_is_not(name: str, exact: bool) -> None:
    mutant = MUTANTS[name]
    error = _lossless_error(mutant.scheme, mutant.case, exact)
    twin = _lossless_error(ss.SCHEMES[mutant.case.twin], mutant.case, exact)
    if exact:
        assert error != 0, f"{name} not caught: {mutant.bug}"
        assert twin == 0
    else:
        assert error > FLOAT_CAUGHT, f"{name} not caught: {mutant.bug} (error {error})"
        assert twin <= 1e-12


@pytest.mark.parametrize("name", [name for name in NAMES if MUTANTS[name].widens_support])
def test_widening_mutants_claim_a_shape_their_scheme_refuses(name: str) -> None:
    mutant = MUTANTS[name]
    base, shape = _registered_base(mutant.scheme), mutant.case.shape
    assert mutant.scheme.supports(shape) and not base.supports(shape)
    with pytest.raises(ss.UnsupportedShape):
        ss.round_law(base, mutant.case.pair(), shape)


@pytest.mark.parametrize("name", LAW_MUTANTS)
def test_seeded_sweep_catches_mutant(name: str) -> None:
    """Random exact pairs (zeros, p == q and near one-hot rows included) over small shapes."""
    mutant = MUTANTS[name]
    twin = ss.SCHEMES[mutant.case.twin]
    caught = []
    for shape in mutant.sweep:
        for seed in SWEEP_SEEDS:
            pair = Random(mutant.sweep_vocab, seed=seed, exact=True)
            assert ss.lossless_error(twin, pair, shape) == 0, (shape, seed)
            caught.append(ss.lossless_error(mutant.scheme, pair, shape) != 0)
    assert any(caught), f"{name}: caught on none of {len(caught)} sweep cases"


#: A fixed search budget, independent of the profile: the search stops at the first hit
#: (no shrinking; the catalogue's fixed cases are the minimal examples).
SEARCH = settings(
    max_examples=1500,
    phases=[Phase.generate],
    database=None,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _lossless(scheme: Any, case: tuple[ss.Shape, Any], exact: bool) -> bool:
    error = ss.lossless_error(scheme, case[1], case[0])
    return bool(error == 0) if exact else bool(error <= 1e-12)


@pytest.mark.parametrize("exact", [True, False], ids=["fraction", "float"])
@pytest.mark.parametrize("name", LAW_MUTANTS)
def test_generic_property_finds_a_case_against_mutant(name: str, exact: bool) -> None:
    """The strategies of ``test_lossless.py`` (every supported catalogue shape) expose it."""
    mutant = MUTANTS[name]
    strategy = cases(mutant.scheme, exact=exact, max_trees=1000 if exact else 3000)
    case = find(strategy, lambda case: not _lossless(mutant.scheme, case, exact), settings=SEARCH)
    assert not _lossless(mutant.scheme, case, exact)
    assert _lossless(ss.SCHEMES[mutant.case.twin], case, exact)


def test_inclusive_accept_is_invisible_to_the_law_but_fails_boundary_noise() -> None:
    """``u = 0`` with ``p(x) = 0 < q(x)`` accepts an impossible token (sgl-project/sglang#35771);
    the law is unchanged because ``u = 0`` has probability zero."""
    mutant = MUTANTS["mutant-inclusive-accept"]
    assert mutant.caught_by == "boundary"
    for exact in (True, False):
        pair, shape = mutant.case.pair(exact), mutant.case.shape
        assert ss.lossless_error(mutant.scheme, pair, shape) == 0
        problems = boundary_violations(mutant.scheme, pair, shape)
        assert any("accepted token 1 has target probability 0" in p for p in problems), problems
        assert boundary_violations(ss.SCHEMES[mutant.case.twin], pair, shape) == []


def test_inclusive_accept_fails_the_generic_boundary_property_in_a_search() -> None:
    mutant = MUTANTS["mutant-inclusive-accept"]
    shape, pair = find(
        cases(mutant.scheme, exact=False, max_trees=100),
        lambda case: bool(boundary_violations(mutant.scheme, case[1], case[0])),
        settings=SEARCH,
    )
    assert boundary_violations(ss.SCHEMES["standard"], pair, shape) == []


# --------------------------------------------------------------------------- controls
@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_control_is_not_flagged(name: str) -> None:
    """NSS with noise shared between drafting and the target draw stays exact
    (reported as a bug in ml-explore/mlx-swift-lm#459, z-lab/dflash#77)."""
    scheme, case = CONTROLS[name]
    assert _lossless_error(scheme, case, exact=True) == 0
    assert _lossless_error(scheme, case, exact=False) <= 1e-12
    for seed in SWEEP_SEEDS:
        for shape in (ss.Shape.chain(1), ss.Shape.chain(2)):
            assert ss.lossless_error(scheme, Random(3, seed=seed, exact=True), shape) == 0


def test_shared_uniform_is_harmful_only_under_the_ratio_rule() -> None:
    """Shared drafting/verifying noise on one case (vllm-project/vllm#54282): standard + shared
    uniform is biased, NSS + shared is not."""
    scheme, case = CONTROLS["nss-shared-uniform"]
    assert _lossless_error(scheme, case, exact=True) == 0
    assert _lossless_error(MUTANTS["mutant-shared-uniform"].scheme, case, exact=True) != 0


# --------------------------------------------------------------------------- mutants are honest
@pytest.mark.parametrize("name", [*NAMES, *sorted(CONTROLS)])
def test_sampled_rule_matches_its_exact_law(name: str) -> None:
    """Each mutant's sampler implements the same bug as its law (fixed seed, chi-square)."""
    scheme, case = (
        CONTROLS[name] if name in CONTROLS else (MUTANTS[name].scheme, MUTANTS[name].case)
    )
    pair = case.pair(exact=False)
    law = ss.round_law(scheme, pair, case.shape)
    counts = sampled_counts(scheme, pair, case.shape, rounds=3000, seed=zlib.crc32(name.encode()))
    pvalue = chi_square_pvalue(counts, law)
    assert pvalue > ALPHA, f"{name}: sampler and law disagree (p = {pvalue:.2e})"


def test_block_without_the_denominator_guard_is_caught() -> None:
    """w = 1 and S = 0 happen when draft == target; the guard sets h = 1. Without it, 0/0 puts a
    NaN into the block probabilities (floats) or raises ZeroDivisionError (Fractions). Its
    coefficient is 0 in exact arithmetic, so the law hides it: check the probabilities."""
    shape = ss.Shape.chain(3)
    floats = ss.pairs.Stationary([0.5, 0.3, 0.2], [0.5, 0.3, 0.2])
    exact = ss.pairs.Stationary([F(1, 2), F(3, 10), F(1, 5)], [F(1, 2), F(3, 10), F(1, 5)])
    for pair in (floats, exact):
        tree = next(iter(shape.enumerate(pair)))[0]
        path = list(range(tree.num_nodes))
        tabs = tables(pair, tree)
        _, accept = ss.SCHEMES["block"].block_probabilities(tree, path, *tabs)
        assert all(0 <= h <= 1 for h in accept), accept
        if pair is exact:
            assert ss.lossless_error("block", pair, shape) == 0
            with pytest.raises(ZeroDivisionError):
                BlockNoDenominatorGuard().block_probabilities(tree, path, *tabs)
        else:
            with np.errstate(all="ignore"):
                _, bad = BlockNoDenominatorGuard().block_probabilities(tree, path, *tabs)
            assert any(np.isnan(float(h)) for h in bad)
