"""Draft trees and shapes: construction, validation and the exact enumeration of drafts.

The chi-square test that sampled trees follow the enumeration weights lives in
``test_sampling_stats.py`` (it shares that file's false-positive budget).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from specsampling import DraftTree, Shape
from specsampling.pairs import Stationary, Table

# ----------------------------------------------------------------------------- DraftTree


def test_from_draws_merges_repeated_tokens():
    tree = DraftTree.from_draws([(0, 2), (0, 1), (0, 2), (1, 0), (1, 0), (2, 2)])
    assert tree.tokens == (-1, 2, 1, 0, 2)
    assert tree.parents == (-1, 0, 0, 1, 2)
    assert tree.candidates == ((1, 2, 1), (3, 3), (4,), (), ())
    assert tree.children(0) == (1, 2)
    assert tree.children(1) == (3,)
    assert tree.num_nodes == 5
    assert [tree.prefix(n) for n in range(5)] == [(), (2,), (1,), (2, 0), (1, 2)]
    assert [tree.depth(n) for n in range(5)] == [0, 1, 1, 2, 2]
    assert tree.max_depth == 2
    assert tree.child_with_token(0, 1) == 2
    assert tree.child_with_token(0, 0) is None
    assert tree.child_with_token(1, 0) == 3


def test_chain_and_root_only():
    chain = DraftTree.chain([3, 3, 1])
    assert chain.tokens == (-1, 3, 3, 1)
    assert chain.parents == (-1, 0, 1, 2)
    assert chain.prefix(3) == (3, 3, 1)
    assert chain.max_depth == 3
    root = DraftTree.from_draws([])
    assert root.num_nodes == 1 and root.candidates == ((),) and root.max_depth == 0


def test_default_candidates_are_children_in_index_order():
    tree = DraftTree(parents=(-1, 0, 0, 1), tokens=(-1, 5, 4, 0))
    assert tree.candidates == ((1, 2), (3,), (), ())
    assert tree == DraftTree.from_draws([(0, 5), (0, 4), (1, 0)])


def test_trees_are_immutable_and_hashable():
    tree = DraftTree.chain([1, 2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        tree.tokens = (-1, 0, 0)
    assert hash(tree) == hash(DraftTree.chain([1, 2]))
    assert tree != DraftTree.chain([2, 1])
    # Candidate order (drafting order) distinguishes trees.
    assert DraftTree.from_draws([(0, 1), (0, 2)]) != DraftTree.from_draws([(0, 2), (0, 1)])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"parents": (), "tokens": ()}, "root"),
        ({"parents": (0,), "tokens": (-1,)}, "root"),
        ({"parents": (-1,), "tokens": (3,)}, "root"),
        ({"parents": (-1, 0), "tokens": (-1,)}, "length"),
        ({"parents": (-1, 1), "tokens": (-1, 0)}, "parent"),
        ({"parents": (-1, 0, 2), "tokens": (-1, 0, 1)}, "parent"),
        ({"parents": (-1, 0, -1), "tokens": (-1, 0, 1)}, "parent"),
        ({"parents": (-1, 0), "tokens": (-1, -3)}, "negative token"),
        ({"parents": (-1, 0, 0), "tokens": (-1, 4, 4)}, "repeats token"),
        ({"parents": (-1, 0), "tokens": (-1, 1), "candidates": ((1,),)}, "one entry per node"),
        ({"parents": (-1, 0), "tokens": (-1, 1), "candidates": ((), ())}, "exactly its children"),
        ({"parents": (-1, 0), "tokens": (-1, 1), "candidates": ((1,), (1,))}, "exactly its"),
    ],
)
def test_tree_validation(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        DraftTree(**kwargs)


def test_from_draws_rejects_unknown_parent():
    with pytest.raises(ValueError, match="parent 2"):
        DraftTree.from_draws([(0, 1), (2, 0)])
    with pytest.raises(ValueError, match="parent -1"):
        DraftTree.from_draws([(-1, 0)])


# ----------------------------------------------------------------------------- Shapes

FULL = Stationary([F(1, 10), F(2, 10), F(3, 10), F(4, 10)], [F(1, 4)] * 4)


def _draws_per_node(tree):
    return [len(c) for c in tree.candidates]


# (shape, depth, number of draw steps, trees of a full-support vocab-4 pair)
SHAPES = [
    (Shape.chain(1), 1, 1, 4),
    (Shape.chain(3), 3, 3, 4**3),
    (Shape.star(3), 1, 3, 4**3),
    (Shape.star(3, replacement=False), 1, 3, 4 * 3 * 2),
    (Shape.star(4, replacement=False), 1, 4, 4 * 3 * 2 * 1),
    (Shape.paths(2, 2), 2, 4, 4**4),
    (Shape.branching((2, 1)), 2, 4, 4 * 3 * 4 * 4),
    (Shape.branching((2, 2), replacement=True), 2, 6, 4**6),
    (Shape.delayed(2, trunk=1, branch=1), 2, 3, 4**3),
    (Shape.delayed(2, trunk=0, branch=2), 2, 4, 4**4),
    (Shape.top((2, 1)), 2, 4, 1),
    (Shape.top((3,)), 1, 3, 1),
]


@pytest.mark.parametrize(("shape", "depth", "steps", "count"), SHAPES, ids=lambda x: repr(x))
def test_enumeration_is_exact_and_complete(shape, depth, steps, count):
    trees = list(shape.enumerate(FULL))
    assert len(trees) == count
    assert shape.depth == depth
    assert len(shape.steps) == steps
    weights = [w for _, w in trees]
    assert all(isinstance(w, (F, int)) and w > 0 for w in weights)
    assert sum(weights) == 1
    for tree, _ in trees:
        assert tree.max_depth == depth
        assert sum(_draws_per_node(tree)) == steps
    assert len({tree for tree, _ in trees}) == count


def test_star_weights_by_hand():
    pair = Stationary([F(1, 2), F(1, 2), F(0)], [F(1, 2), F(1, 3), F(1, 6)])
    iid = dict(Shape.star(2).enumerate(pair))
    assert iid[DraftTree.from_draws([(0, 0), (0, 0)], law="iid")] == F(1, 4)
    assert iid[DraftTree.from_draws([(0, 1), (0, 2)], law="iid")] == F(1, 18)
    wo = dict(Shape.star(2, replacement=False).enumerate(pair))
    # P(1 then 2) = q(1) * q(2) / (1 - q(1)) = 1/3 * 1/6 * 3/2
    assert wo[DraftTree.from_draws([(0, 1), (0, 2)], law="without")] == F(1, 12)
    assert wo[DraftTree.from_draws([(0, 0), (0, 1)], law="without")] == F(1, 2) * F(2, 3)
    assert DraftTree.from_draws([(0, 0), (0, 0)], law="without") not in wo


def test_branching_counts_per_depth():
    pair = Stationary([F(1, 3)] * 3, [F(1, 2), F(1, 3), F(1, 6)])
    trees = list(Shape.branching((3, 2)).enumerate(pair))
    assert len(trees) == 3 * 2 * 1 * (3 * 2) ** 3
    assert sum(w for _, w in trees) == 1
    for tree, _ in trees:
        depth_one = tree.candidates[0]
        assert len(depth_one) == 3 and len(set(depth_one)) == 3
        for child in depth_one:
            assert len(tree.candidates[child]) == 2 and len(set(tree.candidates[child])) == 2
        assert tree.num_nodes == 1 + 3 + 6


def test_paths_share_prefixes_in_a_trie():
    one_hot_draft = Stationary([F(1, 2), F(1, 2)], [F(0), F(1)])
    ((tree, weight),) = Shape.paths(3, 2).enumerate(one_hot_draft)
    assert weight == 1
    assert tree.tokens == (-1, 1, 1)
    assert tree.candidates == ((1, 1, 1), (2, 2, 2), ())


SPARSE = Stationary(
    [F(1, 4), F(1, 4), F(1, 4), F(1, 4)],
    [F(1, 3), F(0), F(2, 3), F(0)],
)


@pytest.mark.parametrize(
    ("shape", "count"),
    [
        (Shape.star(3, replacement=False), 2),
        (Shape.star(4, replacement=False), 2),
        (Shape.branching((3, 3)), 2**3),  # two orders at the root and at each of its 2 children
    ],
    ids=repr,
)
def test_without_replacement_stops_at_the_draft_support(shape, count):
    trees = list(shape.enumerate(SPARSE))
    assert sum(w for _, w in trees) == 1
    assert len(trees) == count
    for tree, weight in trees:
        assert weight > 0
        for node in range(tree.num_nodes):
            if tree.candidates[node]:
                assert sorted(tree.tokens[c] for c in tree.candidates[node]) == [0, 2]
        assert all(SPARSE.draft(())[t] > 0 for t in tree.tokens[1:])


def test_iid_children_keep_multiplicity():
    point = Stationary([F(1, 3)] * 3, [F(0), F(1), F(0)])
    ((tree, weight),) = Shape.star(3).enumerate(point)
    assert weight == 1
    assert tree.candidates[0] == (1, 1, 1)
    assert tree.children(0) == (1,)
    counts = {}
    for tree, weight in Shape.star(2).enumerate(SPARSE):
        counts[tree.candidates[0]] = counts.get(tree.candidates[0], 0) + weight
    assert counts[(1, 1)] == F(1, 9) + F(4, 9)  # (0, 0) and (2, 2) both give one node twice
    assert counts[(1, 2)] == F(2, 9) + F(2, 9)


def test_zero_probability_tokens_are_never_drafted():
    for shape in (Shape.chain(2), Shape.star(3), Shape.paths(2, 2), Shape.top((4,))):
        for tree, weight in shape.enumerate(SPARSE):
            assert weight > 0
            assert set(tree.tokens[1:]) <= {0, 2}, (shape, tree)


def test_top_picks_the_most_probable_draft_tokens():
    pair = Stationary([0.25] * 4, [0.1, 0.4, 0.4, 0.1])
    ((tree, weight),) = Shape.top((3,)).enumerate(pair)
    assert weight == 1
    # Ties at 0.4 and at 0.1 go to the lowest id.
    assert [tree.tokens[c] for c in tree.candidates[0]] == [1, 2, 0]
    ((tree, _),) = Shape.top((9,)).enumerate(SPARSE)
    assert [tree.tokens[c] for c in tree.candidates[0]] == [2, 0]


def test_top_is_per_node_and_deterministic():
    pair = Table(
        {
            (): ([0.5, 0.5, 0.0], [0.2, 0.5, 0.3]),
            (1,): ([0.5, 0.5, 0.0], [0.6, 0.1, 0.3]),
            (2,): ([0.5, 0.5, 0.0], [0.0, 0.0, 1.0]),
        }
    )
    ((tree, weight),) = Shape.top((2, 2)).enumerate(pair)
    assert weight == 1
    assert tree.prefix(tree.candidates[0][0]) == (1,)
    prefixes = [tree.prefix(n) for n in range(1, tree.num_nodes)]
    assert prefixes == [(1,), (2,), (1, 0), (1, 2), (2, 2)]
    rng = np.random.default_rng(0)
    assert all(Shape.top((2, 2)).draft(pair, rng) == tree for _ in range(20))


@pytest.mark.parametrize("shape", LAW_SHAPES, ids=repr)
def test_drafted_trees_are_enumerated(shape):
    pair = ss.pairs.Random(3, seed=2)
    prefix = (1,)
    support = {tree for tree, weight in shape.enumerate(pair, prefix) if weight > 0}
    rng = np.random.default_rng(123)
    for _ in range(200):
        tree = shape.draft(pair, rng, prefix)
        assert tree in support, tree


def test_delayed_tree_has_a_trunk_then_branches():
    for tree, _ in Shape.delayed(3, trunk=2, branch=1).enumerate(FULL):
        assert tree.candidates[0] == (1,) and tree.candidates[1] == (2,)
        assert len(tree.candidates[2]) == 3
        assert tree.max_depth == 3


def test_shape_flags_and_repr():
    assert Shape.chain(2).is_chain and Shape.star(1).is_chain and Shape.paths(1, 3).is_chain
    assert not Shape.star(2).is_chain and not Shape.top((1, 1)).is_chain
    assert Shape.star(2, replacement=False).law == "without"
    assert Shape.paths(2, 2).law == "iid"
    assert Shape.top((2,)).law == "deterministic"
    assert repr(Shape.star(4, replacement=False)) == "star(4, replacement=False)"
    assert repr(Shape.delayed(2, trunk=1, branch=2)) == "delayed(2, trunk=1, branch=2)"
    assert Shape.paths(2, 3) == Shape.paths(2, 3) and Shape.paths(2, 3) != Shape.paths(3, 2)


def test_enumeration_with_floats_sums_to_one():
    pair = ss.pairs.Random(4, seed=8)
    for shape in (Shape.paths(2, 2), Shape.branching((2, 2)), Shape.delayed(2, trunk=1, branch=1)):
        total = sum(w for _, w in shape.enumerate(pair, (0,)))
        assert abs(total - 1) < 1e-12
