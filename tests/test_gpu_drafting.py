"""Tensor drafting equals the reference drafting token for token (docs/torch.md).

Fed the same draft distributions and the same drafting noise (one uniform per draw step), the
batched :mod:`specsampling.gpu.drafting` must draft, for every row of a batch, exactly the tree
:meth:`specsampling.Shape.draft_with_noise` drafts: same nodes in the same order, same candidate
lists with multiplicity, same law. Mutants of the drafter must fail the same comparison.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from proofs_tests.strategies import model_pairs
from specsampling.errors import InvalidDistribution
from specsampling.gpu import drafting
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.pairs import Random, Stationary, Table

DEEPER = (
    ss.Shape.chain(5),
    ss.Shape.star(4),
    ss.Shape.star(4, replacement=False),
    ss.Shape.paths(3, 3),
    ss.Shape.branching((3, 2)),
    ss.Shape.branching((2, 2), replacement=True),
    ss.Shape.branching((1, 1, 1)),
    ss.Shape.delayed(3, trunk=2, branch=2),
    ss.Shape.delayed(2, trunk=0, branch=2),
    ss.Shape.top((3, 2)),
    ss.Shape.top((4, 4)),
    ss.Shape.greedy((3, 2)),
    ss.Shape.greedy((1, 1)),
    ss.Shape.greedy((4,)),
    ss.Shape.hub(2),
    ss.Shape.hub(3),
)
SHAPES = LAW_SHAPES + DEEPER

TIES = Stationary([0.25] * 4, [0.3, 0.3, 0.2, 0.2])  # top-k ties at every rank
ONE_HOT = Stationary([0.5, 0.3, 0.2], [0.0, 1.0, 0.0])  # without replacement exhausts at once
ZEROS = Stationary([0.2, 0.2, 0.2, 0.2, 0.2], [0.5, 0.0, 0.25, 0.0, 0.25])
CONTEXT = Table(  # context dependent, with a one-hot and a tie row
    {
        (): ([0.5, 0.5, 0.0], [0.4, 0.4, 0.2]),
        (0,): ([0.2, 0.3, 0.5], [0.0, 0.0, 1.0]),
        (1,): ([1 / 3, 1 / 3, 1 / 3], [0.1, 0.6, 0.3]),
        (2,): ([0.1, 0.1, 0.8], [0.5, 0.25, 0.25]),
    }
)
PAIRS = {
    "random3": Random(3, seed=0),
    "random5": Random(5, seed=1),
    "random16": Random(16, seed=2),
    "ties": TIES,
    "one_hot": ONE_HOT,
    "zeros": ZEROS,
}


def boundary_noise(rng: np.random.Generator, rows: int, steps: int) -> np.ndarray:
    """Random rows, then all-zero, all-largest-below-one and mixed boundary rows."""
    noise = rng.random((rows + 3, steps))
    noise[rows] = 0.0
    noise[rows + 1] = LARGEST_BELOW_ONE
    noise[rows + 2] = rng.choice([0.0, LARGEST_BELOW_ONE, 0.5], steps)
    return noise


def reference_trees(
    shape: ss.Shape, pair: Any, noise: np.ndarray, prefixes: list[tuple[int, ...]]
) -> list[ss.DraftTree]:
    return [shape.draft_with_noise(pair, row, p) for row, p in zip(noise, prefixes, strict=True)]


def mismatches(shape: ss.Shape, pair: Any, noise: np.ndarray, prefixes: Any, drafter=None) -> list:
    """Rows whose tensor-drafted tree differs from the reference's (laws included)."""
    if drafter is None:
        batch = drafting.draft(shape, pair, noise, prefixes)
    else:
        batch = run_drafter(drafter, drafting.pair_source(pair, prefixes), noise)
    assert batch.laws == (shape.law,) * len(noise)
    got = batch.to_trees()
    want = reference_trees(shape, pair, noise, prefixes)
    return [(row, g, w) for row, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]


def run_drafter(drafter: drafting.TreeDrafter, source: Any, noise: np.ndarray) -> ss.gpu.TreeBatch:
    uniforms = torch.as_tensor(noise, dtype=torch.float64)
    while not drafter.done:
        columns = list(drafter.levels[drafter.level])
        drafter.next_level(source(drafter.frontier), uniforms[:, columns])
    return drafter.finish()


