"""The one shape catalogue of the test suite: every test that needs shapes takes them from here.

* :data:`SHAPES`: every shape the losslessness properties draw from (depth <= 3, at most four
  drafts per node, enumerable over two tokens), with :func:`max_vocab` sizing the vocabulary;
* :data:`LAW_SHAPES`: one small shape per draw law and constructor, for per-scheme unit tests;
* :data:`LARGE_SHAPES`: bigger shapes, never enumerated, for refusal checks.

``specsampling certify`` keeps its own documented list (:func:`specsampling.certify.builtin_shapes`,
a library function cannot import the tests); :data:`CERTIFY_SHAPES` is that list.
"""

from __future__ import annotations

import itertools

import specsampling as ss
from specsampling.certify import builtin_shapes

MIN_VOCAB, MAX_VOCAB = 2, 6
#: Upper bound on the number of draftable trees one example may enumerate.
MAX_TREES = 3000


def max_vocab(shape: ss.Shape, max_trees: int = MAX_TREES, cap: int = MAX_VOCAB) -> int:
    """Largest vocabulary in ``[2, cap]`` whose tree count is within ``max_trees`` (at least 2)."""
    fitting = [v for v in range(MIN_VOCAB, cap + 1) if shape.count_trees(v) <= max_trees]
    return max(fitting, default=MIN_VOCAB)


def _all_widths(max_width: int = 4, max_depth: int = 3) -> list[tuple[int, ...]]:
    widths: list[tuple[int, ...]] = []
    for depth in range(1, max_depth + 1):
        widths.extend(itertools.product(range(1, max_width + 1), repeat=depth))
    return widths


def _catalogue() -> list[ss.Shape]:
    shapes = [ss.Shape.chain(n) for n in (1, 2, 3)]
    shapes += [ss.Shape.star(k, replacement=r) for k in range(1, 5) for r in (True, False)]
    shapes += [ss.Shape.paths(k, n) for k in range(1, 5) for n in (1, 2, 3)]
    for widths in _all_widths():
        shapes += [ss.Shape.branching(widths, replacement=r) for r in (False, True)]
        shapes.append(ss.Shape.top(widths))
        shapes.append(ss.Shape.greedy(widths))
    shapes += [
        ss.Shape.delayed(k, trunk=trunk, branch=branch)
        for k in range(1, 5)
        for trunk in (0, 1, 2)
        for branch in (1, 2, 3)
        if trunk + branch <= 3
    ]
    shapes += [ss.Shape.hub(depth) for depth in (1, 2, 3)]
    # A static catalogue, pruned once: shapes too large to enumerate even over two tokens.
    return [shape for shape in shapes if shape.count_trees(MIN_VOCAB) <= MAX_TREES]


#: Every shape under test: depth <= 3, at most 4 drafts per node, enumerable over 2 tokens.
SHAPES: tuple[ss.Shape, ...] = tuple(_catalogue())

#: One small shape per draw law and constructor (and a sampled chain).
LAW_SHAPES: tuple[ss.Shape, ...] = (
    ss.Shape.chain(2),
    ss.Shape.star(2),
    ss.Shape.star(2, replacement=False),
    ss.Shape.paths(2, 2),
    ss.Shape.branching((2, 1)),
    ss.Shape.delayed(2, trunk=1, branch=1),
    ss.Shape.top((2,)),
    ss.Shape.greedy((2,)),
    ss.Shape.hub(),
)

#: Shapes beyond the catalogue for the refusal checks (bigger, never enumerated there).
LARGE_SHAPES = (
    ss.Shape.chain(6),
    ss.Shape.star(8, replacement=True),
    ss.Shape.star(8, replacement=False),
    ss.Shape.paths(5, 4),
    ss.Shape.branching((3, 3, 3)),
    ss.Shape.branching((3, 3, 3), replacement=True),
    ss.Shape.branching((1, 1, 1, 1)),
    ss.Shape.delayed(6, trunk=3, branch=3),
    ss.Shape.delayed(1, trunk=2, branch=2),
    ss.Shape.top((4, 4, 4)),
    ss.Shape.top((1, 1)),
)

#: The shapes ``specsampling certify`` tries every scheme on.
CERTIFY_SHAPES: tuple[ss.Shape, ...] = builtin_shapes()
