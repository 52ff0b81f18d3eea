"""Grafted trees (law ``grafted``): drawn candidates plus one guess per node from the context.

A guess (prompt lookup's continuation) is drawn by a point mass, so ``specinfer`` tests it as
one, after the node's i.i.d. candidates. The claims, each checked exactly in Fractions:

* a round of any i.i.d. shape with a context-dependent guess grafted in, verified by
  ``specinfer`` or ``nss``, followed by target samples has exactly the target's law;
* a guess tested as a draw from ``q`` (the tree labelled ``iid``), or not removed from the
  running target after its rejection, is biased (mutants);
* testing the guess last accepts ``p(d) + sum_{x != d} min(p(x), q(x))`` at a node with one
  drawn candidate, at least the guess-first order's ``p(d) + sum min(p, (1 - p(d)) q)``;
* every other tree verifier refuses the law.
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from specsampling.exact import target_joint
from specsampling.pairs import Random
from specsampling.schemes import TreeVerifier, tables
from specsampling.schemes import specinfer as specinfer_module
from specsampling.tree import DraftTree, DrawLaw

Shape = ss.Shape
SHAPES = [Shape.chain(2), Shape.star(2), Shape.branching((2, 1), replacement=True), Shape.chain(1)]


def guess(prefix, vocab_size, length=3):
    """A deterministic guess from the context alone (a stand-in for prompt lookup): it often
    shares a first token with the drawn candidates and often leaves them."""
    last = prefix[-1] if prefix else 0
    return [(last + 1 + i * (len(prefix) % 2)) % vocab_size for i in range(length)]


def grafted_round(scheme, pair, shape, prefix, relabel=None, length=3):
    """Exact law of one round's emitted tokens: every tree of ``shape`` with
    :func:`guess` grafted in (``relabel``: a mutant that states another law)."""
    law = {}
    for tree, weight in shape.enumerate(pair, prefix):
        tree = tree.graft(guess(prefix, pair.vocab_size, length))
        if relabel is not None:
            tree = DraftTree(tree.parents, tree.tokens, tree.candidates, relabel)
        for verdict, prob in scheme.verdict_law(tree, *tables(pair, tree, prefix)).items():
            emitted = (*tree.prefix(verdict.node), verdict.token)
            law[emitted] = law.get(emitted, 0) + weight * prob
    return law


def grafted_error(scheme, pair, shape, prefix=(), relabel=None, length=3):
    """Max deviation of one grafted round then target samples from the target's joint law."""
    span = max(shape.depth, length) + 1
    law = {}
    for emitted, prob in grafted_round(scheme, pair, shape, prefix, relabel, length).items():
        tails = (
            {(): 1}
            if len(emitted) >= span
            else target_joint(pair, span - len(emitted), prefix + emitted)
        )
        for tail, tail_prob in tails.items():
            key = (emitted + tail)[:span]
            law[key] = law.get(key, 0) + prob * tail_prob
    target = target_joint(pair, span, prefix)
    return max(abs(law.get(s, 0) - target.get(s, 0)) for s in {*law, *target})


