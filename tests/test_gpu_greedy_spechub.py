"""Path-wise equality of the greedy and SpecHub lowerings with their references (docs/torch.md).

Fed the same trees, tables and float64 noise, ``specsampling.gpu`` must return the reference
verdict and emitted tokens for every row of a batch mixing every catalogue shape the scheme
supports (greedy widths 1-4 at depths 1-3, hub depths 1-3, chains), over random pairs, edge pairs
(p == q, one-hot, disjoint supports, ties in q) and hypothesis-drawn pairs, with random and
boundary uniforms (0 and the largest float below 1). Mutants of both lowerings must fail it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import specsampling as ss
from proofs_tests.catalogue import SHAPES as CATALOGUE
from proofs_tests.pathwise import Round, hypothesis_rounds, mismatches
from specsampling import gpu as ssg
from specsampling.gpu.ops import normalise, numpy_sum
from specsampling.gpu.schemes.greedy import Greedy
from specsampling.gpu.schemes.spechub import Plan, SpecHub
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.pairs import Stationary
from specsampling.schemes import tables

NAMES = ("greedy", "spechub")
#: The lowerings under test, by object (registration is checked by test_gpu_pathwise.py).
LOWERINGS = {"greedy": Greedy(), "spechub": SpecHub()}
EXTRA = {"greedy": (ss.Shape.greedy((5, 2)),), "spechub": (ss.Shape.hub(3),)}


def shapes(name: str) -> list[ss.Shape]:
    """Every catalogue shape the reference supports, plus a few beyond the catalogue."""
    scheme = ss.SCHEMES[name]
    return [s for s in CATALOGUE if scheme.supports(s)] + list(EXTRA[name])


# Hand-made pairs hitting the float64 ties and zero-mass branches.
EDGE = {
    "p_eq_q": ([0.7, 0.2, 0.1], [0.7, 0.2, 0.1]),
    "p_eq_q_dense": ([0.13, 0.21, 0.08, 0.17, 0.11, 0.3], [0.13, 0.21, 0.08, 0.17, 0.11, 0.3]),
    "q_one_hot": ([0.5, 1 / 3, 1 / 6], [1.0, 0.0, 0.0]),
    "q_one_hot_banned": ([0.0, 0.5, 0.5], [1.0, 0.0, 0.0]),
    "p_one_hot": ([0.0, 0.0, 1.0], [0.5, 0.25, 0.25]),
    "disjoint": ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1 / 3, 2 / 3]),
    "ties": ([0.1, 0.4, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 6, 1 / 6]),
    "top_ties": ([0.3, 0.1, 0.2, 0.4], [0.25, 0.25, 0.25, 0.25]),
    "hub_step4": ([0.75, 0.125, 0.125], [0.5, 0.25, 0.25]),
}


def draw_rounds(name: str, pair: Any, seed: int, shape_list: list[ss.Shape]) -> list[Round]:
    """Each shape drafted once with random, all-zero and all-largest noise, shuffled."""
    rng = np.random.default_rng(seed)
    rounds: list[Round] = []
    for shape in shape_list:
        tree = shape.draft(pair, rng)
        target, draft = tables(pair, tree)
        size = tree.num_nodes
        for noise in (
            ss.Noise.draw(rng, size),
            ss.Noise.constant(0.0, size),
            ss.Noise.constant(LARGEST_BELOW_ONE, size),
        ):
            rounds.append((tree, target, draft, noise))
    return [rounds[i] for i in rng.permutation(len(rounds))]


@pytest.mark.parametrize("route", ["numpy", "replayed"])
@pytest.mark.parametrize("vocab", [*range(1, 20), 64, 127, 128, 129, 136, 300, 1031, 8200])
def test_numpy_sum_is_numpy_bit_for_bit(vocab: int, route: str, monkeypatch) -> None:
    """Both routes: numpy's own sum of the rows (the CPU outside ``torch.compile``) and the
    replayed plan (accelerators and compiled graphs), on contiguous and strided rows."""
    if route == "replayed":
        monkeypatch.setattr(ssg.ops, "host_reads_free", lambda tensor: False)
    rng = np.random.default_rng(vocab)
    rows = rng.dirichlet(np.ones(vocab), size=64) * rng.random((64, 1))
    rows[rng.random(rows.shape) < 0.3] = 0.0
    expected = [float(row.sum()) for row in rows]
    assert numpy_sum(torch.tensor(rows)).tolist() == expected
    assert numpy_sum(torch.tensor(rows.T.copy()).T).tolist() == expected  # strided rows
    assert numpy_sum(torch.tensor(rows[None])).shape == (1, 64)  # leading axes are kept


def test_torch_sum_order_differs_so_the_replay_is_needed() -> None:
    """A negative control: torch's own ``sum`` is not numpy's (hence :func:`numpy_sum`)."""
    rows = np.random.default_rng(0).dirichlet(np.ones(7), size=200)
    assert torch.tensor(rows).sum(-1).tolist() != [float(row.sum()) for row in rows]


# --------------------------------------------------------------------------- path-wise equality
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("vocab", [2, 3, 6, 9])
def test_pathwise_every_supported_shape(name: str, vocab: int) -> None:
    for pair_seed in range(2):
        pair = ss.pairs.Random(vocab, seed=pair_seed)
        rounds = draw_rounds(name, pair, pair_seed, shapes(name))
        assert mismatches(LOWERINGS[name], rounds) == []


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("edge", sorted(EDGE))
def test_pathwise_edge_pairs(name: str, edge: str) -> None:
    pair = Stationary(*EDGE[edge])
    shape_list = [s for s in shapes(name) if s.depth <= 2]
    for seed in range(2):
        assert mismatches(LOWERINGS[name], draw_rounds(name, pair, seed, shape_list)) == []


@pytest.mark.parametrize("name", NAMES)
def test_pathwise_large_vocabulary(name: str) -> None:
    """V = 300: numpy's sum splits into blocks (the recursive branch of its order)."""
    wide = [ss.Shape.greedy((4, 2)), ss.Shape.greedy((1, 1)), ss.Shape.hub(2), ss.Shape.chain(3)]
    shape_list = [s for s in wide if ss.SCHEMES[name].supports(s)]
    for seed in range(2):
        pair = ss.pairs.Random(300, seed=seed)
        assert mismatches(LOWERINGS[name], draw_rounds(name, pair, seed, shape_list)) == []


