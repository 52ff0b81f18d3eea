"""The lowering of grafted trees (law ``grafted``): ``specinfer`` and ``nss`` path-wise equal to
their references on batches mixing grafted rows (guesses in ``TreeBatch.guesses``) with plain
i.i.d. rows, on both walk routes; a lowering that reads a guess as a draw from ``q`` is caught.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

import specsampling as ss
from proofs_tests.pathwise import Round, mismatches, run_lowering
from specsampling import gpu as ssg
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes import tables
from specsampling.tree import DrawLaw

SHAPES = [
    ss.Shape.chain(3),
    ss.Shape.chain(1),
    ss.Shape.star(3),
    ss.Shape.branching((2, 2), replacement=True),
    ss.Shape.delayed(2, trunk=1, branch=2),
]
SpecInfer = ssg.schemes.specinfer.SpecInfer


def grafted_rounds(pair: Any, seed: int) -> list[Round]:
    """Trees of every shape, most with a guess grafted in (from the drafted path's start, so
    guesses follow drawn children and leave them at every depth, below leaves too), each with
    random and boundary noise, shuffled."""
    rng = np.random.default_rng(seed)
    vocab = pair.vocab_size
    rounds: list[Round] = []
    for shape in SHAPES:
        for _ in range(3):
            tree = shape.draft(pair, rng)
            path = list(tree.prefix(max(range(tree.num_nodes), key=tree.depth)))
            keep = int(rng.integers(0, len(path) + 1))
            guess = path[:keep] + list(rng.integers(0, vocab, int(rng.integers(0, 4))))
            tree = tree.graft(guess)
            target, draft = tables(pair, tree)
            for noise in (
                ss.Noise.draw(rng, tree.num_nodes),
                ss.Noise.constant(0.0, tree.num_nodes),
                ss.Noise.constant(LARGEST_BELOW_ONE, tree.num_nodes),
            ):
                rounds.append((tree, target, draft, noise))
    order = rng.permutation(len(rounds))
    return [rounds[i] for i in order]


def test_the_rounds_hold_grafted_and_plain_rows() -> None:
    rounds = grafted_rounds(ss.pairs.Random(4, seed=0), 0)
    laws = {r[0].law for r in rounds}
    assert laws == {DrawLaw.GRAFTED, DrawLaw.IID}
    assert any(r[0].law is DrawLaw.GRAFTED and r[0].is_chain for r in rounds)


@pytest.mark.parametrize("name", ["specinfer", "nss"])
@pytest.mark.parametrize("vocab", [2, 3, 6])
def test_pathwise_grafted_batches(name: str, vocab: int) -> None:
    for seed in range(4):
        pair = ss.pairs.Random(vocab, seed=seed)
        assert mismatches(name, grafted_rounds(pair, seed)) == []


@pytest.mark.parametrize("name", ["specinfer", "nss"])
def test_pathwise_grafted_when_every_row_walks_every_depth(name: str, monkeypatch) -> None:
    monkeypatch.setattr(ssg.schemes.base.NodeLowering, "walking_rows", lambda self, d, r: r)
    for seed in range(2):
        assert mismatches(name, grafted_rounds(ss.pairs.Random(3, seed=seed), seed)) == []


class GuessAsDraw(SpecInfer):
    """Reads every guess as a draw from ``q`` (the batch's guesses ignored)."""

    def node_extras(self, batch: Any, target_probs: Any, draft_probs: Any) -> Any:
        return draft_probs.new_zeros(batch.batch_size, draft_probs.shape[1], 0)


class GuessNotRemoved(SpecInfer):
    """A rejected guess updates the running target as a draw from ``q`` would."""

    def node_step(self, target, draft, tokens, valid, uniforms, guessed=None) -> Any:  # type: ignore[no-untyped-def]
        step = super().node_step(target, draft, tokens, valid, uniforms, guessed)
        if guessed is None:
            return step
        plain = super().node_step(target, draft, tokens, valid, uniforms, None)
        return type(step)(step.accepted, plain.stop_probs)


MUTANTS = [GuessAsDraw(), GuessNotRemoved()]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: type(m).__name__)
def test_mutants_are_caught(mutant: Any) -> None:
    found = sum(
        len(mismatches(mutant, grafted_rounds(ss.pairs.Random(3, seed=seed), seed)))
        for seed in range(4)
    )
    assert found > 0


