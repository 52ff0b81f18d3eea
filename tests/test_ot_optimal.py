"""``ot_optimal`` and ``ot_binned`` (specsampling/schemes/ot_optimal.py, ot_binned.py).

Golden values and intermediate plans were worked out independently in exact arithmetic (the
derivation: ``docs/schemes/ot_optimal.md``); they are typed in here, never computed by the code
under test. The optimum comes from :func:`specsampling.optimal_acceptance` (an
independent min-cut formula) and, for small cases, from the LP itself.
"""

from __future__ import annotations

from fractions import Fraction as F
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specsampling as ss
from proofs_tests.mutants_ot import OTNoPriority
from proofs_tests.strategies import distribution_pairs
from specsampling import DraftTree, Noise, Shape
from specsampling.exact import enumerated_acceptance
from specsampling.pairs import Random, Stationary
from specsampling.schemes import tables
from specsampling.schemes.ot_binned import OTBinned
from specsampling.schemes.ot_optimal import SCHEME, plan, selection
from specsampling.schemes.standard import SCHEME as STANDARD

FLOAT_TOLERANCE = 1e-12

#: name: (p, q, n, alpha*, ot_binned tau = inf acceptance)
GOLDEN = {
    "G1": ((F(1, 2), F(1, 3), F(1, 6)), (F(1, 3),) * 3, 2, F(1), F(8, 9)),
    "G2": (
        (F(3, 5), F(3, 10), F(1, 10)),
        (F(1, 10), F(3, 10), F(3, 5)),
        3,
        F(671, 1000),
        F(1937, 3000),
    ),
    "G3": (
        (F(3, 5), F(3, 10), F(1, 10), F(0)),
        (F(1, 10), F(1, 5), F(3, 10), F(2, 5)),
        2,
        F(59, 100),
        F(149, 300),
    ),
    "G4": ((F(7, 10), F(1, 5), F(1, 10)), (F(7, 10), F(1, 5), F(1, 10)), 2, F(1), F(1)),
    "G5": ((F(1, 2), F(1, 2), F(0), F(0)), (F(0), F(0), F(1, 2), F(1, 2)), 3, F(0), F(0)),
    "G6": (
        (F(2, 5), F(1, 4), F(1, 5), F(3, 20), F(0)),
        (F(1, 20), F(1, 10), F(1, 4), F(3, 10), F(3, 10)),
        4,
        F(125679, 160000),
        0.667835,  # to 6 decimals, as worked out
    ),
    "G7": (
        (F(3, 10), F(1, 5), F(1, 5), F(3, 20), F(1, 10), F(1, 20)),
        (F(0), F(1, 10), F(1, 5), F(3, 10), F(1, 4), F(3, 20)),
        3,
        F(7, 10),
        F(619, 1000),
    ),
    "G8": ((F(1, 4),) * 4, (F(1, 2), F(1, 4), F(1, 8), F(1, 8)), 4, F(1), F(1705, 2048)),
    "G9": (
        (F(1, 10), F(1, 5), F(3, 10), F(2, 5)),
        (F(2, 5), F(3, 10), F(1, 5), F(1, 10)),
        2,
        F(79, 100),
        F(209, 300),
    ),
}
NAMES = sorted(GOLDEN)


def _enumerated(scheme: Any, target: Any, draft: Any, n: int) -> Any:
    """Acceptance by exact enumeration of the i.i.d. star (never the closed form)."""
    return enumerated_acceptance(scheme, Stationary(target, draft), Shape.star(n))


def _output_error(scheme: Any, target: Any, draft: Any, n: int) -> Any:
    law = ss.output_law(scheme, target, draft, n)
    return max(abs(a - b) for a, b in zip(law, target, strict=True))


def _floats(values: Any) -> list[float]:
    return [float(x) for x in values]


