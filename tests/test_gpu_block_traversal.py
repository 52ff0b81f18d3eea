"""Path-wise equality of the block and traversal lowerings with their references.

Both are tree schemes with their own verify (no node walk): block's running capped ratio, its
deepest-success ``tau`` and w-weighted residual; traversal's post-order cursor with parent
residuals, weights and draft removals. Fed the same trees, tables and float64 noise, the float64
lowering must return the reference verdict and emitted tokens for every row of a batch mixing
trees of different shapes and sizes (catalogue shapes, deeper shapes, hand-built chains and
random i.i.d. tries with duplicates), with random and boundary uniforms; padding never counts,
and known-buggy variants of each lowering are caught.
"""

from __future__ import annotations

import inspect
import zlib
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from proofs_tests.pathwise import Round, hypothesis_rounds, mismatches, run_lowering
from specsampling import gpu as ssg
from specsampling.gpu.schemes.block import Block
from specsampling.gpu.schemes.traversal import Traversal
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes import tables

ops = ssg.ops
DEEPER = (
    ss.Shape.chain(5),
    ss.Shape.chain(8),
    ss.Shape.star(4),
    ss.Shape.star(6),
    ss.Shape.star(4, replacement=False),
    ss.Shape.paths(3, 3),
    ss.Shape.paths(4, 4),
    ss.Shape.branching((3, 2)),
    ss.Shape.branching((2, 2), replacement=True),
    ss.Shape.branching((2, 1, 2), replacement=True),
    ss.Shape.branching((1, 1, 1)),
    ss.Shape.delayed(3, trunk=2, branch=2),
    ss.Shape.greedy((1, 1)),
)
SHAPES = LAW_SHAPES + DEEPER
LOWERINGS = {"block": Block(), "traversal": Traversal()}


