"""The level walk traces whole under ``torch.compile(fullgraph=True)`` on CPU: no graph break
(no host synchronisation, no Python branch on tensor values) in :meth:`NodeLowering.walk` and
the rules it calls, and the compiled walk gives the eager verdicts (float64, same noise).

Host-planned lowerings (``ot_optimal``, ``ot_binned``, ``khisti``, ResiSpec's default
``Optimised`` policy) plan on the host by design and are not traced (their module docstrings
say why). Compiling takes a minute or more on a small CPU, hence ``slow``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specsampling as ss
from specsampling import gpu as ssg
from specsampling.gpu.schemes import resispec as lowered
from specsampling.schemes import resispec as reference
from specsampling.schemes import tables

pytestmark = pytest.mark.slow


def rounds(shapes: tuple[ss.Shape, ...], grafted: bool = False):
    """Three trees of each shape (small: compile time); ``grafted``: a guess grafted into each
    (following its first drawn token, then leaving the drawn tree)."""
    pair = ss.pairs.Random(6, seed=0)
    rng = np.random.default_rng(0)
    trees = [shape.draft(pair, rng) for shape in shapes for _ in range(3)]
    if grafted:
        trees = [tree.graft([tree.tokens[1], 5, 4]) for tree in trees]
    batch = ssg.TreeBatch.from_trees(trees)
    target, draft = ssg.tables_batch(*zip(*(tables(pair, tree) for tree in trees), strict=True))
    noise = ssg.Noise.from_reference([ss.Noise.draw(rng, tree.num_nodes) for tree in trees])
    return batch, target, draft, noise


CASES = [
    (ssg.get_lowering("standard"), (ss.Shape.chain(3), ss.Shape.chain(1)), False),
    (lowered.ResiSpec(reference.Greedy()), (ss.Shape.star(2),), False),
    (ssg.get_lowering("specinfer"), (ss.Shape.chain(2), ss.Shape.star(2)), True),
]


@pytest.mark.parametrize(
    "lowering, shapes, grafted", CASES, ids=["standard", "resispec-greedy", "specinfer-grafted"]
)
def test_walk_compiles_without_graph_breaks(lowering, shapes, grafted) -> None:
    batch, target, draft, noise = rounds(shapes, grafted)
    assert (batch.guesses is not None) == grafted
    torch._dynamo.reset()
    compiled = torch.compile(lowering.walk, fullgraph=True)  # raises on any graph break
    got = compiled(batch, target, draft, noise)
    expected = lowering.walk(batch, target, draft, noise)
    assert torch.equal(got.node, expected.node) and torch.equal(got.token, expected.token)
    assert torch.equal(got.tokens, expected.tokens)
    assert torch.equal(got.num_emitted, expected.num_emitted)


def test_optimised_policy_is_the_host_step_the_docs_name() -> None:
    """The negative control: ResiSpec's default policy plans on the host, so a full-graph
    compile of its walk must fail (if this ever traces, update the docstrings)."""
    batch, target, draft, noise = rounds((ss.Shape.star(3),))
    resispec = lowered.ResiSpec(reference.Optimised())
    torch._dynamo.reset()
    with pytest.raises(Exception):  # noqa: B017 - dynamo's error type varies across versions
        torch.compile(resispec.walk, fullgraph=True)(batch, target, draft, noise)