# --------------------------------------------------------------------------- equality
@pytest.mark.parametrize("pair_name", sorted(PAIRS))
def test_drafting_equals_reference_for_every_shape(pair_name: str) -> None:
    pair = PAIRS[pair_name]
    rng = np.random.default_rng(7)
    vocab = pair.vocab_size
    for shape in SHAPES:
        noise = boundary_noise(rng, 6, len(shape.steps))
        prefixes = [tuple(int(t) for t in rng.integers(0, vocab, i % 3)) for i in range(len(noise))]
        assert mismatches(shape, pair, noise, prefixes) == [], shape


def test_context_dependent_pair_and_shared_prefix() -> None:
    rng = np.random.default_rng(3)
    shapes = [s for s in SHAPES if s.depth == 1] + [
        ss.Shape.chain(1),
        ss.Shape.greedy((2,)),
        ss.Shape.star(3, replacement=False),
    ]
    for shape in shapes:
        noise = boundary_noise(rng, 8, len(shape.steps))
        for prefix in [(), (0,), (1,), (2,)]:
            assert mismatches(shape, CONTEXT, noise, [prefix] * len(noise)) == [], shape


def test_one_tree_per_row_of_a_large_mixed_batch() -> None:
    """Many rows at once, with duplicates among i.i.d. candidates (V = 2)."""
    rng = np.random.default_rng(11)
    for shape in (ss.Shape.paths(4, 3), ss.Shape.branching((2, 2), replacement=True)):
        pair = Random(2, seed=4)
        noise = boundary_noise(rng, 200, len(shape.steps))
        batch = drafting.draft(shape, pair, noise)
        trees = batch.to_trees()
        assert any(len(c) > len(set(c)) for tree in trees for c in tree.candidates)
        assert trees == reference_trees(shape, pair, noise, [()] * len(noise))
        # The batch is as tight as TreeBatch.from_trees pads it.
        tight = ss.gpu.TreeBatch.from_trees(trees)
        assert batch.parents.shape == tight.parents.shape
        assert batch.candidates.shape == tight.candidates.shape
        assert batch.max_depth == tight.max_depth and batch.chains == tight.chains


@st.composite
def drafting_cases(draw: Any) -> tuple[ss.Shape, Any, np.ndarray]:
    shape = draw(st.sampled_from(SHAPES))
    vocab = draw(st.integers(2, 5))
    pair = draw(model_pairs(vocab, shape.depth))
    uniform = st.one_of(
        st.sampled_from([0.0, LARGEST_BELOW_ONE, 0.5]),
        st.floats(0.0, 1.0, exclude_max=True, allow_nan=False),
    )
    steps = len(shape.steps)
    rows = draw(st.lists(st.lists(uniform, min_size=steps, max_size=steps), min_size=1, max_size=4))
    return shape, pair, np.array(rows, dtype=np.float64)


@given(drafting_cases())
def test_drafting_equals_reference_hypothesis(case: tuple[ss.Shape, Any, np.ndarray]) -> None:
    shape, pair, noise = case
    assert mismatches(shape, pair, noise, [()] * len(noise)) == []


@pytest.mark.cuda
def test_drafting_on_device() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(5)
    pair = Random(6, seed=3)
    for shape in SHAPES:
        noise = boundary_noise(rng, 4, len(shape.steps))
        batch = drafting.draft(shape, pair, torch.tensor(noise, device=device))
        assert batch.device.type == torch.device(device).type
        assert batch.to_trees() == reference_trees(shape, pair, noise, [()] * len(noise))


# --------------------------------------------------------------------------- hand-checked laws
def single(shape: ss.Shape, draft_probs: list[float], uniforms: list[float]) -> tuple[int, ...]:
    """Tokens of the tree drafted below the root from a fixed draft distribution."""
    pair = Stationary([1 / len(draft_probs)] * len(draft_probs), draft_probs)
    tree = drafting.draft(shape, pair, np.array([uniforms])).to_trees()[0]
    return tree.tokens


