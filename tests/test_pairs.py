"""Model pairs: Stationary, Table and the seeded Random pair with its deliberate edge cases."""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from specsampling.pairs import ModelPair, Random, Stationary, Table


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