class SparseRandom:
    """A context-dependent pair with zeros in both rows (``p(x) = 0`` for drafted ``x``,
    ``q(x) = 0`` where ``p(x) > 0``): weights of 0, zero-mass residuals, emptied drafts."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size, self.seed = vocab_size, seed

    def _row(self, prefix: tuple[int, ...], salt: int) -> np.ndarray:
        key = zlib.crc32(repr((self.seed, salt, tuple(prefix))).encode())
        rng = np.random.default_rng(key)
        row = rng.dirichlet(np.ones(self.vocab_size))
        row[rng.random(self.vocab_size) < 0.4] = 0.0
        row[rng.integers(self.vocab_size)] += 0.5  # never all zero
        return row / row.sum()

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._row(prefix, 0)

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._row(prefix, 1)


def supported(name: str) -> list[ss.Shape]:
    return [shape for shape in SHAPES if ss.SCHEMES[name].supports(shape)]


def hand_trees(name: str, rng: np.random.Generator, vocab: int) -> list[ss.DraftTree]:
    """Trees no shape drafts: the bare root, chains of every length (any sampled law), and for
    traversal random i.i.d. tries (random parents and tokens, duplicates included)."""
    trees = [ss.DraftTree((-1,), (-1,), law="iid")]
    for length, law in zip(range(1, 8), ("iid", "without", "greedy") * 3, strict=False):
        trees.append(ss.DraftTree.chain(rng.integers(0, vocab, length).tolist(), law=law))
    if name == "traversal":
        for size in (2, 5, 9):
            draws: list[tuple[int, int]] = []
            nodes = 1
            for _ in range(size):
                draws.append((int(rng.integers(0, nodes)), int(rng.integers(0, vocab))))
                nodes = ss.DraftTree.from_draws(draws).num_nodes
            trees.append(ss.DraftTree.from_draws(draws, law="iid"))
    return trees


def noises(rng: np.random.Generator, num_nodes: int) -> list[ss.Noise]:
    return [
        ss.Noise.draw(rng, num_nodes),
        ss.Noise.constant(0.0, num_nodes),
        ss.Noise.constant(LARGEST_BELOW_ONE, num_nodes),
    ]


def mixed_rounds(name: str, pair: Any, seed: int) -> list[Round]:
    """Every supported shape drafted, plus the hand-built trees, each with random and boundary
    noise, shuffled into one batch."""
    rng = np.random.default_rng(seed)
    trees = [shape.draft(pair, rng) for shape in supported(name)]
    trees += hand_trees(name, rng, pair.vocab_size)
    rounds = [
        (tree, *tables(pair, tree), noise)
        for tree in trees
        for noise in noises(rng, tree.num_nodes)
    ]
    return [rounds[i] for i in rng.permutation(len(rounds))]


def pairs() -> list[Any]:
    return [ss.pairs.Random(3, seed=s) for s in range(3)] + [SparseRandom(3, s) for s in range(3)]


# --------------------------------------------------------------------------- path-wise equality
@pytest.mark.parametrize("name", sorted(LOWERINGS))
@pytest.mark.parametrize("vocab", [2, 3, 6, 40])
@pytest.mark.parametrize("pair_kind", ["random", "sparse"])
def test_pathwise_mixed_batches(name: str, vocab: int, pair_kind: str) -> None:
    for seed in range(2):
        pair: Any = SparseRandom(vocab, seed)
        if pair_kind == "random":
            pair = ss.pairs.Random(vocab, seed=seed)
        rounds = mixed_rounds(name, pair, seed)
        assert len({r[0].num_nodes for r in rounds}) > 3  # sizes really differ
        assert mismatches(LOWERINGS[name], rounds) == []


@pytest.mark.parametrize("name", sorted(LOWERINGS))
def test_pathwise_hypothesis(name: str) -> None:
    @settings(max_examples=60, deadline=None)
    @given(hypothesis_rounds(supported(name)))
    def check(rounds: list[Round]) -> None:
        assert mismatches(LOWERINGS[name], rounds) == []

    check()


@pytest.mark.parametrize("name", sorted(LOWERINGS))
def test_padding_never_counts(name: str) -> None:
    """Padded table rows full of NaN, zeros or ones give the same tokens; a row's verdict does
    not depend on its neighbours (each row alone gives the same)."""
    rounds = mixed_rounds(name, SparseRandom(4, 9), 9)
    assert mismatches(LOWERINGS[name], rounds, pad=float("nan")) == []
    outputs = [run_lowering(LOWERINGS[name], rounds, pad=pad) for pad in (float("nan"), 0.0, 1.0)]
    assert all(torch.equal(out.tokens, outputs[0].tokens) for out in outputs[1:])
    for row in range(0, len(rounds), 7):
        alone = run_lowering(LOWERINGS[name], [rounds[row]])
        width = alone.tokens.shape[1]
        assert alone.tokens[0].tolist() == outputs[0].tokens[row, :width].tolist()


# --------------------------------------------------------------------------- hand-checked goldens
def stationary_round(
    name: str, tree: ss.DraftTree, target: list[float], draft: list[float], noise: Any
) -> tuple[str, Round]:
    size = tree.num_nodes
    rows = (np.stack([np.array(r)] * size) for r in (target, draft))
    return name, (tree, *rows, ss.Noise(*(np.asarray(n, dtype=float) for n in noise)))


P, Q = [1 / 3, 2 / 3], [2 / 3, 1 / 3]
CHAIN = ss.DraftTree.chain([0, 0], law="iid")
STAR = ss.DraftTree.from_draws([(0, 0), (0, 1)], law="iid")
#: ``(scheme, round), verdict`` worked out by hand.
GOLDENS = [
    # w = (1, 1/2, 1/4); h_1 = 0 (no mass in (w_1 p - q)_+), h_2 = w_2 = 1/4.
    # tau = 2: the bonus from p, u = 0.5 -> token 1.
    (stationary_round("block", CHAIN, P, Q, ([0, 0, 0.2], [0.5] * 3)), (2, 1)),
    # tau = 0: (p - q)_+ = (0, 1/3) -> token 1.
    (stationary_round("block", CHAIN, P, Q, ([0, 0, 0.3], [0.5] * 3)), (0, 1)),
    # p = (.4, .3, .24, .06), q = (.1, .2, .3, .4), chain (2, 3): w = (1, .8, .12),
    # (w_1 p - q)_+ = (.22, .04, 0, 0), h_1 = .26 / .46; eta = (0, .1, .5) gives tau = 1 and
    # u = .8 on the normalised w-residual (.846, .154) -> token 0 ((p - q)_+ would give 1).
    (
        stationary_round(
            "block",
            ss.DraftTree.chain([2, 3], law="iid"),
            [0.4, 0.3, 0.24, 0.06],
            [0.1, 0.2, 0.3, 0.4],
            ([0, 0.1, 0.5], [0.8] * 3),
        ),
        (1, 0),
    ),
    # Node 1 (token 0) has w = 1/2: accepted with u = .4, its bonus p with u = .9 -> token 1.
    (stationary_round("traversal", STAR, P, Q, ([0, 0.4, 0], [0.9] * 3)), (1, 1)),
    # Rejected (u = .7): root P <- (0, 1), w <- 1, Q <- (0, 1); node 2 gets w = 1 and is
    # accepted even with the largest uniform; its bonus p with u = .2 -> token 0.
    (stationary_round("traversal", STAR, P, Q, ([0, 0.7, LARGEST_BELOW_ONE], [0.2] * 3)), (2, 0)),
]


@pytest.mark.parametrize(("case", "expected"), GOLDENS)
def test_goldens(case: tuple[str, Round], expected: tuple[int, int]) -> None:
    name, (tree, target, draft, noise) = case
    assert tuple(ss.SCHEMES[name].verify(tree, target, draft, noise)) == expected
    assert mismatches(LOWERINGS[name], [case[1]]) == []
    out = run_lowering(LOWERINGS[name], [case[1]])
    assert (out.node.tolist(), out.token.tolist()) == ([expected[0]], [expected[1]])


# --------------------------------------------------------------------------- mutants
class BlockInclusive(Block):
    """``eta <= h``: takes tau at a node whose acceptance is 0 when ``eta == 0``."""

    def accepts(self, etas: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
        return etas <= accept


class BlockFirstSuccess(Block):
    """tau is the *first* success instead of the last (later successes must override)."""

    def choose_tau(self, path: torch.Tensor, accept: torch.Tensor, noise: Any) -> torch.Tensor:
        safe = path.clamp_min(0)
        passes = self.accepts(noise.accept.gather(1, safe), accept.gather(1, safe))
        passes = passes & (path != -1)
        passes[:, 0] = False
        depths = torch.arange(path.shape[1])
        tau = torch.where(passes, depths, path.shape[1]).amin(-1)
        tau = torch.where(tau == path.shape[1], 0, tau)
        return safe.gather(1, tau[:, None]).squeeze(-1)


class BlockUnweightedResidual(Block):
    """The residual after tau ignores the weight: ``(p - q)_+`` instead of ``(w p - q)_+``."""

    def emit(self, batch: Any, node: Any, weights: Any, target: Any, draft: Any) -> Any:
        return super().emit(batch, node, torch.ones_like(weights), target, draft)


class BlockBonusFromParent(Block):
    """At the chain's end the bonus comes from the parent's target row."""

    def emit(self, batch: Any, node: Any, weights: Any, target: Any, draft: Any) -> Any:
        rows = torch.arange(node.shape[0])
        at_end = (batch.candidates[rows, node, 0] == -1)[:, None]
        parent = target[rows, batch.parents[rows, node].clamp_min(0)]
        return torch.where(at_end, parent, super().emit(batch, node, weights, target, draft))


class TraversalInclusive(Traversal):
    """``u <= w``: accepts a node of weight 0 when ``u == 0``."""

    def accepts(self, u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return u <= weight


class TraversalParentKept(Traversal):
    """A rejection leaves the parent's target unchanged (no w-weighted residual)."""

    def reject(self, weight: Any, target: Any, draft: Any, token: Any, leftover: Any) -> Any:
        new_weight, has_mass = super().reject(weight, target, draft, token, leftover)
        leftover.copy_(target)
        return new_weight, has_mass


