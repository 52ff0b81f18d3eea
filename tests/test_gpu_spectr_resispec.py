"""Path-wise equality of the SpecTr and ResiSpec lowerings (every ResiSpec policy) with their
numpy references, the duplicate-candidate uniform reuse rule, the per-row draw law, and mutants
that the comparison must catch (docs/torch.md)."""

from __future__ import annotations

import inspect
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from proofs_tests.pathwise import Round, hypothesis_rounds, mismatches
from specsampling import gpu as ssg
from specsampling.gpu.schemes import resispec as lowered
from specsampling.gpu.schemes import spectr as lowered_spectr
from specsampling.gpu.tree import PAD
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes import resispec as reference
from specsampling.schemes import tables
from specsampling.schemes.greedy import top_tokens
from specsampling.schemes.spectr import optimal_rho

DEEPER = (
    ss.Shape.chain(5),
    ss.Shape.star(4),
    ss.Shape.star(4, replacement=False),
    ss.Shape.paths(3, 3),
    ss.Shape.branching((3, 2)),
    ss.Shape.branching((2, 2), replacement=True),
    ss.Shape.branching((1, 1, 1)),
    ss.Shape.delayed(3, trunk=2, branch=2),
    ss.Shape.star(5),
    ss.Shape.greedy((1, 1)),
)
SHAPES = LAW_SHAPES + DEEPER
#: Every ResiSpec policy family, with non-default parameters too (each against its own reference).
POLICIES = [
    reference.Optimised(),
    reference.Optimised(steps=7, max_thresholds=2),
    reference.Greedy(),
    reference.ConstantRatio(),
    reference.ConstantRatio(rho=1.25),
    reference.ConfidenceDamping(),
    reference.ConfidenceDamping(scale=(0.25, 0.75), threshold=Fraction(1, 3)),
    reference.ConfidenceDamping(scale=0.4, top=1),
]
LOWERINGS = [lowered_spectr.SpecTr()] + [lowered.ResiSpec(policy) for policy in POLICIES]


def label(lowering: Any) -> str:
    policy = getattr(lowering, "policy", None)
    return lowering.name if policy is None else f"{lowering.name}-{policy.reference!r}"


def supported(lowering: Any) -> list[ss.Shape]:
    return [shape for shape in SHAPES if lowering.reference_scheme.supports(shape)]


def mixed_rounds(lowering: Any, pair: Any, seed: int) -> list[Round]:
    """Every supported shape drafted twice, each with random, zero and largest-below-one noise."""
    rng = np.random.default_rng(seed)
    rounds: list[Round] = []
    for shape in supported(lowering) * 2:
        tree = shape.draft(pair, rng)
        target, draft = tables(pair, tree)
        for noise in (
            ss.Noise.draw(rng, tree.num_nodes),
            ss.Noise.constant(0.0, tree.num_nodes),
            ss.Noise.constant(LARGEST_BELOW_ONE, tree.num_nodes),
        ):
            rounds.append((tree, target, draft, noise))
    return [rounds[i] for i in rng.permutation(len(rounds))]


def has_duplicates(rounds: list[Round]) -> bool:
    return any(len(set(c)) < len(c) for r in rounds for c in r[0].candidates)


# --------------------------------------------------------------------------- path-wise equality
@pytest.mark.parametrize("lowering", LOWERINGS, ids=label)
@pytest.mark.parametrize("vocab", [2, 3, 6])
def test_pathwise_mixed_batches(lowering: Any, vocab: int) -> None:
    for pair_seed in range(2):
        rounds = mixed_rounds(lowering, ss.pairs.Random(vocab, seed=pair_seed), pair_seed)
        assert mismatches(lowering, rounds) == []
    if vocab <= 3:
        assert has_duplicates(rounds)  # the reuse rule was exercised


@pytest.mark.parametrize("lowering", LOWERINGS[:5], ids=label)
def test_pathwise_hypothesis(lowering: Any) -> None:
    @settings(max_examples=40, deadline=None)
    @given(
        hypothesis_rounds(
            supported(lowering), max_vocab=3, boundary=(0.0, LARGEST_BELOW_ONE), max_trees=6
        )
    )
    def check(rounds: list[Round]) -> None:
        assert mismatches(lowering, rounds) == []

    check()


def test_duplicate_reuse_is_what_decides() -> None:
    """A hand-made i.i.d. star ``x, x`` under damping by 1/2: the first copy (acceptance 1/4) is
    rejected at ``u = 0.6``, the second (acceptance 1/2) accepted only through the rescaled
    uniform ``(0.6 - 1/4) / (3/4)``; reading ``0.6`` again rejects it."""
    target, draft = np.array([0.25, 0.75]), np.array([0.5, 0.5])
    tree = ss.DraftTree.from_draws([(0, 0), (0, 0)], law="iid")
    noise = ss.Noise(np.array([0.0, 0.6]), np.array([0.9, 0.9]))
    rounds = [(tree, np.stack([target, target]), np.stack([draft, draft]), noise)]
    damping = lowered.ResiSpec(reference.ConfidenceDamping())
    assert tuple(damping.reference_scheme.verify(*rounds[0])) == (1, 1)
    for lowering in (damping, lowered.ResiSpec(), lowered_spectr.SpecTr()):
        assert mismatches(lowering, rounds) == []
    assert mismatches(NoReuseResiSpec(reference.ConfidenceDamping()), rounds) != []


def test_the_law_is_per_row() -> None:
    """The same trees as i.i.d. and as without-replacement rows in one batch: each row gets its
    own law's reference verdict, and the two laws disagree on some rows."""
    pair, rng = ss.pairs.Random(5, seed=1), np.random.default_rng(1)
    rounds = []
    for _ in range(30):
        tree = ss.Shape.star(3, replacement=False).draft(pair, rng)
        target, draft = tables(pair, tree)
        noise = ss.Noise.draw(rng, tree.num_nodes)
        rounds += [(tree.with_law(law), target, draft, noise) for law in ("iid", "without")]
    for policy in (reference.Greedy(), reference.Optimised()):
        lowering = lowered.ResiSpec(policy)
        assert mismatches(lowering, rounds) == []
        verdicts = [tuple(lowering.reference_scheme.verify(*r)) for r in rounds]
        assert verdicts[0::2] != verdicts[1::2]


def test_fraction_threshold_compares_exactly() -> None:
    """``q = float(1/3) < Fraction(1, 3)``: not damped by the reference, nor by the lowering."""
    third = np.full(3, 1 / 3)
    target = np.array([0.5, 0.3, 0.2])
    tree = ss.DraftTree.from_draws([(0, 0), (0, 1)], law="iid")
    rounds = [
        (tree, np.stack([target] * 3), np.stack([third] * 3), ss.Noise.constant(u, 3))
        for u in np.linspace(0, 0.99, 12)
    ]
    exact = reference.ConfidenceDamping(scale=0.0, threshold=Fraction(1, 3))
    rounded = reference.ConfidenceDamping(scale=0.0, threshold=1 / 3)
    for policy in (exact, rounded):
        assert mismatches(lowered.ResiSpec(policy), rounds) == []
    verdicts = {
        p: [tuple(reference.ResiSpec(p).verify(*r)) for r in rounds] for p in (exact, rounded)
    }
    assert verdicts[exact] != verdicts[rounded]


