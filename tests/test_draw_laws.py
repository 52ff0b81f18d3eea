"""The round contract at its edges: trees carry their draw law and verifiers refuse the others.

Calling ``verify``/``verdict_law`` directly on trees (what an inference engine does) must be as
exact as ``round_law``, or refuse: for every registered tree verifier and every draw law of the
catalogue, the verdict laws summed over ``Shape.enumerate`` equal ``round_law``, or raise
``UnsupportedShape``.
"""

from __future__ import annotations

import re
from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from proofs_tests.catalogue import LAW_SHAPES
from specsampling.pairs import Random, Stationary
from specsampling.schemes import KeyedCoupling, TreeVerifier, tables
from specsampling.tree import SAMPLED_LAWS, DrawLaw

TREE_VERIFIERS = sorted(n for n, s in ss.SCHEMES.items() if isinstance(s, TreeVerifier))
THE_ISSUE_PAIR = Stationary([F(1, 2), F(1, 3), F(1, 6)], [F(1, 6), F(1, 3), F(1, 2)])


def _direct_round_law(scheme, pair, shape):
    """``sum_T P(T) verdict_law(T)``, each tree verified directly, as an engine would."""
    law: dict[tuple[int, ...], object] = {}
    for tree, weight in shape.enumerate(pair):
        for verdict, prob in scheme.verdict_law(tree, *tables(pair, tree)).items():
            emitted = (*tree.prefix(verdict.node), verdict.token)
            law[emitted] = law.get(emitted, 0) + weight * prob
    return law


def test_every_law_of_the_catalogue_is_covered():
    # grafted trees come from DraftTree.graft, not a shape: tests/test_grafted.py
    assert {shape.law for shape in LAW_SHAPES} == set(DrawLaw) - {DrawLaw.UNKNOWN, DrawLaw.GRAFTED}


@pytest.mark.parametrize("shape", LAW_SHAPES, ids=repr)
@pytest.mark.parametrize("name", TREE_VERIFIERS)
def test_direct_verdict_laws_equal_round_law_or_raise(name, shape):
    scheme = ss.SCHEMES[name]
    for pair in (THE_ISSUE_PAIR, Random(3, seed=5, exact=True)):
        if scheme.supports(shape):
            assert _direct_round_law(scheme, pair, shape) == ss.round_law(scheme, pair, shape)
            continue
        with pytest.raises(ss.UnsupportedShape):
            ss.round_law(scheme, pair, shape)
        with pytest.raises(ss.UnsupportedShape, match=f"law '{shape.law.value}'"):
            _direct_round_law(scheme, pair, shape)


def test_resispec_on_trees_without_replacement_the_reported_case():
    """The reported case: direct verdict laws of ``star(2, replacement=False)`` trees gave a
    first-token law of 55987/115920 instead of 1/2."""
    scheme = ss.SCHEMES["resispec"]
    law = _direct_round_law(scheme, THE_ISSUE_PAIR, ss.Shape.star(2, replacement=False))
    first = sum((prob for emitted, prob in law.items() if emitted[0] == 0), F(0))
    assert first == F(1, 2)
    # The wrong answer came from i.i.d. proposals applied to a without-replacement tree.
    mislabelled = F(0)
    for tree, weight in ss.Shape.star(2, replacement=False).enumerate(THE_ISSUE_PAIR):
        iid = tree.with_law("iid")
        for verdict, prob in scheme.verdict_law(iid, *tables(THE_ISSUE_PAIR, iid)).items():
            if (*iid.prefix(verdict.node), verdict.token)[0] == 0:
                mislabelled += weight * prob
    assert mislabelled == F(55987, 115920)


@pytest.mark.parametrize("name", TREE_VERIFIERS)
def test_hand_built_trees_of_unknown_law(name):
    """Only schemes exact for any tree (nss) verify a tree whose author did not state its law."""
    scheme = ss.SCHEMES[name]
    pair = Stationary([0.5, 0.3, 0.2], [0.2, 0.3, 0.5])
    for tree in (ss.DraftTree.chain([1, 0]), ss.DraftTree.from_draws([(0, 1), (0, 2)])):
        target, draft = tables(pair, tree)
        noise = ss.Noise.draw(np.random.default_rng(0), tree.num_nodes)
        if DrawLaw.UNKNOWN in scheme.laws:
            assert scheme.verify(tree, target, draft, noise) in scheme.verdict_law(
                tree, target, draft
            )
            continue
        for call in (
            lambda: scheme.verify(tree, target, draft, noise),  # noqa: B023
            lambda: scheme.verdict_law(tree, target, draft),  # noqa: B023
        ):
            with pytest.raises(ss.UnsupportedShape, match=re.escape("DraftTree(..., law=...)")):
                call()
    assert [n for n in TREE_VERIFIERS if DrawLaw.UNKNOWN in ss.SCHEMES[n].laws] == ["nss"]


