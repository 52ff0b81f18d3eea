"""Path-wise equality of the torch lowering with its numpy reference (docs/torch.md).

Fed the same trees, tables and noise, the float64 lowering must return the reference verdict for
every row of a batch that mixes trees of different shapes and sizes, so a row's result never
depends on its neighbours or on padding. Mutants of the lowering must fail the same comparison.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from proofs_tests.pathwise import Round, hypothesis_rounds, mismatches, run_lowering
from specsampling import gpu as ssg
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes import tables

ops = ssg.ops
NSS, RSD = ssg.schemes.nss.NSS, ssg.schemes.rsd.RSD
SpecInfer, Standard = ssg.schemes.specinfer.SpecInfer, ssg.schemes.standard.Standard

DEEPER = (
    ss.Shape.chain(5),
    ss.Shape.star(4),
    ss.Shape.star(4, replacement=False),
    ss.Shape.paths(3, 3),
    ss.Shape.branching((3, 2)),
    ss.Shape.branching((2, 2), replacement=True),
    ss.Shape.branching((1, 1, 1)),
    ss.Shape.delayed(3, trunk=2, branch=2),
    ss.Shape.top((3, 2)),
    ss.Shape.greedy((3, 2)),
    ss.Shape.greedy((1, 1)),
    ss.Shape.hub(2),
)
SHAPES = LAW_SHAPES + DEEPER
LOWERED = sorted(n for n, low in ssg.SCHEMES.items() if isinstance(low, ssg.schemes.TreeLowering))


def supported(name: str) -> list[ss.Shape]:
    return [shape for shape in SHAPES if ss.SCHEMES[name].supports(shape)]


def boundary_noises(rng: np.random.Generator, num_nodes: int) -> list[ss.Noise]:
    return [
        ss.Noise.draw(rng, num_nodes),
        ss.Noise.constant(0.0, num_nodes),
        ss.Noise.constant(LARGEST_BELOW_ONE, num_nodes),
    ]


def mixed_rounds(name: str, pair: Any, seed: int) -> list[Round]:
    """Every supported shape drafted once, each with random and boundary noise, shuffled."""
    rng = np.random.default_rng(seed)
    rounds: list[Round] = []
    for shape in supported(name):
        tree = shape.draft(pair, rng)
        target, draft = tables(pair, tree)
        rounds += [(tree, target, draft, n) for n in boundary_noises(rng, tree.num_nodes)]
    order = rng.permutation(len(rounds))
    return [rounds[i] for i in order]


@pytest.mark.parametrize("name", LOWERED)
@pytest.mark.parametrize("vocab", [2, 3, 6])
@pytest.mark.parametrize("pair_seed", [0, 1, 2])
def test_pathwise_mixed_batches(name: str, vocab: int, pair_seed: int) -> None:
    pair = ss.pairs.Random(vocab, seed=pair_seed)
    for seed in range(3):
        assert mismatches(name, mixed_rounds(name, pair, seed)) == []


@pytest.mark.parametrize("name", LOWERED)
def test_pathwise_when_every_row_walks_every_depth(name: str, monkeypatch) -> None:
    """The accelerators' route of the node walk (every row decided at every depth, stopped
    rows keeping their verdict, every level's rule run and its leaves' bonus rows selected)
    gives the reference's verdicts too; the CPU route, which decides only for the rows still
    walking and skips what a level without leaves or of leaves only does not need, is what the
    other path-wise tests run."""
    monkeypatch.setattr(ssg.schemes.base.NodeLowering, "walking_rows", lambda self, d, r: r)
    monkeypatch.setattr(
        ssg.schemes.base.NodeLowering, "leaf_rows", lambda self, leaf: (True, False)
    )
    recursive = ssg.schemes.specinfer.RecursiveRejection
    monkeypatch.setattr(recursive, "rejecting_rows_only", lambda self, target: False)
    resispec = ssg.schemes.resispec.ResiSpec
    monkeypatch.setattr(resispec, "rejecting_rows_only", lambda self, target: False)
    spectr = ssg.schemes.spectr.SpecTr
    monkeypatch.setattr(spectr, "rejecting_rows_only", lambda self, stopping: False)
    pair = ss.pairs.Random(3, seed=1)
    assert mismatches(name, mixed_rounds(name, pair, 1)) == []


@pytest.mark.parametrize("name", ["specinfer", "rsd"])
def test_recursive_rejection_updating_too_few_rows_is_caught(name: str, monkeypatch) -> None:
    """Mutant of the CPU route of recursive rejection: the update formed for the rejecting
    rows but written for the first of them only (a row's later slots test a stale p')."""
    recursive = type(ssg.get_lowering(name))
    original = recursive.update

    def first_row_only(self: Any, target: Any, draft: Any, token: Any) -> Any:
        new_target, new_draft = original(self, target, draft, token)
        new_target[1:] = target[1:]
        return new_target, new_draft

    monkeypatch.setattr(recursive, "update", first_row_only)
    pair = ss.pairs.Random(3, seed=1)
    assert mismatches(name, mixed_rounds(name, pair, 1)) != []


@pytest.mark.parametrize("wrong", [(False, False), (True, True)])
def test_a_walk_misjudging_its_leaves_is_caught(wrong: tuple[bool, bool], monkeypatch) -> None:
    """Mutants of the CPU walk's leaf read: never selecting the bonus rows (leaves stop with
    the rule's residual), or treating every level as leaves (no rule runs)."""
    monkeypatch.setattr(ssg.schemes.base.NodeLowering, "leaf_rows", lambda self, leaf: wrong)
    pair = ss.pairs.Random(3, seed=1)
    assert mismatches("standard", mixed_rounds("standard", pair, 1)) != []


