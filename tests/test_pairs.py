"""Model pairs: Stationary, Table and the seeded Random pair with its deliberate edge cases."""

from __future__ import annotations

import itertools
import re
from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from specsampling.pairs import ModelPair, Random, Stationary, Table, check_model_pair


def _all_prefixes(vocab_size, max_length):
    for length in range(max_length + 1):
        yield from itertools.product(range(vocab_size), repeat=length)


def test_random_is_deterministic_in_seed_and_prefix():
    prefixes = list(_all_prefixes(3, 3))
    first, second = Random(3, seed=11), Random(3, seed=11)
    # Query in different orders: rows must not depend on the cache or on call history.
    for prefix in prefixes:
        first.draft(prefix)
    for prefix in reversed(prefixes):
        np.testing.assert_array_equal(second.target(prefix), first.target(prefix))
        np.testing.assert_array_equal(second.draft(prefix), first.draft(prefix))
    # Lists and numpy ints name the same prefix as tuples of ints.
    np.testing.assert_array_equal(first.target([1, 2]), first.target((np.int64(1), 2)))


def test_random_seeds_and_prefixes_differ():
    rows = {seed: Random(5, seed=seed).target(()) for seed in range(10)}
    for a, b in itertools.combinations(rows, 2):
        assert not np.array_equal(rows[a], rows[b]), (a, b)
    pair = Random(5, seed=0)
    assert not np.array_equal(pair.target((0,)), pair.target((1,)))
    assert not np.array_equal(pair.target((0,)), pair.target((0, 0)))


def test_random_rows_are_distributions_with_the_declared_edge_cases():
    pair = Random(5, seed=3)
    zeros = equal = one_hot = 0
    for prefix in _all_prefixes(5, 3):  # 156 prefixes
        target, draft = pair.target(prefix), pair.draft(prefix)
        for row in (target, draft):
            assert row.shape == (5,) and row.dtype == np.float64
            assert np.all(row >= 0) and abs(row.sum() - 1) < 1e-12
            assert np.count_nonzero(row) >= 1
        zeros += bool(np.any(target == 0) or np.any(draft == 0))
        equal += bool(np.array_equal(target, draft))
        # Near one-hot: one token holds almost all the mass, every other token keeps a sliver.
        one_hot += any(row.max() > 1 - 1e-6 and np.all(row > 0) for row in (target, draft))
    assert zeros >= 20, zeros
    assert equal >= 3, equal
    assert one_hot >= 3, one_hot


def test_random_exact_rows_are_fractions_summing_to_one():
    pair = Random(4, seed=5, exact=True)
    seen_zero = seen_equal = False
    for prefix in _all_prefixes(4, 2):
        for row in (pair.target(prefix), pair.draft(prefix)):
            assert row.dtype == object
            assert all(isinstance(x, F) and x >= 0 for x in row)
            assert sum(row) == 1
            seen_zero |= any(x == 0 for x in row)
        seen_equal |= bool(np.all(pair.target(prefix) == pair.draft(prefix)))
    assert seen_zero and seen_equal


def test_random_exact_pair_is_lossless_exactly():
    pair = Random(3, seed=4, exact=True)
    assert ss.lossless_error("specinfer", pair, ss.Shape.paths(2, 1)) == 0


def test_random_repr_and_size():
    pair = Random(vocab_size=6, seed=2)
    assert pair.vocab_size == 6
    assert "seed=2" in repr(pair) and "vocab_size=6" in repr(pair)
    assert isinstance(pair, ModelPair)


def test_table_lookup_and_missing_prefix():
    pair = Table({(): ([1.0, 0.0], [0.5, 0.5]), (np.int64(0),): ([0.25, 0.75], [0.5, 0.5])})
    assert pair.vocab_size == 2
    np.testing.assert_array_equal(pair.target(()), [1.0, 0.0])
    np.testing.assert_array_equal(pair.target([0]), [0.25, 0.75])
    np.testing.assert_array_equal(pair.draft((0,)), [0.5, 0.5])
    with pytest.raises(KeyError, match=r"\(1, 2\)"):
        pair.target((1, 2))
    with pytest.raises(KeyError, match=r"\(1,\)"):
        pair.draft([1])
    assert isinstance(pair, ModelPair)


def test_table_rejects_empty_mapping():
    with pytest.raises(ValueError, match="mapping"):
        Table({})


def test_table_missing_prefix_surfaces_in_the_engine():
    pair = Table({(): ([0.5, 0.5], [0.5, 0.5])})
    with pytest.raises(KeyError, match=r"prefix \(\d,\)"):
        ss.round_law("standard", pair, ss.Shape.chain(1))


