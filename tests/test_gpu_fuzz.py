"""Fuzz of every registered tree lowering on float32/bf16 tables, and the chi-square of sampled
lowered rounds against the exact round law (docs/torch.md).

**Fuzz.** Tables at vocabularies up to 256k whose rows mix exact zeros, float32/bf16 denormals,
(near) one-hot rows and draft == target rows (all-zero residuals), cast to float32 or bf16 and
padded like a serving engine's batch: the vocabulary padded to a multiple of 128 with zero
columns, and padding nodes' rows full of NaN (never to be read). Trees of every shape the scheme
supports are drafted by the reference from the *draft* rows, so every drafted token has positive
draft mass (by construction every positive float64 entry stays positive after the cast). For
every row of every batch: no categorical draw sees a NaN distribution, every emitted token is in
``[0, V)`` (never a padded vocabulary column, never a ``-1`` lane), the emitted path follows real
nodes of the row's tree, and every emitted token has positive target probability at its
position. The default run has a few 256k cases and many small ones; the larger sweep is marked
``slow`` (``-m slow``).

**Chi-square.** For each scheme, sampled rounds (trees drawn from their exact draft law,
``Shape.enumerate``, verified by the lowering with fresh torch noise) are compared by Pearson's
chi-square on **counts** with ``ss.round_law``, bins merged to expected count >= 5: the scheme's
own single-position law with float64 tables, and a deeper tree shape with float32 tables.
False-positive budget ``FALSE_POSITIVE_BUDGET = 1e-3`` for this file, split evenly (Bonferroni)
over ``NUM_CHI_SQUARE_TESTS``; the negative control (a lowering whose residual is the target)
must be rejected at the same level and spends none of the budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import specsampling as ss
from proofs_tests.chisquare import chi_square_pvalue
from specsampling import gpu as ssg
from specsampling.certify import builtin_shapes
from specsampling.schemes import tables

TREE_LOWERINGS = sorted(
    name for name, lowering in ssg.SCHEMES.items() if isinstance(lowering, ssg.schemes.TreeLowering)
)
DTYPES = [torch.float32, torch.bfloat16]
#: A float32 and bf16 subnormal, exact in both (bf16 subnormals are multiples of 2^-133).
DENORMAL = 2.0**-130
BIG_VOCAB = 256_000
VOCAB_ALIGN = 128


def all_shapes(name: str) -> list[ss.Shape]:
    scheme = ss.SCHEMES[name]
    shapes = list(builtin_shapes())
    shapes += [s for s in (scheme.single_shape(k) for k in (1, 2, 3)) if s not in shapes]
    return [s for s in shapes if scheme.supports(s)]


def own_shape(name: str) -> ss.Shape:
    """The scheme's own two-candidate law, or a chain where it has none."""
    scheme = ss.SCHEMES[name]
    shape = scheme.single_shape(2)
    return shape if scheme.supports(shape) else ss.Shape.chain(2)


# --------------------------------------------------------------------------- adversarial rows
ROW_KINDS = ("sparse", "denormal", "one-hot", "near one-hot", "dense")


def adversarial_row(rng: np.random.Generator, vocab: int, kind: str) -> np.ndarray:
    """A float64 distribution whose positive entries stay positive in float32 and bf16."""
    row = np.zeros(vocab)
    if kind == "sparse":
        support = rng.choice(vocab, size=min(vocab, int(rng.integers(1, 8))), replace=False)
        row[support] = rng.random(support.size) + 0.01
    elif kind == "denormal":
        support = rng.choice(vocab, size=min(vocab, int(rng.integers(1, 4))), replace=False)
        row[support] = rng.random(support.size) + 0.01
        row /= row.sum()
        tail = rng.choice(vocab, size=min(vocab - 1, 200), replace=False)
        tail = tail[row[tail] == 0]
        row[tail] = DENORMAL * rng.integers(1, 9, tail.size)
        return row  # the denormals are below float64's resolution of the mass 1
    elif kind == "one-hot":
        row[rng.integers(vocab)] = 1.0
        return row
    elif kind == "near one-hot":
        spread = rng.choice(vocab, size=min(vocab, 100), replace=False)
        row[spread] = 1e-9
        row[spread[0]] = 0.0
        row[spread[0]] = 1.0 - row.sum()
        return row
    else:  # dense with exact zeros
        row = rng.random(vocab) ** 3
        row[rng.random(vocab) < 0.3] = 0.0
        row[rng.integers(vocab)] += 0.1
    return row / row.sum()