@pytest.mark.cuda
@pytest.mark.parametrize("name", LOWERED)
def test_pathwise_on_device(name: str) -> None:
    """The same comparison on CUDA when one is present (on CPU otherwise)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for pair_seed in range(3):
        pair = ss.pairs.Random(5, seed=pair_seed)
        assert mismatches(name, mixed_rounds(name, pair, pair_seed), device=device) == []


@pytest.mark.parametrize("name", LOWERED)
def test_pathwise_hypothesis(name: str) -> None:
    @given(hypothesis_rounds(supported(name)))
    def check(rounds: list[Round]) -> None:
        assert mismatches(name, rounds) == []

    check()


# --------------------------------------------------------------------------- mutants
class InclusiveAccept(SpecInfer):
    """``u * q <= p``: accepts a token of zero target mass when ``u == 0``."""

    def accepts(self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> Any:
        return u * draft_x.double() <= target_x.double()


class InclusiveAcceptStandard(Standard):
    def accepts(self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> Any:
        return u * draft_x.double() <= target_x.double()


class ResidualNotZeroed(SpecInfer):
    """After a rejection the rejected token keeps its running mass in the residual."""

    def update(self, target: torch.Tensor, draft: torch.Tensor, token: torch.Tensor) -> Any:
        kept = ops.gather_tokens(target, token)[:, None]  # [B, 1]
        weights = ops.residual(target, draft).scatter(-1, token[:, None], kept)  # [B, V]
        return weights / weights.sum(-1, keepdim=True), draft


class BonusFromParent(NSS):
    """The bonus at a leaf drawn from the parent's target row."""

    def bonus_row(self, batch: ssg.TreeBatch, node: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(batch.batch_size, device=node.device)
        return batch.parents[rows, node].clamp_min(0)


class PaddingSelectable(RSD):
    """Padded candidate slots treated as real: ``-1`` ids clamped to node 0 are selectable."""

    def candidate_mask(self, candidate_nodes: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(candidate_nodes, dtype=torch.bool)


MUTANTS = [
    InclusiveAccept(),
    InclusiveAcceptStandard(),
    ResidualNotZeroed(),
    BonusFromParent(),
    PaddingSelectable(),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: type(m).__name__)
def test_mutants_are_caught(mutant: Any) -> None:
    found = 0
    for pair_seed in range(8):
        pair = ss.pairs.Random(3, seed=pair_seed)
        found += len(mismatches(mutant, mixed_rounds(mutant.name, pair, pair_seed)))
    assert found > 0, f"the path-wise test passes the mutant {type(mutant).__name__}"


# --------------------------------------------------------------------------- padding and range
@pytest.mark.parametrize("name", LOWERED)
def test_padding_never_read_and_tokens_in_range(name: str) -> None:
    """Padded table rows full of NaN (or of a point mass on the last token) change nothing;
    every emitted token is in ``[0, V)`` with positive target mass where it was emitted."""
    vocab = 4
    pair = ss.pairs.Random(vocab, seed=7)
    rounds = mixed_rounds(name, pair, 7)
    assert mismatches(name, rounds, pad=float("nan")) == []
    outputs = [run_lowering(name, rounds, pad=pad) for pad in (float("nan"), 0.0, 1.0)]
    for out in outputs[1:]:
        assert torch.equal(out.tokens, outputs[0].tokens)
    out = outputs[0]
    assert bool(((out.token >= 0) & (out.token < vocab)).all())
    for row, (tree, target, _, _) in enumerate(rounds):
        node = 0
        for position, token in enumerate(out.tokens[row, : out.num_emitted[row]].tolist()):
            assert 0 <= token < vocab and target[node, token] > 0
            if position < out.num_emitted[row] - 1:
                node = tree.child_with_token(node, token)
                assert node is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_low_precision_tables_stay_in_range(dtype: torch.dtype) -> None:
    """float32/bf16 tables (computed in float32): tokens in range with positive target mass,
    and verdicts off the reference only near a rounding boundary (bound: 2% of the rows with
    random noise; boundary uniforms meet the float32 CDF's lost tail mass, not counted)."""
    random_rows = off = 0
    for name in LOWERED:
        for seed in range(3):
            rounds = mixed_rounds(name, ss.pairs.Random(50, seed=seed), seed)
            batch = ssg.TreeBatch.from_trees([r[0] for r in rounds])
            target, draft = ssg.tables_batch(
                [r[1] for r in rounds], [r[2] for r in rounds], dtype=dtype
            )
            out = ssg.verify(
                name, batch, target, draft, ssg.Noise.from_reference([r[3] for r in rounds])
            )
            assert bool(((out.token >= 0) & (out.token < 50)).all())
            rows = torch.arange(len(rounds))
            assert bool((target[rows, out.node, out.token] > 0).all())
            for row, (tree, t, d, noise) in enumerate(rounds):
                if {noise.accept[0], noise.sample[0]} & {0.0, LARGEST_BELOW_ONE}:
                    continue
                random_rows += 1
                expected = tuple(ss.SCHEMES[name].verify(tree, t, d, noise))
                off += (int(out.node[row]), int(out.token[row])) != expected
    assert off <= 0.02 * random_rows


def test_the_walk_never_synchronises() -> None:
    """No ``.item()``, ``.tolist()`` or Python branching on tensor values in the verify path."""
    import inspect

    sources = [
        inspect.getsource(getattr(type(lowering), method))
        for lowering in ssg.SCHEMES.values()
        for method in lowering.hot_path
    ]
    assert all(lowering.hot_path for lowering in ssg.SCHEMES.values())
    shared = (ops.categorical, ops.residual, ops.remove_token, ssg.schemes.base.standard_step)
    shared += tuple(getattr(ssg.schemes.base.Descent, m) for m in ("start", "advance", "verified"))
    sources += [inspect.getsource(f) for f in shared]
    sources += [inspect.getsource(ssg.schemes.rsd.RSD.update)]
    # The module-level pieces of the multi-candidate lowerings, called from their hot paths.
    spectr, resispec = ssg.schemes.spectr, ssg.schemes.resispec
    helpers: list[Any] = [
        spectr.accept_probability,
        spectr.reuse_uniform,
        spectr.later_copies,
        spectr.gamma,
        spectr.rejection,
        spectr.optimal_rho,
        spectr.bisection_rho,
        spectr.residual,
        ops.normalise_in_place,
        resispec.top_mask,
        resispec.ratio_sub_target,
        ssg.schemes.greedy.token_mask,
        ssg.schemes.spechub.hub_token,
        ssg.schemes.spechub.hub_plan,
    ]
    for policy in resispec.POLICIES.values():
        helpers += [policy.at_node, policy.sub_target]
    sources += [inspect.getsource(f) for f in helpers]
    for source in sources:
        body = source.split('"""')[-1]
        # A branch on static metadata (shapes, dtypes, Python ints) says so on its line.
        lines = [line for line in body.splitlines() if "# static" not in line]
        for forbidden in (".item(", ".tolist(", "bool(", "int(", "float(", ".nonzero(", "if "):
            assert forbidden not in "\n".join(lines), forbidden


def test_categorical_matches_reference_at_the_boundaries() -> None:
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(7), size=60)
    rows[rng.random(rows.shape) < 0.4] = 0.0
    rows[np.arange(60), rng.integers(0, 7, 60)] += 0.1  # every row keeps some mass
    rows[:10, -3:] = 0.0  # trailing zeros: the clip to the last positive token
    rows[10:20] = np.eye(7)[rng.integers(0, 7, 10)]
    for u in (0.0, LARGEST_BELOW_ONE, 0.5, *rng.random(5)):
        expected = [ss.ops.categorical(row, u) for row in rows]
        uniforms = torch.full((60,), u, dtype=torch.float64)
        got = ops.categorical(torch.tensor(rows), uniforms).tolist()
        assert got == expected


@pytest.mark.parametrize("vocab", [6, 300])
def test_residual_and_remove_token_match_reference(vocab: int) -> None:
    """Bit for bit in float64: the row masses are summed in numpy's order (``ops.numpy_sum``),
    which ``torch.sum`` does not follow from a few entries on (a 1-ulp mass can move a
    boundary draw)."""
    rng = np.random.default_rng(1)
    target, draft = rng.dirichlet(np.ones(vocab), size=(2, 30))
    draft[:5] = target[:5]  # zero-mass residual: the target comes back
    got = ops.residual(torch.tensor(target), torch.tensor(draft)).numpy()
    expected = [ss.ops.residual(p, q) for p, q in zip(target, draft, strict=True)]
    np.testing.assert_array_equal(got, expected)
    tokens = rng.integers(0, vocab, 30)
    got = ops.remove_token(torch.tensor(target), torch.tensor(tokens)).numpy()
    expected = [ss.ops.remove_token(p, t) for p, t in zip(target, tokens, strict=True)]
    np.testing.assert_array_equal(got, expected)
    buffer = torch.tensor(target)  # in place: the same rows, written over the buffer
    assert ops.remove_token(buffer, torch.tensor(tokens), in_place=True) is buffer
    np.testing.assert_array_equal(buffer.numpy(), expected)
    assert (ops.remove_token(torch.tensor([[1.0, 0.0]]), torch.tensor([0])) == 0).all()


def test_row_gathers_are_fresh_copies_of_the_indexed_rows() -> None:
    """``ops.table_rows`` (the walk's level rows, which a step owns and may write over) and
    ``ops.take_rows``: the indexed rows, bit for bit, in fresh storage, for contiguous and
    strided tables alike (a view written over would corrupt the caller's table)."""
    table = torch.rand(4, 5, 7, dtype=torch.float64)
    rows, nodes = torch.tensor([3, 0, 3]), torch.tensor([1, 4, 1])
    for source in (table, table.transpose(0, 1).contiguous().transpose(0, 1)):  # strided
        got = ops.table_rows(source, rows, nodes)
        assert torch.equal(got, source[rows, nodes])
        got.fill_(-1.0)  # written over: the table is untouched
        assert torch.equal(source, table)
    flat = table[:, 0]  # [4, 7], strided
    taken = ops.take_rows(flat, rows)
    assert torch.equal(taken, flat[rows]) and taken.data_ptr() != flat.data_ptr()
    taken.fill_(-1.0)
    assert torch.equal(flat, table[:, 0]) and (table >= 0).all()
    assert ops.take_rows(flat, slice(1, 3)).data_ptr() == flat[1].data_ptr()  # a slice: a view


def test_a_one_ulp_residual_mass_cannot_move_a_boundary_draw() -> None:
    """Regression: token 3 drawn twice at the root; with the residual's mass summed by
    ``torch.sum`` the lowering's last-uniform draw emitted 4 where the reference emits 5."""
    tree = ss.DraftTree.from_draws([(0, 3), (0, 3)], law="iid")
    p, q = np.array([1, 1, 2, 0, 2, 6]) / 12, np.array([0, 0, 2, 6, 0, 4]) / 12
    uniform = np.full(6, 1 / 6)
    target, draft = np.stack([p, uniform]), np.stack([q, uniform])
    noise = ss.Noise(np.array([0.5, 0.9]), np.array([LARGEST_BELOW_ONE, 0.5]))
    assert mismatches("specinfer", [(tree, target, draft, noise)]) == []


# --------------------------------------------------------------------------- layout
def test_tree_batch_round_trips_every_law() -> None:
    pair = ss.pairs.Random(3, seed=0)
    rng = np.random.default_rng(0)
    trees = [shape.draft(pair, rng) for shape in SHAPES]
    trees += [ss.DraftTree.chain([2, 1]), ss.DraftTree.from_draws([(0, 1), (0, 1)], law="iid")]
    trees.append(ss.DraftTree((-1,), (-1,)))
    batch = ssg.TreeBatch.from_trees(trees)
    assert batch.to_trees() == trees
    assert [t.law for t in batch.to_trees()] == [t.law for t in trees]
    assert batch.chains == tuple(t.is_chain for t in trees)
    assert batch.max_depth == max(t.max_depth for t in trees)
    assert batch.num_nodes.tolist() == [t.num_nodes for t in trees]
    assert batch.depth[0, : trees[0].num_nodes].tolist() == [
        trees[0].depth(n) for n in range(trees[0].num_nodes)
    ]
    widest = [0] * (batch.max_depth + 1)
    for tree in trees:
        for node, cands in enumerate(tree.candidates):
            widest[tree.depth(node)] = max(widest[tree.depth(node)], len(cands))
    assert batch.level_slots == tuple(widest)
    # computed in __post_init__ when not given (the same host read as chains and max_depth)
    rebuilt = ssg.TreeBatch(
        batch.parents, batch.tokens, batch.num_nodes, batch.candidates, batch.depth, batch.laws
    )
    assert (rebuilt.chains, rebuilt.max_depth, rebuilt.level_slots) == (
        batch.chains,
        batch.max_depth,
        batch.level_slots,
    )
    assert batch.to("cpu").level_slots == batch.level_slots
    assert ssg.TreeBatch.roots(2).level_slots == (0,)
    for bad in ((1,), (*widest[:-1], -1), (*widest[:-1], 1.5)):
        with pytest.raises(ValueError, match="level_slots"):
            dataclasses.replace(batch, level_slots=bad)


def drafted_batch(shape: ss.Shape, pair: Any, seed: int, count: int) -> tuple[Any, ...]:
    """``count`` trees of ``shape`` drafted from ``pair`` with their tables and noise: the
    reference rounds, then the batch, float64 tables and noise of the lowering."""
    rng = np.random.default_rng(seed)
    rounds = []
    for _ in range(count):
        tree = shape.draft(pair, rng)
        rounds.append((tree, *tables(pair, tree), ss.Noise.draw(rng, tree.num_nodes)))
    batch = ssg.TreeBatch.from_trees([r[0] for r in rounds])
    target, draft = ssg.tables_batch([r[1] for r in rounds], [r[2] for r in rounds])
    return rounds, batch, target, draft, ssg.Noise.from_reference([r[3] for r in rounds])


class SlotCounting(SpecInfer):
    """SpecInfer recording how many candidate slots each walk step loops over."""

    def __init__(self) -> None:
        self.widths: list[int] = []

    def node_step(self, target: Any, draft: Any, tokens: Any, valid: Any, u: Any) -> Any:
        self.widths.append(int(tokens.shape[1]))
        return super().node_step(target, draft, tokens, valid, u)


def test_the_walk_loops_over_the_slots_of_each_level_only() -> None:
    """On merged branching trees (up to 8 candidates at depth 2, two at the root, none at the
    leaves) each walk step sees the slots its level can hold (on the CPU the level of leaves
    runs no rule at all), the verdicts stay the reference's, and a batch whose level bounds are
    too small is refused, and unchecked loses them (the bound is what keeps it exact)."""
    shape = ss.Shape.branching((2, 2, 2), replacement=True)
    rounds, batch, target, draft, noise = drafted_batch(shape, ss.pairs.Random(8, seed=2), 3, 24)
    assert batch.candidates.shape[-1] > max(batch.level_slots[:1] + batch.level_slots[-1:])
    counting = SlotCounting()
    out = ssg.verify(counting, batch, target, draft, noise)
    assert batch.level_slots[-1] == 0
    assert counting.widths == [w for w in batch.level_slots if w > 0]
    expected = [ss.SCHEMES["specinfer"].verify(t, p, q, n) for t, p, q, n in rounds]
    assert list(zip(out.node.tolist(), out.token.tolist(), strict=True)) == expected
    narrow = dataclasses.replace(batch, level_slots=(1,) * len(batch.level_slots))
    with pytest.raises(ss.InvalidDistribution, match="level_slots"):  # checked by validation
        ssg.verify("specinfer", narrow, target, draft, noise)
    out = ssg.verify("specinfer", narrow, target, draft, noise, validate=False)
    assert list(zip(out.node.tolist(), out.token.tolist(), strict=True)) != expected


def test_noise_from_reference_and_draw() -> None:
    noise = ssg.Noise.from_reference([ss.Noise.constant(0.25, 3), ss.Noise.constant(0.0, 1)])
    assert noise.accept.dtype == torch.float64 and noise.accept.shape == (2, 3)
    assert noise.sample[0].tolist() == [0.25] * 3 and torch.isnan(noise.sample[1, 1:]).all()
    trees = [ss.DraftTree.chain([1, 0], law="iid"), ss.DraftTree.chain([1], law="iid")]
    batch = ssg.TreeBatch.from_trees(trees)
    first = ssg.Noise.draw(batch, torch.Generator().manual_seed(3))
    again = ssg.Noise.draw(batch, torch.Generator().manual_seed(3))
    assert first.accept.dtype == torch.float64 and torch.equal(first.accept, again.accept)
    first.check(batch)
    target = torch.full((2, 3, 2), 0.5, dtype=torch.float64)
    seeded = [
        ssg.verify("nss", batch, target, target, generator=torch.Generator().manual_seed(3))
        for _ in range(2)
    ]
    assert torch.equal(seeded[0].tokens, seeded[1].tokens)


def test_noise_constructors_name_what_they_expect() -> None:
    one = ss.Noise.constant(0.5, 2)
    with pytest.raises(
        TypeError, match=r"noises: expected a sequence of ss\.Noise .*pass \[noise\]"
    ):
        ssg.Noise.from_reference(one)  # was: "noises[0]: 'numpy.ndarray' object has no ..."
    with pytest.raises(TypeError, match=r"noises: expected a sequence of ss\.Noise .*NoneType"):
        ssg.Noise.from_reference(None)
    with pytest.raises(TypeError, match="batch: expected a TreeBatch"):
        ssg.Noise.draw([ss.DraftTree.chain([1])])
    assert ssg.Noise.from_reference(n for n in [one]).accept.shape == (1, 2)  # any iterable


def test_import_without_torch_says_how_to_install() -> None:
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ImportError('no torch here')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import specsampling.gpu\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert 'pip install "specsampling[torch]"' in result.stderr


# --------------------------------------------------------------------------- input errors
def _inputs() -> tuple[ssg.TreeBatch, torch.Tensor, torch.Tensor, ssg.Noise]:
    trees = [ss.DraftTree.chain([1, 0], law="iid"), ss.DraftTree.from_draws([(0, 2)], law="iid")]
    batch = ssg.TreeBatch.from_trees(trees)
    target = torch.full((2, 3, 3), 1 / 3, dtype=torch.float64)
    noise = ssg.Noise.from_reference([ss.Noise.constant(0.5, 3), ss.Noise.constant(0.5, 2)])
    return batch, target, target.clone(), noise


def test_bad_tables_are_refused_naming_the_argument() -> None:
    batch, target, draft, noise = _inputs()
    cases = [
        (target[:, :2], draft, "target_probs: expected shape"),
        (target, draft[..., :2], "draft_probs: vocabulary mismatch"),
        (target.numpy(), draft, "target_probs: expected a float tensor"),
        (target, draft.long(), "draft_probs: expected a float tensor"),
        # float8 (no arithmetic) and meta tensors (no values) reached raw torch errors
        (target.to(torch.float8_e4m3fn), draft, "target_probs: expected a float tensor .*float16"),
        (target, draft.to("meta"), "draft_probs: a tensor on the meta device holds no values"),
    ]
    bad = target.clone()
    bad[0, 1, 2] = float("nan")
    cases.append((bad, draft, r"target_probs\[0, 1\]: NaN or inf at index 2"))
    bad = draft.clone()
    bad[1, 1] = torch.tensor([1.5, -0.5, 0.0])
    cases.append((target, bad, r"draft_probs\[1, 1\]: negative entry at index 1"))
    bad = target.clone()
    bad[1, 0] *= 1.1
    cases.append((bad, draft, r"target_probs\[1, 0\]: mass is 1.1"))
    for t, d, message in cases:
        with pytest.raises(ss.InvalidDistribution, match=message):
            ssg.verify("specinfer", batch, t, d, noise)
    tokens, chain = torch.tensor([[1, 0]]), target[:1]
    for t, d, message in cases[4:6]:  # verify_chain refuses them the same way
        with pytest.raises(ss.InvalidDistribution, match=message):
            ssg.verify_chain("specinfer", tokens, t[:1], d[:1, :2])
    assert ssg.verify_chain("specinfer", tokens, chain, chain[:, :2], validate=True).tokens.shape
    padded = target.clone()
    padded[1, 2] = float("nan")  # node 2 of row 1 is padding: never checked, never read
    ssg.verify("specinfer", batch, padded, draft, noise)


def test_bad_tokens_and_noise_are_refused() -> None:
    batch, target, draft, noise = _inputs()
    with pytest.raises(ss.InvalidDistribution, match=r"batch.tokens\[1, 1\]: token id 2 >= "):
        half = torch.full((2, 3, 2), 0.5, dtype=torch.float64)
        ssg.verify("nss", batch, half, half, noise)
    outside = ssg.Noise(noise.accept.clone(), noise.sample)
    outside.accept[1, 1] = 1.0
    with pytest.raises(ss.InvalidDistribution, match=r"noise.accept\[1\]: uniforms must lie"):
        ssg.verify("nss", batch, target, draft, outside)
    with pytest.raises(ss.InvalidDistribution, match=r"noise\.sample: expected shape"):
        ssg.verify("nss", batch, target, draft, ssg.Noise(noise.accept, noise.sample[:, :2]))
    with pytest.raises(
        ss.InvalidDistribution, match=r"noises\[0\]: noise\.accept: uniforms must lie"
    ):
        ssg.Noise.from_reference([ss.Noise(np.array([1.0]), np.array([0.5]))])


def test_laws_the_reference_is_not_exact_for_are_refused() -> None:
    batch, target, draft, noise = _inputs()
    star = ss.DraftTree.from_draws([(0, 1), (0, 2)], law="iid")
    without = star.with_law("without")
    refusals = [
        ("standard", star),
        ("specinfer", without),
        ("rsd", ss.DraftTree.from_draws([(0, 1), (0, 1)], law="iid")),
        ("specinfer", ss.DraftTree.chain([1], law="unknown")),
        ("rsd", star.with_law("deterministic")),
    ]
    for name, tree in refusals:
        trees = [ss.DraftTree.chain([1], law="iid"), tree]
        batch = ssg.TreeBatch.from_trees(trees)
        with pytest.raises(ss.UnsupportedShape, match=f"batch row 1: scheme '{name}'"):
            ssg.verify(name, batch, target, draft, noise)
        with pytest.raises(ss.UnsupportedShape):
            ss.SCHEMES[name].check_tree(tree)
    ssg.verify("nss", ssg.TreeBatch.from_trees([star.with_law("unknown")] * 2), target, draft)
    with pytest.raises(KeyError, match="unknown torch lowering 'nope'"):
        ssg.verify("nope", batch, target, draft, noise)
    with pytest.raises(ss.UnsupportedShape, match="'gumbel' is a keyed coupling"):
        ssg.verify("gumbel", batch, target, draft, noise)


@pytest.mark.parametrize("name", ["ot_optimal", "ot_binned", "khisti", "resispec"])
def test_host_planned_lowerings_plan_only_the_nodes_the_walk_reaches(name, monkeypatch) -> None:
    """The host plan runs once per multi-candidate node on each row's walked path (the root to
    the verdict's node, both ends included), level by level, never for a node the walk skips, and
    the verdicts stay the reference's. Branching trees whose rows stop at every depth."""
    lowering = ssg.SCHEMES[name]
    if name == "resispec":
        target_object, method = lowering.policy.reference, "at_node"
    else:
        target_object, method = lowering.scheme, "decision"
    owner = type(target_object)  # the class: the policies are frozen dataclasses
    original = getattr(owner, method)
    calls: list[int] = []

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    shape = ss.Shape.branching((2, 3, 2), replacement=True)
    rounds, batch, target, draft, noise = drafted_batch(shape, ss.pairs.Random(12, seed=3), 5, 16)
    monkeypatch.setattr(owner, method, counted)
    out = ssg.verify(name, batch, target, draft, noise)
    monkeypatch.setattr(owner, method, original)
    expected_calls, depths = 0, set()
    for row, (tree, t, d, n) in enumerate(rounds):
        assert (int(out.node[row]), int(out.token[row])) == tuple(
            ss.SCHEMES[name].verify(tree, t, d, n)
        )
        node, path = int(out.node[row]), []
        while node != -1:
            path.append(node)
            node = tree.parents[node] if node else -1
        expected_calls += sum(len(tree.candidates[v]) >= 2 for v in path)
        depths.add(len(path))
    assert len(depths) >= 3  # rows stop at several depths
    total = sum(len(tree.candidates[v]) >= 2 for tree, *_ in rounds for v in range(tree.num_nodes))
    assert len(calls) == expected_calls < total


def test_tables_that_require_grad_verify_as_detached_ones() -> None:
    """A verdict has no gradient: tables with ``requires_grad`` (logits' softmax inside a
    training loop) verify as their detached values, by every tree lowering and every chain
    engine, although the lowerings write into buffers (``out=``), which autograd refuses."""
    from specsampling.gpu.schemes import TreeLowering

    rng = np.random.default_rng(5)
    pair = ss.pairs.Random(6, seed=0)
    shapes = (ss.Shape.branching((2, 2), replacement=True), ss.Shape.branching((2, 2)))
    for name in sorted(ssg.SCHEMES):
        if not isinstance(ssg.get_lowering(name), TreeLowering):
            continue
        shape = next((s for s in shapes if ss.SCHEMES[name].supports(s)), ss.Shape.chain(3))
        trees = [shape.draft(pair, rng) for _ in range(4)]
        drafted = [tables(pair, tree) for tree in trees]
        batch = ssg.TreeBatch.from_trees(trees)
        target, draft = ssg.tables_batch(*zip(*drafted, strict=True), dtype=torch.float32)
        noise = ssg.Noise.draw(batch, torch.Generator().manual_seed(0))
        expected = ssg.verify(name, batch, target, draft, noise)
        got = ssg.verify(
            name, batch, target.clone().requires_grad_(), draft.clone().requires_grad_(), noise
        )
        assert torch.equal(got.tokens, expected.tokens), name
        g = torch.Generator().manual_seed(2)
        chain_target = torch.softmax(3 * torch.randn(4, 4, 6, generator=g), -1)  # [B, γ + 1, V]
        chain_draft = torch.softmax(3 * torch.randn(4, 3, 6, generator=g), -1)  # [B, γ, V]
        tokens = torch.multinomial(chain_draft.reshape(-1, 6), 1, generator=g).reshape(4, 3)
        expected = ssg.verify_chain(
            name, tokens, chain_target, chain_draft, generator=torch.Generator().manual_seed(1)
        )
        got = ssg.verify_chain(
            name,
            tokens,
            chain_target.clone().requires_grad_(),
            chain_draft.clone().requires_grad_(),
            generator=torch.Generator().manual_seed(1),
        )
        assert torch.equal(got.tokens, expected.tokens), name
