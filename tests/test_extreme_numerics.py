"""Regression tests at numerical extremes of the reference: probabilities that underflow along a
path, subnormal draft entries whose ratio to the target overflows float64, enumeration counts
past Python's integer-to-string limit, and policy parameters at their boundaries."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import specsampling as ss
from specsampling.exact import _about
from specsampling.pairs import Stationary
from specsampling.schemes.resispec import ResiSpec
from specsampling.schemes.resispec_policy import ConstantRatio

KEYED = ("gumbel", "poisson", "gls", "gls_strong")


def _keyed_shape(name: str, width: int) -> ss.Shape:
    if name == "gumbel":
        return ss.Shape.chain(width)
    return ss.Shape.star(width, replacement=name != "poisson")


@pytest.mark.parametrize("name", KEYED)
def test_keyed_round_law_has_no_nan_where_a_path_underflows(name):
    """A path whose float64 mass underflows to 0 was queued and divided by its zero mass: NaN
    in the round law, and lossless_error hid it (max() skips a NaN that is not first)."""
    pair = Stationary([1e-200, 1 - 1e-200], [1e-200, 1 - 1e-200])
    shape = ss.Shape.chain(2) if name == "gumbel" else _keyed_shape(name, 1)
    emitted = ss.expected_emitted(name, pair, shape)
    assert math.isfinite(emitted) and emitted == pytest.approx(shape.depth + 1, abs=1e-12)
    assert ss.lossless_error(name, pair, shape) <= 1e-12
    law = ss.round_law(name, pair, shape)
    assert all(math.isfinite(float(p)) for p in law.values()) and law, law


def test_lossless_error_propagates_a_nan(monkeypatch):
    """A NaN in an emitted law is reported as NaN, wherever it falls (``max()`` keeps a NaN
    only when it comes first)."""
    from specsampling import exact

    target = {(t,): 0.125 for t in range(8)}
    for bad in range(8):
        emitted = dict(target) | {(bad,): math.nan}
        monkeypatch.setattr(exact, "extended_law", lambda *a, law=emitted, **k: law)
        monkeypatch.setattr(exact, "target_joint", lambda *a, **k: target)
        pair = Stationary([0.125] * 8, [0.125] * 8)
        assert math.isnan(ss.lossless_error("standard", pair, ss.Shape.chain(1))), bad


@pytest.mark.parametrize("name", ["gls", "gls_strong", "poisson"])
def test_keyed_laws_take_subnormal_draft_entries(name):
    """A subnormal draft entry made ``p / q`` overflow: ``math domain error`` (gls) and numpy's
    ``Maximum allowed size exceeded`` (poisson) instead of a law; the token, drafted with
    probability under 1e-300, is left out of the ratios."""
    target, draft = [1e-310, 0.5, 0.5], [0.5, 1e-310, 0.5]
    value = ss.acceptance(name, target, draft, 2)
    assert 0 <= value <= 1 and math.isfinite(value)
    law = ss.output_law(name, target, draft, 2)
    assert np.allclose(np.asarray(law, dtype=float), target, atol=1e-12)
    shape = _keyed_shape(name, 2)
    assert ss.lossless_error(name, Stationary(target, draft), shape) <= 1e-12


def test_enumeration_counts_past_4300_digits_are_refused_with_the_intended_message():
    """``_about`` printed the count with ``str()``, which refuses more than 4,300 digits."""
    assert _about(12345) == "1.2e+04" and _about(10**301) == "1e+301"
    assert _about(7 * 10**20000) == "1e+20000"
    with pytest.raises(ValueError, match=r"about 1e\+\d+ .*candidate tuples"):
        ss.acceptance("traversal", [0.5, 0.5], [0.5, 0.5], 20000)


def test_constant_ratio_checks_rho():
    """``rho=0`` gave a bare ZeroDivisionError (Fractions) or a misleading contract error."""
    for rho in (0, -1, math.inf, math.nan, True, "2"):
        with pytest.raises(ValueError, match="rho: expected None or a finite number > 0"):
            ConstantRatio(rho)
    scheme = ResiSpec(ConstantRatio(Fraction(3, 2)))
    half = [Fraction(1, 2), Fraction(1, 2)]
    assert isinstance(ss.acceptance(scheme, half, [Fraction(1, 4), Fraction(3, 4)], 2), Fraction)
