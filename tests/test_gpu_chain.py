"""``specsampling.gpu.verify_chain``: chains in the FlashInfer/vLLM layout.

Path-wise equality with the reference for every registered scheme exact on sampled chains
(iterated at test time), with real draft tables and point-mass drafts, ragged lengths and
boundary noise; the fast standard path against its own mutants; the point-mass rule certified
by the exact engine on a pair whose draft is a point mass.
"""

from __future__ import annotations

import inspect
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specsampling as ss
from proofs_tests.strategies import model_pairs
from specsampling import gpu as ssg
from specsampling.gpu import chain as C
from specsampling.gpu import chain_rules as R
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes import tables

GAMMA = 4
Round = tuple[ss.DraftTree, np.ndarray, np.ndarray, ss.Noise]


def chain_schemes() -> list[str]:
    """Registered tree lowerings whose reference is exact on sampled chains (read at test time:
    other lowerings are being registered)."""
    names = []
    for name, lowering in ssg.SCHEMES.items():
        reference = ss.SCHEMES[name]
        if isinstance(lowering, ssg.schemes.TreeLowering) and reference.exact_for(
            ss.DrawLaw.IID, True
        ):
            names.append(name)
    return sorted(names)


def point_mass_tables(tree: ss.DraftTree, target: np.ndarray) -> np.ndarray:
    """One-hot draft rows of the drafted tokens (the leaf row: a one-hot too, never read)."""
    vocab = target.shape[1]
    nexts = [*tree.tokens[1:], 0]
    return np.eye(vocab)[nexts]


def chain_rounds(pair: Any, rng: np.random.Generator, count: int, point_mass: bool) -> list[Round]:
    """Ragged chains (0..GAMMA drafts), random and boundary noise."""
    vocab = pair.vocab_size
    rounds = []
    for index in range(count):
        length = int(rng.integers(0, GAMMA + 1))
        if point_mass:  # deterministic drafts: any tokens, also ones the target rules out
            tree = ss.DraftTree.chain(rng.integers(0, vocab, length).tolist(), law="iid")
        elif length:
            tree = ss.Shape.chain(length).draft(pair, rng)
        else:
            tree = ss.DraftTree.chain([], law="iid")
        target, draft = tables(pair, tree)
        if point_mass:
            draft = point_mass_tables(tree, target)
        size = tree.num_nodes
        noise = [
            ss.Noise.draw(rng, size),
            ss.Noise.constant(0.0, size),
            ss.Noise.constant(LARGEST_BELOW_ONE, size),
        ][index % 3]
        rounds.append((tree, target, draft, noise))
    return rounds


def layout(
    rounds: list[Round], point_mass: bool, pad: float = 0.0, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, ssg.Noise]:
    batch, vocab = len(rounds), rounds[0][1].shape[1]
    draft_tokens = torch.full((batch, GAMMA), -1, dtype=torch.long)
    target = torch.full((batch, GAMMA + 1, vocab), pad, dtype=torch.float64)
    draft = torch.full((batch, GAMMA, vocab), pad, dtype=torch.float64)
    accept = torch.full((batch, GAMMA + 1), 0.5, dtype=torch.float64)
    sample = accept.clone()
    for row, (tree, t, d, noise) in enumerate(rounds):
        n = tree.num_nodes - 1
        draft_tokens[row, :n] = torch.tensor(tree.tokens[1:], dtype=torch.long)
        target[row, : n + 1] = torch.tensor(t)
        draft[row, :n] = torch.tensor(d[:n])
        accept[row, : n + 1] = torch.tensor(noise.accept)
        sample[row, : n + 1] = torch.tensor(noise.sample)
    return (
        draft_tokens,
        target.to(dtype),
        None if point_mass else draft.to(dtype),
        ssg.Noise(accept, sample),
    )


def expected(name: str, rounds: list[Round]) -> list[tuple[int, int, tuple[int, ...]]]:
    out = []
    for tree, target, draft, noise in rounds:
        node, token = ss.SCHEMES[name].verify(tree, target, draft, noise)
        out.append((node, token, (*tree.prefix(node), token)))
    return out


def got(out: ssg.Verified) -> list[tuple[int, int, tuple[int, ...]]]:
    rows = []
    for node, token, tokens, count in zip(
        out.node.tolist(),
        out.token.tolist(),
        out.tokens.tolist(),
        out.num_emitted.tolist(),
        strict=True,
    ):
        assert set(tokens[count:]) <= {-1}, tokens
        rows.append((node, token, tuple(tokens[:count])))
    return rows


def mismatches(name: str, rounds: list[Round], point_mass: bool, **kwargs: Any) -> list:
    draft_tokens, target, draft, noise = layout(rounds, point_mass)
    out = ssg.verify_chain(name, draft_tokens, target, draft, noise, **kwargs)
    return [
        (row, a, b)
        for row, (a, b) in enumerate(zip(got(out), expected(name, rounds), strict=True))
        if a != b
    ]


# --------------------------------------------------------------------------- path-wise equality
@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
@pytest.mark.parametrize("vocab", [2, 5])
def test_pathwise_every_chain_scheme(vocab: int, point_mass: bool) -> None:
    names = chain_schemes()
    assert {"standard", "specinfer", "rsd", "nss"} <= set(names)
    for name in names:
        for seed in range(3):
            rounds = chain_rounds(
                ss.pairs.Random(vocab, seed=seed), np.random.default_rng(seed), 18, point_mass
            )
            assert mismatches(name, rounds, point_mass) == [], name
            assert mismatches(name, rounds, point_mass, validate=False) == [], name


def test_equals_verify_on_a_tree_batch_of_chains() -> None:
    """Same node numbering as ``DraftTree.chain``: the tree verifier on a TreeBatch agrees."""
    rounds = chain_rounds(ss.pairs.Random(4, seed=3), np.random.default_rng(3), 12, False)
    draft_tokens, target, draft, noise = layout(rounds, False)
    for name in chain_schemes():
        out = ssg.verify_chain(name, draft_tokens, target, draft, noise)
        batch = ssg.TreeBatch.from_trees([r[0] for r in rounds])
        tree_target, tree_draft = ssg.tables_batch([r[1] for r in rounds], [r[2] for r in rounds])
        tree_noise = ssg.Noise.from_reference([r[3] for r in rounds])
        walked = ssg.verify(name, batch, tree_target, tree_draft, tree_noise)
        assert torch.equal(out.node, walked.node) and torch.equal(out.token, walked.token)


@st.composite
def hypothesis_chains(draw: Any, point_mass: bool) -> list[Round]:
    vocab = draw(st.integers(2, 4))
    pair = draw(model_pairs(vocab, GAMMA))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    uniform = st.one_of(
        st.sampled_from([0.0, LARGEST_BELOW_ONE, 0.5]),
        st.floats(0.0, 1.0, exclude_max=True, allow_nan=False),
    )
    rounds = []
    for length in draw(st.lists(st.integers(0, GAMMA), min_size=1, max_size=5)):
        if point_mass:
            tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length))
            tree = ss.DraftTree.chain(tokens, law="iid")
        else:
            tree = (
                ss.Shape.chain(length).draft(pair, rng)
                if length
                else ss.DraftTree.chain([], law="iid")
            )
        target, draft = tables(pair, tree)
        if point_mass:
            draft = point_mass_tables(tree, target)
        lanes = st.lists(uniform, min_size=tree.num_nodes, max_size=tree.num_nodes)
        rounds.append(
            (tree, target, draft, ss.Noise.checked(draw(lanes), draw(lanes), tree.num_nodes))
        )
    return rounds


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_pathwise_hypothesis_fast_path(point_mass: bool) -> None:
    @settings(max_examples=60, deadline=None)
    @given(hypothesis_chains(point_mass))
    def check(rounds: list[Round]) -> None:
        for name in ("standard", "specinfer", "rsd"):
            assert mismatches(name, rounds, point_mass) == []

    check()


def test_padding_rows_never_read() -> None:
    rounds = chain_rounds(ss.pairs.Random(5, seed=1), np.random.default_rng(1), 15, False)
    for point_mass in (False, True):
        draft_tokens, target, draft, noise = layout(rounds, point_mass, pad=float("nan"))
        clean = layout(rounds, point_mass)
        for name in chain_schemes():
            a = ssg.verify_chain(name, draft_tokens, target, draft, noise)
            b = ssg.verify_chain(name, *clean)
            assert torch.equal(a.tokens, b.tokens), name