def test_float32_grafted_tables_stay_in_range_and_near_the_reference() -> None:
    rounds = grafted_rounds(ss.pairs.Random(50, seed=3), 3)
    rounds = [r for r in rounds if {r[3].accept[0], r[3].sample[0]} - {0.0, LARGEST_BELOW_ONE}]
    batch = ssg.TreeBatch.from_trees([r[0] for r in rounds])
    target, draft = ssg.tables_batch(
        [r[1] for r in rounds], [r[2] for r in rounds], dtype=torch.float32
    )
    noise = ssg.Noise.from_reference([r[3] for r in rounds])
    out = ssg.verify("specinfer", batch, target, draft, noise)
    rows = torch.arange(len(rounds))
    assert bool(((out.token >= 0) & (out.token < 50)).all())
    assert bool((target[rows, out.node, out.token] > 0).all())
    off = sum(
        (int(out.node[row]), int(out.token[row]))
        != tuple(ss.SCHEMES["specinfer"].verify(tree, t, d, n))
        for row, (tree, t, d, n) in enumerate(rounds)
    )
    assert off <= 0.02 * len(rounds)


def test_tree_batch_carries_the_guesses() -> None:
    rounds = grafted_rounds(ss.pairs.Random(4, seed=1), 1)
    trees = [r[0] for r in rounds]
    batch = ssg.TreeBatch.from_trees(trees)
    assert batch.guesses is not None and batch.to_trees() == trees
    assert torch.equal(batch.to("cpu").guesses, batch.guesses)
    plain = [t for t in trees if t.law is DrawLaw.IID]
    assert ssg.TreeBatch.from_trees(plain).guesses is None
    with pytest.raises(ValueError, match="need their guesses"):
        dataclasses.replace(batch, guesses=None)
    with pytest.raises(ValueError, match="guesses must be"):
        dataclasses.replace(batch, guesses=batch.guesses[:, :1])


def test_verify_refuses_guesses_the_reference_would_not_read() -> None:
    """Guesses outside grafted rows, or not their node's last candidate listed once, would be
    tested as point masses by the lowering and not by the reference: ``verify`` refuses them
    when it validates (its one host read); construction and ``.to`` read nothing."""
    tree = ss.DraftTree.from_draws([(0, 2), (0, 1)], law="iid")
    grafted = tree.graft([3])  # root: drawn 2, drawn 1, guessed 3 (node 3)
    batch = ssg.TreeBatch.from_trees([grafted, tree])
    assert batch.guesses.tolist() == [[3, -1, -1, -1], [-1, -1, -1, -1]]
    target = torch.full((2, 4, 4), 0.25, dtype=torch.float64)
    ssg.verify("specinfer", batch, target, target)  # sound: no error
    bad = {
        "a guess in an iid row": [[3, -1, -1, -1], [2, -1, -1, -1]],
        "a drawn candidate": [[2, -1, -1, -1], [-1, -1, -1, -1]],
        "a node without candidates": [[3, 3, -1, -1], [-1, -1, -1, -1]],
        "below -1": [[3, -5, -1, -1], [-1, -1, -1, -1]],
    }
    for case, guesses in bad.items():
        wrong = dataclasses.replace(batch, guesses=torch.tensor(guesses)).to("cpu")  # no check
        assert not bool(ssg.tree.guesses_valid(wrong)), case
        with pytest.raises(ss.InvalidDistribution, match=r"batch\.guesses: each entry must be -1"):
            ssg.verify("specinfer", wrong, target, target)
        ssg.verify("specinfer", wrong, target, target, validate=False)  # trusted, as documented
    twice = ss.DraftTree.from_draws([(0, 2), (0, 1), (0, 2)], law="iid")
    listed = ssg.TreeBatch.from_trees([twice])  # the last candidate (node 1) listed twice
    wrong = dataclasses.replace(
        listed, laws=(DrawLaw.GRAFTED,), guesses=torch.tensor([[1, -1, -1]])
    )
    with pytest.raises(ValueError, match="listed once"):
        ssg.verify("specinfer", wrong, target[:1, :3], target[:1, :3])
    # table defects are named before the guesses
    with pytest.raises(ss.InvalidDistribution, match="target_probs"):
        ssg.verify("specinfer", wrong, 2 * target[:1, :3], target[:1, :3])


def test_other_lowerings_refuse_grafted_rows() -> None:
    rounds = grafted_rounds(ss.pairs.Random(4, seed=2), 2)
    exact = set()
    for name, lowering in ssg.SCHEMES.items():
        if not isinstance(lowering, ssg.schemes.TreeLowering):
            continue
        try:
            run_lowering(name, rounds)
        except ss.UnsupportedShape as err:
            assert "law 'grafted'" in str(err)
            continue
        exact.add(name)
    assert exact == {"specinfer", "nss"}


def test_certify_torch_runs_grafted_rows_and_catches_the_mutant() -> None:
    from specsampling.certify_torch import certify_torch

    good, bad = certify_torch(["specinfer", GuessAsDraw()]).schemes
    assert good.certified and 0 < good.grafted_rows < good.pathwise_rows
    assert not bad.certified and {v.kind for v in bad.violations} == {"path-wise"}