def test_stated_laws_are_honoured():
    pair = Stationary([0.5, 0.3, 0.2], [0.2, 0.3, 0.5])
    chain = ss.DraftTree.chain([1, 0], law="iid")
    star_iid = ss.DraftTree.from_draws([(0, 1), (0, 1)], law=DrawLaw.IID)
    star_wo = ss.DraftTree.from_draws([(0, 1), (0, 2)], law="without")
    noise = ss.Noise.constant(0.5, 3)
    for name in ("standard", "specinfer", "rsd", "block", "spectr", "traversal", "resispec"):
        ss.SCHEMES[name].verify(chain, *tables(pair, chain), noise)  # a sampled chain: all run
    ss.SCHEMES["specinfer"].verify(star_iid, *tables(pair, star_iid), ss.Noise.constant(0.5, 2))
    ss.SCHEMES["rsd"].verify(star_wo, *tables(pair, star_wo), noise)
    with pytest.raises(ss.UnsupportedShape, match="'rsd' is not exact for a tree drawn by law"):
        ss.SCHEMES["rsd"].verify(star_iid, *tables(pair, star_iid), ss.Noise.constant(0.5, 2))
    with pytest.raises(ss.UnsupportedShape, match="chains and trees drawn by law grafted, iid"):
        ss.SCHEMES["specinfer"].verdict_law(star_wo, *tables(pair, star_wo))
    # A deterministic chain is not a sample from q: ratio schemes refuse it.
    top = ss.DraftTree.chain([1, 0], law="deterministic")
    with pytest.raises(ss.UnsupportedShape):
        ss.SCHEMES["standard"].verdict_law(top, *tables(pair, top))


def test_shapes_stamp_their_law_on_every_tree():
    pair = Random(3, seed=1)
    rng = np.random.default_rng(0)
    for shape in LAW_SHAPES:
        assert shape.draft(pair, rng).law is shape.law
        assert shape.draft_with(pair, lambda proposal, path, step: int(proposal.argmax())).law is (
            shape.law
        )
        assert {tree.law for tree, _ in shape.enumerate(pair)} == {shape.law}


def test_draw_law_values_and_errors():
    assert DrawLaw.of("without") is DrawLaw.WITHOUT and DrawLaw.IID == "iid"
    assert SAMPLED_LAWS == {DrawLaw.IID, DrawLaw.WITHOUT, DrawLaw.GREEDY}
    with pytest.raises(ValueError, match="law: expected one of"):
        ss.DraftTree.chain([1], law="sampled")
    tree = ss.DraftTree.chain([2, 1], law="iid")
    assert tree != tree.with_law("without") and tree.with_law("iid") == tree
    assert tree.is_chain and tree.is_sampled_chain
    assert not ss.DraftTree.chain([2], law="deterministic").is_sampled_chain
    assert not ss.DraftTree.from_draws([(0, 1), (0, 1)], law="iid").is_chain


@pytest.mark.parametrize(
    "build",
    [
        lambda: ss.DraftTree.chain([1.0, 2]),
        lambda: ss.DraftTree.from_draws([(0, True)]),
        lambda: ss.DraftTree(parents=(-1, 0), tokens=(-1, "3")),
    ],
)
def test_non_integer_ids_are_refused_at_construction(build):
    with pytest.raises(ValueError, match=r"tree: .* integer ids"):
        build()


@pytest.mark.parametrize("value", ["False", 0, None, 1.0])
def test_replacement_must_be_a_bool(value):
    with pytest.raises(ValueError, match="replacement: expected True or False"):
        ss.Shape.star(2, replacement=value)
    with pytest.raises(ValueError, match="replacement: expected True or False"):
        ss.Shape.branching((2,), replacement=value)


def test_every_registered_scheme_is_one_of_the_two_families():
    for name, scheme in ss.SCHEMES.items():
        assert isinstance(scheme, ss.Scheme), name
        assert isinstance(scheme, TreeVerifier) != isinstance(scheme, KeyedCoupling), name
        if isinstance(scheme, KeyedCoupling):
            assert isinstance(scheme.strong_invariance, bool)
            assert not hasattr(scheme, "verify")