# --------------------------------------------------------------------------- residual hits
def hit_round() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ssg.Noise]:
    """p <= q everywhere at lane 0 (masses off by rounding): the rejection at lane 0 falls back
    to p, whose draw is the drafted token -- the reference descends and tests lane 1."""
    target = torch.tensor([[[0.5 - 2**-40, 0.5], [0.25, 0.75]]], dtype=torch.float64)
    draft = torch.tensor([[[0.5, 0.5]]], dtype=torch.float64)
    accept = torch.tensor([[0.5, LARGEST_BELOW_ONE]], dtype=torch.float64)
    sample = torch.tensor([[0.0, 0.9]], dtype=torch.float64)
    return torch.tensor([[0]]), target, draft, ssg.Noise(accept, sample)


def test_zero_mass_residual_hit_descends_like_the_reference() -> None:
    draft_tokens, target, draft, noise = hit_round()
    tree = ss.DraftTree.chain([0], law="iid")
    reference = ss.Noise(noise.accept[0].numpy(), noise.sample[0].numpy())
    expect = ss.SCHEMES["standard"].verify(
        tree, target[0].numpy(), np.vstack([draft[0].numpy(), [[0.5, 0.5]]]), reference
    )
    assert tuple(expect) == (1, 1)  # the hit descended: node 1, then the bonus
    for name in ("standard", "spectr", "resispec"):  # the last two take the same engine
        again = ss.SCHEMES[name].verify(
            tree, target[0].numpy(), np.vstack([draft[0].numpy(), [[0.5, 0.5]]]), reference
        )
        assert tuple(again) == (1, 1), name
        out = ssg.verify_chain(name, draft_tokens, target, draft, noise)
        assert (int(out.node[0]), int(out.token[0])) == (1, 1), name
        assert out.tokens.tolist() == [[0, 1]]
    # sync-free: one round, the row stops on the drafted token (documented)
    fast = ssg.verify_chain("standard", draft_tokens, target, draft, noise, validate=False)
    assert fast.tokens.tolist() == [[0, -1]] and int(fast.node[0]) == 0


# --------------------------------------------------------------------------- mutants
class InclusiveAccept(C.StandardChain):
    def tests(self, tables: C.ChainTables, accept_uniforms: torch.Tensor) -> torch.Tensor:
        gamma = tables.draft_tokens.shape[1]
        real = torch.arange(gamma)[None] < tables.num_drafts[:, None]
        target_x = tables.target_flat[tables.target_index[:, :gamma], tables.draft_tokens]
        draft_x = self.drafted_mass(tables, accept_uniforms)
        return real & (accept_uniforms * draft_x.double() <= target_x.double())


class PointMassKeepsToken(C.StandardChain):
    """The point-mass residual keeps the rejected token (``p`` itself)."""

    def residual(self, tables: C.ChainTables, target: Any, lane: Any, token: Any) -> Any:
        if tables.draft_flat is None:
            return target, target.sum(-1, keepdim=True)
        return super().residual(tables, target, lane, token)


class ResidualFromNextRow(C.StandardChain):
    """The residual taken against the draft row after the stop (off by one)."""

    def residual(self, tables: C.ChainTables, target: Any, lane: Any, token: Any) -> Any:
        gamma = tables.draft_tokens.shape[1]
        return super().residual(tables, target, (lane + 1).clamp_max(gamma - 1), token)


class SampleLaneOffByOne(C.StandardChain):
    """The stop token drawn with the next node's sample uniform."""

    def stop_round(self, tables: Any, accepted: Any, sample_uniforms: Any, start: Any) -> Any:
        shifted = torch.cat([sample_uniforms[:, 1:], sample_uniforms[:, :1]], dim=1)
        return super().stop_round(tables, accepted, shifted, start)


class NoHitRounds(C.StandardChain):
    """Never resumes after a residual hit."""

    def run(self, tables: Any, noise: Any, rounds: Any = None) -> Any:
        return super().run(tables, noise, 1)


MUTANTS = [InclusiveAccept(), PointMassKeepsToken(), ResidualFromNextRow(), SampleLaneOffByOne()]


def engine_mismatches(engine: C.StandardChain, rounds: list[Round], point_mass: bool) -> int:
    draft_tokens, target, draft, noise = layout(rounds, point_mass)
    lengths = C.draft_lengths(draft_tokens)
    out, _ = engine.run(C.padded_tables(draft_tokens, lengths, target, draft), noise)
    return sum(a != b for a, b in zip(got(out), expected("standard", rounds), strict=True))


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: type(m).__name__)
def test_mutants_of_the_fast_path_are_caught(mutant: C.StandardChain) -> None:
    found = 0
    for seed in range(6):
        for point_mass in (False, True):
            pair = ss.pairs.Random(3, seed=seed)
            rounds = chain_rounds(pair, np.random.default_rng(seed), 18, point_mass)
            assert engine_mismatches(C.STANDARD_CHAIN, rounds, point_mass) == 0
            found += engine_mismatches(mutant, rounds, point_mass)
    assert found > 0


def test_no_hit_rounds_mutant_is_caught() -> None:
    draft_tokens, target, draft, noise = hit_round()
    lengths = C.draft_lengths(draft_tokens)
    tables_ = C.padded_tables(draft_tokens, lengths, target, draft)
    good, _ = C.STANDARD_CHAIN.run(tables_, noise)
    bad, _ = NoHitRounds().run(tables_, noise)
    assert good.tokens.tolist() == [[0, 1]] and bad.tokens.tolist() != good.tokens.tolist()


def test_subclass_of_a_fast_lowering_runs_its_own_walk() -> None:
    """A mutant lowering named 'standard' must not be silently replaced by the fast path."""

    class Inclusive(ssg.schemes.standard.Standard):
        def accepts(self, u: Any, target_x: Any, draft_x: Any) -> Any:
            return u * draft_x.double() <= target_x.double()

    tokens = torch.tensor([[1]])
    target = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]], dtype=torch.float64)
    draft = torch.tensor([[[0.5, 0.5]]], dtype=torch.float64)
    zeros = torch.zeros((1, 2), dtype=torch.float64)
    noise = ssg.Noise(zeros, zeros)
    assert int(ssg.verify_chain("standard", tokens, target, draft, noise).node[0]) == 0
    assert int(ssg.verify_chain(Inclusive(), tokens, target, draft, noise).node[0]) == 1


def test_hot_path_has_no_host_synchronisation() -> None:
    sources = [inspect.getsource(getattr(C.StandardChain, m)) for m in C.StandardChain.hot_path]
    for engine in (R.NSSChain, R.BlockChain, R.TraversalChain, C.GreedyChain):
        sources += [inspect.getsource(getattr(engine, m)) for m in engine.hot_path]
    sources += [
        inspect.getsource(f)
        for f in (
            ssg.ops.categorical,
            ssg.ops.last_positive,
            C.stop_distribution,
            ssg.ops.block_sums,
            ssg.ops.pick_block,
            ssg.ops.block_index,
            ssg.ops.pick_in_block,
            ssg.ops.categorical_blocks_batched,
            ssg.ops.categorical_blocks_or_batched,
            R.pack_chain,
            R.take_rows,
        )
    ]
    for source in sources:
        body = source.split('"""')[-1]
        for forbidden in (".item(", ".tolist(", "bool(", "int(", "float(", ".nonzero(", "if "):
            assert forbidden not in body, forbidden


# --------------------------------------------------------------------------- nss/block/traversal
def test_each_scheme_takes_its_chain_engine() -> None:
    """The dispatch: exact lowering types only (a subclass, such as a mutant, walks)."""
    for name, engine in (("nss", R.NSS_CHAIN), ("block", R.BLOCK_CHAIN)):
        assert C.CHAIN_RULES[type(ssg.get_lowering(name))] is engine
    assert C.CHAIN_RULES[type(ssg.get_lowering("traversal"))] is R.TRAVERSAL_CHAIN
    from specsampling.gpu.schemes.resispec import ResiSpec
    from specsampling.schemes.resispec_policy import ConstantRatio

    standard_rule = ("standard", "specinfer", "rsd", "spectr", "resispec", "spechub")
    for name in (*standard_rule, "ot_optimal", "ot_binned", "khisti"):
        assert C.takes_standard_rule(ssg.get_lowering(name)), name
    # greedy: a point-mass draft covers supp q, so its split is None and it draws differently
    for name in ("nss", "block", "traversal", "greedy"):
        assert not C.takes_standard_rule(ssg.get_lowering(name)), name
    from specsampling.gpu.schemes.base import HostPlanned
    from specsampling.schemes.ot_optimal import OTOptimal

    class Mutant(OTOptimal):
        pass

    assert not C.takes_standard_rule(HostPlanned(Mutant()))  # a subclass walks
    assert not C.takes_standard_rule(ResiSpec(ConstantRatio(rho=1.25)))  # rho != 1 on chains
    assert C.takes_standard_rule(ResiSpec(ConstantRatio()))