# --------------------------------------------------------------------------- goldens
@pytest.mark.parametrize("name", NAMES)
def test_golden_optimum_exactly_and_lossless(name: str) -> None:
    p, q, n, alpha, _ = GOLDEN[name]
    assert ss.optimal_acceptance(p, q, n) == alpha  # the independent formula agrees
    assert _enumerated("ot_optimal", p, q, n) == alpha
    assert ss.acceptance("ot_optimal", p, q, n) == alpha
    assert _output_error("ot_optimal", p, q, n) == 0
    node = plan(p, q, n)
    assert node.alpha == alpha
    assert list(node.realised_r) == list(node.target_r)  # exact arithmetic: r_real = r


@pytest.mark.parametrize("name", NAMES)
def test_golden_in_float64(name: str) -> None:
    p, q, n, alpha, _ = GOLDEN[name]
    p, q = _floats(p), _floats(q)
    assert abs(_enumerated("ot_optimal", p, q, n) - float(alpha)) <= FLOAT_TOLERANCE
    assert _output_error("ot_optimal", p, q, n) <= FLOAT_TOLERANCE
    assert abs(ss.lp_acceptance(p, q, n) - float(alpha)) <= 1e-9


def _tree(node: Any, part: int) -> list[tuple[int, int, str, int]]:
    tree = node.trees[part]
    return [
        (tree.lo[i], tree.hi[i], str(tree.stop[i]), tree.split[i]) for i in range(tree.num_nodes)
    ]


def test_intermediate_values_g1() -> None:
    p, q, n, *_ = GOLDEN["G1"]
    node = plan(p, q, n)
    assert node.cut == 0 and node.levels[1] == 0  # A* empty, d = 0
    assert list(node.target_r) == list(p)  # r = p
    root, first_leaf, inner, *leaves = _tree(node, 1)
    assert (root, first_leaf, inner) == ((0, 3, "1/4", 1), (0, 1, "1", -1), (1, 3, "0", 2))
    assert leaves == [(1, 2, "1", -1), (2, 3, "1", -1)]


def test_intermediate_values_g2_and_g6() -> None:
    p, q, n, *_ = GOLDEN["G2"]
    node = plan(p, q, n)
    assert list(node.order[: node.cut]) == [0]  # A* = {0}
    assert node.levels == (F(271, 100), F(143, 200))
    assert list(node.target_r) == [F(271, 1000), F(3, 10), F(429, 1000)]
    assert _tree(node, 1)[0] == (0, 2, "71/90", 1)
    p, q, n, *_ = GOLDEN["G6"]
    node = plan(p, q, n)
    assert list(node.order[: node.cut]) == [0]
    assert node.levels == (F(29679, 8000), F(58321, 96000))
    assert list(node.target_r) == [F(29679, 160000), F(1, 4), F(1, 5)] + [F(58321, 320000)] * 2
    inner = [row for row in _tree(node, 1) if row[3] >= 0]
    assert inner == [(0, 4, "200/973", 1), (1, 4, "693023/844116", 2)]
    assert (2, 4, "1", -1) in _tree(node, 1)


def test_intermediate_values_g3_g5_g7_g8() -> None:
    node = plan(*GOLDEN["G3"][:3])
    assert node.levels == (F(19, 10), F(51, 70))
    assert list(node.target_r) == [F(19, 100), F(3, 10), F(153, 700), F(51, 175)]
    node = plan(*GOLDEN["G5"][:3])
    assert node.cut == 0 and node.levels[1] == 1  # A* = {0, 1} off the support, r = q
    assert list(node.target_r) == list(GOLDEN["G5"][1])
    node = plan(*GOLDEN["G7"][:3])
    assert node.levels[1] == F(6, 7)
    assert list(node.target_r) == [0, F(1, 5), F(1, 5), F(9, 35), F(3, 14), F(9, 70)]
    node = plan(*GOLDEN["G8"][:3])
    assert list(node.order) == [2, 3, 1, 0]
    inner = [row for row in _tree(node, 1) if row[3] >= 0]
    assert inner == [(0, 4, "47/111", 2), (2, 4, "1/38", 3)]