# --------------------------------------------------------------------------- pieces
def test_batched_rho_matches_the_reference() -> None:
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(5), size=(2, 40))
    rows[rng.random(rows.shape) < 0.3] = 0.0
    rows[..., 0] += 0.05
    rows /= rows.sum(-1, keepdims=True)
    rows[1, :5] = rows[0, :5]  # p == q
    counts = rng.integers(1, 6, 40)
    got = lowered_spectr.optimal_rho(
        torch.tensor(rows[0]), torch.tensor(rows[1]), torch.tensor(counts), 5
    ).tolist()
    expected = [optimal_rho(p, q, int(k)) for p, q, k in zip(rows[0], rows[1], counts, strict=True)]
    assert max(abs(g - e) for g, e in zip(got, expected, strict=True)) <= 2.0**-40
    assert sum(g == e for g, e in zip(got, expected, strict=True)) >= 38
    assert {e for e, k in zip(expected, counts, strict=True) if k == 1} == {1.0}


def test_top_mask_matches_top_tokens_with_ties() -> None:
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 3, size=(50, 6)) / 4.0  # many ties and zeros
    for count in (1, 2, 4):
        got = lowered.top_mask(torch.tensor(rows), count).numpy()
        assert (got == np.stack([top_tokens(row, count) for row in rows])).all()


def test_optimised_parameters_are_the_reference_choice() -> None:
    """The encoded per-node rule is the reference optimiser's pick (a damping at this node)."""
    target, draft = np.array([1 / 2, 1 / 3, 1 / 6]), np.full(3, 1 / 3)
    tree = ss.DraftTree.from_draws([(0, 0), (0, 1)], law="iid")
    batch = ssg.TreeBatch.from_trees([tree])
    tabs = [torch.tensor(np.stack([a] * 3))[None] for a in (target, draft)]
    params = lowered.ResiSpec().policy.node_parameters(batch, *tabs)
    choice = reference.optimise(target, draft, 2).policy
    assert isinstance(choice, reference.ConfidenceDamping)
    assert params[0, 0].tolist() == [lowered.DAMPING, 1.0, choice.scale, choice.threshold]
    assert (params[0, 1:] == torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=params.dtype)).all()


def test_registered_lowering_mirrors_the_registered_reference() -> None:
    registered = ssg.SCHEMES["resispec"]
    assert isinstance(registered, lowered.ResiSpec)
    assert registered.reference_scheme is ss.SCHEMES["resispec"]
    assert registered.policy.reference == ss.SCHEMES["resispec"].policy
    assert isinstance(registered.policy, lowered.Optimised)
    assert isinstance(ssg.SCHEMES["spectr"], lowered_spectr.SpecTr)
    other = lowered.ResiSpec(reference.Greedy())
    assert other.reference_scheme.policy == reference.Greedy()


def test_policy_methods_never_synchronise() -> None:
    """The lowered policies' per-node methods and the shared pieces are sync-free
    (``Optimised.node_parameters`` is the documented host step, outside the walk's hot path)."""
    functions: list[Any] = [
        lowered_spectr.optimal_rho,
        lowered_spectr.bisection_rho,
        lowered_spectr.gamma,
        lowered_spectr.rejection,
        lowered_spectr.residual,
        lowered_spectr.reuse_uniform,
        lowered_spectr.accept_probability,
        lowered_spectr.later_copies,
        lowered.top_mask,
        lowered.ratio_sub_target,
        lowered.ResiSpec.walk,
        lowered.ResiSpec.step,
        lowered.ResiSpec.stage,
        lowered_spectr.SpecTr.node_step,
    ]
    for cls in lowered.POLICIES.values():
        functions += [cls.at_node, cls.sub_target]
    for function in functions:
        body = inspect.getsource(function).split('"""')[-1]
        for forbidden in (".item(", ".tolist(", "bool(", "int(", "float(", ".nonzero(", ".cpu("):
            assert forbidden not in body, (function.__qualname__, forbidden)


@pytest.mark.cuda
def test_pathwise_on_device() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for lowering in LOWERINGS:
        rounds = mixed_rounds(lowering, ss.pairs.Random(5, seed=4), 4)
        assert mismatches(lowering, rounds, device=device) == []