def test_greedy_with_point_mass_drafts_takes_the_nss_engine(monkeypatch) -> None:
    """Greedy's chain node with a point-mass draft draws y ~ p and descends on a hit: NSS's
    engine, path-wise equal to the reference (the point-mass path-wise test above); with draft
    tables it takes its own chain engine."""
    calls = []
    run = R.NSS_CHAIN.run
    monkeypatch.setattr(R.NSS_CHAIN, "run", lambda *args: calls.append(1) or run(*args))
    rounds = chain_rounds(ss.pairs.Random(5, seed=4), np.random.default_rng(4), 18, True)
    assert mismatches("greedy", rounds, True) == []
    assert calls == [1]
    greedy_calls = []
    greedy_run = C.GREEDY_CHAIN.run
    monkeypatch.setattr(
        C.GREEDY_CHAIN, "run", lambda *args: greedy_calls.append(1) or greedy_run(*args)
    )
    rounds = chain_rounds(ss.pairs.Random(5, seed=4), np.random.default_rng(4), 18, False)
    assert mismatches("greedy", rounds, False) == []
    assert calls == [1] and greedy_calls == [1]


def covering_rounds(seed: int) -> list[Round]:
    """Sampled chains whose draft rows are, at random lanes, the one-hot of the drafted token
    (the drafted token then covers supp q: greedy's NSS case), the other lanes dense."""
    rng = np.random.default_rng(seed)
    rounds = chain_rounds(ss.pairs.Random(5, seed=seed), rng, 24, False)
    mixed = []
    for tree, target, draft, noise in rounds:
        hot = point_mass_tables(tree, target)
        lanes = rng.random(draft.shape[0]) < 0.5
        mixed.append((tree, target, np.where(lanes[:, None], hot, draft), noise))
    return mixed


def test_greedy_with_draft_tables_covering_lanes_pathwise() -> None:
    """Greedy's chain engine on draft tables mixing dense rows (the standard rule with
    norm(q)) and one-hot rows (NSS's rule): the reference's verdict on every row, and a
    standard-only engine (the mutant) is caught."""
    for seed in range(4):
        rounds = covering_rounds(seed)
        assert mismatches("greedy", rounds, False) == [], seed
        assert mismatches("greedy", rounds, False, validate=False) == [], seed


def test_greedy_residual_hit_descends_like_the_reference() -> None:
    """Greedy with draft tables on a zero-mass residual whose draw is the drafted token: with
    validation the row descends as the reference does; without, one round stops on the drafted
    token, as the standard engine does."""
    draft_tokens, target, draft, noise = hit_round()
    tree = ss.DraftTree.chain([0], law="iid")
    reference = ss.Noise(noise.accept[0].numpy(), noise.sample[0].numpy())
    expect = ss.SCHEMES["greedy"].verify(
        tree, target[0].numpy(), np.vstack([draft[0].numpy(), [[0.5, 0.5]]]), reference
    )
    assert tuple(expect) == (1, 1)
    out = ssg.verify_chain("greedy", draft_tokens, target, draft, noise)
    assert out.tokens.tolist() == [[0, 1]]
    fast = ssg.verify_chain("greedy", draft_tokens, target, draft, noise, validate=False)
    assert fast.tokens.tolist() == [[0, -1]]


def test_greedy_chain_mutant_without_the_covering_rule_is_caught(monkeypatch) -> None:
    monkeypatch.setattr(C.GREEDY_CHAIN, "run", C.STANDARD_CHAIN.run)
    assert any(mismatches("greedy", covering_rounds(seed), False) for seed in range(4))


def dense_lanes(tables: Any, noise: Any) -> Any:
    """Greedy's sync-free lane route (accelerators, torch.compile): every lane tested and drawn."""
    own, covers = C.GREEDY_CHAIN.covering_lanes(tables)
    return own, covers, C.GREEDY_CHAIN.nss_draws(own, noise)


def test_greedy_sync_free_lane_route_is_pathwise_too(monkeypatch) -> None:
    """The route off the CPU (every lane's covering test and NSS draw) gives the reference's
    verdicts on the covering rounds, as the CPU's sparse route does."""
    monkeypatch.setattr(C.GREEDY_CHAIN, "lanes", dense_lanes)
    for seed in range(4):
        assert mismatches("greedy", covering_rounds(seed), False) == [], seed


def test_greedy_sparse_lanes_read_only_lanes_that_can_cover(monkeypatch) -> None:
    """64 chains of 8 with softmax draft rows, a few lanes one-hot: the CPU route tests and draws
    only the lanes whose mass equals their drafted entry (the one-hot ones), and its tokens equal
    the sync-free route's, in float32 and float64; a route that never covers is caught."""
    g = torch.Generator().manual_seed(5)
    batch, gamma, vocab = 64, 8, 300
    logits = torch.randn(batch, gamma + 1, vocab, generator=g, dtype=torch.float64)
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits[:, :gamma] * 0.8, -1)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).view(batch, gamma)
    hot = torch.rand(batch, gamma, generator=g) < 0.1  # about 51 one-hot lanes
    one_hot = torch.nn.functional.one_hot(tokens, vocab).to(draft.dtype)
    draft = torch.where(hot[..., None], one_hot, draft)
    noise = ssg.Noise(*torch.rand(2, batch, gamma + 1, generator=g, dtype=torch.float64))
    tested = []
    original = ssg.ops.max_off_token

    def counted(rows: Any, token: Any) -> Any:
        tested.append(len(rows))
        return original(rows, token)

    monkeypatch.setattr(ssg.ops, "max_off_token", counted)
    for dtype in (torch.float64, torch.float32):
        sparse = ssg.verify_chain("greedy", tokens, target.to(dtype), draft.to(dtype), noise)
        assert tested[-1] == int(hot.sum())
        with monkeypatch.context() as patched:
            patched.setattr(C.GREEDY_CHAIN, "lanes", dense_lanes)
            dense = ssg.verify_chain("greedy", tokens, target.to(dtype), draft.to(dtype), noise)
        assert torch.equal(sparse.tokens, dense.tokens)
    never = C.GreedyChain()
    monkeypatch.setattr(
        never,
        "lanes",
        lambda tables, noise: (
            tables._replace(draft_mass=ssg.ops.numpy_sum(tables.draft_flat)),
            torch.zeros_like(tables.draft_tokens, dtype=torch.bool),
            torch.full_like(tables.draft_tokens, -1),
        ),
    )
    monkeypatch.setattr(C, "GREEDY_CHAIN", never)
    assert any(mismatches("greedy", covering_rounds(seed), False) for seed in range(4))