def test_worked_example_selection_g1() -> None:
    """G1: with probability 1/4 a uniform draw, else the draw with the highest p/q."""
    node = plan(*GOLDEN["G1"][:3])
    assert selection(node, [2, 0]) == {0: F(1, 8) + F(3, 4), 2: F(1, 8)}
    assert selection(node, [1, 1]) == {1: 1}
    assert selection(node, [2, 1]) == {2: F(1, 8), 1: F(7, 8)}


# --------------------------------------------------------------------------- optimality
@settings(max_examples=60)
@given(data=st.data())
def test_acceptance_equals_the_optimum_exactly(data: st.DataObject) -> None:
    vocab = data.draw(st.integers(2, 4), label="vocab")
    n = data.draw(st.integers(2, 4 if vocab <= 3 else 3), label="n")
    p, q = data.draw(distribution_pairs(vocab, exact=True), label="pair")
    assert _enumerated("ot_optimal", p, q, n) == ss.optimal_acceptance(p, q, n)
    assert _output_error("ot_optimal", p, q, n) == 0


@settings(max_examples=60)
@given(data=st.data())
def test_acceptance_equals_the_optimum_in_float64(data: st.DataObject) -> None:
    """Near p == q (1e-9), with zeros and tiny masses included (the strategy's relations)."""
    vocab = data.draw(st.integers(2, 5), label="vocab")
    n = data.draw(st.integers(2, 4), label="n")
    p, q = data.draw(distribution_pairs(vocab, exact=False), label="pair")
    gap = abs(_enumerated("ot_optimal", p, q, n) - ss.optimal_acceptance(p, q, n))
    assert gap <= FLOAT_TOLERANCE
    node = plan(p, q, n)
    assert abs(node.realised_r - node.target_r).max() <= FLOAT_TOLERANCE
    assert _output_error("ot_optimal", p, q, n) <= FLOAT_TOLERANCE


def test_no_priority_mutant_is_lossless_but_caught_by_the_optimality_check() -> None:
    """M8: the optimality check has teeth (the lossless property alone cannot see it)."""
    p, q, n, alpha, _ = GOLDEN["G6"]
    mutant = OTNoPriority()
    assert _output_error(mutant, p, q, n) == 0
    assert _enumerated(mutant, p, q, n) < alpha
    assert ss.lossless_error(mutant, Random(3, seed=1, exact=True), Shape.paths(2, 2)) == 0


def test_beats_the_shipped_verifiers_on_dirichlet_pairs() -> None:
    """At V = 50 the optimum is reached to rounding; SpecInfer and SpecTr stay below it."""
    rng = np.random.default_rng(0)
    for n in (2, 4, 8):
        p, q = rng.dirichlet(np.ones(50)), rng.dirichlet(np.ones(50))
        node = plan(p, q, n)
        optimum = ss.optimal_acceptance(p, q, n)
        selected = float(np.minimum(p, node.realised_r).sum())  # no hits: the acceptance
        assert abs(selected - optimum) <= FLOAT_TOLERANCE
        assert abs(node.realised_r.sum() - 1) <= FLOAT_TOLERANCE
        assert ss.acceptance("specinfer", p, q, n) < optimum - 1e-3
        assert ss.acceptance("spectr", p, q, n) < optimum - 1e-4


def test_large_vocabulary_plan_is_exact_to_rounding() -> None:
    """V = 5,000 with a top-64 draft (zeros elsewhere): r_real is a distribution within 1e-12 of
    the closed form, ``min(p, r)`` sums to the optimum, and the tree is small."""
    rng = np.random.default_rng(1)
    vocab = 5000
    p = rng.dirichlet(np.full(vocab, 0.1))
    q = np.zeros(vocab)
    top = np.argsort(-(p + rng.gamma(0.1, size=vocab) * 1e-3))[:64]
    q[top] = rng.dirichlet(np.ones(64))
    node = plan(p, q, 8)
    assert abs(node.realised_r.sum() - 1) <= FLOAT_TOLERANCE
    assert abs(node.realised_r - node.target_r).max() <= FLOAT_TOLERANCE
    assert (node.realised_r[q == 0] == 0).all()
    assert abs(np.minimum(p, node.realised_r).sum() - ss.optimal_acceptance(p, q, 8)) <= 1e-12
    assert sum(t.num_nodes for t in node.trees) <= 2 * 64 - 1
    assert node.residual.min() >= 0 and abs(node.residual.sum() - 1) <= FLOAT_TOLERANCE