class FuzzPair:
    """A context-dependent model pair of adversarial rows (memoised per prefix); a quarter of
    the contexts have draft == target (zero residual)."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self._vocab_size, self._seed = vocab_size, seed
        self._rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def target(self, prefix: Any) -> np.ndarray:
        return self._row(tuple(prefix))[0]

    def draft(self, prefix: Any) -> np.ndarray:
        return self._row(tuple(prefix))[1]

    def _row(self, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        if prefix not in self._rows:
            rng = np.random.default_rng([self._seed, len(prefix), *prefix])
            kinds = rng.choice(ROW_KINDS, size=2)
            target = adversarial_row(rng, self._vocab_size, str(kinds[0]))
            same = rng.random() < 0.25
            draft = target.copy() if same else adversarial_row(rng, self._vocab_size, str(kinds[1]))
            self._rows[prefix] = (target, draft)
        return self._rows[prefix]

    def __repr__(self) -> str:
        return f"FuzzPair({self._vocab_size}, seed={self._seed})"


# --------------------------------------------------------------------------- the fuzz harness
class NaNWatch:
    """Wraps ``ssg.ops.categorical`` and ``ssg.ops.categorical_blocks`` (every lowering draws
    through one of them: float64 the first, below it the second): records draws from a
    distribution with a NaN or inf entry, or from a non-finite uniform."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bad = 0
        self.calls = 0
        for name in ("categorical", "categorical_blocks"):
            self.watch(monkeypatch, name)

    def watch(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        original = getattr(ssg.ops, name)

        def watched(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            self.bad += int((~torch.isfinite(probs)).any()) + int((~torch.isfinite(u)).any())
            return original(probs, u)

        monkeypatch.setattr(ssg.ops, name, watched)


def fuzz_rounds(
    name: str, shapes: list[ss.Shape], vocab: int, seed: int, drafts: int
) -> Iterator[tuple[ss.DraftTree, np.ndarray, np.ndarray]]:
    pair = FuzzPair(vocab, seed)
    rng = np.random.default_rng(seed)
    for shape in shapes:
        for _ in range(drafts):
            tree = shape.draft(pair, rng)
            yield (tree, *tables(pair, tree))


def check_fuzz(
    name: str,
    shapes: list[ss.Shape],
    vocab: int,
    dtype: torch.dtype,
    seed: int,
    watch: NaNWatch,
    drafts: int = 2,
    device: str = "cpu",
) -> int:
    """Verify one mixed batch and check every row; returns the number of rows."""
    rounds = list(fuzz_rounds(name, shapes, vocab, seed, drafts))
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(len(rounds))
    rounds = [rounds[i] for i in order]
    padded = -(-vocab // VOCAB_ALIGN) * VOCAB_ALIGN + VOCAB_ALIGN  # a serving engine's padding
    for tree, _, draft_rows in rounds:  # drafted tokens have positive draft mass by design
        for node in range(1, tree.num_nodes):
            assert draft_rows[tree.parents[node], tree.tokens[node]] > 0
    batch = ssg.TreeBatch.from_trees([r[0] for r in rounds])
    num_nodes = batch.parents.shape[1]
    target = torch.full((len(rounds), num_nodes, padded), float("nan"), dtype=dtype)  # [B, N, V']
    draft = torch.full((len(rounds), num_nodes, padded), float("nan"), dtype=dtype)  # [B, N, V']
    for row, (tree, t, d) in enumerate(rounds):
        target[row, : tree.num_nodes] = 0.0
        draft[row, : tree.num_nodes] = 0.0
        target[row, : tree.num_nodes, :vocab] = torch.from_numpy(t).to(dtype)
        draft[row, : tree.num_nodes, :vocab] = torch.from_numpy(d).to(dtype)
    positive = torch.from_numpy(_stack(rounds, 1, num_nodes))  # [B, N, V]
    assert bool(((target[:, :, :vocab] > 0) == positive).all()), "test design: an underflow"
    before = watch.bad
    generator = torch.Generator(device=device).manual_seed(seed)
    batch, target, draft = batch.to(device), target.to(device), draft.to(device)
    out = ssg.verify(name, batch, target, draft, generator=generator)
    assert watch.bad == before, f"{name}: a categorical draw saw NaN/inf ({dtype}, V={vocab})"
    assert bool(((out.token >= 0) & (out.token < vocab)).all()), (name, out.token)
    tokens, counts, nodes = out.tokens.tolist(), out.num_emitted.tolist(), out.node.tolist()
    for row, (tree, _, _) in enumerate(rounds):
        assert 0 <= nodes[row] < tree.num_nodes
        assert counts[row] == tree.depth(nodes[row]) + 1
        assert set(tokens[row][counts[row] :]) <= {-1}
        node = 0
        for position, token in enumerate(tokens[row][: counts[row]]):
            assert 0 <= token < vocab, (name, row, token)
            assert float(target[row, node, token]) > 0, (name, row, position, token)
            if position < counts[row] - 1:
                child = tree.child_with_token(node, token)
                assert child is not None, (name, row, "emitted path leaves the tree")
                node = child
        assert node == nodes[row] and tokens[row][counts[row] - 1] == out.token[row]
    return len(rounds)


def _stack(rounds: list[Any], index: int, num_nodes: int) -> np.ndarray:
    """``target > 0`` of every round as ``[B, N, V]`` (padding nodes: False)."""
    vocab = rounds[0][index].shape[1]
    mask = np.zeros((len(rounds), num_nodes, vocab), dtype=bool)
    for row, r in enumerate(rounds):
        mask[row, : r[index].shape[0]] = r[index] > 0
    return mask


SMALL_VOCABS = (2, 3, 17, 1000)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", TREE_LOWERINGS)
def test_fuzz_small_vocabularies(name: str, dtype: torch.dtype, monkeypatch: Any) -> None:
    watch = NaNWatch(monkeypatch)
    rows = 0
    for seed, vocab in enumerate(SMALL_VOCABS):
        rows += check_fuzz(name, all_shapes(name), vocab, dtype, seed, watch)
    assert watch.calls > 0 and rows >= 2 * len(SMALL_VOCABS)


@pytest.mark.parametrize("name", TREE_LOWERINGS)
def test_fuzz_256k_vocabulary(name: str, monkeypatch: Any) -> None:
    """One 256k batch per scheme, float32 and bf16 by turns (both dtypes at 256k for every
    scheme in the slow sweep)."""
    watch = NaNWatch(monkeypatch)
    dtype = DTYPES[TREE_LOWERINGS.index(name) % 2]
    check_fuzz(name, [own_shape(name)], BIG_VOCAB, dtype, 7, watch, drafts=3)
    assert watch.calls > 0


@pytest.mark.cuda
@pytest.mark.parametrize("name", TREE_LOWERINGS)
def test_fuzz_on_device(name: str, monkeypatch: Any) -> None:
    """The 256k fuzz in both dtypes on CUDA when one is present (4096 columns on CPU)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = BIG_VOCAB if device == "cuda" else 4096
    watch = NaNWatch(monkeypatch)
    for seed, dtype in enumerate(DTYPES):
        check_fuzz(name, all_shapes(name), vocab, dtype, 11 + seed, watch, device=device)
    assert watch.calls > 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", TREE_LOWERINGS)
def test_fuzz_sweep(name: str, dtype: torch.dtype, monkeypatch: Any) -> None:
    """Every supported shape at 32k, 128k and 256k, more seeds (``-m slow``)."""
    watch = NaNWatch(monkeypatch)
    for seed, vocab in enumerate((32_000, 128_000, BIG_VOCAB, 50_257, 151_936)):
        check_fuzz(name, all_shapes(name), vocab, dtype, 100 + seed, watch)
    for seed in range(20):
        check_fuzz(name, all_shapes(name), int(2 + seed * 7), dtype, 200 + seed, watch, drafts=4)


def test_the_fuzz_rows_are_adversarial() -> None:
    """The generator really makes the rows it promises (test design)."""
    rng = np.random.default_rng(0)
    for kind in ROW_KINDS:
        row = adversarial_row(rng, 1000, kind)
        assert row.min() >= 0 and abs(row.sum() - 1) < 1e-12, kind
        for dtype in DTYPES:
            cast = torch.from_numpy(row).to(dtype)
            assert bool(((cast > 0) == torch.from_numpy(row > 0)).all()), (kind, dtype)
    denormal = torch.from_numpy(adversarial_row(rng, 1000, "denormal")).to(torch.bfloat16)
    tiny = (denormal > 0) & (denormal < torch.finfo(torch.bfloat16).tiny)
    assert int(tiny.sum()) > 100  # bf16 subnormals are present
    one_hot = adversarial_row(rng, 50, "one-hot")
    assert (one_hot == 1).sum() == 1 and (one_hot == 0).sum() == 49
    near = adversarial_row(rng, 1000, "near one-hot")
    assert 1 - 1e-6 < near.max() < 1 and (near == 0).sum() > 800
    pair = FuzzPair(20, 0)
    same = sum(np.array_equal(pair.target((t,)), pair.draft((t,))) for t in range(20))
    assert 0 < same < 20  # p == q contexts (zero residual) and others


class NaNResidual(ssg.schemes.standard.Standard):
    """Mutant: the residual divided by its mass without the zero-mass guard (NaN at p == q)."""

    def node_step(self, target: Any, draft: Any, tokens: Any, valid: Any, uniforms: Any) -> Any:
        step = super().node_step(target, draft, tokens, valid, uniforms)
        weights = (target - draft).clamp_min(0)  # [B, V]
        return ssg.schemes.NodeStep(step.accepted, weights / weights.sum(-1, keepdim=True))


class UniformStop(ssg.schemes.standard.Standard):
    """Mutant: stops with the uniform distribution over every column, padding included."""

    def node_step(self, target: Any, draft: Any, tokens: Any, valid: Any, uniforms: Any) -> Any:
        step = super().node_step(target, draft, tokens, valid, uniforms)
        return ssg.schemes.NodeStep(step.accepted, torch.ones_like(target) / target.shape[-1])


@pytest.mark.parametrize(
    ("mutant", "message"), [(NaNResidual(), "NaN/inf"), (UniformStop(), "out.token|tensor")]
)
def test_fuzz_catches_mutants(mutant: Any, message: str, monkeypatch: Any) -> None:
    monkeypatch.setitem(ssg.SCHEMES._items, "standard", mutant)
    watch = NaNWatch(monkeypatch)
    with pytest.raises(AssertionError, match=message):
        for seed in range(20):
            check_fuzz("standard", all_shapes("standard"), 17, torch.float32, seed, watch)


# --------------------------------------------------------------------------- chi-square
SEED = 20240612
NUM_ROUNDS = 20_000
CHI_PAIR = ss.pairs.Random(3, seed=2)  # context dependent; some rows have zeros
DEEPER = (
    ss.Shape.paths(2, 2),
    ss.Shape.branching((2, 1), replacement=True),
    ss.Shape.branching((2, 2)),
    ss.Shape.delayed(2, trunk=1, branch=1),
    ss.Shape.greedy((2, 2)),
    ss.Shape.hub(2),
    ss.Shape.chain(3),
)


def chi_shapes(name: str) -> list[tuple[ss.Shape, torch.dtype]]:
    """The scheme's own law in float64 and a deeper supported shape in float32."""
    deeper = next(s for s in DEEPER if ss.SCHEMES[name].supports(s))
    return [(own_shape(name), torch.float64), (deeper, torch.float32)]


CHI_CASES = [(name, shape, dtype) for name in TREE_LOWERINGS for shape, dtype in chi_shapes(name)]
FALSE_POSITIVE_BUDGET = 1e-3
NUM_CHI_SQUARE_TESTS = len(CHI_CASES)
ALPHA = FALSE_POSITIVE_BUDGET / NUM_CHI_SQUARE_TESTS  # per test, Bonferroni


def sampled_counts(lowering: Any, shape: ss.Shape, dtype: torch.dtype, seed: int) -> Counter:
    """Counts of emitted tuples of ``NUM_ROUNDS`` lowered rounds: trees drawn from their exact
    draft law (``shape.enumerate``), verified in one batch with fresh float64 torch noise."""
    trees, weights = zip(*shape.enumerate(CHI_PAIR), strict=True)
    probs = np.array([float(w) for w in weights])
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(trees), size=NUM_ROUNDS, p=probs / probs.sum())
    unique = ssg.TreeBatch.from_trees(list(trees))
    index = torch.from_numpy(picks)
    batch = ssg.TreeBatch(
        unique.parents[index],
        unique.tokens[index],
        unique.num_nodes[index],
        unique.candidates[index],
        unique.depth[index],
        tuple(unique.laws[i] for i in picks),
        tuple(unique.chains[i] for i in picks),
        unique.max_depth,
    )
    target, draft = ssg.tables_batch(
        *zip(*(tables(CHI_PAIR, tree) for tree in trees), strict=True), dtype=dtype
    )
    generator = torch.Generator().manual_seed(seed)
    out = ssg.verify(lowering, batch, target[index], draft[index], generator=generator)
    tokens, counts = out.tokens.tolist(), out.num_emitted.tolist()
    return Counter(tuple(row[:count]) for row, count in zip(tokens, counts, strict=True))


def test_budget_is_declared() -> None:
    assert ALPHA * NUM_CHI_SQUARE_TESTS == pytest.approx(FALSE_POSITIVE_BUDGET)
    assert {case[0] for case in CHI_CASES} == set(TREE_LOWERINGS) and len(TREE_LOWERINGS) >= 4


@pytest.mark.parametrize("index", range(len(CHI_CASES)))
def test_sampled_lowered_rounds_match_round_law(index: int) -> None:
    name, shape, dtype = CHI_CASES[index]
    law = ss.round_law(name, CHI_PAIR, shape)
    counts = sampled_counts(name, shape, dtype, SEED + index)
    pvalue = chi_square_pvalue(counts, law)
    assert pvalue > ALPHA, (name, shape, dtype, pvalue)


class ResidualIsTarget(ssg.schemes.standard.Standard):
    """Mutant: a rejection draws from the target instead of ``norm((p - q)_+)``."""

    def node_step(self, target: Any, draft: Any, tokens: Any, valid: Any, uniforms: Any) -> Any:
        step = super().node_step(target, draft, tokens, valid, uniforms)
        return ssg.schemes.NodeStep(step.accepted, target)


def test_negative_control_wrong_residual_is_rejected() -> None:
    """Power check (no budget spent): the same harness rejects a lossy lowering."""
    shape = ss.Shape.chain(2)
    law = ss.round_law("standard", CHI_PAIR, shape)
    for dtype in (torch.float64, torch.float32):
        counts = sampled_counts(ResidualIsTarget(), shape, dtype, SEED + 999)
        assert chi_square_pvalue(counts, law) < ALPHA
        assert chi_square_pvalue(sampled_counts("standard", shape, dtype, SEED + 999), law) > ALPHA


def test_stray_outcome_fails_immediately() -> None:
    with pytest.raises(AssertionError, match="probability 0"):
        chi_square_pvalue(Counter({(0,): 10, (1,): 1}), {(0,): 0.5, (2,): 0.5})
