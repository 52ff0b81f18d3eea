"""The generic losslessness property over the scheme registry.

Every registered scheme, on every catalogue shape it supports and on model pairs drawn by
hypothesis, emits exactly the target's law: ``lossless_error <= 1e-12`` in float64 and ``== 0``
with ``Fraction`` pairs for rational schemes. Registering a scheme puts it under test here.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import specsampling as ss
from proofs_tests.catalogue import LARGE_SHAPES, SHAPES, max_vocab
from proofs_tests.oracles import boundary_violations, keyed_boundary_violations, max_deviation
from proofs_tests.strategies import (
    cases,
    model_pairs,
    shapes_for,
    supported_shapes,
)
from specsampling.pairs import Stationary
from specsampling.tree import DraftTree

NAMES = sorted(ss.SCHEMES)
RATIONAL = [name for name in NAMES if ss.SCHEMES[name].rational]
#: Keyed couplings draft and verify from one keyed field; they have no per-node ``verify``.
KEYED = [name for name in NAMES if isinstance(ss.SCHEMES[name], ss.schemes.KeyedCoupling)]
FLOAT_TOLERANCE = 1e-12

#: Schemes whose accept test uses the draft probabilities (they cannot verify top-k drafts).
DOCUMENTED_RATIO_BASED = (
    "standard",
    "specinfer",
    "rsd",
    "block",
    "traversal",
    "spectr",
    "resispec",
)


# --------------------------------------------------------------------------- losslessness
@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_lossless_in_float64(name: str, data: st.DataObject) -> None:
    scheme = ss.SCHEMES[name]
    shape, pair = data.draw(cases(scheme, exact=False), label="shape, pair")
    error = ss.lossless_error(scheme, pair, shape)
    assert error <= FLOAT_TOLERANCE, f"{name} on {shape!r}: lossless error {error}"


@pytest.mark.parametrize("name", RATIONAL)
@given(data=st.data())
def test_lossless_exactly_with_fractions(name: str, data: st.DataObject) -> None:
    scheme = ss.SCHEMES[name]
    shape, pair = data.draw(cases(scheme, exact=True, max_trees=1000), label="shape, pair")
    error = ss.lossless_error(scheme, pair, shape)
    assert isinstance(error, Fraction), f"{name}: exact inputs gave a {type(error).__name__}"
    assert error == 0, f"{name} on {shape!r}: lossless error {error}"


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_round_law_is_a_distribution_of_valid_outputs(name: str, data: st.DataObject) -> None:
    scheme = ss.SCHEMES[name]
    exact = scheme.rational and data.draw(st.booleans(), label="exact")
    shape, pair = data.draw(cases(scheme, exact=exact, max_trees=1000), label="shape, pair")
    law = ss.round_law(scheme, pair, shape)
    total = sum(law.values())
    if exact:
        assert total == 1
    else:
        assert abs(total - 1) <= FLOAT_TOLERANCE
    for emitted, prob in law.items():
        assert prob > 0, f"zero-probability entry {emitted} in the round law"
        assert 1 <= len(emitted) <= shape.depth + 1
        assert all(0 <= token < pair.vocab_size for token in emitted), emitted
        for i, token in enumerate(emitted):
            assert pair.target(emitted[:i])[token] > 0, f"{emitted}: token {i} has target mass 0"


STREAM_SHAPES = (
    *(ss.Shape.chain(n) for n in (1, 2, 3)),
    *(ss.Shape.star(k, replacement=r) for k in (1, 2, 3) for r in (True, False)),
)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_stream_law_over_two_rounds_is_the_target_joint(name: str, data: st.DataObject) -> None:
    """The multi-round check: ``depth + 2`` tokens need at least two rounds."""
    scheme = ss.SCHEMES[name]
    exact = scheme.rational and data.draw(st.booleans(), label="exact")
    shape = data.draw(shapes_for(scheme, STREAM_SHAPES), label="shape")
    vocab = data.draw(st.integers(2, 3 if shape.depth <= 2 else 2), label="vocab")
    length = shape.depth + 2
    # Rounds start at contexts of up to length - 1 tokens and look depth tokens further.
    pair = data.draw(model_pairs(vocab, length - 1 + shape.depth, exact), label="pair")
    law = ss.stream_law(scheme, pair, shape, length)
    deviation = max_deviation(law, ss.exact.target_joint(pair, length))
    if exact:
        assert deviation == 0
    else:
        assert deviation <= FLOAT_TOLERANCE


# --------------------------------------------------------------------------- boundary noise
@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_boundary_noise_never_accepts_or_emits_impossible_tokens(
    name: str, data: st.DataObject
) -> None:
    """u = 0 and u = largest float below 1 (sgl-project/sglang#35771, #30822;
    vllm-project/vllm#44744); keyed couplings: the
    keyed field's extreme exponentials ``0`` and ``53 ln 2``."""
    scheme = ss.SCHEMES[name]
    exact = scheme.rational and data.draw(st.booleans(), label="exact")
    shape, pair = data.draw(cases(scheme, exact=exact, max_trees=400), label="shape, pair")
    if name in KEYED:
        assert keyed_boundary_violations(scheme, pair, shape) == []
    else:
        assert boundary_violations(scheme, pair, shape) == []


# --------------------------------------------------------------------------- refusals
def test_documented_schemes_are_registered_and_every_family_is_drawn() -> None:
    kinds = {shape.kind for shape in SHAPES}
    assert kinds == {"chain", "star", "paths", "branching", "delayed", "top", "greedy", "hub"}
    assert all(shape.depth <= 3 for shape in SHAPES)
    for name in NAMES:
        assert supported_shapes(ss.SCHEMES[name]), f"{name} supports no catalogue shape"
    # The vocabulary shrinks as shapes grow, down to two tokens.
    assert max_vocab(ss.Shape.chain(1)) == 6 and max_vocab(ss.Shape.paths(4, 2)) == 2


#: Pairs of shapes built by different constructors that draft the same trees by the same law.
SAME_STRUCTURE = (
    (ss.Shape.delayed(2, trunk=0, branch=2), ss.Shape.paths(2, 2)),
    (ss.Shape.delayed(3, trunk=0, branch=1), ss.Shape.star(3)),
    (ss.Shape.branching((2,)), ss.Shape.star(2, replacement=False)),
    (ss.Shape.branching((3,), replacement=True), ss.Shape.star(3)),
    (ss.Shape.paths(1, 3), ss.Shape.chain(3)),
    (ss.Shape.branching((1, 1)), ss.Shape.chain(2)),
)


@pytest.mark.parametrize("name", NAMES)
def test_support_follows_structure_not_constructor_names(name: str) -> None:
    scheme = ss.SCHEMES[name]
    for one, other in SAME_STRUCTURE:
        assert scheme.supports(one) == scheme.supports(other), f"{name}: {one!r} vs {other!r}"


def _small_pair() -> Stationary:
    return Stationary([0.5, 0.5], [0.25, 0.75])


@pytest.mark.parametrize("name", NAMES)
def test_unsupported_shapes_are_refused_and_supported_ones_run(name: str) -> None:
    scheme = ss.SCHEMES[name]
    pair = _small_pair()
    refused = [shape for shape in (*SHAPES, *LARGE_SHAPES) if not scheme.supports(shape)]
    for shape in refused:
        with pytest.raises(ss.UnsupportedShape):
            ss.round_law(scheme, pair, shape)
        with pytest.raises(ss.UnsupportedShape):
            ss.speculate(scheme, pair, shape, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        if scheme.supports(shape):
            tokens = ss.speculate(scheme, pair, shape, rng).tokens
            assert 1 <= len(tokens) <= shape.depth + 1 and set(tokens) <= {0, 1}, (shape, tokens)


def _depends_on_draft(scheme: Any) -> bool:
    """Whether the verdict law on a one-token draft changes with the draft probabilities."""
    tree = DraftTree.chain([0], law="iid")
    target = np.array([[0.5, 0.5], [0.5, 0.5]])
    laws = [
        scheme.verdict_law(tree, target, np.array([draft, [0.5, 0.5]]))
        for draft in ([0.25, 0.75], [0.75, 0.25])
    ]
    return bool(max_deviation(*laws) > 0)


@pytest.mark.parametrize("name", NAMES)
def test_draft_ratio_schemes_refuse_deterministic_top_drafts(name: str) -> None:
    """Top-k drafts are not samples from q: a rule that reads q is not exact on them
    (huggingface/transformers#32867)."""
    scheme = ss.SCHEMES[name]
    if name in DOCUMENTED_RATIO_BASED:
        assert _depends_on_draft(scheme), f"{name} is documented as ratio-based"
    tops = [shape for shape in (*SHAPES, *LARGE_SHAPES) if shape.law == "deterministic"]
    assert tops
    supported = [shape for shape in tops if scheme.supports(shape)]
    if name in KEYED:  # drafts are race winners from q: a top-k tree is never one
        assert not supported, f"{name} claims {supported[:3]}"
        return
    assert not (_depends_on_draft(scheme) and supported), f"{name} claims {supported[:3]}"