# --------------------------------------------------------------------------- ot_binned
@pytest.mark.parametrize("name", NAMES)
def test_binned_golden_at_infinite_tau(name: str) -> None:
    p, q, n, _, expected = GOLDEN[name]
    binned = OTBinned(tau=float("inf"))
    got = _enumerated(binned, p, q, n)
    if isinstance(expected, float):
        assert abs(float(got) - expected) <= 5e-7
    else:
        assert got == expected
    assert _output_error(binned, p, q, n) == 0


@pytest.mark.parametrize("tau", [F(0), F(1, 100), F(1, 10), F(10)])
@pytest.mark.parametrize("name", NAMES)
def test_binned_is_lossless_and_within_its_bound_exactly(name: str, tau: F) -> None:
    p, q, n, alpha, _ = GOLDEN[name]
    binned = OTBinned(tau=tau)
    assert _output_error(binned, p, q, n) == 0
    bound = binned.loss_bound(p, q, n)
    assert bound >= 0
    assert _enumerated(binned, p, q, n) >= alpha - bound
    if tau == 0:
        assert _enumerated(binned, p, q, n) == alpha


@settings(max_examples=40)
@given(data=st.data())
def test_binned_bound_on_drawn_pairs(data: st.DataObject) -> None:
    vocab = data.draw(st.integers(2, 4), label="vocab")
    n = data.draw(st.integers(2, 3), label="n")
    tau = data.draw(st.sampled_from([F(0), F(1, 50), F(1, 5), F(100)]), label="tau")
    p, q = data.draw(distribution_pairs(vocab, exact=True), label="pair")
    binned = OTBinned(tau=tau)
    assert _output_error(binned, p, q, n) == 0
    optimum = ss.optimal_acceptance(p, q, n)
    assert _enumerated(binned, p, q, n) >= optimum - binned.loss_bound(p, q, n)


def test_binned_groups_shrink_the_tree_and_keep_the_bound_at_scale() -> None:
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.full(3000, 0.3)), rng.dirichlet(np.full(3000, 0.3))
    exact_plan = plan(p, q, 4)
    optimum = ss.optimal_acceptance(p, q, 4)
    for tau in (1e-4, 1e-6):
        node = plan(p, q, 4, tau)
        cells = sum(len(b) - 1 for b in node.cell_bounds)
        assert cells < sum(len(b) - 1 for b in exact_plan.cell_bounds)
        assert abs(node.realised_r.sum() - 1) <= FLOAT_TOLERANCE
        selected = float(np.minimum(p, node.realised_r).sum())
        assert selected >= optimum - node.loss_bound - FLOAT_TOLERANCE
        assert selected <= optimum + FLOAT_TOLERANCE


@pytest.mark.parametrize("tau", [-1e-3, float("nan"), "1e-6", None, True])
def test_binned_rejects_a_bad_tau(tau: Any) -> None:
    with pytest.raises(ValueError, match="tau"):
        OTBinned(tau=tau)


# --------------------------------------------------------------------------- shapes and noise
@pytest.mark.parametrize("scheme", [SCHEME, OTBinned()], ids=["ot_optimal", "ot_binned"])
def test_refuses_draw_laws_it_is_not_exact_for(scheme: Any) -> None:
    for shape in (
        Shape.star(2, replacement=False),
        Shape.hub(),
        Shape.greedy((2,)),
        Shape.top((2,)),
    ):
        assert not scheme.supports(shape)
        with pytest.raises(ss.UnsupportedShape):
            scheme.check(shape)
    for shape in (Shape.chain(3), Shape.star(3), Shape.paths(2, 2), Shape.delayed(2, 1, 1)):
        assert scheme.supports(shape)
    tree = DraftTree(parents=(-1, 0, 0), tokens=(-1, 1, 2), law="without")
    pair = Stationary([0.5, 0.3, 0.2], [0.2, 0.3, 0.5])
    target, draft = tables(pair, tree)
    with pytest.raises(ss.UnsupportedShape):
        scheme.verify(tree, target, draft, Noise.draw(np.random.default_rng(0), 3))
    with pytest.raises(ss.UnsupportedShape):
        scheme.verdict_law(tree, target, draft)