def test_hand_checked_draws() -> None:
    q = [0.3, 0.3, 0.2, 0.2]
    # top-k: ties to the lowest id, the uniforms unread.
    assert single(ss.Shape.top((3,)), q, [0.9, 0.9, 0.9]) == (-1, 0, 1, 2)
    # greedy: top-1 is 0, then a draw from q without 0, i.e. (1, 2, 3) with masses 3/7 2/7 2/7.
    assert single(ss.Shape.greedy((2,)), q, [0.0, 0.42]) == (-1, 0, 1)
    assert single(ss.Shape.greedy((2,)), q, [0.0, 0.44]) == (-1, 0, 2)
    # without replacement renormalises after each removal: 0.99 picks the last remaining token.
    assert single(ss.Shape.star(3, replacement=False), q, [0.0, 0.0, 0.99]) == (-1, 0, 1, 3)
    assert single(ss.Shape.star(3, replacement=True), q, [0.0, 0.0, 0.99]) == (-1, 0, 3)
    # hub: x1 = 2 is not the hub 0, so the hub follows; x1 = 0 is the hub, so x2 ~ q without 0.
    assert single(ss.Shape.hub(), q, [0.7, 0.0]) == (-1, 2, 0)
    assert single(ss.Shape.hub(), q, [0.1, 0.0]) == (-1, 0, 1)
    # without replacement stops at the draft's support; so does top.
    assert single(ss.Shape.star(3, replacement=False), [0.0, 1.0, 0.0], [0.5] * 3) == (-1, 1)
    assert single(ss.Shape.top((3,)), [0.5, 0.0, 0.5], [0.5] * 3) == (-1, 0, 2)
    # The clipped inverse CDF never returns a zero-mass token, even at the largest uniform.
    assert single(ss.Shape.chain(1), [0.5, 0.5, 0.0], [LARGEST_BELOW_ONE]) == (-1, 1)


def test_node_ids_follow_step_order() -> None:
    """paths(2, 2) drafts path 1 then path 2: node ids by step order, not by level."""
    pair = Stationary([0.5, 0.5], [0.5, 0.5])
    tree = drafting.draft(ss.Shape.paths(2, 2), pair, np.array([[0.0, 0.9, 0.9, 0.0]]))
    (got,) = tree.to_trees()
    assert got.tokens == (-1, 0, 1, 1, 0) and got.parents == (-1, 0, 1, 0, 3)
    merged = drafting.draft(ss.Shape.paths(2, 2), pair, np.array([[0.0, 0.9, 0.0, 0.0]]))
    (tree,) = merged.to_trees()
    assert tree.tokens == (-1, 0, 1, 0) and tree.candidates == ((1, 1), (2, 3), (), ())


def test_drafting_reads_only_the_draft() -> None:
    class DraftOnly:
        vocab_size = 3

        def target(self, prefix: Any) -> Any:
            raise AssertionError("drafting read the target")

        def draft(self, prefix: Any) -> Any:
            return np.array([0.2, 0.5, 0.3])

    shape = ss.Shape.hub(2)
    noise = np.full((2, len(shape.steps)), 0.25)
    assert drafting.draft(shape, DraftOnly(), noise).batch_size == 2


def test_level_api_on_tensors() -> None:
    """The drafter driven by a callable reading the frontier (as a model would)."""
    shape = ss.Shape.branching((2, 2))
    pair = Random(4, seed=9)
    noise = boundary_noise(np.random.default_rng(2), 3, len(shape.steps))
    seen: list[drafting.Frontier] = []

    def source(frontier: drafting.Frontier) -> torch.Tensor:
        seen.append(frontier)
        rows = [
            [pair.draft(tuple(path)) if ok else np.zeros(4) for path, ok in zip(p, e, strict=True)]
            for p, e in zip(frontier.paths.tolist(), frontier.exists.tolist(), strict=True)
        ]
        return torch.tensor(np.array(rows))

    batch = drafting.draft(shape, source, noise)
    assert batch.to_trees() == reference_trees(shape, pair, noise, [()] * len(noise))
    assert [f.steps for f in seen] == [(-1,), (0, 1)]
    assert [tuple(f.paths.shape) for f in seen] == [(6, 1, 0), (6, 2, 1)]


