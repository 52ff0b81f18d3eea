"""The path-wise comparison of a torch lowering with its numpy reference, shared by the
``tests/test_gpu_*.py`` files: run one mixed batch through the lowering and list the rows whose
verdict, emitted path or ``-1`` padding differ from the reference's; and the hypothesis rounds
(drawn pairs, trees of given shapes, drawn and boundary uniforms) they feed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

import specsampling as ss
import specsampling.gpu as ssg
from proofs_tests.strategies import model_pairs
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes import tables

#: One round: a tree, its target and draft tables ``(num_nodes, V)`` and its noise.
Round = tuple[ss.DraftTree, np.ndarray, np.ndarray, ss.Noise]


def run_lowering(
    lowering: Any, rounds: list[Round], device: str = "cpu", pad: float = 0.0
) -> ssg.Verified:
    """``ssg.verify`` on one batch of ``rounds`` (padding table rows filled with ``pad``)."""
    batch = ssg.TreeBatch.from_trees([r[0] for r in rounds], device=device)
    target, draft = ssg.tables_batch(
        [r[1] for r in rounds], [r[2] for r in rounds], device=device, pad=pad
    )
    noise = ssg.Noise.from_reference([r[3] for r in rounds], device=device)
    return ssg.verify(lowering, batch, target, draft, noise)


def mismatches(lowering: Any, rounds: list[Round], device: str = "cpu", pad: float = 0.0) -> list:
    """Rows whose lowered verdict, emitted tokens or ``-1`` tail differ from the reference's
    (``get_lowering(lowering).reference_scheme``: a policy-specific ResiSpec included)."""
    reference = ssg.get_lowering(lowering).reference_scheme
    out = run_lowering(lowering, rounds, device, pad)
    got = list(zip(out.node.tolist(), out.token.tolist(), strict=True))
    tokens, counts = out.tokens.tolist(), out.num_emitted.tolist()
    bad = []
    for row, (tree, target, draft, noise) in enumerate(rounds):
        expected = tuple(reference.verify(tree, target, draft, noise))
        path = (*tree.prefix(expected[0]), expected[1])
        tail = set(tokens[row][counts[row] :]) - {-1}
        if got[row] != expected or tuple(tokens[row][: counts[row]]) != path or tail:
            bad.append((row, tree, got[row], expected))
    return bad


@st.composite
def hypothesis_rounds(
    draw: Any,
    shapes: Sequence[ss.Shape],
    max_vocab: int = 4,
    boundary: tuple[float, ...] = (0.0, LARGEST_BELOW_ONE, 0.5),
    max_trees: int = 5,
) -> list[Round]:
    """Trees of ``shapes`` over a drawn pair (zeros, one-hot, p == q, disjoint supports; small
    vocabularies give i.i.d. duplicates), with drawn and ``boundary`` uniforms."""
    vocab = draw(st.integers(2, max_vocab))
    pair = draw(model_pairs(vocab, max(s.depth for s in shapes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    uniform = st.one_of(
        st.sampled_from(boundary), st.floats(0.0, 1.0, exclude_max=True, allow_nan=False)
    )
    rounds = []
    for shape in draw(st.lists(st.sampled_from(list(shapes)), min_size=1, max_size=max_trees)):
        tree = shape.draft(pair, rng)
        lanes = st.lists(uniform, min_size=tree.num_nodes, max_size=tree.num_nodes)
        noise = ss.Noise.checked(draw(lanes), draw(lanes), tree.num_nodes)
        rounds.append((tree, *tables(pair, tree), noise))
    return rounds