def test_chains_are_standard_speculative_sampling_path_by_path() -> None:
    rng = np.random.default_rng(3)
    pair = Random(5, seed=4)
    for _ in range(200):
        tree = Shape.chain(3).draft(pair, rng)
        noise = Noise.draw(rng, tree.num_nodes)
        target, draft = tables(pair, tree)
        expected = STANDARD.verify(tree, target, draft, noise)
        assert SCHEME.verify(tree, target, draft, noise) == expected
        assert OTBinned().verify(tree, target, draft, noise) == expected


def test_one_categorical_with_the_first_childs_uniform() -> None:
    """Spec 0.5: the node decision reads ``noise.accept[first child]`` only; a reject reads
    ``noise.sample[node]``. G1, draws (2, 0): A* is empty and r = p, so token 2 is selected with
    1/8 (the root's uniform draw) and token 0 with 7/8, both accepted: pi = (1/8, 7/8, 0)."""
    p, q = np.array([0.5, 1 / 3, 1 / 6]), np.full(3, 1 / 3)
    tree = DraftTree(parents=(-1, 0, 0), tokens=(-1, 2, 0), law="iid")
    target, draft = np.stack([p] * 3), np.stack([q] * 3)
    descend, stop = SCHEME.node_law(tree, 0, target, draft)
    assert [child for child, _ in descend] == [1, 2]
    assert [prob for _, prob in descend] == pytest.approx([1 / 8, 7 / 8], abs=1e-15)
    assert stop == pytest.approx(np.zeros(3), abs=1e-15)
    for u, child in ((0.0, 1), (0.124, 1), (0.126, 2), (0.99, 2)):
        noise = Noise(accept=np.array([0.0, u, 0.7]), sample=np.array([0.3, 0.1, 0.2]))
        verdict = SCHEME.verify(tree, target, draft, noise)
        assert verdict.node == child
        other = Noise(accept=np.array([0.5, u, 0.1]), sample=noise.sample)  # unread uniforms
        assert SCHEME.verify(tree, target, draft, other) == verdict


def test_plan_validates_its_input() -> None:
    with pytest.raises(ss.InvalidDistribution):
        plan([0.5, 0.6], [0.5, 0.5], 2)
    with pytest.raises(ValueError, match="num_drafts"):
        plan([0.5, 0.5], [0.5, 0.5], 0)


def test_benchmark_runs_quickly_and_reports_the_optimum(tmp_path: Any) -> None:
    """``benchmarks/ot_verifiers.py --quick``: every table filled, ``ot_optimal`` at the optimum
    to rounding (no timing is asserted; speed claims live in benchmarks/results)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    output = tmp_path / "ot.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/ot_verifiers.py", "--quick", "--output", str(output)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = output.read_text()
    sections = text.split("## ")
    top = [
        line
        for line in sections[1].splitlines()
        if line.startswith("| 2 ") or line.startswith("| 4 ")
    ]
    binned = [
        line
        for line in sections[2].splitlines()
        if line.startswith("| 2 ") or line.startswith("| 4 ")
    ]
    khisti = [
        line
        for line in sections[3].splitlines()
        if line.startswith("| 2 ") or line.startswith("| 4 ")
    ]
    assert len(top) == 4 and len(binned) == 2 and len(khisti) == 2
    for line in top:
        *_, gap, bound = (float(cell) for cell in line.strip("|").split("|")[-2:])
        assert abs(gap) <= 1e-12 and bound == 0, line
    for line in binned:
        gap, bound = (float(cell) for cell in line.strip("|").split("|")[-2:])
        assert 0 <= gap <= bound + 1e-12 and bound < 1e-1, line