# --------------------------------------------------------------------------- mutants
class NoReuseSpecTr(lowered_spectr.SpecTr):
    """A duplicate reads the rejected copy's uniform again instead of the rescaled one."""

    def reuse(self, u: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
        return u


class ResidualNotZeroedSpecTr(lowered_spectr.SpecTr):
    """The stop distribution keeps the full target mass of the rejected candidates."""

    def stop_probs(self, target, draft, rho, counts, candidate_tokens, candidate_valid):
        probs = super().stop_probs(target, draft, rho, counts, candidate_tokens, candidate_valid)
        kept = target.gather(-1, candidate_tokens)  # [B, C]
        kept = torch.where(candidate_valid, kept, probs.gather(-1, candidate_tokens))
        return probs.scatter(-1, candidate_tokens, kept)


class NoReuseResiSpec(lowered.ResiSpec):
    def reuse(self, u: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
        return u


class ResidualNotZeroedResiSpec(lowered.ResiSpec):
    """The shaped residual keeps the rejected candidate's current mass."""

    def shaped_rest(self, current, kept, token):
        rest = current - kept  # [B, V]
        return rest.scatter(-1, token[:, None], current.gather(-1, token[:, None]))


class DampLastToo(lowered.ConfidenceDamping):
    """Damping applied to the last candidate too (the contract says it must not be)."""

    def sub_target(self, resolved, target, draft, current, proposal, index, counts):
        return torch.where(resolved, self.scales[0] * current, current)


class OptimisedAsGreedy(lowered.Optimised):
    """The host-resolved rule ignored: greedy at every node."""

    def sub_target(self, resolved, target, draft, current, proposal, index, counts):
        return current


def with_policy(policy: lowered.Policy) -> lowered.ResiSpec:
    lowering = lowered.ResiSpec(policy.reference)
    lowering.policy = policy
    return lowering


MUTANTS = [
    NoReuseSpecTr(),
    ResidualNotZeroedSpecTr(),
    NoReuseResiSpec(reference.ConfidenceDamping()),
    NoReuseResiSpec(reference.ConstantRatio()),
    ResidualNotZeroedResiSpec(),
    with_policy(DampLastToo(reference.ConfidenceDamping())),
    with_policy(OptimisedAsGreedy(reference.Optimised())),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: type(m).__name__ + "-" + label(m))
def test_mutants_are_caught(mutant: Any) -> None:
    found = mismatches_found(mutant, pair_seeds=8)
    assert found > 0, f"the path-wise test passes the mutant {type(mutant).__name__}"


def mismatches_found(lowering: Any, pair_seeds: int) -> int:
    """Rows where ``lowering`` differs from its reference over mixed rounds of random pairs
    (vocabularies 2 and 3, ``pair_seeds`` pairs each): what a mutant must make positive."""
    found = 0
    for vocab in (2, 3):
        for pair_seed in range(pair_seeds):
            pair = ss.pairs.Random(vocab, seed=pair_seed)
            found += len(mismatches(lowering, mixed_rounds(lowering, pair, pair_seed)))
    return found


# --------------------------------------------------------------------------- SpecTr's CPU routes
def test_spectr_sync_free_stop_rows_are_pathwise_too(monkeypatch) -> None:
    """The accelerators' stop distribution (every row's residual) gives the reference's
    verdicts too; the CPU route (:meth:`SpecTr.stopping_rows`: the residual of the rows that
    rejected every candidate only) is what the other path-wise tests run."""
    lowering = lowered_spectr.SpecTr()
    assert lowering.rejecting_rows_only(torch.zeros(1, dtype=torch.bool))  # the CPU, eager
    monkeypatch.setattr(lowered_spectr.SpecTr, "rejecting_rows_only", lambda self, rows: False)
    for vocab in (2, 3):
        rounds = mixed_rounds(lowering, ss.pairs.Random(vocab, seed=vocab), vocab)
        assert mismatches(lowering, rounds) == []


def test_spectr_stop_rows_misread_is_caught(monkeypatch) -> None:
    """Mutant of the CPU route: the residual formed for the rows that accepted a candidate
    (and target kept for those that rejected every one)."""
    original = lowered_spectr.SpecTr.stopping_rows

    def swapped(self: Any, stopping: torch.Tensor, *args: Any) -> torch.Tensor:
        counts = args[3]  # [B]
        return original(self, ~stopping & (counts > 0), *args)

    monkeypatch.setattr(lowered_spectr.SpecTr, "stopping_rows", swapped)
    lowering = lowered_spectr.SpecTr()
    assert mismatches_found(lowering, pair_seeds=4) > 0


def test_spectr_one_candidate_levels_run_the_standard_rule(monkeypatch) -> None:
    """A level whose nodes hold one candidate (rho* = 1) runs the standard rule: on paths no
    level of one slot searches for rho* (nor forms K-SEQ's residual), and the verdicts stay
    the reference's."""
    slots: list[int] = []
    original = lowered_spectr.optimal_rho

    def counted(*args: Any) -> torch.Tensor:
        slots.append(args[3])  # max_count: the level's candidate slots
        return original(*args)

    monkeypatch.setattr(lowered_spectr, "optimal_rho", counted)
    lowering = lowered_spectr.SpecTr()
    pair = ss.pairs.Random(64, seed=5)  # paths that do not merge
    rng = np.random.default_rng(5)
    rounds = []
    for _ in range(6):
        tree = ss.Shape.paths(3, 4).draft(pair, rng)
        for noise in (ss.Noise.draw(rng, tree.num_nodes), ss.Noise.constant(0.0, tree.num_nodes)):
            rounds.append((tree, *tables(pair, tree), noise))  # u = 0: walks to the leaves
    assert mismatches(lowering, rounds) == []
    assert slots and min(slots) >= 2  # the root's (and merged prefixes') levels only


def test_rho_is_searched_only_where_the_first_verdict_depends_on_it(monkeypatch) -> None:
    """The CPU route searches rho* only for the rows whose first candidate fails the test under
    rho = k: with u = 0 every first candidate passes (full-support pairs) and nothing is
    searched, with u just below 1 some rows are; the verdicts stay the reference's."""
    searched: list[int] = []
    original = lowered_spectr.optimal_rho

    def counted(target: torch.Tensor, *args: Any) -> torch.Tensor:
        searched.append(target.shape[0])
        return original(target, *args)

    monkeypatch.setattr(lowered_spectr, "optimal_rho", counted)
    monkeypatch.setattr(lowered, "optimal_rho", counted)
    rng = np.random.default_rng(3)
    target, draft = rng.dirichlet(np.ones(5), size=2)  # full support: p(x) > 0 everywhere
    pair = ss.pairs.Stationary(target, draft)
    trees = [ss.Shape.branching((3, 2), replacement=True).draft(pair, rng) for _ in range(6)]
    for lowering in (lowered_spectr.SpecTr(), lowered.ResiSpec(reference.ConstantRatio())):
        for u, expected in ((0.0, False), (LARGEST_BELOW_ONE, True)):
            searched.clear()
            rounds = [
                (tree, *tables(pair, tree), ss.Noise.constant(u, tree.num_nodes)) for tree in trees
            ]
            assert mismatches(lowering, rounds) == []
            assert (sum(searched) > 0) is expected


def test_a_rho_ceiling_below_k_is_caught(monkeypatch) -> None:
    """Mutant of the CPU route: the first candidate tested under rho = 1 instead of k, so rows
    that pass there skip the search and verify at rho = 1."""

    def ones(counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.ones(counts.shape, dtype=dtype)

    monkeypatch.setattr(lowered_spectr, "rho_ceiling", ones)
    monkeypatch.setattr(lowered, "rho_ceiling", ones)
    assert mismatches_found(lowered_spectr.SpecTr(), pair_seeds=4) > 0
    assert mismatches_found(lowered.ResiSpec(reference.ConstantRatio()), pair_seeds=4) > 0


# --------------------------------------------------------------------------- ResiSpec's CPU routes
RESISPEC = [lowering for lowering in LOWERINGS if isinstance(lowering, lowered.ResiSpec)]


@pytest.mark.parametrize("lowering", RESISPEC, ids=label)
def test_resispec_sync_free_loop_is_pathwise_too(lowering: Any, monkeypatch) -> None:
    """The accelerators' loop (every row's stage formed at every slot and selected) gives the
    reference's verdicts too; the CPU route (:meth:`ResiSpec.host_step`: the accept tests from
    the candidates' entries, the stages for the rejecting rows only) is what the other
    path-wise tests run."""
    assert lowering.rejecting_rows_only(torch.zeros(1, 2))  # the CPU, eager: the host route
    monkeypatch.setattr(lowered.ResiSpec, "rejecting_rows_only", lambda self, target: False)
    for vocab in (2, 3):
        rounds = mixed_rounds(lowering, ss.pairs.Random(vocab, seed=vocab), vocab)
        assert mismatches(lowering, rounds) == []


def owned_step_inputs(lowering: Any, seed: int) -> tuple[torch.Tensor, ...]:
    """One level's inputs for ``lowering.step``: 64 rows of 4 slots over 6 tokens, half of
    them without replacement (distinct candidates), uniforms mostly near 1 (many rejections);
    ``Optimised`` rows resolved to ratio and damping rules alternately."""
    generator = torch.Generator().manual_seed(seed)
    rows, slots, vocab = 64, 4, 6

    def rows_of_mass() -> torch.Tensor:
        weights = torch.rand(rows, vocab, generator=generator, dtype=torch.float64) ** 3
        return weights / weights.sum(-1, keepdim=True)

    target, draft = rows_of_mass(), rows_of_mass()
    without = torch.arange(rows) % 2 == 0  # [B]
    orders = [torch.randperm(vocab, generator=generator)[:slots] for _ in range(rows)]
    distinct = torch.stack(orders)  # [B, C]
    drawn = torch.randint(0, vocab, (rows, slots), generator=generator)
    tokens = torch.where(without[:, None], distinct, drawn)  # [B, C]
    counts = torch.randint(1, slots + 1, (rows, 1), generator=generator)
    valid = torch.arange(slots)[None, :] < counts  # [B, C]
    uniforms = torch.rand(rows, slots, generator=generator, dtype=torch.float64) ** 0.2
    if not isinstance(lowering, lowered.ResiSpec):  # SpecTr: no extras
        return torch.zeros(rows, 0), target, draft, tokens, valid, uniforms
    parameters = torch.zeros(rows, lowering.policy.num_parameters, dtype=torch.float64)
    if isinstance(lowering.policy, lowered.Optimised):
        ratio = torch.tensor([lowered.RATIO, 1.3, 0.0, 0.0], dtype=torch.float64)
        damping = torch.tensor([lowered.DAMPING, 1.0, 0.5, 0.1], dtype=torch.float64)
        parameters = torch.where((torch.arange(rows) % 3 == 0)[:, None], ratio, damping)
    extras = torch.cat([without[:, None].to(torch.float64), parameters], -1)  # [B, 1 + P]
    return extras, target, draft, tokens, valid, uniforms


@pytest.mark.parametrize("lowering", [lowered_spectr.SpecTr(), *RESISPEC], ids=label)
def test_steps_overwrite_only_the_rows_they_own(lowering: Any) -> None:
    """The CPU routes write ResiSpec's stages and SpecTr's stop rows over the walk's own
    gathered rows (``owned``, as the walk calls them) and over copies otherwise: a caller's
    rows are left as they were, and both give the same verdicts and stop rows, also for
    policies that read p at every stage (kept aside before p is overwritten)."""
    stopped_after_two = written = 0
    for seed in range(3):
        extras, target, draft, tokens, valid, uniforms = owned_step_inputs(lowering, seed)
        inputs = target.clone(), draft.clone()
        copied = lowering.step(extras, target, draft, tokens, valid, uniforms)
        assert torch.equal(target, inputs[0]) and torch.equal(draft, inputs[1])
        mine = target.clone(), draft.clone()
        owned = lowering.step(extras, *mine, tokens, valid, uniforms, owned=True)
        assert torch.equal(owned.accepted, copied.accepted)
        stopped = owned.accepted == PAD  # [B]: the rows the walk draws from
        assert torch.equal(owned.stop_probs[stopped], copied.stop_probs[stopped])
        written += not torch.equal(mine[0], inputs[0])  # written in place: no copy
        stopped_after_two += int((stopped & (valid.sum(-1) >= 2)).sum())
    assert written > 0
    assert stopped_after_two > 10  # later stages ran, reading p and q of rejecting rows


class HalvedThenWhole(lowered.Policy):
    r"""A custom lowered policy reading both tables (the base class's flags, no clamp
    guarantees): :math:`a_1 = t_1^2`, then :math:`a_k = t_k` (plus :math:`0 \cdot p q`)."""

    def sub_target(self, resolved, target, draft, current, proposal, index, counts):
        return (current * current if index == 1 else current) + 0.0 * target * draft


@pytest.mark.parametrize("scaled", [False, True])
def test_host_route_equals_the_sync_free_loop_for_a_policy_reading_both_tables(
    scaled: bool, monkeypatch
) -> None:
    """The CPU route's compact rows (:meth:`ResiSpec.host_step`) against the sync-free loop
    that forms every row's update at every slot, owned or not, for a policy that reads ``p``
    and ``q`` at every stage. ``scaled``: a draft of 4x the target's mass (i.i.d. rows, so q
    is never renormalised) makes a row that rejected the first two slots stop there with no
    mass left (t_2, at most 2p, kept whole): that stop row comes from the compact rows."""
    lowering = lowered.ResiSpec(reference.Greedy())
    lowering.policy = HalvedThenWhole(reference.Greedy())
    later_zero_mass = 0
    for seed in range(3):
        extras, target, draft, tokens, valid, uniforms = owned_step_inputs(lowering, seed)
        if scaled:
            draft = 4 * target
            extras[:, 0] = 0.0  # i.i.d. rows
            tokens = torch.where(target.gather(-1, tokens) > 0, tokens, target.argmax(-1, True))
        inputs = target.clone(), draft.clone()
        host = lowering.step(extras, target, draft, tokens, valid, uniforms)
        assert torch.equal(target, inputs[0]) and torch.equal(draft, inputs[1])
        owned = lowering.step(extras, target.clone(), draft.clone(), tokens, valid, uniforms, True)
        with monkeypatch.context() as patch:
            patch.setattr(lowered.ResiSpec, "rejecting_rows_only", lambda self, target: False)
            loop = lowering.step(extras, target, draft, tokens, valid, uniforms)
        stopped = loop.accepted == PAD  # [B]: the rows the walk draws from
        for step in (host, owned):
            assert torch.equal(step.accepted, loop.accepted)
            assert torch.equal(step.stop_probs[stopped], loop.stop_probs[stopped])
        reached = stopped & (valid.sum(-1) >= 3) & (uniforms[:, :2] >= 0.5).all(-1)  # [B]
        later_zero_mass += int((reached & (loop.stop_probs != target).any(-1)).sum())
    assert later_zero_mass > 0 or not scaled


@pytest.mark.parametrize("policy", [reference.ConfidenceDamping(), reference.ConstantRatio()])
def test_resispec_host_route_updating_too_few_rows_is_caught(policy: Any, monkeypatch) -> None:
    """Mutant of the CPU route: each stage formed for the rejecting rows but the shaped rest
    kept for the first of them only (a later row's next stage reads a wrong t)."""
    original = lowered.ResiSpec.stage

    def first_row_only(self: Any, *args: Any) -> Any:
        kept, rest, _ = original(self, *args)
        rest[1:] = args[3][1:]  # t_k itself: the rows after the first not shaped
        return kept, rest, ops_sum(rest)

    monkeypatch.setattr(lowered.ResiSpec, "stage", first_row_only)
    lowering = lowered.ResiSpec(policy)
    assert mismatches_found(lowering, pair_seeds=4) > 0


def ops_sum(rows: torch.Tensor) -> torch.Tensor:
    return ssg.ops.numpy_sum(rows)[:, None]


def test_a_fixed_ratio_run_as_the_standard_rule_is_caught(monkeypatch) -> None:
    """``ConstantRatio`` with a fixed rho is the one policy not standard at one candidate
    (:attr:`ResiSpec.standard_at_one_candidate`): a mutant claiming it is gets caught on the
    one-candidate levels of chains and paths."""
    flags = {label(low): low.standard_at_one_candidate for low in RESISPEC}
    assert [name for name, flag in flags.items() if not flag] == [
        "resispec-ConstantRatio(rho=1.25)"
    ]
    lowering = lowered.ResiSpec(reference.ConstantRatio(rho=1.25))
    rng = np.random.default_rng(0)
    rounds: list[Round] = []
    for pair_seed in range(4):  # batches of one candidate per level: chains and paths
        pair = ss.pairs.Random(3, seed=pair_seed)
        for shape in (ss.Shape.chain(4), ss.Shape.paths(2, 3)):
            tree = shape.draft(pair, rng)
            for _ in range(60):  # the rules differ on narrow bands of u: many draws
                rounds.append((tree, *tables(pair, tree), ss.Noise.draw(rng, tree.num_nodes)))
    assert mismatches(lowering, rounds) == []
    monkeypatch.setattr(lowered.ResiSpec, "standard_at_one_candidate", True)
    assert mismatches(lowering, rounds) != []


def test_a_new_sub_target_does_not_inherit_the_guarantees() -> None:
    """A policy subclass with its own ``sub_target`` is neither ``bounded`` nor ``capped``
    unless it says so, so ``kept`` applies the contract's clamps to its a_k."""

    class Doubled(lowered.ConstantRatio):
        def sub_target(self, resolved, target, draft, current, proposal, index, counts):
            return 2 * super().sub_target(resolved, target, draft, current, proposal, index, counts)

    class Declared(Doubled):
        bounded = True

    assert lowered.ConstantRatio.bounded and lowered.ConstantRatio.capped
    assert not Doubled.bounded and not Doubled.capped
    assert Declared.bounded and not Declared.capped
    lowering = with_policy(Doubled(reference.ConstantRatio()))
    current = torch.tensor([[0.5, 0.25, 0.25]])
    proposal = torch.tensor([[0.2, 0.2, 0.6]])
    sub = 2 * torch.minimum(torch.minimum(current / 1.5, proposal), current)
    assert torch.equal(lowering.kept(sub, current, proposal), torch.tensor([[0.2, 0.2, 0.25]]))


def test_a_searching_policy_without_a_first_bound_is_refused_clearly() -> None:
    """A policy that says it searches but gives no ``first_bound`` fails on the CPU route with
    an error naming what is missing, not an AttributeError deep in the step."""

    class Searching(lowered.Greedy):
        searches = True

    lowering = with_policy(Searching(reference.Greedy()))
    extras, target, draft, tokens, valid, uniforms = owned_step_inputs(lowering, 0)
    with pytest.raises(NotImplementedError, match=r"Searching sets searches = True.*first_bound"):
        lowering.step(extras, target, draft, tokens, valid, uniforms)


@pytest.mark.parametrize("policy", [reference.Greedy(), reference.ConfidenceDamping()])
def test_a_policy_wrongly_capped_is_caught(policy: Any, monkeypatch) -> None:
    """Mutant: a policy whose a_k can exceed q_k declared ``capped`` (m_k taken as a_k, not
    min(a_k, q_k)); the path-wise comparison sees it."""
    lowering = lowered.ResiSpec(policy)
    monkeypatch.setattr(type(lowering.policy), "capped", True)
    assert mismatches_found(lowering, pair_seeds=4) > 0


STANDARD_AT_ONE = [low for low in RESISPEC if low.standard_at_one_candidate]


@pytest.mark.parametrize("lowering", STANDARD_AT_ONE, ids=label)
def test_a_drafted_token_of_no_draft_mass_is_rejected_as_the_reference(
    lowering: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ResiSpec's one-candidate test is u q(x) < min(p, q)(x): a token the draft gives no mass
    is rejected (the standard test, u * 0 < p(x), would accept it), on the tree walk's
    one-candidate levels (both routes) and on the chain engines (batched and host rows)."""
    p, q = np.array([0.6, 0.2, 0.2]), np.array([0.5, 0.5, 0.0])
    tree = ss.DraftTree.from_draws([(0, 2)], law="iid")
    noise = ss.Noise.checked([0.3, 0.3], [0.1, 0.1], 2)
    rounds: list[Round] = [(tree, np.stack([p, p]), np.stack([q, q]), noise)]
    expected = tuple(lowering.reference_scheme.verify(*rounds[0]))
    assert expected == (0, 0)  # rejected, then the residual's draw
    assert mismatches(lowering, rounds) == []
    for rows in (1, 64):  # the chain engine's host route, then its batched route
        target = torch.tensor(np.stack([p, p]))[None].expand(rows, -1, -1)
        out = ssg.verify_chain(
            lowering,
            torch.full((rows, 1), 2),
            target,
            torch.tensor(q)[None, None].expand(rows, 1, -1),
            ssg.Noise(
                torch.full((rows, 2), 0.3, dtype=torch.float64),
                torch.full((rows, 2), 0.1, dtype=torch.float64),
            ),
            validate=False,
        )
        assert out.node.tolist() == [0] * rows and out.token.tolist() == [0] * rows
    monkeypatch.setattr(lowered.ResiSpec, "rejecting_rows_only", lambda self, target: False)
    assert mismatches(lowering, rounds) == []


def test_constant_ratio_rho_star_of_rows_off_one_as_the_reference() -> None:
    """The reference's rho* is that of its validated rows, each divided by its sum; float64
    rows whose sums are one only to rounding give the same verdicts (the raw rows' rho*
    differs in the tenth digit and flips a test at u near one)."""
    p = np.array([0.22921564389593033, 0.7707843561040696])
    q = np.array([0.22921564389592924, 0.7707843561040708])
    assert p.sum() != 1.0
    tree = ss.DraftTree.from_draws([(0, 1), (0, 0)], law="iid")
    lowering = lowered.ResiSpec(reference.ConstantRatio())
    rounds: list[Round] = [
        (tree, np.stack([p] * 3), np.stack([q] * 3), ss.Noise.checked([0, u, 0], [0.5] * 3, 3))
        for u in (1 - 1e-9, 1 - 1e-10, 0.5)
    ]
    assert mismatches(lowering, rounds) == []


def test_a_non_positive_fixed_ratio_is_refused() -> None:
    for rho in (0, -1.0):
        with pytest.raises(ValueError, match="rho"):
            lowered.ResiSpec(reference.ConstantRatio(rho=rho))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bounded_policies_stay_within_the_running_target(dtype: torch.dtype) -> None:
    """Every policy that declares itself ``bounded`` gives 0 <= a_k <= t_k in every bit on
    non-negative rows (zeros, ties and tiny values included), so the one-pass m_k of
    :meth:`ResiSpec.stage` equals the contract's clamped three-pass one bit for bit; one that
    declares itself ``capped`` also a_k <= q_k, so that m_k is a_k without a pass."""
    generator = torch.Generator().manual_seed(0)
    rows, vocab = 64, 40

    def rows_of(power: int) -> torch.Tensor:
        values = torch.rand(rows, vocab, generator=generator, dtype=torch.float64) ** power
        values[:, ::7] = 0.0
        values[:8, :4] = 1e-300 if dtype == torch.float64 else 1e-40
        return (values / values.sum(-1, keepdim=True)).to(dtype)

    target, draft, current, proposal = (rows_of(power) for power in (2, 3, 4, 5))
    current[:8] = target[:8]
    proposal[:8] = draft[:8]
    counts = torch.randint(1, 5, (rows,), generator=generator)
    checked = capped = 0
    for lowering in RESISPEC:
        policy = lowering.policy
        assert policy.bounded or not policy.capped, label(lowering)
        if not policy.bounded:
            continue
        parameters = torch.stack(
            [
                torch.randint(0, 3, (rows,), generator=generator).to(dtype),  # kind
                1 + 3 * torch.rand(rows, generator=generator, dtype=dtype),  # rho
                torch.rand(rows, generator=generator, dtype=dtype),  # scale
                torch.rand(rows, generator=generator, dtype=dtype) / vocab,  # threshold
            ],
            -1,
        )[:, : policy.num_parameters]
        resolved = policy.at_node(target, draft, counts, 4, parameters)
        for index in range(1, 5):
            sub = policy.sub_target(resolved, target, draft, current, proposal, index, counts)
            assert bool((sub >= 0).all()) and bool((sub <= current).all()), label(lowering)
            clamped = torch.minimum(torch.minimum(sub.clamp_min(0), current), proposal)
            assert torch.equal(torch.minimum(sub, proposal), clamped)
            assert torch.equal(lowering.kept(sub, current, proposal), clamped)
            if policy.capped:  # m_k is a_k itself
                assert bool((sub <= proposal).all()), label(lowering)
                capped += 1
            checked += 1
    assert checked == 4 * sum(1 for low in RESISPEC if low.policy.bounded) > 0
    assert capped == 4 * sum(1 for low in RESISPEC if low.policy.capped) > 0


def test_policies_are_pointwise_and_read_only_the_tables_they_say() -> None:
    """What the CPU route relies on, for every lowered policy: :meth:`sub_target` at gathered
    tokens (``[B, 1]``, :func:`resolved_at`) is the gather of the whole rows' bit for bit, and
    ``None`` for a table its ``reads_target`` / ``reads_draft`` says it does not read changes
    nothing."""
    generator = torch.Generator().manual_seed(1)
    rows, vocab = 32, 24
    target, draft, current, proposal = (
        torch.rand(rows, vocab, generator=generator, dtype=torch.float64).softmax(-1)
        for _ in range(4)
    )
    counts = torch.randint(1, 4, (rows,), generator=generator)
    column = torch.randint(0, vocab, (rows, 1), generator=generator)
    parameters = torch.tensor([[lowered.DAMPING, 1.0, 0.5, 1 / vocab]] * rows, dtype=torch.float64)
    parameters[::2] = torch.tensor([lowered.RATIO, 1.5, 1.0, 0.0], dtype=torch.float64)
    for lowering in RESISPEC:
        policy = lowering.policy
        resolved = policy.at_node(target, draft, counts, 3, parameters[:, : policy.num_parameters])
        for index in (1, 2, 3):
            whole = policy.sub_target(resolved, target, draft, current, proposal, index, counts)
            at_tokens = policy.sub_target(
                lowered.resolved_at(resolved, column),
                target.gather(-1, column) if policy.reads_target else None,
                draft.gather(-1, column) if policy.reads_draft else None,
                current.gather(-1, column),
                proposal.gather(-1, column),
                index,
                counts,
            )
            assert torch.equal(at_tokens, whole.gather(-1, column)), label(lowering)


# --------------------------------------------------------------------------- fast paths
def full_bisection(target: torch.Tensor, draft: torch.Tensor, counts: torch.Tensor, k: int):
    """The reference's bisection run for its full static length (no dtype cap), in torch."""
    counts = counts.clamp_min(1)

    def feasible(rho: torch.Tensor) -> torch.Tensor:
        rejected = (draft - target / rho[:, None]).clamp_min(0).sum(-1)
        return lowered_spectr.gamma(rejected, counts, k) <= rho

    low = torch.ones(target.shape[0], dtype=target.dtype)
    high = counts.to(target.dtype)
    settled = ~(torch.minimum(target, draft).sum(-1) > 0) | feasible(low)
    for _ in range(41 + max(k - 1, 1).bit_length()):
        active = ~settled & (high - low > lowered_spectr.TOLERANCE)
        middle = (low + high) / 2
        ok = feasible(middle)
        high = torch.where(active & ok, middle, high)
        low = torch.where(active & ~ok, middle, low)
    return torch.where(settled, torch.ones_like(high), high)


def random_rows(generator: torch.Generator, dtype: torch.dtype, vocab_size: int):
    target = torch.rand(128, vocab_size, generator=generator, dtype=dtype) ** 4
    draft = torch.rand(128, vocab_size, generator=generator, dtype=dtype) ** 4
    draft[:8] = target[:8]  # p == q: rho* = 1
    target[8:12, : vocab_size // 2] = 0  # partly disjoint supports
    draft[8:12, vocab_size // 2 :] = 0
    return target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_capped_bisection_is_the_full_bisection_bit_for_bit(dtype: torch.dtype) -> None:
    """``bisection_steps`` stops float32 once the bracket is two adjacent floats: the same rho*
    as running the reference's full step count, for every k (and 1 without any pass)."""
    generator = torch.Generator().manual_seed(3)
    for vocab_size in (3, 40, 700):
        target, draft = random_rows(generator, dtype, vocab_size)
        for k in (1, 2, 3, 4, 6, 9):
            counts = torch.randint(0, k + 1, (128,), generator=generator)
            got = lowered_spectr.bisection_rho(target, draft, counts, k)
            assert torch.equal(got, full_bisection(target, draft, counts, k)), (vocab_size, k)
            if dtype == torch.float64:  # every route: the reference's bisection bit for bit
                assert torch.equal(lowered_spectr.optimal_rho(target, draft, counts, k), got)


def test_a_bisection_cut_too_short_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: eleven bits fewer than float32 holds; the comparison above must see it."""
    monkeypatch.setattr(lowered_spectr, "mantissa_bits", lambda dtype: 12)
    generator = torch.Generator().manual_seed(3)
    target, draft = random_rows(generator, torch.float32, 40)
    counts = torch.full((128,), 3)
    got = lowered_spectr.bisection_rho(target, draft, counts, 3)
    assert not torch.equal(got, full_bisection(target, draft, counts, 3))


def float32_feasible(target, draft, counts, k, rho) -> torch.Tensor:
    """The lowering's own float32 test, ``gamma(rejection(rho)) <= rho``, per row."""
    counts = counts.clamp_min(1)
    return lowered_spectr.gamma(lowered_spectr.rejection(target, draft, rho), counts, k) <= rho


def correlated_rows(generator: torch.Generator, rows: int, vocab_size: int, scale: float = 3.0):
    """float32 rows of a correlated pair (target logits ``scale`` N(0, 1), the draft's the same
    plus N(0, 1)) and their float64 originals."""
    logits = scale * torch.randn(rows, vocab_size, generator=generator, dtype=torch.float64)
    noise = torch.randn(rows, vocab_size, generator=generator, dtype=torch.float64)
    target64, draft64 = logits.softmax(-1), (logits + noise).softmax(-1)
    return target64.float(), draft64.float(), target64.float().double(), draft64.float().double()


def test_newton_rho_is_the_cpu_float32_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """``optimal_rho`` takes the Newton search on CPU float32 tables and nowhere else: not in
    float64 (the reference's bisection bit for bit), not where host reads are not free."""
    calls: list[int] = []
    original = lowered_spectr.newton_rho

    def counted(*args: Any) -> torch.Tensor:
        calls.append(args[0].shape[0])
        return original(*args)

    monkeypatch.setattr(lowered_spectr, "newton_rho", counted)
    generator = torch.Generator().manual_seed(11)
    target, draft, target64, draft64 = correlated_rows(generator, 16, 300)
    counts = torch.full((16,), 3)
    lowered_spectr.optimal_rho(target, draft, counts, 3)
    assert calls == [16]
    lowered_spectr.optimal_rho(target64, draft64, counts, 3)
    lowered_spectr.optimal_rho(target, draft, torch.ones(16, dtype=torch.long), 1)  # no pass
    monkeypatch.setattr(ssg.ops, "host_reads_free", lambda tensor: False)
    bisected = lowered_spectr.optimal_rho(target, draft, counts, 3)
    assert calls == [16]
    assert torch.equal(bisected, lowered_spectr.bisection_rho(target, draft, counts, 3))


def test_newton_rho_is_feasible_and_optimal_to_float32_rounding() -> None:
    """Every row's rho passes the same float32 test the bisection uses (so the residual keeps
    its sign), lies in ``[1, k]``, is 1 exactly where the bisection settles at 1, and on
    correlated pairs is the float64 rho* to within ``2^-17`` relative (measured: ``2^-22`` to
    ``2^-18.3``, the float32 bisection's own distance ``2^-23.5`` to ``2^-18.3``: float32 sums
    of up to ``k`` powers)."""
    generator = torch.Generator().manual_seed(12)
    for vocab_size in (3, 40, 700):
        target, draft = random_rows(generator, torch.float32, vocab_size)
        for k in (1, 2, 3, 4, 6, 9):
            counts = torch.randint(0, k + 1, (128,), generator=generator)
            got = lowered_spectr.optimal_rho(target, draft, counts, k)
            bisected = lowered_spectr.bisection_rho(target, draft, counts, k)
            assert torch.equal(got == 1, bisected == 1), (vocab_size, k)
            tops = counts.clamp_min(1).float()
            assert bool(((got >= 1) & (got <= tops)).all())
            ok = float32_feasible(target, draft, counts, k, got) | (got == tops) | (got == 1)
            assert bool(ok.all()), (vocab_size, k)
    for vocab_size, k, scale in ((5000, 2, 3.0), (5000, 4, 3.0), (5000, 8, 3.0), (2000, 4, 0.3)):
        target, draft, target64, draft64 = correlated_rows(generator, 64, vocab_size, scale)
        counts = torch.full((64,), k)
        got = lowered_spectr.optimal_rho(target, draft, counts, k).double()
        exact = lowered_spectr.optimal_rho(target64, draft64, counts, k)
        assert bool(((got - exact).abs() <= 2.0**-17 * exact).all()), (vocab_size, k)
        assert bool((got > 1).all())  # the case has teeth: every row searches


def reference_residual(target, draft, rho, counts, k, dtype=torch.float64) -> torch.Tensor:
    """``norm((p - gamma min(p / rho, q))_+)`` (``p`` without mass), in ``dtype`` arithmetic."""
    target, draft, rho = target.to(dtype), draft.to(dtype), rho.to(dtype)
    capped = torch.minimum(target / rho[:, None], draft)
    rejected = (draft - target / rho[:, None]).clamp_min(0).sum(-1)
    scale = lowered_spectr.gamma(rejected, counts.clamp_min(1), k)
    scale = torch.where(capped.sum(-1) > 0, scale, 0.0)
    weights = (target - scale[:, None] * capped).clamp_min(0)
    mass = weights.sum(-1, keepdim=True)
    return torch.where(mass > 0, weights / torch.where(mass > 0, mass, 1.0), target)


@pytest.mark.parametrize("rho_kind", ["optimal", "one", "k"])
def test_float32_residual_is_the_reference_formula_to_rounding(rho_kind: str) -> None:
    """The float32 residual, ``max(p ((rho - gamma) / rho)_+, p - gamma q)``, is the reference's
    ``(p - gamma min(p / rho, q))_+`` normalised, on every kind of row (``p == q``, partly
    disjoint supports) and for a feasible rho, rho = 1 (infeasible where the supports overlap:
    the clip of ``(rho - gamma) / rho`` matters there) and rho = k; never negative. Its distance to
    the formula in float64 is at most twice (plus ``10^-6``) that of the formula evaluated in
    float32 (rows where ``gamma min(p / rho, q)`` nearly cancels ``p`` lose digits either way),
    plus twice the distance float32's rounding of gamma alone causes (:func:`gamma_rounding`:
    at a rho within float32 rounding of rho*, the weights' mass is tiny and divides it)."""
    generator = torch.Generator().manual_seed(14)
    tight = 0  # rows where float32's rounding of gamma moves the residual by under 10^-5
    for vocab_size in (3, 40, 700):
        target, draft = random_rows(generator, torch.float32, vocab_size)
        for k in (1, 2, 4, 9):
            counts = torch.randint(0, k + 1, (128,), generator=generator)
            rho = {
                "optimal": lowered_spectr.optimal_rho(target, draft, counts, k),
                "one": torch.ones(128),
                "k": counts.clamp_min(1).float(),
            }[rho_kind]
            got = lowered_spectr.residual(target, draft, rho, counts, k)
            assert got.dtype == torch.float32 and bool((got >= 0).all())
            expected = reference_residual(target, draft, rho, counts, k)
            rounded = reference_residual(target, draft, rho, counts, k, torch.float32).double()
            error = (got.double() - expected).abs().amax(-1)  # [128]
            bound = 2 * (rounded - expected).abs().amax(-1) + 1e-6
            rounding = gamma_rounding(target, draft, rho, counts, k)  # [128]
            assert bool((error <= bound + 2 * rounding).all())
            tight += int((rounding < 1e-5).sum())
    assert tight >= 0.9 * 3 * 4 * 128  # the widening is for the few ill-conditioned rows


def gamma_rounding(target, draft, rho, counts, k) -> torch.Tensor:
    """How far float32's rounding of gamma alone moves the normalised residual, per row:
    ``|gamma_32 - gamma_64|`` (the weights move by at most that times ``sum min(p / rho, q)
    <= 1``) over the float64 weights' mass (0 where that mass is 0: the fallback ``p``)."""
    scales = []
    for dtype in (torch.float32, torch.float64):
        rejected = (draft.to(dtype) - target.to(dtype) / rho.to(dtype)[:, None]).clamp_min(0)
        scales.append(lowered_spectr.gamma(rejected.sum(-1), counts.clamp_min(1), k).double())
    target64, draft64, rho64 = target.double(), draft.double(), rho.double()
    capped = torch.minimum(target64 / rho64[:, None], draft64)
    scale = torch.where(capped.sum(-1) > 0, scales[1], 0.0)
    mass = (target64 - scale[:, None] * capped).clamp_min(0).sum(-1)  # [B]
    gap = (scales[0] - scales[1]).abs()
    return torch.where(mass > 0, gap / torch.where(mass > 0, mass, 1.0), 0.0)


def test_float32_residual_without_the_clip_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: ``p (1 - gamma / rho)`` unclipped goes negative where rho is infeasible."""
    generator = torch.Generator().manual_seed(14)
    target, draft = random_rows(generator, torch.float32, 40)
    counts = torch.full((128,), 4)
    original = torch.Tensor.clamp_min

    def no_clip(self: torch.Tensor, value: Any) -> torch.Tensor:
        return self if self.dim() == 1 else original(self, value)

    monkeypatch.setattr(torch.Tensor, "clamp_min", no_clip)
    got = lowered_spectr.residual(target, draft, torch.ones(128), counts, 4)
    assert not bool((got >= 0).all())


def test_newton_rho_stopped_early_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants: a bracket of ``2^-8`` misses the optimum; returning the infeasible end of the
    bracket instead of the feasible one breaks the sign of the residual; a tangent "bound"
    ``2^-12`` above the tangent model's root stops the search above the optimum."""
    generator = torch.Generator().manual_seed(13)
    target, draft, target64, draft64 = correlated_rows(generator, 64, 3000)
    counts = torch.full((64,), 4)
    exact = lowered_spectr.optimal_rho(target64, draft64, counts, 4)
    monkeypatch.setattr(lowered_spectr, "NEWTON_WIDTH", 2.0**-8)
    coarse = lowered_spectr.optimal_rho(target, draft, counts, 4).double()
    assert not bool(((coarse - exact).abs() <= 2.0**-17 * exact).all())
    monkeypatch.undo()
    finished = lambda self: np.ones_like(self.low, dtype=bool)  # noqa: E731
    monkeypatch.setattr(lowered_spectr._NewtonState, "done", finished)
    unsearched = lowered_spectr.optimal_rho(target, draft, counts, 4)
    assert not bool(((unsearched.double() - exact).abs() <= 2.0**-17 * exact).all())
    monkeypatch.undo()
    original = lowered_spectr._NewtonState.update

    def keep_low(self: Any, *args: Any) -> None:
        original(self, *args)
        self.high = np.where(self.low > 1, self.low, self.high)  # the infeasible end

    monkeypatch.setattr(lowered_spectr._NewtonState, "update", keep_low)
    low = lowered_spectr.optimal_rho(target, draft, counts, 4)
    assert not bool(float32_feasible(target, draft, counts, 4, low).all())
    monkeypatch.undo()
    bound = lowered_spectr.tangent_bound
    above = lambda *args: bound(*args) * (1 + 2.0**-12)  # noqa: E731 - not a lower bound
    monkeypatch.setattr(lowered_spectr, "tangent_bound", above)
    high = lowered_spectr.optimal_rho(target, draft, counts, 4).double()
    assert not bool(((high - exact).abs() <= 2.0**-17 * exact).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_rejection_rounds_as_the_reference_formula(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(4)
    target, draft = random_rows(generator, dtype, 500)
    rho = 1 + 3 * torch.rand(128, generator=generator, dtype=dtype)
    terms = (draft - target / rho[:, None]).clamp_min(0)
    fused = torch.addcdiv(draft, target, rho[:, None], value=-1).clamp_min_(0)
    assert torch.equal(fused, terms)
    # summed in numpy's order in float64 (the reference's ``total``), by torch below it
    expected = torch.from_numpy(terms.numpy().sum(-1)) if dtype == torch.float64 else terms.sum(-1)
    assert torch.equal(lowered_spectr.rejection(target, draft, rho), expected)


def test_optimised_plans_nodes_side_by_side_as_one_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`plan_nodes` on several threads returns the one loop's rules in the same order
    (nodes of a real-size pair), and the threaded planning keeps the walk path-wise equal."""
    pair = ss.pairs.Random(1500, seed=3)  # above MEMO_VOCAB: every call plans afresh
    rng = np.random.default_rng(3)
    rows = [ss.Shape.branching((3, 2), replacement=True).draft(pair, rng) for _ in range(2)]
    jobs = [
        (*tables(pair, tree), node)
        for tree in rows
        for node in range(tree.num_nodes)
        if len(tree.candidates[node]) >= 2
    ]
    jobs = [(target[node], draft[node], 2 + index % 3) for index, (target, draft, node) in
            enumerate(jobs)]  # fmt: skip
    at_node = reference.Optimised().at_node
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = lowered.plan_nodes(at_node, jobs)
        torch.set_num_threads(2)
        calls: list[int] = []
        pooled = lowered.ThreadPoolExecutor

        class Counted(pooled):  # type: ignore[misc, valid-type]
            def __init__(self, workers: int) -> None:
                calls.append(workers)
                super().__init__(workers)

        monkeypatch.setattr(lowered, "ThreadPoolExecutor", Counted)
        side_by_side = lowered.plan_nodes(at_node, jobs)
        assert calls == [2] and len(jobs) >= 4
        assert side_by_side == alone
        monkeypatch.setattr(lowered, "PLAN_THREADS_FROM", 0)  # every planned node, pooled
        lowering = lowered.ResiSpec()
        rounds = mixed_rounds(lowering, ss.pairs.Random(3, seed=5), 5)
        assert mismatches(lowering, rounds) == []
        assert len(calls) > 1
    finally:
        torch.set_num_threads(threads)


def test_optimised_plans_only_nodes_with_two_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """One candidate slot: no reference call (no host step); otherwise one call per node with
    two or more candidates, with that node's rows, and greedy elsewhere."""
    policy = lowered.ResiSpec().policy
    calls: list[int] = []
    original = policy.reference.at_node

    def spy(target: Any, draft: Any, count: int) -> Any:
        calls.append(count)
        return original(target, draft, count)

    monkeypatch.setattr(type(policy.reference), "at_node", lambda self, t, d, k: spy(t, d, k))
    pair = ss.pairs.Random(5, seed=2)
    rng = np.random.default_rng(2)
    chains = [ss.Shape.chain(3).draft(pair, rng) for _ in range(3)]
    batch = ssg.TreeBatch.from_trees(chains)
    tabs = ssg.tables_batch(*zip(*(tables(pair, tree) for tree in chains), strict=True))
    params = policy.node_parameters(batch, *tabs)
    assert calls == [] and (params == torch.tensor(lowered.UNPLANNED, dtype=params.dtype)).all()
    trees = [ss.Shape.branching((3, 2), replacement=True).draft(pair, rng) for _ in range(3)]
    trees += chains
    batch = ssg.TreeBatch.from_trees(trees)
    target, draft = ssg.tables_batch(*zip(*(tables(pair, tree) for tree in trees), strict=True))
    params = policy.node_parameters(batch, target, draft)
    expected = [
        (row, node, len(tree.candidates[node]))
        for row, tree in enumerate(trees)
        for node in range(tree.num_nodes)
        if len(tree.candidates[node]) >= 2
    ]
    assert sorted(calls) == sorted(count for _, _, count in expected) and expected
    for row, tree in enumerate(trees):
        for node in range(tree.num_nodes):
            count = len(tree.candidates[node])
            if count >= 2:
                rule = original(target[row, node].numpy(), draft[row, node].numpy(), count)
                want = lowered.encode(rule)
            else:
                want = lowered.UNPLANNED
            assert params[row, node].tolist() == list(want), (row, node)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_candidate_chains_verify_as_standard(dtype: torch.dtype) -> None:
    """On chains SpecTr (rho* = 1) and ResiSpec under its default policy reduce to the standard
    rule bit for bit: the ground for running them on the standard chain engine."""
    pair = ss.pairs.Random(6, seed=5)
    rng = np.random.default_rng(5)
    trees = [ss.Shape.chain(4).draft(pair, rng) for _ in range(64)]
    batch = ssg.TreeBatch.from_trees(trees)
    target, draft = ssg.tables_batch(
        *zip(*(tables(pair, tree) for tree in trees), strict=True), dtype=dtype
    )
    noise = ssg.Noise.from_reference([ss.Noise.draw(rng, tree.num_nodes) for tree in trees])
    standard = ssg.verify("standard", batch, target, draft, noise)
    for name in ("spectr", "resispec"):
        out = ssg.verify(name, batch, target, draft, noise)
        assert torch.equal(out.node, standard.node) and torch.equal(out.token, standard.token)


def test_gamma_equals_the_reference_horner_loop_bit_for_bit() -> None:
    """The lowered gamma (the loop run to the largest k, each row's value taken after its own
    k - 1 steps) against the reference's Horner loop row by row, float64, k = 0..12."""
    from specsampling.schemes.spectr import _gamma

    rng = np.random.default_rng(0)
    rejected = rng.random(400)
    rejected[:4] = [0.0, 1.0, LARGEST_BELOW_ONE, 2**-40]
    counts = rng.integers(0, 13, 400)
    got = lowered_spectr.gamma(torch.tensor(rejected), torch.tensor(counts), 12).tolist()
    for value, r, k in zip(got, rejected, counts, strict=True):
        assert value == _gamma(float(r), max(int(k), 1)), (r, k)


def test_float64_normalisers_add_in_numpy_order() -> None:
    """SpecTr's rejection mass and residual normaliser, and a ``without`` step's renormaliser
    (coupled lowerings), sum in numpy's pairwise order in float64, as the references' ``total``
    and ``.sum()``: bit for bit at a vocabulary where ``torch.sum`` misses it."""
    from specsampling.gpu.schemes.coupled import without_proposal

    rng = np.random.default_rng(6)
    weights = rng.random((4, 40_000)) ** 6
    target = rng.random((4, 40_000))
    differs = torch.from_numpy(weights).sum(-1).numpy() != weights.sum(-1)  # [4]
    assert differs.any()  # the case has teeth: torch's batched sum misses numpy's on a row
    rows = torch.from_numpy(weights)
    out = ssg.ops.normalise_in_place(rows.clone(), torch.from_numpy(target))
    assert torch.equal(out, torch.from_numpy(weights / weights.sum(-1, keepdims=True)))
    taken = torch.zeros_like(rows, dtype=torch.bool)
    taken[:, 3] = True
    proposal, drawable = without_proposal(rows, taken)
    remaining = weights.copy()
    remaining[:, 3] = 0
    assert bool(drawable.all())
    assert torch.equal(proposal, torch.from_numpy(remaining / remaining.sum(-1, keepdims=True)))
    rho = torch.full((4,), 1.5, dtype=torch.float64)
    expected = np.maximum(weights - target / 1.5, 0).sum(-1)
    assert torch.equal(
        lowered_spectr.rejection(torch.from_numpy(target), rows, rho), torch.from_numpy(expected)
    )


@pytest.mark.parametrize("validate", [True, False])
def test_optimised_plans_float64_rows_verify_let_through(validate: bool) -> None:
    """Float64 rows whose mass is off 1 by more than the reference's own tolerance, which
    ``verify`` accepts at a larger ``tolerance`` (or unchecked), are planned on their
    renormalised values instead of being refused by the reference optimiser; rows within it
    go to the optimiser as they are (the path-wise tests)."""
    tree = ss.DraftTree.from_draws([(0, 0), (0, 1)], law="iid")  # two i.i.d. candidates
    target = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64).expand(1, 3, 3).contiguous()
    draft = torch.tensor([0.6, 0.2, 0.2015], dtype=torch.float64).expand(1, 3, 3).contiguous()
    batch = ssg.TreeBatch.from_trees([tree])
    for u in (0.05, 0.5, 0.9):
        noise = ssg.Noise.from_reference([ss.Noise.constant(u, 3)])
        out = ssg.verify("resispec", batch, target, draft, noise, validate=validate, tolerance=1e-2)
        fixed = draft / draft.sum(-1, keepdim=True)  # the same draft, renormalised
        want = ssg.verify("resispec", batch, target, fixed, noise, validate=validate)
        assert torch.equal(out.token, want.token) and 0 <= int(out.token[0]) < 3, u
    rows = np.array([[0.5, 0.5], [0.6, 0.4001], [0.7, 0.3000001]])  # off by 0, 1e-4, 1e-7
    kept = lowered._renormalised(rows, everywhere=False)
    assert np.array_equal(kept[[0, 2]], rows[[0, 2]]) and abs(kept[1].sum() - 1) < 1e-15