class TraversalDraftKept(Traversal):
    """A rejection leaves the parent's draft unchanged (the token is not removed)."""

    def reject(self, weight: Any, target: Any, draft: Any, token: Any, leftover: Any) -> Any:
        kept = draft.clone()
        new_weight, has_mass = super().reject(weight, target, draft, token, leftover)
        draft.copy_(kept)
        return new_weight, has_mass


class TraversalWeightKept(Traversal):
    """A rejection leaves the parent's weight unchanged."""

    def reject(self, weight: Any, target: Any, draft: Any, token: Any, leftover: Any) -> Any:
        _, has_mass = super().reject(weight, target, draft, token, leftover)
        return weight, has_mass


class TraversalTableBonus(Traversal):
    """The bonus at an accepted node is drawn from its table row, not its updated target."""

    def walk(self, batch: Any, target_probs: Any, draft_probs: Any, noise: Any) -> Any:
        out = super().walk(batch, target_probs, draft_probs, noise)
        rows = torch.arange(batch.batch_size)
        token = ops.categorical(target_probs[rows, out.node], noise.sample[rows, out.node])
        return self.emitted_tokens(batch, out.node, token)


MUTANTS = [
    BlockInclusive(),
    BlockFirstSuccess(),
    BlockUnweightedResidual(),
    BlockBonusFromParent(),
    TraversalInclusive(),
    TraversalParentKept(),
    TraversalDraftKept(),
    TraversalWeightKept(),
    TraversalTableBonus(),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: type(m).__name__)