# --------------------------------------------------------------------------- errors
def test_invalid_inputs_are_refused() -> None:
    pair = Random(3, seed=0)
    shape = ss.Shape.star(2)
    with pytest.raises(InvalidDistribution, match="noise: expected shape"):
        drafting.draft(shape, pair, np.zeros((2, 3)))
    with pytest.raises(InvalidDistribution, match=r"\[0, 1\)"):
        drafting.draft(shape, pair, np.ones((2, 2)))
    with pytest.raises(ValueError, match="one prefix per row"):
        drafting.draft(shape, pair, np.zeros((2, 2)), prefix=[(0,)])
    drafter = drafting.TreeDrafter(ss.Shape.chain(2), batch_size=2)
    with pytest.raises(InvalidDistribution, match="draft_probs: expected shape"):
        drafter.next_level(torch.ones(2, 2, 3) / 3, torch.zeros(2, 1, dtype=torch.float64))
    with pytest.raises(InvalidDistribution, match="uniforms: expected shape"):
        drafter.next_level(torch.ones(2, 1, 3) / 3, torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="levels left"):
        drafter.finish()
    with pytest.raises(ValueError, match="batch_size"):
        drafting.TreeDrafter(shape, 0)
    with pytest.raises(ValueError, match="expected 2 uniforms"):
        shape.draft_with_noise(pair, [0.5])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        shape.draft_with_noise(pair, [0.5, 1.0])


# --------------------------------------------------------------------------- the reference
def test_reference_noise_drafting_is_the_sampled_drafting() -> None:
    """Where no step is skipped (full-support drafts), ``draft(pair, rng)`` reads one uniform
    per step in step order: ``draft_with_noise`` on those uniforms drafts the same tree."""
    pair = Random(8, seed=5)  # rows may have zeros: keep only shapes that cannot exhaust
    dense = Stationary([1 / 8] * 8, np.arange(1, 9) / 36)
    for shape in SHAPES:
        for seed in range(5):
            for p in (pair, dense):
                if p is pair and shape.law not in ("iid",):
                    continue
                tree = shape.draft(p, np.random.default_rng(seed))
                uniforms = np.random.default_rng(seed).random(len(shape.steps))
                assert shape.draft_with_noise(p, uniforms) == tree, (shape, seed)


# --------------------------------------------------------------------------- mutants
class TiesToHighest(drafting.TreeDrafter):
    """Deterministic top-k breaking ties towards the highest id."""

    def top_token(self, probs: torch.Tensor) -> torch.Tensor:
        vocab = probs.shape[-1]
        return vocab - 1 - probs.flip(-1).argmax(-1)


class WithoutKeepsDrawn(drafting.TreeDrafter):
    """Without-replacement steps that do not remove the tokens already drawn."""

    def draw(self, mode: str, probs: Any, u: Any, parent_key: Any, done: Any) -> Any:
        if mode == "without":
            return super().draw("iid", probs, u, parent_key, done)
        return super().draw(mode, probs, u, parent_key, done)


class HubIsFirstDraw(drafting.TreeDrafter):
    """The hub step always takes the hub, even when the first draw already was the hub."""

    def draw(self, mode: str, probs: Any, u: Any, parent_key: Any, done: Any) -> Any:
        if mode == "hub":
            return super().draw("top", probs, u, parent_key, [])
        return super().draw(mode, probs, u, parent_key, done)


class NoDuplicateMerge(drafting.TreeDrafter):
    """Duplicate i.i.d. draws recorded as skipped instead of as another candidate."""

    def draw(self, mode: str, probs: Any, u: Any, parent_key: Any, done: Any) -> Any:
        token, exists = super().draw(mode, probs, u, parent_key, done)
        if mode == "iid":
            exists = exists & ~self.drawn_before(probs, parent_key, done).gather(
                1, token[:, None]
            ).squeeze(1)
        return token, exists


MUTANTS = [TiesToHighest, WithoutKeepsDrawn, HubIsFirstDraw, NoDuplicateMerge]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
def test_mutants_are_caught(mutant: type[drafting.TreeDrafter]) -> None:
    rng = np.random.default_rng(1)
    found = 0
    for pair in (TIES, Random(3, seed=0), Random(5, seed=1)):
        for shape in SHAPES:
            noise = boundary_noise(rng, 6, len(shape.steps))
            found += len(mismatches(shape, pair, noise, [()] * len(noise), mutant(shape, 9)))
    assert found > 0


def test_unmutated_drafter_passes_the_mutant_harness() -> None:
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        noise = boundary_noise(rng, 6, len(shape.steps))
        assert mismatches(shape, TIES, noise, [()] * 9, drafting.TreeDrafter(shape, 9)) == []