class EqualRows:
    """A pair with ``p <= q`` at some prefixes (``q`` a Dirichlet row, ``p`` the same with
    ``2^-40`` taken off one entry: ``S = 0`` there, so block accepts a node with ``w = 1`` and
    traversal deletes it, and ``w < 1`` below the reduced token) and unrelated rows with zeros
    elsewhere."""

    vocab_size = 4

    def _rows(self, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([len(prefix), *prefix])
        target = rng.dirichlet(np.ones(4))
        if sum(prefix) % 3 != 2:
            draft = target.copy()
            target[rng.integers(4)] -= 2**-40
            return target, draft
        draft = rng.dirichlet(np.ones(4))
        draft[rng.integers(4)] = 0.0
        return target, draft / draft.sum()

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._rows(tuple(prefix))[0]

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._rows(tuple(prefix))[1]


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_rules_pathwise_at_block_boundaries_and_zero_masses(point_mass: bool) -> None:
    """Vocabularies across the 128-token blocks of the float32 draw and pairs with ``p == q``
    rows (the one place block and traversal differ on a chain): reference verdicts, float64."""
    for name in ("nss", "block", "traversal", "standard", "spectr", "resispec"):
        for vocab, pair in ((4, EqualRows()), (300, ss.pairs.Random(300, seed=1))):
            rounds = chain_rounds(pair, np.random.default_rng(vocab), 24, point_mass)
            assert mismatches(name, rounds, point_mass) == [], (name, vocab)
            assert mismatches(name, rounds, point_mass, validate=False) == [], (name, vocab)


class BlockRuleOnTraversal(R.TraversalChain):
    """Traversal with block's zero-mass rule (h = 1 when S = 0 and w = 1)."""

    def acceptance(self, mass: Any, weights: Any) -> Any:
        return R.BlockChain.acceptance(self, mass, weights)


class ShallowestTau(R.BlockChain):
    """tau = the shallowest success instead of the deepest."""

    def choose_tau(self, chain: Any, accept: Any, noise: Any) -> Any:
        nodes = torch.arange(accept.shape[1])
        real = (nodes[None] >= 1) & (nodes[None] <= chain.num_drafts[:, None])
        passes = real & (noise.accept < accept)
        first = torch.where(passes, nodes[None], accept.shape[1]).amin(-1)
        return torch.where(passes.any(-1), first, 0)


class UnweightedResidual(R.BlockChain):
    """The stop residual (p - q)_+ without the weight w_tau."""

    def weighted_residual(self, out: Any, target: Any, draft: Any, token: Any, scale: Any) -> Any:
        return super().weighted_residual(out, target, draft, token, torch.ones_like(scale))


class NoBonusBlock(R.BlockChain):
    """The acceptance at the chain's end is h (a residual mass), not w_n."""

    def acceptances(self, chain: Any, weights: Any, noise: Any) -> Any:
        longer = chain._replace(num_drafts=chain.num_drafts + 1)
        return super().acceptances(longer, weights, noise)


class NSSSampleLane(R.NSSChain):
    """Every node's draw made with the next node's sample uniform."""

    def uniforms(self, sample: Any) -> Any:
        return torch.cat([sample[:, 1:], sample[:, :1]], 1)


class SkipsPassingNodes(R.BlockChain):
    """Nodes skipped as certain failures from half their weight on (the bound is h <= w)."""

    @staticmethod
    def fail_margin(dtype: Any, vocab: int) -> float:
        return -0.5


RULE_MUTANTS = [
    ("traversal", BlockRuleOnTraversal()),
    ("block", SkipsPassingNodes()),
    ("block", ShallowestTau()),
    ("block", UnweightedResidual()),
    ("block", NoBonusBlock()),
    ("nss", NSSSampleLane()),
]


def rule_mismatches(name: str, engine: Any, rounds: list[Round], point_mass: bool) -> int:
    draft_tokens, target, draft, noise = layout(rounds, point_mass)
    lengths = C.draft_lengths(draft_tokens)
    chain = C.chain_round(draft_tokens, lengths, target, draft, torch.float64)
    out = engine.run(chain, noise)
    return sum(a != b for a, b in zip(got(out), expected(name, rounds), strict=True))


@pytest.mark.parametrize("case", RULE_MUTANTS, ids=lambda c: type(c[1]).__name__)
def test_mutants_of_the_rule_engines_are_caught(case: tuple[str, Any]) -> None:
    name, mutant = case
    engine = C.CHAIN_RULES[type(ssg.get_lowering(name))]
    found = 0
    for seed in range(4):
        for point_mass in (False, True):
            for pair in (ss.pairs.Random(3, seed=seed), EqualRows()):
                rounds = chain_rounds(pair, np.random.default_rng(seed), 18, point_mass)
                assert rule_mismatches(name, engine, rounds, point_mass) == 0
                found += rule_mismatches(name, mutant, rounds, point_mass)
    assert found > 0


class DenseBlock(R.BlockChain):
    """Block with every inner node's mass and the weights by tensor ops (the accelerators'
    sync-free route)."""

    def masses(self, chain: Any, weights: Any, noise: Any) -> Any:
        return self.row_masses(chain, weights)

    def weights(self, chain: Any) -> Any:
        return self.chain_weights(chain)


class DenseTraversal(R.TraversalChain):
    """Traversal with every inner node's mass and the weights by tensor ops."""

    def masses(self, chain: Any, weights: Any, noise: Any) -> Any:
        return self.row_masses(chain, weights)

    def weights(self, chain: Any) -> Any:
        return self.chain_weights(chain)


class RoundedHostWeights(R.BlockChain):
    """Mutant: the host loop rounds each weight to float32 (one rounding more than the ops)."""

    @staticmethod
    def capped_value(scaled: float, draft_x: float) -> float:
        return float(np.float32(R.BlockChain.capped_value(scaled, draft_x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_host_weights_equal_the_tensor_weights_bit_for_bit(dtype: torch.dtype) -> None:
    """The CPU's host loop over the lanes (small batches) and the sync-free tensor ops give the
    same float64 weights, with zero draft masses, ratios above 1 and point-mass drafts among
    the lanes; a host loop with one more rounding is caught."""
    g = torch.Generator().manual_seed(5)
    batch, gamma, vocab = 12, 8, 6
    target = torch.softmax(3 * torch.randn(batch, gamma + 1, vocab, generator=g), -1)
    draft = torch.softmax(3 * torch.randn(batch, gamma, vocab, generator=g), -1)
    draft[:, :, 0] = 0  # token 0 has no draft mass: traversal's weight 0, block's cap
    draft = draft / draft.sum(-1, keepdim=True)
    tokens = torch.randint(0, vocab, (batch, gamma), generator=g)
    lengths = torch.randint(0, gamma + 1, (batch,), generator=g)
    assert batch <= R.HOST_WEIGHT_ROWS
    for probs in (draft.to(dtype), None):
        chain = C.chain_round(tokens, lengths, target.to(dtype), probs, dtype)
        for engine in (R.BLOCK_CHAIN, R.TRAVERSAL_CHAIN):
            host, tensor = engine.host_weights(chain), engine.chain_weights(chain)
            assert host.dtype == tensor.dtype == torch.float64
            assert torch.equal(host, tensor)
            assert torch.equal(engine.weights(chain), host)  # the route the CPU takes
        inner = ((tensor > 0) & (tensor < 1)).sum()
        assert inner > 10  # weights strictly inside (0, 1): roundings to compare
        assert not torch.equal(RoundedHostWeights().host_weights(chain), tensor)


def test_the_sync_free_mass_route_is_pathwise_too() -> None:
    """The route :func:`verify_chain` takes off the CPU and under ``torch.compile`` (every
    inner node's mass) gives the reference verdicts, as the CPU's deciding-masses route."""
    for name, engine in (("block", DenseBlock()), ("traversal", DenseTraversal())):
        for seed in range(3):
            for point_mass in (False, True):
                for pair in (ss.pairs.Random(3, seed=seed), EqualRows()):
                    rounds = chain_rounds(pair, np.random.default_rng(seed), 18, point_mass)
                    assert rule_mismatches(name, engine, rounds, point_mass) == 0


class CountingBlock(R.BlockChain):
    """Block counting the rows of every mass pass."""

    def __init__(self) -> None:
        self.rows = 0

    def weighted_residual(self, out: Any, target: Any, draft: Any, token: Any, scale: Any) -> Any:
        self.rows += out.shape[0]
        return super().weighted_residual(out, target, draft, token, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_deciding_masses_read_fewer_rows_and_give_the_same_tokens(dtype: torch.dtype) -> None:
    """Block and traversal on a batch of 64 chains of 8 drafts: the CPU route reads well under
    half the rows of the sync-free one, and every token is the same."""
    g = torch.Generator().manual_seed(3)
    batch, gamma, vocab = 64, 8, 500
    logits = torch.randn(batch, gamma + 1, vocab, generator=g, dtype=torch.float64)
    target = torch.softmax(logits, -1).to(dtype)
    draft = torch.softmax(
        logits[:, :gamma]
        + 0.5 * torch.randn(logits[:, :gamma].shape, generator=g, dtype=torch.float64),
        -1,
    ).to(dtype)
    tokens = torch.multinomial(draft.double().reshape(-1, vocab), 1, generator=g)
    tokens = tokens.view(batch, gamma)
    lengths = torch.randint(0, gamma + 1, (batch,), generator=g)
    noise = ssg.Noise(*torch.rand(2, batch, gamma + 1, generator=g, dtype=torch.float64))
    for probs in ((target, draft), (target, None)):
        chain = C.chain_round(tokens, lengths, probs[0], probs[1], dtype)
        for sparse, dense in (
            (CountingBlock(), DenseBlock()),
            (R.TRAVERSAL_CHAIN, DenseTraversal()),
        ):
            assert torch.equal(sparse.run(chain, noise).tokens, dense.run(chain, noise).tokens)
    counting = CountingBlock()  # the last chain: real draft tables
    counting.run(C.chain_round(tokens, lengths, target, draft, dtype), noise)
    read = counting.rows - batch  # less the stop row of every sequence
    assert 0 < read < 0.5 * batch * (gamma - 1), read


class PointMassDraft:
    """``pair`` whose draft is the point mass on the argmax of ``pair``'s draft (ties to the
    lowest id): a deterministic drafter (n-gram / argmax), exact when ``pair`` is exact."""

    def __init__(self, pair: Any) -> None:
        self._pair = pair

    @property
    def vocab_size(self) -> int:
        return int(self._pair.vocab_size)

    def target(self, prefix: tuple[int, ...]) -> Any:
        return self._pair.target(prefix)

    def draft(self, prefix: tuple[int, ...]) -> Any:
        draft = self._pair.draft(prefix)
        point = np.array([Fraction(0)] * len(draft), dtype=object)
        point[int(np.argmax(np.asarray(draft, dtype=np.float64)))] = Fraction(1)
        exact = isinstance(draft[0], Fraction)
        return point if exact else point.astype(np.float64)


def test_point_mass_drafts_are_exact_for_every_chain_scheme() -> None:
    """Exact engine: the round law of each scheme point-mass drafts are routed to is the target's
    (Fractions: exactly 0)."""
    pair = PointMassDraft(ss.pairs.Random(3, seed=2, exact=True))
    for name in chain_schemes():
        assert ss.lossless_error(name, pair, ss.Shape.chain(3)) == 0, name


def test_argmax_draft_with_softmax_q_is_lossy() -> None:
    """Negative control: a deterministic draft verified with the draft's *softmax* ``q`` (not
    the point mass) emits the wrong law -- why ``draft_probs=None`` exists
    (deepseek-ai/DeepSpec#31)."""
    target = np.array([Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)], dtype=object)
    softmax = np.array([Fraction(1, 4), Fraction(1, 2), Fraction(1, 4)], dtype=object)
    drafted = 1  # the argmax, drafted with probability 1
    for draft, lossless in ((softmax, False), (np.eye(3, dtype=int)[drafted] + Fraction(0), True)):
        accept, stop = ss.ops.standard_step_law(target, draft, drafted)
        law = stop.copy()
        law[drafted] += accept
        assert (list(law) == list(target)) is lossless


def test_point_mass_rounds_match_the_target_law() -> None:
    """Chi-square on counts of the fast path's first emitted token (point-mass drafts, fresh
    noise) against the target (alpha 1e-4, every expected count >= 5)."""
    from scipy import stats

    pair = ss.pairs.Random(4, seed=4)
    draws, draft = 6000, PointMassDraft(pair).draft
    first = int(np.argmax(draft(())))
    second = int(np.argmax(draft((first,))))
    rows = [pair.target(()), pair.target((first,)), pair.target((first, second))]
    target = torch.tensor(np.array(rows, dtype=np.float64))[None].expand(draws, -1, -1)
    out = ssg.verify_chain(
        "standard",
        torch.tensor([[first, second]] * draws),
        target.contiguous(),
        None,
        generator=torch.Generator().manual_seed(0),
    )
    counts = np.bincount(out.tokens[:, 0].numpy(), minlength=4)
    expect = pair.target(()) * draws
    assert expect.min() >= 5
    assert stats.chisquare(counts, expect).pvalue > 1e-4


# --------------------------------------------------------------------------- input errors
def test_invalid_inputs_name_the_argument() -> None:
    tokens = torch.tensor([[1, 0]])
    target = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    draft = torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)
    cases = [
        (tokens.double(), target, draft, "draft_tokens: expected an integer tensor"),
        (tokens, target[:, :2], draft, r"target_probs: expected shape \(1, 3, vocab_size\)"),
        (tokens, target, draft[..., :2], "draft_probs: vocabulary mismatch"),
        (torch.tensor([[3, 0]]), target, draft, r"draft_tokens\[0, 0\]: token id 3"),
        (torch.tensor([[1, -2]]), target, draft, r"draft_tokens\[0, 1\]: token id -2"),
    ]
    bad = target.clone()
    bad[0, 1, 1] = float("nan")
    cases.append((tokens, bad, draft, r"target_probs\[0, 1\]: NaN or inf at index 1"))
    bad = draft.clone()
    bad[0, 1] = torch.tensor([0.0, 0.5, 0.5])
    cases.append((tokens, target, bad, r"draft_probs\[0, 1\]: the drafted token 0 has zero"))
    for t, p, q, message in cases:
        with pytest.raises(ss.InvalidDistribution, match=message):
            ssg.verify_chain("standard", t, p, q)
    noise = ssg.Noise(torch.ones((1, 3), dtype=torch.float64), torch.zeros((1, 3)).double())
    with pytest.raises(ss.InvalidDistribution, match=r"noise.accept\[0\]"):
        ssg.verify_chain("standard", tokens, target, draft, noise)
    with pytest.raises(ss.InvalidDistribution, match="num_draft_tokens: every length"):
        ssg.verify_chain("standard", tokens, target, draft, num_draft_tokens=[3])
    padded = target.clone()
    padded[0, 2] = float("nan")  # row 2 is padding for a one-draft chain: never checked
    ssg.verify_chain("standard", tokens, padded, draft, num_draft_tokens=[1])
    keyed = [n for n, low in ssg.SCHEMES.items() if not isinstance(low, ssg.schemes.TreeLowering)]
    for name in keyed:
        with pytest.raises(ss.UnsupportedShape, match="keyed coupling"):
            ssg.verify_chain(name, tokens, target, draft)


def test_fresh_noise_is_seeded_by_the_generator() -> None:
    tokens = torch.tensor([[1, 0], [2, -1]])
    target = torch.softmax(torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1)), -1)
    runs = [
        ssg.verify_chain(
            "specinfer", tokens, target.double(), None, generator=torch.Generator().manual_seed(7)
        )
        for _ in range(2)
    ]
    explicit = ssg.verify_chain(
        "specinfer",
        tokens,
        target.double(),
        None,
        C.chain_noise(2, 2, torch.Generator().manual_seed(7)),
    )
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert torch.equal(runs[0].tokens, explicit.tokens)
    assert runs[0].num_emitted.tolist()[1] <= 2  # the -1 padded row has one draft


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_a_step_without_any_draft_lane_emits_the_reference_bonus(point_mass: bool) -> None:
    """``γ = 0`` (a serving step where no request drafted): every chain scheme emits one token,
    the reference's verdict on a root-only tree (it raised on the tree walk before)."""
    batch_size, vocab = 5, 7
    generator = torch.Generator().manual_seed(3)
    target = torch.rand(batch_size, 1, vocab, generator=generator, dtype=torch.float64)
    target /= target.sum(-1, keepdim=True)
    draft = None if point_mass else torch.zeros(batch_size, 0, vocab, dtype=torch.float64)
    noise = ssg.Noise(
        torch.rand(batch_size, 1, generator=generator, dtype=torch.float64),
        torch.rand(batch_size, 1, generator=generator, dtype=torch.float64),
    )
    root = ss.DraftTree.chain([], law="iid")
    names = [n for n, low in ssg.SCHEMES.items() if isinstance(low, ssg.schemes.TreeLowering)]
    for name in names:
        if not ss.SCHEMES[name].exact_for(ss.DrawLaw.IID, True):
            continue
        out = ssg.verify_chain(
            name, torch.zeros(batch_size, 0, dtype=torch.long), target, draft, noise
        )
        expect = [
            tuple(
                ss.SCHEMES[name].verify(
                    root,
                    target[b].numpy(),
                    target[b].numpy(),
                    ss.Noise(noise.accept[b].numpy(), noise.sample[b].numpy()),
                )
            )
            for b in range(batch_size)
        ]
        assert [(int(n), int(t)) for n, t in zip(out.node, out.token, strict=True)] == expect, name
        assert out.tokens.shape == (batch_size, 1) and out.num_emitted.tolist() == [1] * 5
        low = ssg.verify_chain(
            name,
            torch.zeros(batch_size, 0, dtype=torch.long),
            target.float(),
            None if draft is None else draft.float(),
        )
        assert ((low.token >= 0) & (low.token < vocab)).all(), name


# --------------------------------------------------------------------------- host draws
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_host_draws_equal_the_batched_route_bit_for_bit(dtype: torch.dtype) -> None:
    """``categorical_blocks(_or)`` on the CPU for a few rows searches on the host (numpy); the
    tokens must be the batched route's, bit for bit: ragged and empty tails, zero blocks and
    rows, thresholds at 0 and next to 1, non-finite rows that are not chosen."""
    generator = torch.Generator().manual_seed(5)
    ops = ssg.ops
    checked = 0
    for vocab in (1, 5, 127, 128, 129, 300, 1024, 32_000):
        for rows in range(1, ops.HOST_DRAW_ROWS + 1):
            for trial in range(12):
                weights = torch.rand(rows, vocab, generator=generator, dtype=dtype) ** 8
                if trial % 3 == 1:  # whole zero blocks and zero entries
                    weights[:, : vocab // 2] = 0
                    weights[weights < 0.01] = 0
                if trial % 4 == 2:  # one row without mass
                    weights[0] = 0
                u = torch.rand(rows, generator=generator, dtype=torch.float64)
                u[0] = (0.0, LARGEST_BELOW_ONE, float(u[0]))[trial % 3]
                fallback = torch.rand(rows, vocab, generator=generator, dtype=dtype)
                use = torch.rand(rows, generator=generator) < 0.5
                weights_or = torch.where(use[:, None], float("nan"), weights)  # never read there
                host = ops.categorical_blocks(weights, u)
                assert ops._draws_on_host(weights)
                assert torch.equal(host, ops.categorical_blocks_batched(weights, u))
                assert torch.equal(
                    ops.categorical_blocks_or(weights_or, fallback, use, u),
                    ops.categorical_blocks_or_batched(weights, fallback, use, u),
                )
                assert bool(((host >= 0) & (host < vocab)).all())
                # one row from Python values: draw_one, and draw_one_or choosing by mass
                no_mass = ~(weights.sum(-1) > 0)  # [rows]
                either = ops.categorical_blocks_or_batched(weights, fallback, no_mass, u)
                for row in range(rows):
                    assert ops.draw_one(weights[row], float(u[row])) == int(host[row])
                    drawn = ops.draw_one_or(weights[row], fallback[row], float(u[row]))
                    assert drawn == int(either[row]), (vocab, row, trial)
                checked += 1
    assert checked == 8 * ops.HOST_DRAW_ROWS * 12
    assert not ops._draws_on_host(torch.zeros(ops.HOST_DRAW_ROWS + 1, 4))  # batched beyond


# --------------------------------------------------------------------------- block's host route
@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_block_host_run_pathwise_one_and_two_rows(point_mass: bool) -> None:
    """Batches of one and two rows take the CPU's host route (``BlockChain.host_run``): the
    reference's verdicts, bit for bit."""
    assert R.HOST_RUN_ROWS >= 2
    for name in ("block", "traversal"):
        for seed in range(3):
            rounds = chain_rounds(
                ss.pairs.Random(5, seed=seed), np.random.default_rng(seed), 24, point_mass
            )
            for start in range(0, len(rounds), 2):
                for size in (1, 2):
                    part = rounds[start : start + size]
                    assert mismatches(name, part, point_mass, validate=False) == [], name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_block_host_run_equals_the_batched_run(dtype: torch.dtype, point_mass: bool) -> None:
    """``host_run`` and ``batched_run`` give the same tokens on the same chain round, float32
    and float64, on correlated rows over 300 tokens (masses over several blocks), ragged
    lengths, and noise at 0, next to 1 and at the acceptance's own values."""
    generator = torch.Generator().manual_seed(3)
    vocab, gamma = 300, 6
    checked = 0
    for engine in (R.BLOCK_CHAIN, R.TRAVERSAL_CHAIN):
        for trial in range(60):
            batch = 1 + trial % R.HOST_RUN_ROWS
            logits = 3 * torch.randn(batch, gamma + 1, vocab, generator=generator)
            target = logits.softmax(-1)
            near = logits[:, :gamma] + torch.randn(batch, gamma, vocab, generator=generator)
            draft = near.softmax(-1)
            tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator)
            tokens = tokens.view(batch, gamma)
            lengths = torch.randint(0, gamma + 1, (batch,), generator=generator)
            accept = torch.rand(batch, gamma + 1, generator=generator, dtype=torch.float64)
            sample = torch.rand(batch, gamma + 1, generator=generator, dtype=torch.float64)
            if trial % 5 == 1:
                accept.zero_()
            if trial % 5 == 2:
                accept.fill_(LARGEST_BELOW_ONE)
            chain = C.chain_round(
                tokens, lengths, target, None if point_mass else draft, dtype=dtype
            )
            if trial % 5 == 3:  # uniforms at the weights: tests at their boundaries
                accept = engine.host_weights(chain).clone()
            noise = ssg.Noise(accept, sample)
            host, batched = engine.host_run(chain, noise), engine.batched_run(chain, noise)
            for a, b in zip(host, batched, strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b), (engine, trial)
            assert engine.run(chain, noise).node.tolist() == host.node.tolist()
            checked += 1
    assert checked == 120


def test_block_float64_masses_add_in_numpy_order() -> None:
    """float64 masses :math:`S_i` are the reference's ``positive_part(w p - q).sum()`` bit for
    bit on every route (numpy's pairwise order; ``torch.sum`` of a long row differs from it,
    and with the batch shape), so no route's verdict moves with a 1-ulp mass."""
    generator = torch.Generator().manual_seed(8)
    batch, gamma, vocab = 2, 3, 40_000
    target = torch.rand(batch, gamma + 1, vocab, generator=generator, dtype=torch.float64) ** 6
    target /= target.sum(-1, keepdim=True)
    draft = torch.rand(batch, gamma, vocab, generator=generator, dtype=torch.float64) ** 6
    draft /= draft.sum(-1, keepdim=True)
    tokens = torch.randint(0, vocab, (batch, gamma), generator=generator)
    chain = C.chain_round(tokens, torch.full((batch,), gamma), target, draft, torch.float64)
    engine = R.BLOCK_CHAIN
    weights = engine.chain_weights(chain)  # [B, γ + 1]
    expected = np.zeros((batch, gamma + 1))
    differs = 0
    for row in range(batch):
        for node in range(1, gamma):
            w = float(weights[row, node])
            values = np.maximum(w * target[row, node].numpy() - draft[row, node].numpy(), 0)
            expected[row, node] = values.sum()
            differs += float(torch.from_numpy(values).sum()) != expected[row, node]
            host = engine.host_residual(
                chain, torch.empty(1, vocab, dtype=torch.float64), row, node, w
            )
            assert host == expected[row, node]
    assert differs  # the case has teeth: torch's own sum misses numpy's on some row
    masses = engine.row_masses(chain, weights).numpy()
    assert np.array_equal(masses[:, 1:gamma], expected[:, 1:gamma])
    accept = torch.zeros(batch, gamma + 1, dtype=torch.float64)
    accept[:, gamma] = LARGEST_BELOW_ONE  # the end fails: the deepest inner node is read
    deciding = engine.deciding_masses(chain, weights, ssg.Noise(accept, accept))
    assert np.array_equal(deciding.numpy()[:, gamma - 1], expected[:, gamma - 1])


# --------------------------------------------------------------------------- standard's host route
@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_chain_engines_pathwise_on_one_and_two_rows(point_mass: bool) -> None:
    """Rounds of one and two rows take the CPU's host routes (``StandardChain.host_run``,
    ``GreedyChain.host_run``, ``BlockChain.host_run``): every chain scheme's verdicts are the
    reference's, bit for bit, with and without validation; greedy also on lanes whose one-hot
    draft covers its support."""
    assert C.HOST_STANDARD_ROWS >= 2
    for name in chain_schemes():
        for seed in range(2):
            rounds = chain_rounds(
                ss.pairs.Random(5, seed=seed), np.random.default_rng(seed), 12, point_mass
            )
            if name == "greedy" and not point_mass:
                rounds = covering_rounds(seed)[:12]
            for start in range(0, len(rounds), 2):
                for size in (1, 2):
                    part = rounds[start : start + size]
                    assert mismatches(name, part, point_mass) == [], name
                    assert mismatches(name, part, point_mass, validate=False) == [], name


def random_tables(
    generator: torch.Generator, batch: int, dtype: torch.dtype, point_mass: bool, hot: float
) -> tuple[C.ChainTables, ssg.Noise]:
    """Correlated rows over 300 tokens, ragged lengths; ``hot``: the share of draft rows that
    are the one-hot of their drafted token (greedy's covering lanes)."""
    gamma, vocab = 5, 300
    logits = 3 * torch.randn(batch, gamma + 1, vocab, generator=generator, dtype=torch.float64)
    target = logits.softmax(-1)
    draft = (logits[:, :gamma] + torch.randn(batch, gamma, vocab, generator=generator)).softmax(-1)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator)
    tokens = tokens.view(batch, gamma)
    covering = torch.rand(batch, gamma, generator=generator) < hot
    one_hot = torch.nn.functional.one_hot(tokens, vocab).to(draft.dtype)
    draft = torch.where(covering[..., None], one_hot, draft)
    lengths = torch.randint(0, gamma + 1, (batch,), generator=generator)
    tables = C.padded_tables(
        tokens, lengths, target.to(dtype), None if point_mass else draft.to(dtype)
    )
    noise = ssg.Noise(
        torch.rand(batch, gamma + 1, generator=generator, dtype=torch.float64),
        torch.rand(batch, gamma + 1, generator=generator, dtype=torch.float64),
    )
    return tables, noise


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nss_host_run_equals_the_batched_run(dtype: torch.dtype) -> None:
    """NSS's CPU route draws node by node only for the rows still descending: the same tokens
    as the batched route's draws at every node, bit for bit, on batches of 1 to 40 rows with
    ragged lengths, shallow and deep descents (draft tokens drawn from the target itself), and
    uniforms at 0 and next to 1."""
    generator = torch.Generator().manual_seed(21)
    depths = []
    for trial in range(48):
        batch, gamma, vocab = (1, 2, 5, 40)[trial % 4], 1 + trial % 6, (7, 300, 1000)[trial % 3]
        logits = torch.randn(batch, gamma + 1, vocab, generator=generator, dtype=torch.float64)
        target = (logits * (1 + 4 * (trial % 2))).softmax(-1)  # peaked rows: deep descents
        tokens = torch.multinomial(target[:, :gamma].reshape(-1, vocab), 1, generator=generator)
        tokens = tokens.view(batch, gamma)
        lengths = torch.randint(0, gamma + 1, (batch,), generator=generator)
        noise = ssg.Noise(
            torch.rand(batch, gamma + 1, generator=generator, dtype=torch.float64),
            torch.rand(batch, gamma + 1, generator=generator, dtype=torch.float64),
        )
        if trial % 5 == 3:
            noise = ssg.Noise(noise.accept, torch.zeros_like(noise.sample))
        if trial % 5 == 4:
            noise = ssg.Noise(noise.accept, torch.full_like(noise.sample, LARGEST_BELOW_ONE))
        chain = C.chain_round(tokens, lengths, target.to(dtype), None, dtype)
        host, batched = R.NSS_CHAIN.host_run(chain, noise), R.NSS_CHAIN.batched_run(chain, noise)
        for a, b in zip(host, batched, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), trial
        depths += host.node.tolist()
    assert max(depths) >= 3 and 0 in depths  # deep descents and first-node stops were checked


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_host_routes_draw_from_the_target_where_the_residual_has_no_mass(
    dtype: torch.dtype,
) -> None:
    """A drafted token of no mass under equal target and draft rows is rejected with a residual
    of no mass: the stop token is drawn from the target, on the standard engine's host route
    as on its batched one (one and two rows), never token 0 of an empty residual."""
    vocab = 300
    generator = torch.Generator().manual_seed(3)
    for batch in (1, 2):
        logits = torch.randn(batch, 3, vocab, generator=generator, dtype=torch.float64)
        logits[..., :5] = -float("inf")  # tokens 0-4 carry no mass
        target = logits.softmax(-1).to(dtype)
        draft = target[:, :2].clone()
        tokens = torch.tensor([[3, 7]] * batch)  # lane 0 drafts a token of no mass: rejected
        noise = ssg.Noise(
            torch.rand(batch, 3, generator=generator, dtype=torch.float64),
            torch.rand(batch, 3, generator=generator, dtype=torch.float64),
        )
        tables = C.padded_tables(tokens, torch.full((batch,), 2), target, draft)
        host = C.STANDARD_CHAIN.host_run(tables, noise, 1)[0]
        assert torch.equal(host.tokens, C.STANDARD_CHAIN.batched_run(tables, noise, 1)[0].tokens)
        assert host.node.tolist() == [0] * batch
        assert (host.token >= 5).all()  # from the target's support


