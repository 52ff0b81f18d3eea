"""Drafter-invariance checks (``specsampling.invariance``) and their place in ``certify``.

The checks must pass for the strong couplings, must flag the active-set GLS verifier (which is
only conditionally invariant) and must catch the mutant that keys noise by draft step within a
round instead of by absolute position (``docs/watermark.md``, "Keyed noise"), through
``certify`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import specsampling as ss
from specsampling.certify import certify
from specsampling.invariance import (
    conditional_violations,
    drafters,
    strong_violations,
)
from specsampling.keyed import KeyedNoise
from specsampling.pairs import Perturbed
from specsampling.schemes.gumbel import Poisson

STRONG = ["gumbel", "poisson", "gls_strong"]
PAIR = ss.pairs.Random(5, seed=3)


def _shapes(name: str) -> list[ss.Shape]:
    candidates = [
        ss.Shape.chain(3),
        ss.Shape.star(2, replacement=False),
        ss.Shape.branching((2, 2)),
        ss.Shape.paths(3, 2),
        ss.Shape.star(3),
    ]
    return [s for s in candidates if ss.SCHEMES[name].supports(s)]


@pytest.mark.parametrize("name", STRONG)
@pytest.mark.parametrize("window", [None, 2])
def test_strong_couplings_emit_target_only_decoding(name: str, window: int | None) -> None:
    scheme = ss.SCHEMES[name]
    assert scheme.strong_invariance
    for shape in _shapes(name):
        assert strong_violations(scheme, PAIR, shape, window=window, length=20) == []


def test_active_set_gls_is_not_strongly_invariant_but_conditionally() -> None:
    gls = ss.SCHEMES["gls"]
    assert not gls.strong_invariance
    assert strong_violations(gls, PAIR, ss.Shape.paths(3, 2)), "the check has no teeth"
    problems, compared = conditional_violations(gls, PAIR, ss.Shape.paths(3, 2))
    assert problems == [] and compared >= 20


def test_the_drafters_differ_and_the_perturbation_is_small() -> None:
    found = drafters(PAIR)
    drafts = [np.asarray(p.draft((1, 2)), dtype=float) for p in found.values()]
    assert not np.allclose(drafts[0], drafts[2]) and not np.allclose(drafts[1], drafts[2])
    moved = np.asarray(Perturbed(PAIR).draft((1,)), dtype=float)
    assert 0 < np.abs(moved - PAIR.draft((1,))).max() < 1e-6
    assert moved.sum() == pytest.approx(1.0, abs=1e-15)


@dataclass(frozen=True)
class _StepKeyed(KeyedNoise):
    """Mutant noise: keyed by the draft step within the round, not the absolute position."""

    round_start: int = 0

    def context(self, sequence: Any) -> int:
        return int(ss.keyed.position_context(len(sequence) - self.round_start))


class _StepKeyedPoisson(Poisson):
    name = "poisson-step-keyed"

    def sample_keyed(self, pair: Any, shape: ss.Shape, noise: KeyedNoise, prefix: Any = ()) -> Any:
        mutant = _StepKeyed(noise.key, noise.window, noise.start, len(tuple(prefix)))
        return super().sample_keyed(pair, shape, mutant, prefix)


def test_certify_catches_noise_keyed_by_draft_step() -> None:
    report = certify(["poisson", _StepKeyedPoisson()])
    good, mutant = report.schemes
    assert good.certified and good.structural_checks > 0
    assert not mutant.certified
    kinds = {v.kind for v in mutant.violations}
    assert kinds == {"invariance"}, kinds  # its law is still exact: only invariance breaks
    assert mutant.max_float_error <= 1e-12


def test_keyed_generation_refuses_non_keyed_schemes_and_bad_windows() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="key"):
        ss.generate("specinfer", PAIR, ss.Shape.star(2), 5, rng, key=3)
    with pytest.raises(ValueError, match="window"):
        ss.generate("gumbel", PAIR, ss.Shape.chain(2), 5, rng, window=2)
    with pytest.raises(ValueError, match="window"):
        ss.generate("gumbel", PAIR, ss.Shape.chain(2), 5, rng, key=3, window=0)