# --------------------------------------------------------------------------- refusals
class _RawPair:
    """A model pair returning a model's raw draft row as it is (no validation of its own)."""

    vocab_size = 3

    def __init__(self, row: list[float]) -> None:
        self.row = np.array(row, dtype=float)

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return np.full(3, 1 / 3)

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.row.copy()


def test_next_level_refuses_uniforms_outside_the_unit_interval() -> None:
    probs = torch.tensor([[[0.2, 0.5, 0.3]]], dtype=torch.float64)
    for u in (1.0, 1.5, -0.5, float("nan"), float("inf")):
        drafter = drafting.TreeDrafter(ss.Shape.chain(1), batch_size=1)
        message = r"uniforms\[0, 0\]: .* is not in \[0, 1\)"
        with pytest.raises(ss.InvalidDistribution, match=message):
            drafter.next_level(probs, torch.tensor([[u]], dtype=torch.float64))
    drafter = drafting.TreeDrafter(ss.Shape.chain(1), batch_size=1)  # trusted: no check
    out = drafter.next_level(probs, torch.tensor([[0.5]], dtype=torch.float64), validate=False)
    assert out.tokens.tolist() == [[1]]


def test_draft_rows_without_mass_or_with_bad_entries_are_refused() -> None:
    rows = {
        "no positive mass": [0.0, 0.0, 0.0],
        "a NaN or infinite entry": [float("nan"), 0.5, 0.5],
        "a negative entry": [-0.2, 0.5, 0.7],
    }
    for what, row in rows.items():  # raw tensors: named by row and frontier slot
        drafter = drafting.TreeDrafter(ss.Shape.chain(1), batch_size=1)
        with pytest.raises(ss.InvalidDistribution, match=rf"draft_probs\[0, 0\]: .*{what}"):
            drafter.next_level(torch.tensor([[row]]), torch.zeros(1, 1, dtype=torch.float64))
    for row in (*rows.values(), [float("inf"), 0.5, 0.5]):  # a pair: named by its context
        for shape in (ss.Shape.chain(1), ss.Shape.top((2,))):
            noise = np.full((1, len(shape.steps)), 0.7)
            with pytest.raises(ss.InvalidDistribution, match=r"pair\.draft\(\) has"):
                drafting.draft(shape, _RawPair(row), noise)
            with pytest.raises(ss.InvalidDistribution, match=r"pair: draft\(\) has"):
                shape.draft_with_noise(_RawPair(row), noise[0])  # the reference refuses it too
    # a deeper level names the row and slot it was read at; rows whose node does not exist
    # are never read (zeros there are fine)
    shape = ss.Shape.chain(2)
    drafter = drafting.TreeDrafter(shape, batch_size=2)
    drafter.next_level(torch.full((2, 1, 3), 1 / 3, dtype=torch.float64), torch.zeros(2, 1))
    bad = torch.full((2, 1, 3), 1 / 3, dtype=torch.float64)
    bad[1, 0] = 0.0
    with pytest.raises(ss.InvalidDistribution, match=r"draft_probs\[1, 0\]: .*no positive mass"):
        drafter.next_level(bad, torch.zeros(2, 1, dtype=torch.float64))


def test_draft_names_noise_prefix_and_source_problems() -> None:
    pair = ss.pairs.Stationary([0.5, 0.5], [0.25, 0.75])
    shape = ss.Shape.chain(1)
    with pytest.raises(ss.InvalidDistribution, match=r"noise: expected shape .*at least one row"):
        drafting.draft(shape, pair, np.zeros((0, 1)))
    with pytest.raises(ss.InvalidDistribution, match="noise: expected real uniforms"):
        drafting.draft(shape, pair, np.array([[0.5 + 2j]]))

    def source(frontier: drafting.Frontier) -> torch.Tensor:
        return torch.full((*frontier.exists.shape, 2), 0.5, dtype=torch.float64)

    with pytest.raises(ValueError, match="prefix: only a model pair source"):
        drafting.draft(shape, source, np.zeros((1, 1)), np.array([0]))
    assert drafting.draft(shape, source, np.zeros((1, 1)), np.array([])).tokens.shape[0] == 1

    class Short(_RawPair):
        def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
            return np.array([0.5, 0.5])

    with pytest.raises(ss.InvalidDistribution, match=r"source: pair\.draft\(\) has shape \(2,\)"):
        drafting.draft(shape, Short([0.0]), np.array([[0.5]]))