@pytest.mark.parametrize("name", ["block", "traversal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_host_route_draws_from_the_target_where_node_0_has_no_residual(
    name: str, dtype: torch.dtype
) -> None:
    """Block and traversal stopping at node 0 whose residual has no mass (a draft row above the
    target everywhere: ``q = p`` plus mass on the drafted token, engine-level tables) draw the
    stop token from the target, on the host route (one and two rows) as on the batched one
    (nine rows), never token 0 of an empty residual."""
    engine = R.BLOCK_CHAIN if name == "block" else R.TRAVERSAL_CHAIN
    vocab = 300
    generator = torch.Generator().manual_seed(4)
    for batch in (1, 2, 9):
        logits = torch.randn(batch, 3, vocab, generator=generator, dtype=torch.float64)
        logits[..., :5] = -float("inf")  # tokens 0-4 carry no mass
        target = logits.softmax(-1)
        draft = target[:, :2].clone()
        tokens = torch.tensor([[int(target[b, 0].argmax()), 7] for b in range(batch)])
        draft[torch.arange(batch), 0, tokens[:, 0]] += 0.5  # p_0 <= q_0: no residual at node 0
        noise = ssg.Noise(
            torch.full((batch, 3), LARGEST_BELOW_ONE, dtype=torch.float64),  # every test fails
            torch.rand(batch, 3, generator=generator, dtype=torch.float64),
        )
        chain = C.chain_round(tokens, torch.full((batch,), 2), target, draft, dtype)
        verdicts = engine.run(chain, noise)
        assert torch.equal(verdicts.tokens, engine.batched_run(chain, noise).tokens)
        assert verdicts.node.tolist() == [0] * batch
        assert (verdicts.token >= 5).all()  # from the target's support


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standard_host_run_equals_the_batched_run(dtype: torch.dtype) -> None:
    """``host_run`` and ``batched_run`` of the standard and greedy engines give the same
    verdicts and unresolved flags on the same round: draft tables and point masses, one and
    two rows, one round and rounds until no hit, caller's bonus tokens (vLLM's layout), noise
    at 0 and next to 1, covering lanes for greedy, and the zero-mass residual hit."""
    generator = torch.Generator().manual_seed(11)
    checked = 0
    for trial in range(80):
        engine = (C.STANDARD_CHAIN, C.GREEDY_CHAIN)[trial % 2]
        point_mass = engine is C.STANDARD_CHAIN and trial % 4 == 2
        batch = 1 + (trial // 2) % 2
        tables, noise = random_tables(generator, batch, dtype, point_mass, 0.3)
        if trial % 5 == 1:
            noise = ssg.Noise(torch.zeros_like(noise.accept), noise.sample)
        if trial % 5 == 2:
            noise = ssg.Noise(torch.full_like(noise.accept, LARGEST_BELOW_ONE), noise.sample)
        if trial % 3 == 0:
            bonus = torch.randint(0, 300, (batch,), generator=generator)
            tables = tables._replace(bonus_tokens=bonus)
        rounds = (None, 1)[trial % 2 == 0 and trial % 3 == 1]
        host = engine.host_run(tables, noise, rounds)
        batched = engine.batched_run(tables, noise, rounds)
        for a, b in zip((*host[0], host[1]), (*batched[0], batched[1]), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), (trial, a, b)
        checked += 1
    draft_tokens, target, draft, noise = hit_round()
    for engine in (C.STANDARD_CHAIN, C.GREEDY_CHAIN):
        tables = C.padded_tables(draft_tokens, torch.tensor([1]), target.to(dtype), draft.to(dtype))
        for rounds in (None, 1):
            host, batched = (
                engine.host_run(tables, noise, rounds),
                engine.batched_run(tables, noise, rounds),
            )
            assert host[0].tokens.tolist() == batched[0].tokens.tolist()
            assert host[1].tolist() == batched[1].tolist()
            if dtype == torch.float64:  # (float32 rounds the hit away: p == q there)
                assert host[1].tolist() == [rounds == 1]
            checked += 1
    assert checked == 84


# --------------------------------------------------------------------------- review regressions
def test_host_routes_read_strided_tables_as_contiguous_ones() -> None:
    """Column-strided float32 tables (a valid input): a row's block sums depend on its layout, so
    the host route reads contiguous rows, as the batched route's gathers: the same token as the
    contiguous tables and as the batched route (a strided row once drew another)."""
    checked = 0
    for seed in range(60):
        generator = torch.Generator().manual_seed(seed)
        target = torch.rand(1, 2, 300, generator=generator) ** 4
        target /= target.sum(-1, keepdim=True)
        wide = torch.zeros(1, 2, 600)
        wide[..., ::2] = target
        strided = wide[..., ::2]  # the same values, column stride 2
        tokens = torch.tensor([[int(target[0, 0].argmax())]])
        noise = ssg.Noise(
            torch.zeros(1, 2, dtype=torch.float64),
            torch.full((1, 2), LARGEST_BELOW_ONE, dtype=torch.float64),
        )
        contiguous = ssg.verify_chain("standard", tokens, target, None, noise).token
        assert torch.equal(
            ssg.verify_chain("standard", tokens, strided, None, noise).token, contiguous
        )
        for engine, draft in ((C.STANDARD_CHAIN, None), (C.GREEDY_CHAIN, strided[:, :1])):
            tables = C.padded_tables(tokens, torch.tensor([1]), strided, draft)
            host, batched = engine.host_run(tables, noise)[0], engine.batched_run(tables, noise)[0]
            assert torch.equal(host.tokens, batched.tokens)
        checked += 1
    assert checked == 60


def test_padding_lanes_with_junk_are_never_read() -> None:
    """Lanes past a row's drafts may hold anything (validation reads only real rows): NaN target
    rows and zero draft rows there give every chain scheme the same verdict on one row (host
    routes) as on twenty (batched), never a division error."""
    target = torch.full((1, 4, 5), 0.2, dtype=torch.float64)
    draft = torch.full((1, 3, 5), 0.2, dtype=torch.float64)
    target[0, 2:] = float("nan")
    draft[0, 1:] = 0.0
    tokens = torch.tensor([[2, -1, -1]])
    half = torch.full((1, 4), 0.5, dtype=torch.float64)
    for name in chain_schemes():
        verdicts = []
        for size in (1, 20):
            noise = ssg.Noise(half.repeat(size, 1), half.repeat(size, 1))
            out = ssg.verify_chain(
                name,
                tokens.repeat(size, 1),
                target.repeat(size, 1, 1),
                draft.repeat(size, 1, 1),
                noise,
            )
            verdicts.append(out.tokens[0].tolist())
        assert verdicts[0] == verdicts[1] and verdicts[0][2:] == [-1, -1], (name, verdicts)


def test_zero_rows_give_empty_verdicts() -> None:
    for name in chain_schemes():
        for draft in (torch.zeros(0, 3, 5), None):
            out = ssg.verify_chain(
                name, torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 4, 5), draft
            )
            shapes = [tuple(t.shape) for t in out]
            assert shapes == [(0,), (0,), (0, 4), (0,)], (name, shapes)
            assert all(t.dtype == torch.long for t in out), name


def test_block_host_route_draws_the_end_from_its_target_alone() -> None:
    """When tau is the chain's end the host route draws from the target row directly (no stop
    buffer, whose unwritten memory float64 would otherwise normalise): no floating-point
    warning, the batched route's token."""
    import warnings

    generator = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(1, 3, 300, generator=generator, dtype=torch.float64), -1)
    draft = target[:, :2].clone()  # q = p: every draft accepted, tau = the end
    tokens = torch.tensor([[int(target[0, 0].argmax()), int(target[0, 1].argmax())]])
    noise = ssg.Noise(
        torch.zeros(1, 3, dtype=torch.float64), torch.full((1, 3), 0.4, dtype=torch.float64)
    )
    chain = C.chain_round(tokens, torch.tensor([2]), target, draft, torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        host = R.BLOCK_CHAIN.host_run(chain, noise)
    assert int(host.node[0]) == 2
    assert torch.equal(host.tokens, R.BLOCK_CHAIN.batched_run(chain, noise).tokens)


def test_standard_host_route_reads_the_tables_draft_mass() -> None:
    """ChainTables may carry ``draft_mass`` (the rule reads q / mass): the host route's residual
    divides by it as the batched route does."""
    for seed in range(40):
        generator = torch.Generator().manual_seed(seed)
        tables, noise = random_tables(generator, 2, torch.float64, False, 0.0)
        assert tables.draft_flat is not None
        mass = 1.0 + torch.rand(
            tables.draft_flat.shape[0], generator=generator, dtype=torch.float64
        )
        # the verdicts of the rows divided beforehand: q / mass read in the tests and residuals
        divided = tables._replace(draft_flat=tables.draft_flat / mass[:, None])
        tables = tables._replace(draft_mass=mass)
        for rounds in (None, 1):
            host = C.STANDARD_CHAIN.host_run(tables, noise, rounds)
            batched = C.STANDARD_CHAIN.batched_run(tables, noise, rounds)
            expected = C.STANDARD_CHAIN.batched_run(divided, noise, rounds)
            assert torch.equal(host[0].tokens, batched[0].tokens), seed
            assert torch.equal(host[1], batched[1]), seed
            assert torch.equal(batched[0].tokens, expected[0].tokens), seed


@pytest.mark.parametrize("batch", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_chain_reads_the_normalised_draft(batch: int, dtype: torch.dtype) -> None:
    """Greedy with draft tables reads :math:`q' = q / \\sum q` (at a chain node no candidate
    is excluded): on draft rows of mass 0.5-2 (``validate=False``) and full support (no lane
    covers) its verdicts are the standard rule's on the rows divided by their sums beforehand
    (numpy's order in float64, torch's below, as the engine sums), on the host route (1-2
    rows) and the batched one (5): the accept tests and the residuals both read :math:`q'`."""
    for seed in range(30):
        generator = torch.Generator().manual_seed(seed)
        gamma, vocab = 4, 200
        logits = torch.randn(batch, gamma + 1, vocab, generator=generator, dtype=torch.float64)
        target = (3 * logits).softmax(-1)
        draft = 3 * logits[:, :gamma] + torch.randn(batch, gamma, vocab, generator=generator)
        draft = draft.softmax(-1) * (0.5 + 1.5 * torch.rand(batch, gamma, 1, generator=generator))
        tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator)
        tokens = tokens.view(batch, gamma)
        noise = ssg.chain.chain_noise(batch, gamma, generator)
        rows = draft.to(dtype)
        sums = (
            torch.from_numpy(rows.numpy().sum(-1, keepdims=True))
            if dtype == torch.float64
            else rows.sum(-1, keepdim=True)
        )
        normalised = rows / sums
        greedy = ssg.verify_chain(
            "greedy", tokens, target.to(dtype), draft.to(dtype), noise, validate=False
        )
        standard = ssg.verify_chain(
            "standard", tokens, target.to(dtype), normalised, noise, validate=False
        )
        assert torch.equal(greedy.tokens, standard.tokens), seed


def test_host_draws_decline_tables_numpy_cannot_read() -> None:
    """A bf16 fallback or one that requires grad takes the batched route (numpy reads neither):
    the same token as it, no error."""
    ops = ssg.ops
    weights = torch.rand(1, 300, generator=torch.Generator().manual_seed(1))
    u = torch.tensor([0.3], dtype=torch.float64)
    use = torch.tensor([True])
    for fallback in (weights.to(torch.bfloat16), weights.clone().requires_grad_()):
        assert not ops._draws_on_host(fallback)
        expected = ops.categorical_blocks_or_batched(weights, fallback, use, u)
        assert torch.equal(ops.categorical_blocks_or(weights, fallback, use, u), expected)
        empty = torch.zeros_like(weights[0])  # no mass: draw_one_or draws from the fallback
        assert ops.draw_one_or(empty, fallback[0], 0.3) == int(expected[0])


@pytest.mark.parametrize("batch", [2, 8])  # the host route and the batched one
def test_column_major_tables_verify_as_their_contiguous_copies(batch: int) -> None:
    """Tables whose rows are not contiguous in memory (column-major) give the tokens of their
    contiguous copies, bit for bit, even with a uniform on the float32 accept boundary: greedy's
    draft masses were summed along the strided rows on the batched route, an ulp off the
    contiguous sums on some rows, which flipped tests next to the boundary."""
    gamma, vocab = 1, 5000
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(batch, gamma + 1, vocab, generator=gen, dtype=torch.float64)
    target = logits.softmax(-1).float()
    noise_logits = torch.randn(batch, gamma, vocab, generator=gen, dtype=torch.float64)
    draft = (logits[:, :gamma] + noise_logits).softmax(-1).float()
    tokens = torch.multinomial(draft.double().reshape(-1, vocab), 1, generator=gen)
    tokens = tokens.reshape(batch, gamma)
    column_major = draft.reshape(-1, vocab).T.contiguous().T.reshape(batch, gamma, vocab)
    column_major_target = target.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    assert torch.equal(column_major, draft) and column_major.stride(-1) != 1
    assert torch.equal(column_major_target, target) and column_major_target.stride(-1) != 1
    # q'(x) as the contiguous rows give it, and uniforms on its accept boundary p(x) / q'(x)
    q_x = draft[:, 0].gather(-1, tokens).squeeze(-1) / draft[:, 0].sum(-1)  # [B]
    p_x = target[:, 0].gather(-1, tokens).squeeze(-1)  # [B]
    boundary = (p_x.double() / q_x.double()).clamp(max=0.5)  # [B]
    differ = 0
    for step in range(-24, 25):
        accept = torch.full((batch, gamma + 1), 0.5, dtype=torch.float64)
        accept[:, 1] = boundary * (1 + step * 2.0**-52)
        sample = torch.full((batch, gamma + 1), 0.5, dtype=torch.float64)
        noise = ssg.Noise(accept, sample)
        for name in ("greedy", "standard", "block", "nss"):
            want = ssg.verify_chain(name, tokens, target, draft, noise, validate=False)
            got = ssg.verify_chain(name, tokens, column_major_target, column_major, noise)
            differ += int((want.tokens != got.tokens).any(-1).sum())
    assert differ == 0