def pairs():
    return [Random(vocab_size=3, seed=seed, exact=True) for seed in (0, 1, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=repr)
@pytest.mark.parametrize("name", ["specinfer", "nss"])
def test_grafted_rounds_are_exact(name, shape):
    grafted = 0
    for pair in pairs():
        for prefix in [(), (1,)]:
            assert grafted_error(ss.SCHEMES[name], pair, shape, prefix) == 0
            grafted += any(
                tree.graft(guess(prefix, 3)).law is DrawLaw.GRAFTED
                for tree, _ in shape.enumerate(pair, prefix)
            )
    assert grafted  # the guesses did leave the drawn trees


def test_float64_grafted_rounds_are_exact_to_rounding():
    pair = Random(vocab_size=4, seed=3)
    assert grafted_error(ss.SCHEMES["specinfer"], pair, SHAPES[2]) < 1e-12


@pytest.mark.parametrize("shape", SHAPES[:3], ids=repr)
def test_a_guess_tested_as_a_draw_from_q_is_biased(shape):
    errors = [
        grafted_error(ss.SCHEMES["specinfer"], pair, shape, relabel=DrawLaw.IID) for pair in pairs()
    ]
    assert max(errors) > F(1, 100)


def test_a_guess_left_in_the_running_target_is_biased(monkeypatch):
    monkeypatch.setattr(specinfer_module, "remove_token", lambda probs, token: probs)
    errors = [grafted_error(ss.SCHEMES["specinfer"], pair, Shape.chain(2)) for pair in pairs()]
    assert max(errors) > F(1, 100)


def test_the_guess_last_accepts_the_stated_probability():
    """At the root of ``chain(1)`` with guess ``d``: some candidate is accepted with probability
    ``p(d) + sum_{x != d} min(p(x), q(x))`` (averaged over the drawn candidate), which is at
    least what testing the guess first would accept."""
    scheme = ss.SCHEMES["specinfer"]
    for pair in pairs():
        p, q = pair.target(()), pair.draft(())
        for d in range(3):
            accepted = F(0)
            for tree, weight in Shape.chain(1).enumerate(pair):
                tree = tree.graft([d])
                descend, _ = scheme.node_law(tree, 0, *tables(pair, tree))
                accepted += weight * sum(prob for _, prob in descend)
            others = [x for x in range(3) if x != d]
            assert accepted == p[d] + sum(min(p[x], q[x]) for x in others)
            assert accepted >= p[d] + sum(min(p[x], (1 - p[d]) * q[x]) for x in others)


def test_every_other_tree_verifier_refuses_grafted_trees():
    tree = DraftTree.chain([0, 1], law="iid").graft([2])
    pair = pairs()[0]
    exact = set()
    for name, scheme in ss.SCHEMES.items():
        if not isinstance(scheme, TreeVerifier):
            continue
        if scheme.exact_for(DrawLaw.GRAFTED, False):
            exact.add(name)
            continue
        with pytest.raises(ss.UnsupportedShape, match="law 'grafted'"):
            scheme.verdict_law(tree, *tables(pair, tree))
    assert exact == {"specinfer", "nss"}


def test_sampled_verify_follows_its_law():
    """``verify`` with explicit noise lands on each verdict as often as ``verdict_law`` says."""
    pair = Random(vocab_size=3, seed=1)
    tree = DraftTree.from_draws([(0, 1), (0, 1), (1, 2)], law="iid").graft([0, 2])
    scheme = ss.SCHEMES["specinfer"]
    target, draft = tables(pair, tree)
    law = scheme.verdict_law(tree, target, draft)
    rng = np.random.default_rng(0)
    counts: dict = {}
    draws = 20_000
    for _ in range(draws):
        verdict = scheme.verify(tree, target, draft, ss.Noise.draw(rng, tree.num_nodes))
        counts[verdict] = counts.get(verdict, 0) + 1
    assert set(counts) <= set(law)
    for verdict, prob in law.items():
        assert abs(counts.get(verdict, 0) / draws - prob) < 4 * np.sqrt(prob / draws) + 1e-3


# ----------------------------------------------------------------------------- the tree
def test_graft_follows_drawn_children_then_hangs_the_rest():
    tree = DraftTree.from_draws([(0, 5), (0, 6), (1, 7)], law="iid")
    grown = tree.graft([5, 8, 9])
    assert grown.tokens == (-1, 5, 6, 7, 8, 9)
    assert grown.candidates[1] == (3, 4) and grown.guesses == (-1, 4, -1, -1, 5, -1)
    assert grown.guess(1) == 4 and grown.guess(4) == 5 and grown.guess(0) is None
    assert tree.graft([5, 7]) is tree and tree.graft([]) is tree  # nothing new
    below_a_leaf = DraftTree.chain([5], law="iid").graft([5, 3])
    assert below_a_leaf.is_chain and below_a_leaf.law is DrawLaw.GRAFTED


def test_graft_of_trees_not_drawn_iid_is_unknown():
    without = DraftTree.from_draws([(0, 1), (0, 2)], law="without")
    assert without.graft([3]).law is DrawLaw.UNKNOWN and without.graft([3]).guesses == ()
    sampled_chain = DraftTree.chain([1], law="without")
    assert sampled_chain.graft([3]).law is DrawLaw.GRAFTED
    assert DraftTree.chain([1], law="deterministic").graft([3]).law is DrawLaw.UNKNOWN


def test_guesses_are_checked():
    tree = DraftTree.chain([4], law="iid").graft([6])
    with pytest.raises(ValueError, match="already grafted"):
        tree.graft([1])
    with pytest.raises(ValueError, match="guesses are for law 'grafted'"):
        DraftTree(tree.parents, tree.tokens, tree.candidates, "iid", tree.guesses)
    with pytest.raises(ValueError, match="one guess per node"):
        DraftTree(tree.parents, tree.tokens, tree.candidates, "grafted", (2,))
    with pytest.raises(ValueError, match="must be its last candidate"):
        DraftTree(tree.parents, tree.tokens, ((2, 1), (), ()), "grafted", tree.guesses)
    with pytest.raises(ValueError, match="integer ids"):
        DraftTree(tree.parents, tree.tokens, tree.candidates, "grafted", (2.0, -1, -1))
    with pytest.raises(ValueError, match="child node ids or -1"):  # -5 is not "none"
        DraftTree(tree.parents, tree.tokens, tree.candidates, "grafted", (-5, -1, -1))
    with pytest.raises(TypeError, match="chain: expected a sequence"):
        DraftTree.chain([4], law="iid").graft(5)
    with pytest.raises(ValueError, match="integer ids"):
        DraftTree.chain([4], law="iid").graft([1.5])
    assert tree.with_law("iid").guesses == () and tree.with_law("grafted") == tree


# ----------------------------------------------------------------------------- the engine
def test_the_exact_engine_grafts_as_this_file_does():
    """``ss.lossless_error(..., graft=)`` and ``ss.round_law(..., graft=)`` agree with this
    file's own enumeration, and refuse what they cannot graft."""
    pair = pairs()[1]
    shape = Shape.chain(2)

    def lookup(prefix):
        return guess(prefix, 3)

    law = ss.round_law("specinfer", pair, shape, graft=lookup)
    assert law == grafted_round(ss.SCHEMES["specinfer"], pair, shape, ())
    assert ss.lossless_error("specinfer", pair, shape, graft=lookup) == 0
    biased = MislabelledSpecInfer()
    errors = [ss.lossless_error(biased, p, shape, graft=lookup) for p in pairs()]
    assert max(errors) > F(1, 100)
    with pytest.raises(ValueError, match="graft: 'gumbel' drafts by its own keyed race"):
        ss.round_law("gumbel", pair, shape, graft=lookup)
    with pytest.raises(TypeError, match="graft: expected a function"):
        ss.round_law("specinfer", pair, shape, graft=[1, 2])
    with pytest.raises(ss.InvalidDistribution, match=r"graft\(prefix\)\[0\]: id 7"):
        ss.round_law("specinfer", pair, shape, graft=lambda prefix: [7])


class MislabelledSpecInfer(type(ss.SCHEMES["specinfer"])):  # type: ignore[misc]
    """Reads every guess as a draw from ``q``: the mutant certification must catch."""

    name = "specinfer_guess_as_draw"

    def node_verify(self, tree, node, target_probs, draft_probs, noise):
        return super().node_verify(tree.with_law("iid"), node, target_probs, draft_probs, noise)

    def node_law(self, tree, node, target_probs, draft_probs):
        return super().node_law(tree.with_law("iid"), node, target_probs, draft_probs)


def test_certify_runs_the_grafted_cases_and_catches_the_mutant():
    from specsampling.certify import certify

    good, bad = certify([ss.SCHEMES["specinfer"], MislabelledSpecInfer()]).schemes
    assert good.certified and good.grafted_cases > 0
    assert not bad.certified
    assert {v.kind for v in bad.violations} <= {"exact error", "float error"}
    assert all(v.shape.endswith("grafted") for v in bad.violations)


def test_certify_checks_that_other_tree_verifiers_refuse_grafted_trees():
    from specsampling.certify import _check_grafted_refusal

    assert _check_grafted_refusal(ss.SCHEMES["spectr"]) == []

    class Silent(type(ss.SCHEMES["spectr"])):  # type: ignore[misc]
        def check_tree(self, tree):  # the law check removed
            return None

    found = _check_grafted_refusal(Silent())
    assert [v.kind for v in found] == ["refusal", "refusal"]