def test_structural_predicates():
    assert ss.Shape.delayed(2, trunk=0, branch=2).root_paths == (2, 2)
    assert ss.Shape.paths(3, 1).root_paths == ss.Shape.star(3).root_paths == (1, 1, 1)
    assert ss.Shape.star(2, replacement=False).root_paths is None
    assert ss.Shape.top((2, 2)).level_widths == (2, 2)
    # GLS treats a trunk-less delayed tree as the paths it is.
    pair = Random(3, seed=2)
    delayed, paths = ss.Shape.delayed(2, trunk=0, branch=2), ss.Shape.paths(2, 2)
    for name in ("gls", "gls_strong"):
        assert ss.SCHEMES[name].supports(delayed)
        a = ss.expected_emitted(name, pair, delayed)
        assert a == pytest.approx(ss.expected_emitted(name, pair, paths), abs=1e-12)


@pytest.mark.parametrize("shape", LAW_SHAPES, ids=repr)
def test_count_trees_bounds_the_enumeration(shape):
    pair = Stationary([0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4])  # full support
    count = sum(1 for _ in shape.enumerate(pair))
    assert count <= shape.count_trees(4)
    if shape.law in (DrawLaw.IID, DrawLaw.DETERMINISTIC):  # the bound is tight without merges
        assert count == shape.count_trees(4)


def test_many_steps_do_not_hit_the_recursion_limit():
    """A star of 988 candidates without replacement over three tokens is three draws deep."""
    pair = Stationary([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3)
    assert ss.acceptance("rsd", *(pair.target(()), pair.draft(())), 988) == 1


# --------------------------------------------------------------------------- entry points
def test_entry_points_name_a_wrong_pair_or_shape():
    pair = Stationary([0.5, 0.5], [0.25, 0.75])
    target, draft = pair.target(()), pair.draft(())
    with pytest.raises(TypeError, match="Stationary"):
        ss.round_law("nss", (target, draft), ss.Shape.chain(1))
    with pytest.raises(TypeError, match=r"shape: expected a specsampling.Shape"):
        ss.expected_emitted("nss", pair, "chain(2)")
    with pytest.raises(TypeError, match=r"shape: expected a specsampling.Shape"):
        ss.speculate("nss", pair, "chain(2)", np.random.default_rng(0))


def test_exact_engine_refuses_unaffordable_rounds_at_once():
    big = Random(100_000, seed=0)
    with pytest.raises(ValueError, match=r"probability-table entries.*estimate_emitted"):
        ss.expected_emitted("standard", big, ss.Shape.chain(1))
    with pytest.raises(ValueError, match=r"max_trees=2000000; estimate it by Monte Carlo"):
        ss.round_law("specinfer", Random(50, seed=0), ss.Shape.paths(3, 3))
    with pytest.raises(ValueError, match="max_trees=10"):
        ss.lossless_error("nss", Random(4, seed=0), ss.Shape.star(2), max_trees=10)
    # A scheme's refusal of the shape comes first: it is the more useful answer.
    with pytest.raises(ss.UnsupportedShape):
        ss.round_law("rsd", big, ss.Shape.star(8))


def test_long_enumerations_report_progress(monkeypatch, capsys):
    monkeypatch.setattr(ss.exact, "PROGRESS_ABOVE", 0)
    ss.round_law("nss", Random(3, seed=0), ss.Shape.star(2))
    err = capsys.readouterr().err
    assert re.search(r"round law of 'nss' on star\(2, replacement=True\): \d+ trees in", err)
    monkeypatch.setattr(ss.exact, "PROGRESS_ABOVE", 10**6)
    ss.round_law("nss", Random(3, seed=0), ss.Shape.star(2))
    assert capsys.readouterr().err == ""


def test_single_position_acceptance_at_a_real_vocabulary():
    """Closed forms at V = 150,000, or an immediate refusal naming the Monte-Carlo route."""
    rng = np.random.default_rng(0)
    target, draft = rng.dirichlet(np.ones(150_000)), rng.dirichlet(np.ones(150_000))
    overlap = float(np.minimum(target, draft).sum())
    for name in ("standard", "block", "traversal", "rsd", "gumbel", "poisson", "resispec"):
        assert ss.acceptance(name, target, draft, 1) == pytest.approx(
            overlap if name not in ("gumbel", "poisson") else ss.acceptance("gls", target, draft, 1)
        )
    with pytest.raises(ValueError, match=r"no closed form for num_drafts=8.*estimate_emitted"):
        ss.acceptance("rsd", target, draft, 8)
    with pytest.raises(ValueError, match=r"POISSON_MAX_PAIRS.*estimate_emitted"):
        ss.acceptance("poisson", target, draft, 2)