def test_mutants_are_caught(mutant: Any) -> None:
    found = sum(
        len(mismatches(mutant, mixed_rounds(mutant.name, pair, seed)))
        for seed, pair in enumerate(pairs())
    )
    found += sum(
        len(mismatches(mutant, [case[1]])) for case, _ in GOLDENS if case[0] == mutant.name
    )
    assert found > 0, f"the path-wise test passes the mutant {type(mutant).__name__}"


class EveryRowEveryRound(Traversal):
    """Traversal as off the CPU: every round on every row, all ``N - 1`` of them."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def still_rejecting(self, rows: Any, rejected: Any) -> Any:
        self.rows.append(int(rows.shape[0]))
        return rows


class SyncFreeTraversal(EveryRowEveryRound):
    """Traversal wholly as off the CPU: every row every round, every row descends
    ``max_depth`` levels, the parents' rows gathered and selected."""

    def enter(self, *args: Any) -> Any:
        return self.dense_enter(*args)

    def current_rows(self, *args: Any) -> Any:
        return self.selected_rows(*args)


class CountingTraversal(Traversal):
    """Traversal counting the rows of every rejection round."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def reject_round(self, batch: Any, state: Any, noise: Any, rows: Any) -> Any:
        self.rows.append(int(rows.shape[0]))
        return super().reject_round(batch, state, noise, rows)


def test_traversal_rounds_run_on_the_rows_still_rejecting_only() -> None:
    """The CPU route (rounds on the rows still rejecting, until none is left) and the sync-free
    one (every row, ``N - 1`` rounds) both give the reference's verdicts; the CPU route runs far
    fewer row-rounds."""
    rounds = [r for seed, pair in enumerate(pairs()) for r in mixed_rounds("traversal", pair, seed)]
    assert mismatches(EveryRowEveryRound(), rounds) == []
    assert mismatches(SyncFreeTraversal(), rounds) == []
    counting = CountingTraversal()
    assert mismatches(counting, rounds) == []
    batch = ssg.TreeBatch.from_trees([r[0] for r in rounds])
    every = (batch.parents.shape[1] - 1) * len(rounds)
    assert counting.rows[0] == len(rounds)
    assert all(a >= b > 0 for a, b in zip(counting.rows, counting.rows[1:], strict=False))
    assert sum(counting.rows) < every / 2, (sum(counting.rows), every)


# --------------------------------------------------------------------------- contract
def test_hot_paths_never_synchronise() -> None:
    """No ``.item()``, ``.tolist()`` or Python branching on tensor values in the walk (for
    traversal: in every rejection round; its walk only asks :meth:`still_rejecting`, which
    keeps every row off the CPU, so the loop's exit never reads the device there)."""
    assert "walk" in LOWERINGS["block"].hot_path
    assert "reject_round" in LOWERINGS["traversal"].hot_path
    source = inspect.getsource(Traversal.still_rejecting).split('"""')[-1]
    assert source.count("if ") == 1 and "ops.host_reads_free(rows)" in source
    for lowering in LOWERINGS.values():
        for method in lowering.hot_path:
            source = inspect.getsource(getattr(type(lowering), method)).split('"""')[-1]
            for forbidden in (".item(", ".tolist(", "bool(", "int(", "float(", ".nonzero(", "if "):
                assert forbidden not in source, (lowering.name, method, forbidden)


def test_laws_the_references_are_not_exact_for_are_refused() -> None:
    chain = ss.DraftTree.chain([1], law="iid")
    star = ss.DraftTree.from_draws([(0, 1), (0, 2)], law="iid")
    refusals = [
        ("block", star),
        ("block", star.with_law("without")),
        ("block", ss.DraftTree.chain([1], law="deterministic")),
        ("traversal", star.with_law("deterministic")),
        ("traversal", star.with_law("unknown")),
    ]
    target = torch.full((2, 3, 3), 1 / 3, dtype=torch.float64)
    for name, tree in refusals:
        batch = ssg.TreeBatch.from_trees([chain, tree])
        with pytest.raises(ss.UnsupportedShape, match=f"batch row 1: scheme '{name}'"):
            ssg.verify(LOWERINGS[name], batch, target, target)
        with pytest.raises(ss.UnsupportedShape):
            ss.SCHEMES[name].check_tree(tree)


def test_links_follow_first_drafted_order() -> None:
    """Distinct children in first-drafted order: duplicates merged, hand-given order kept."""
    tree = ss.DraftTree.from_draws([(0, 2), (0, 1), (0, 2), (1, 0), (0, 0), (1, 1)], law="iid")
    reordered = ss.DraftTree(tree.parents, tree.tokens, ((4, 2, 1, 2), (5, 3), (), (), (), ()))
    links = Traversal().links(ssg.TreeBatch.from_trees([tree, reordered]))
    assert links.first_child.tolist() == [[1, 3, -1, -1, -1, -1], [4, 5, -1, -1, -1, -1]]
    assert links.next_sibling.tolist() == [[-1, 2, 4, 5, -1, -1], [-1, -1, 1, -1, 2, 3]]


def test_float64_masses_and_normalisers_add_in_numpy_order() -> None:
    """At a vocabulary where ``torch.sum`` of a long row misses numpy's pairwise sum, block's
    acceptances and traversal's deletion step use the reference's own sums, bit for bit."""
    rng = np.random.default_rng(4)
    vocab = 40_000
    p = rng.random((2, 3, vocab)) ** 6
    q = rng.random((2, 3, vocab)) ** 6
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)
    trees = [ss.DraftTree.chain([int(rng.integers(vocab)), int(rng.integers(vocab))], law="iid")]
    batch = ssg.TreeBatch.from_trees(trees * 2)
    target, draft = torch.from_numpy(p), torch.from_numpy(q)
    weights = torch.tensor([[1.0, 0.3, 0.7], [1.0, 0.55, 0.2]], dtype=torch.float64)
    h = Block().block_acceptances(batch, weights, target, draft)  # [B, N]
    traversal = Traversal()
    leftover = torch.empty(2, vocab, dtype=torch.float64)
    remaining = draft[:, 1].clone()
    token = torch.tensor([5, 6])
    new_weight, _ = traversal.reject(weights[:, 1], target[:, 1], remaining, token, leftover)
    differs = 0
    for row in range(2):
        w = float(weights[row, 1])
        values = np.maximum(w * p[row, 1] - q[row, 1], 0)
        mass = values.sum()
        differs += float(torch.from_numpy(values).sum()) != mass
        assert float(h[row, 1]) == mass / (mass + (1 - w))
        assert float(new_weight[row]) == mass / (mass + (1 - w))
        assert torch.equal(leftover[row], torch.from_numpy(values / mass))
        removed = q[row, 1].copy()
        removed[int(token[row])] = 0
        assert torch.equal(remaining[row], torch.from_numpy(removed / removed.sum()))
    assert differs  # torch's own sum misses numpy's here
