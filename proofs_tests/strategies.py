"""Hypothesis strategies for the losslessness proofs, built by mapping and never by filtering.

Distributions are normalised random weights with edge cases mapped in (zeros, one-hot, masses
near ``1e-12``); target/draft pairs get special relations (equal, near-equal, disjoint supports,
one-hot target); model pairs are stationary, context-dependent tables or seeded random pairs;
shapes come from the catalogue (:mod:`proofs_tests.catalogue`) and the vocabulary is sized per
shape so that the number of draftable trees stays below a budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from hypothesis import strategies as st

import specsampling as ss
from proofs_tests.catalogue import MAX_TREES, MIN_VOCAB, SHAPES, max_vocab
from specsampling.pairs import ModelPair, Random, Stationary, Table

#: A mass "near 1e-12" (relative to weights of order one).
TINY_FLOAT, TINY_EXACT = 1e-12, Fraction(1, 10**12)

# Repeated entries weight the draw: generic cases find subtle bugs, edge cases find the rest.
DISTRIBUTION_KINDS = ("dense", "dense", "sparse", "one_hot", "tiny")
PAIR_RELATIONS = ("independent",) * 4 + ("equal", "near_equal", "disjoint", "one_hot_target")
PAIR_KINDS = ("stationary", "table", "random")


# --------------------------------------------------------------------------- shapes
def supported_shapes(scheme: Any, shapes: Sequence[ss.Shape] = SHAPES) -> dict[str, list[ss.Shape]]:
    """The catalogue shapes ``scheme`` supports, grouped by shape kind."""
    groups: dict[str, list[ss.Shape]] = {}
    for shape in shapes:
        if scheme.supports(shape):
            groups.setdefault(shape.kind, []).append(shape)
    return groups


def shapes_for(scheme: Any, shapes: Sequence[ss.Shape] = SHAPES) -> st.SearchStrategy[ss.Shape]:
    """A supported shape: first a kind (so every family is drawn), then a shape of that kind."""
    groups = supported_shapes(scheme, shapes)
    if not groups:
        raise ValueError(f"scheme {scheme.name!r} supports no catalogue shape")
    return st.sampled_from(sorted(groups)).flatmap(lambda kind: st.sampled_from(groups[kind]))


# --------------------------------------------------------------------------- distributions
def _normalise(weights: Sequence[Any], exact: bool) -> Any:
    if exact:
        mass = sum(weights, Fraction(0))
        return np.array([Fraction(w) / mass for w in weights], dtype=object)
    arr = np.asarray(weights, dtype=np.float64)
    return arr / arr.sum()


def one_hot(vocab: int, token: int, exact: bool = False) -> Any:
    """The point mass on ``token``."""
    return _normalise([int(t == token) for t in range(vocab)], exact)


@st.composite
def weights(draw: Any, vocab: int, exact: bool = False) -> list[Any]:
    """Positive weights: small integers (exact) or floats in ``[0.01, 1]``."""
    if exact:
        values = st.integers(1, 7)
    else:
        values = st.floats(0.01, 1.0, allow_nan=False, allow_infinity=False)
    result: list[Any] = draw(st.lists(values, min_size=vocab, max_size=vocab))
    return result


@st.composite
def distributions(draw: Any, vocab: int, exact: bool = False) -> Any:
    """A distribution over ``vocab`` tokens: dense, with zeros, one-hot or with tiny masses.

    The kept token ``keep`` always has a weight of order one, so nothing needs filtering.
    """
    kind = draw(st.sampled_from(DISTRIBUTION_KINDS))
    keep = draw(st.integers(0, vocab - 1))
    if kind == "one_hot":
        return one_hot(vocab, keep, exact)
    values = draw(weights(vocab, exact))
    if kind in ("sparse", "tiny"):
        marked = draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab))
        small: Any = 0 if kind == "sparse" else (TINY_EXACT if exact else TINY_FLOAT)
        values = [
            small if hit and i != keep else w
            for i, (w, hit) in enumerate(zip(values, marked, strict=True))
        ]
    return _normalise(values, exact)


@st.composite
def distribution_pairs(draw: Any, vocab: int, exact: bool = False) -> tuple[Any, Any]:
    """``(target, draft)`` with a drawn relation: independent, equal, near-equal, disjoint
    supports or a one-hot target."""
    relation = draw(st.sampled_from(PAIR_RELATIONS))
    if relation == "disjoint":
        order = draw(st.permutations(range(vocab)))
        cut = draw(st.integers(1, vocab - 1))
        values = draw(weights(vocab, exact))
        target = [values[t] if t in order[:cut] else 0 for t in range(vocab)]
        draft = [values[t] if t in order[cut:] else 0 for t in range(vocab)]
        return _normalise(target, exact), _normalise(draft, exact)
    target = draw(distributions(vocab, exact))
    if relation == "equal":
        return target, target.copy()
    if relation == "near_equal":
        other = draw(distributions(vocab, exact))
        eps: Any = Fraction(1, 10**6) if exact else 1e-9
        return target, _normalise(list(target + eps * other), exact)
    if relation == "one_hot_target":
        target = one_hot(vocab, draw(st.integers(0, vocab - 1)), exact)
    return target, draw(distributions(vocab, exact))


# --------------------------------------------------------------------------- model pairs
def prefixes(vocab: int, depth: int) -> list[tuple[int, ...]]:
    """Every token prefix of length ``0..depth``."""
    result: list[tuple[int, ...]] = []
    for length in range(depth + 1):
        result.extend(itertools.product(range(vocab), repeat=length))
    return result


def table(rows: Sequence[tuple[Any, Any]], vocab: int, depth: int, salt: int = 0) -> Table:
    """A :class:`Table` over every prefix up to ``depth``, cycling through ``rows`` by prefix."""
    mapping = {}
    for prefix in prefixes(vocab, depth):
        code = salt + len(prefix) + sum((t + 1) * 3**i for i, t in enumerate(prefix))
        mapping[prefix] = rows[code % len(rows)]
    return Table(mapping)


@st.composite
def model_pairs(draw: Any, vocab: int, depth: int, exact: bool = False) -> ModelPair:
    """A stationary pair, a context-dependent table covering every prefix up to ``depth``, or
    a seeded :class:`Random` pair."""
    kind = draw(st.sampled_from(PAIR_KINDS))
    if kind == "stationary":
        return Stationary(*draw(distribution_pairs(vocab, exact)))
    if kind == "random":
        return Random(vocab, seed=draw(st.integers(0, 2**32 - 1)), exact=exact)
    rows = draw(st.lists(distribution_pairs(vocab, exact), min_size=2, max_size=4))
    return table(rows, vocab, depth, salt=draw(st.integers(0, 10**6)))


@st.composite
def cases(
    draw: Any,
    scheme: Any,
    exact: bool = False,
    shapes: Sequence[ss.Shape] = SHAPES,
    max_trees: int = MAX_TREES,
) -> tuple[ss.Shape, ModelPair]:
    """``(shape, pair)``: a shape ``scheme`` supports and a pair over a vocabulary sized for it.

    The pair answers every prefix up to ``shape.depth``, all that one round and its lossless
    extension query.
    """
    shape = draw(shapes_for(scheme, shapes))
    vocab = draw(st.integers(MIN_VOCAB, max_vocab(shape, max_trees)))
    return shape, draw(model_pairs(vocab, shape.depth, exact))


@st.composite
def draft_trees(draw: Any, vocab: int, max_nodes: int = 8) -> ss.DraftTree:
    """An arbitrary draft tree (a trie, candidates possibly repeated): any drafting rule."""
    steps = st.tuples(st.integers(0, max_nodes), st.integers(0, vocab - 1))
    raw = draw(st.lists(steps, min_size=1, max_size=max_nodes))
    draws: list[tuple[int, int]] = []
    nodes: dict[tuple[int, int], int] = {}
    for parent, token in raw:
        key = (parent % (len(nodes) + 1), token)
        nodes.setdefault(key, len(nodes) + 1)
        draws.append(key)
    return ss.DraftTree.from_draws(draws)
