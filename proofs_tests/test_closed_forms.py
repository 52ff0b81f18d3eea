"""Closed-form calculators equal exact enumeration of the schemes' round laws.

Acceptance is computed here from the scheme's own outcomes, ``P(first emitted token is a drafted
root token)``, never through the calculator under test; with ``Fraction`` inputs the comparison
is exact equality.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st

import specsampling as ss
from proofs_tests.catalogue import SHAPES, max_vocab
from proofs_tests.oracles import enumerated_acceptance
from proofs_tests.strategies import (
    distribution_pairs,
    draft_trees,
    model_pairs,
    shapes_for,
)
from specsampling import calculators
from specsampling.ops import positive_part, residual, total
from specsampling.pairs import Stationary
from specsampling.schemes import tables

FLOAT_TOLERANCE = 1e-12
F = Fraction


def _agree(closed: Any, enumerated: Any, exact: bool) -> bool:
    if exact:
        return bool(closed == enumerated)
    return bool(abs(closed - enumerated) <= FLOAT_TOLERANCE)


@st.composite
def single_position(draw: Any, max_drafts: int = 4) -> tuple[Any, Any, int, bool]:
    """``(target, draft, num_drafts, exact)`` with ``vocab ** num_drafts`` kept small."""
    exact = draw(st.booleans())
    num_drafts = draw(st.integers(1, max_drafts))
    vocab = draw(st.integers(2, max_vocab(ss.Shape.star(num_drafts), max_trees=1300)))
    target, draft = draw(distribution_pairs(vocab, exact))
    return target, draft, num_drafts, exact


# --------------------------------------------------------------------------- single position
@given(case=single_position(max_drafts=1))
def test_standard_acceptance_is_the_enumerated_acceptance(case: Any) -> None:
    target, draft, _, exact = case
    closed = calculators.standard_acceptance(target, draft)
    enumerated = enumerated_acceptance(
        ss.SCHEMES["standard"], Stationary(target, draft), ss.Shape.star(1)
    )
    assert _agree(closed, enumerated, exact), (closed, enumerated)


@given(case=single_position())
def test_nss_acceptance_is_the_enumerated_acceptance(case: Any) -> None:
    target, draft, k, exact = case
    closed = calculators.nss_acceptance(target, draft, k)
    enumerated = enumerated_acceptance(
        ss.SCHEMES["nss"], Stationary(target, draft), ss.Shape.star(k, replacement=True)
    )
    assert _agree(closed, enumerated, exact), (closed, enumerated)


@given(case=single_position())
def test_specinfer_acceptance_is_the_enumerated_acceptance(case: Any) -> None:
    target, draft, k, exact = case
    closed = calculators.specinfer_acceptance(target, draft, k)
    enumerated = enumerated_acceptance(
        ss.SCHEMES["specinfer"], Stationary(target, draft), ss.Shape.star(k, replacement=True)
    )
    assert _agree(closed, enumerated, exact), (closed, enumerated)


def specinfer_acceptance_with_original_target(target: Any, draft: Any, k: int) -> Any:
    """The WRONG variant of the SpecInfer formula: the last sum uses the original p.

    The closed form must use the final residual p_k in the last sum (``docs/schemes/specinfer.md``,
    Pitfalls); the original p gives errors up to 0.25.
    """
    target, draft = np.asarray(target), np.asarray(draft)
    current, rejected, missing = target, 1, target * 0 + 1
    for _ in range(k):
        step = total(np.minimum(current, draft))
        if not step < 1:
            return 1 - rejected + rejected * step
        rejected = rejected * (1 - step)
        missing = missing * (1 - positive_part(draft - current) / (1 - step))
        current = residual(current, draft)
    return 1 - rejected + rejected * total(target * (1 - missing))


def test_specinfer_formula_with_the_original_target_is_wrong() -> None:
    """Negative control: the oracle tells the right formula from the wrong one."""
    worst = F(0)
    rows = [
        ([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3),
        ([F(1, 2), F(1, 2), F(0)], [F(0), F(1, 2), F(1, 2)]),
        ([F(7, 10), F(1, 5), F(1, 10)], [F(1, 10), F(1, 5), F(7, 10)]),
    ]
    for seed in range(12):
        pair = ss.pairs.Random(3, seed=seed, exact=True)
        rows.append((pair.target(()), pair.draft(())))
    for target, draft in rows:
        for k in (2, 3):
            enumerated = enumerated_acceptance(
                ss.SCHEMES["specinfer"], Stationary(target, draft), ss.Shape.star(k)
            )
            assert calculators.specinfer_acceptance(target, draft, k) == enumerated
            wrong = specinfer_acceptance_with_original_target(
                np.array(target, dtype=object), np.array(draft, dtype=object), k
            )
            worst = max(worst, abs(wrong - enumerated))
    # Golden case A (tests/test_goldens.py): p = (1/2, 1/3, 1/6), q uniform, k = 2, acceptance 8/9.
    case_a = np.array([F(1, 2), F(1, 3), F(1, 6)], dtype=object), np.array([F(1, 3)] * 3)
    assert calculators.specinfer_acceptance(*case_a, 2) == F(8, 9)
    assert specinfer_acceptance_with_original_target(*case_a, 2) != F(8, 9)
    assert worst > F(1, 20), f"the wrong formula is only off by {worst}"


# --------------------------------------------------------------------------- chains
@given(data=st.data())
def test_chain_expected_accepted_is_the_standard_block_efficiency(data: st.DataObject) -> None:
    exact = data.draw(st.booleans(), label="exact")
    length = data.draw(st.integers(1, 3), label="length")
    vocab = data.draw(st.integers(2, max_vocab(ss.Shape.chain(length))), label="vocab")
    pair = data.draw(model_pairs(vocab, length, exact), label="pair")
    event(type(pair).__name__)
    closed = calculators.chain_expected_accepted(pair, length)
    emitted = ss.expected_emitted("standard", pair, ss.Shape.chain(length))
    assert _agree(closed + 1, emitted, exact), (closed, emitted)


# --------------------------------------------------------------------------- NSS on fixed trees
def _nss_expected_accepted_by_law(tree: ss.DraftTree, pair: Any) -> Any:
    target_probs, draft_probs = tables(pair, tree)
    law = ss.SCHEMES["nss"].verdict_law(tree, target_probs, draft_probs)
    return sum((prob * tree.depth(verdict.node) for verdict, prob in law.items()), 0)


@given(data=st.data())
def test_nss_expected_accepted_on_drawn_trees(data: st.DataObject) -> None:
    """Arbitrary trees: any drafting rule, deterministic ones included."""
    exact = data.draw(st.booleans(), label="exact")
    vocab = data.draw(st.integers(2, 4), label="vocab")
    tree = data.draw(draft_trees(vocab), label="tree")
    pair = data.draw(model_pairs(vocab, tree.max_depth, exact), label="pair")
    closed = calculators.nss_expected_accepted(tree, tables(pair, tree)[0])
    assert _agree(closed, _nss_expected_accepted_by_law(tree, pair), exact)


TOP_SHAPES = [shape for shape in SHAPES if shape.kind == "top"]


@given(data=st.data())
def test_nss_expected_accepted_on_shape_trees(data: st.DataObject) -> None:
    """Trees of the catalogue shapes, ``Shape.top`` trees included, and the whole round law."""
    exact = data.draw(st.booleans(), label="exact")
    shape = data.draw(
        st.one_of(st.sampled_from(TOP_SHAPES), shapes_for(ss.SCHEMES["nss"])), label="shape"
    )
    vocab = data.draw(st.integers(2, max_vocab(shape, max_trees=300)), label="vocab")
    pair = data.draw(model_pairs(vocab, shape.depth, exact), label="pair")
    expected: Any = 0
    for tree, weight in shape.enumerate(pair):
        closed = calculators.nss_expected_accepted(tree, tables(pair, tree)[0])
        assert _agree(closed, _nss_expected_accepted_by_law(tree, pair), exact), tree
        expected = expected + weight * closed
    assert _agree(expected + 1, ss.expected_emitted("nss", pair, shape), exact)
    if shape.kind == "top":
        (tree, weight), *rest = list(shape.enumerate(pair))
        assert rest == [] and weight == 1, "a top shape drafts one tree"