def test_stationary_is_prefix_independent():
    pair = Stationary([F(1, 3), F(2, 3)], [F(1, 2), F(1, 2)])
    assert pair.vocab_size == 2
    assert pair.target(()) is pair.target((1, 0, 1))
    assert pair.draft(()).dtype == object
    assert list(pair.draft((5,))) == [F(1, 2), F(1, 2)]
    assert "Stationary" in repr(pair)
    assert isinstance(pair, ModelPair)


def test_stationary_rejects_mixed_exact_and_float():
    with pytest.raises(ValueError, match="both exact"):
        Stationary([F(1, 2), F(1, 2)], [0.5, 0.5])
    with pytest.raises(ValueError, match="both exact"):
        Stationary([0.5, 0.5], [F(1, 2), F(1, 2)])


def test_stationary_with_integer_entries_is_float():
    pair = Stationary([1, 0], [0, 1])
    assert pair.target(()).dtype == np.float64


# ---------------------------------------------------------------- bad input

HALF = [0.5, 0.5]


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ((HALF, HALF), r"Stationary\(target, draft\)"),
        ([HALF, HALF], r"Stationary\(target, draft\)"),
        (np.array([HALF, HALF]), r"Stationary\(target, draft\)"),
        ({(): (HALF, HALF)}, r"Table\(\{prefix: \(target, draft\)"),
        (None, "Stationary"),
        ("nss", "Stationary"),
        (Stationary, "instance"),
    ],
    ids=["tuple", "list", "array", "dict", "None", "str", "class"],
)
def test_check_model_pair_refuses_with_a_hint(value, hint):
    with pytest.raises(TypeError, match=r"^pair: expected a model pair") as info:
        check_model_pair(value)
    assert re.search(hint, str(info.value))
    with pytest.raises(TypeError, match=r"^draft_from: expected a model pair"):
        check_model_pair(value, "draft_from")


def test_check_model_pair_passes_pairs_through():
    for pair in (Stationary(HALF, HALF), Table({(): (HALF, HALF)}), Random(3)):
        assert check_model_pair(pair) is pair

    class NoSize:
        vocab_size = 0

        def target(self, prefix):
            return HALF

        def draft(self, prefix):
            return HALF

    with pytest.raises(ValueError, match=r"pair\.vocab_size"):
        check_model_pair(NoSize())


def test_swapped_refuses_non_pairs_with_the_hint():
    with pytest.raises(TypeError, match=r"target_from: .*Stationary\(target, draft\)"):
        ss.pairs.Swapped((HALF, HALF))
    with pytest.raises(TypeError, match="draft_from"):
        ss.pairs.Swapped(Random(2), {(): (HALF, HALF)})


@pytest.mark.parametrize(
    ("mapping", "error", "message"),
    [
        ([((), (HALF, HALF))], TypeError, "mapping: expected a dict"),
        ({"ab": (HALF, HALF)}, TypeError, "keys are prefixes.*'ab'"),
        ({0: (HALF, HALF)}, TypeError, "keys are prefixes.*int 0"),
        ({None: (HALF, HALF)}, TypeError, "keys are prefixes"),
        ({(0.5,): (HALF, HALF)}, ss.InvalidDistribution, r"mapping\[\(0\.5,\)\].*integers"),
        ({(5,): (HALF, HALF)}, ss.InvalidDistribution, "id 5 out of range"),
        ({(-1,): (HALF, HALF)}, ss.InvalidDistribution, "id -1 out of range"),
        ({(): HALF}, ValueError, "pair of distributions, got two numbers"),
        ({(): (HALF, HALF, HALF)}, ValueError, "got tuple of length 3"),
        ({(): HALF[0]}, ValueError, r"mapping\[\(\)\]: expected a \(target, draft\)"),
        ({(): ([F(1, 2), F(1, 2)], HALF)}, ValueError, "not mixed"),
        (
            {(): (HALF, HALF), (0,): ([F(1, 2), F(1, 2)], [F(1, 2), F(1, 2)])},
            ValueError,
            r"mapping\[\(0,\)\].*not mixed",
        ),
    ],
)
def test_table_refuses_malformed_mappings(mapping, error, message):
    with pytest.raises(error, match=message):
        Table(mapping)


def test_random_exact_must_be_a_bool():
    with pytest.raises(TypeError, match="exact"):
        Random(3, exact="no")


def test_stationary_and_table_take_a_tolerance():
    off = [0.5, 0.5 + 4e-4]
    for make in (
        lambda **kw: Stationary(off, HALF, **kw),
        lambda **kw: Table({(): (off, HALF)}, **kw),
    ):
        with pytest.raises(ss.InvalidDistribution, match=r"mass is 1\.0004, .*tolerance=0\.001"):
            make()
        pair = make(tolerance=1e-3)
        assert pair.target(()).sum() == pytest.approx(1, abs=1e-15)