@pytest.mark.cuda
@pytest.mark.parametrize("name", NAMES)
def test_pathwise_on_device(name: str) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pair = ss.pairs.Random(6, seed=3)
    assert (
        mismatches(LOWERINGS[name], draw_rounds(name, pair, 3, shapes(name)), device=device) == []
    )


@pytest.mark.parametrize("name", NAMES)
def test_pathwise_hypothesis(name: str) -> None:
    @settings(max_examples=120, deadline=None)
    @given(hypothesis_rounds(shapes(name), max_vocab=6, max_trees=6))
    def check(rounds: list[Round]) -> None:
        assert mismatches(LOWERINGS[name], rounds) == []

    check()


@pytest.mark.parametrize(
    ("name", "tree"),
    [
        ("greedy", ss.DraftTree.from_draws([(0, 1), (0, 2)], law="hub")),
        ("greedy", ss.DraftTree.from_draws([(0, 1), (0, 2)], law="iid")),
        ("spechub", ss.DraftTree.from_draws([(0, 1), (0, 2)], law="greedy")),
        ("spechub", ss.DraftTree.from_draws([(0, 1), (0, 2)], law="without")),
    ],
)
def test_other_laws_are_refused(name: str, tree: ss.DraftTree) -> None:
    batch = ssg.TreeBatch.from_trees([ss.DraftTree.chain([1], law="iid"), tree])
    table = torch.full((2, 3, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ss.UnsupportedShape, match=f"batch row 1: scheme '{name}'"):
        ssg.verify(LOWERINGS[name], batch, table, table)


# --------------------------------------------------------------------------- mutants
class GreedyInclusiveAccept(Greedy):
    """``u * q' <= p``: accepts a random draft of zero target mass when ``u == 0``."""

    def accepts(self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> Any:
        return u * draft_x.double() <= target_x.double()


class GreedyTiesToHighest(Greedy):
    """``T`` recomputed as the draft's top ``k - 1`` with ties to the highest id."""

    def split(self, draft: Any, candidate_tokens: Any, candidate_valid: Any) -> Any:
        deterministic, last, _, covered = super().split(draft, candidate_tokens, candidate_valid)
        order = draft.flip(-1).argsort(dim=-1, descending=True, stable=True)  # [B, V] flipped ids
        ranks = torch.empty_like(order).scatter_(
            -1, draft.shape[-1] - 1 - order, torch.arange(draft.shape[-1]).expand_as(order)
        )  # [B, V] rank of each token, ties: highest id first
        count = last[:, None].clamp_max((draft > 0).sum(-1, keepdim=True))  # [B, 1]
        deterministic = (ranks < count) & (draft > 0)
        rest, _ = normalise(torch.where(deterministic, torch.zeros_like(draft), draft))
        return deterministic, last, rest, covered


class GreedyResidualDropsT(Greedy):
    """The residual forgets ``p`` on ``T``: ``norm((p - q')_+ 1_{V \\ T})`` (no T hits)."""

    def residual(self, target: Any, deterministic: Any, rest: Any) -> Any:
        weights = torch.where(deterministic, 0.0, (target - rest).clamp_min(0))
        normalised, has_mass = normalise(weights)
        return torch.where(has_mass, normalised, target)


class GreedyFullDraft(Greedy):
    """Accept test and residual against the unrestricted ``q`` instead of ``q'``."""

    def split(self, draft: Any, candidate_tokens: Any, candidate_valid: Any) -> Any:
        deterministic, last, _, covered = super().split(draft, candidate_tokens, candidate_valid)
        return deterministic, last, draft, covered


class GreedyTorchSum(Greedy):
    """``q'`` normalised with torch's own ``sum`` (a different float64 rounding order)."""

    def split(self, draft: Any, candidate_tokens: Any, candidate_valid: Any) -> Any:
        deterministic, last, rest, covered = super().split(draft, candidate_tokens, candidate_valid)
        raw = torch.where(deterministic, torch.zeros_like(draft), draft)
        mass = raw.sum(-1, keepdim=True)
        return deterministic, last, torch.where(mass > 0, raw / mass, rest), covered


class SpecHubInclusiveAccept(SpecHub):
    def accepts(self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> Any:
        return u * draft_x.double() <= target_x.double()


class SpecHubSwappedLetters(SpecHub):
    """The plan computed with target and draft swapped (the authors' letters, read literally)."""

    def plan(self, target: torch.Tensor, draft: torch.Tensor) -> Plan:
        return super().plan(draft, target)


class SpecHubTiesToHighest(SpecHub):
    """The hub taken as the highest-id maximum of the draft."""

    def hub(self, draft: torch.Tensor) -> torch.Tensor:
        return draft.shape[-1] - 1 - draft.flip(-1).argmax(-1)


class SpecHubHubTestsSwapped(SpecHub):
    """The two pair types' hub fractions exchanged."""

    def plan(self, target: torch.Tensor, draft: torch.Tensor) -> Plan:
        plan = super().plan(target, draft)
        return plan._replace(
            hub_left=plan.hub_target,
            hub_target=plan.hub_left,
            free_first=plan.free_second,
            free_second=plan.free_first,
        )


MUTANTS = [
    GreedyInclusiveAccept(),
    GreedyTiesToHighest(),
    GreedyResidualDropsT(),
    GreedyFullDraft(),
    SpecHubInclusiveAccept(),
    SpecHubSwappedLetters(),
    SpecHubTiesToHighest(),
    SpecHubHubTestsSwapped(),
]


def mutant_batches(name: str) -> list[list[Round]]:
    """One batch per edge pair and per random pair (vocabularies 3, 5, 7), every supported
    shape of depth <= 2."""
    shape_list = [s for s in shapes(name) if s.depth <= 2]
    pairs = [Stationary(*EDGE[edge]) for edge in sorted(EDGE)]
    pairs += [ss.pairs.Random(vocab, seed=vocab) for vocab in (3, 5, 7)]
    return [draw_rounds(name, pair, seed, shape_list) for seed, pair in enumerate(pairs)]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: type(m).__name__)
def test_mutants_are_caught(mutant: Any) -> None:
    found = 0
    for rounds in mutant_batches(mutant.name):
        assert mismatches(LOWERINGS[mutant.name], rounds) == []  # the correct twin
        found += len(mismatches(mutant, rounds))
    assert found > 0, f"the path-wise test passes {type(mutant).__name__}"


def test_torch_sum_mutant_is_caught_on_equal_pairs() -> None:
    """p == q on chains with u just below one: the accept test meets q'(X) = p(X) exactly, so a
    normalising mass off by one rounding step flips verdicts."""
    rng = np.random.default_rng(5)
    rounds = []
    for _ in range(200):
        row = rng.dirichlet(np.ones(7))
        pair = Stationary(row, row)
        tree = ss.Shape.greedy((1,)).draft(pair, rng)
        rounds.append((tree, *tables(pair, tree), ss.Noise.constant(LARGEST_BELOW_ONE, 2)))
    assert mismatches(Greedy(), rounds) == []
    assert mismatches(GreedyTorchSum(), rounds)
