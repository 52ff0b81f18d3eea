"""Tree policies, the shape search, depth profiles and ``specsampling simulate``.

Statistical checks: 5 comparisons at 4.5 standard errors with fixed seeds (budget < 4e-5); the
policy checks are exact.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import specsampling as ss
from specsampling import simulators as sim
from specsampling.cli import main
from specsampling.simulators import policies
from specsampling.simulators.policies import HeapTree, OptTree

ROOT = (1, 2, 0, 3)


def _brute_top(draft: np.ndarray, budget: int) -> set[tuple[int, ...]]:
    """The ``budget`` prefixes of largest draft probability, by enumeration (stationary q)."""
    scored = []
    for depth in range(1, budget + 1):
        for path in itertools.product(range(len(draft)), repeat=depth):
            scored.append((float(np.prod(draft[list(path)])), path))
    scored.sort(key=lambda s: -s[0])
    assert scored[budget - 1][0] > scored[budget][0]  # no tie at the cut (test precondition)
    return {path for _, path in scored[:budget]}


@pytest.mark.parametrize("budget", [1, 3, 4, 6])
def test_heap_tree_is_the_top_budget_prefix_set(budget: int) -> None:
    draft = np.array([0.55, 0.3, 0.15])
    pair = ss.pairs.Stationary([0.2, 0.5, 0.3], draft)
    tree = HeapTree(budget).draft_trees(pair, [()])[0]
    got = {tree.prefix(n) for n in range(1, tree.num_nodes)}
    assert got == _brute_top(draft, budget)
    assert tree.law == ss.DrawLaw.DETERMINISTIC


def test_opt_tree_layers_and_threshold() -> None:
    pair = ss.pairs.Stationary([0.5, 0.5], [0.7, 0.3])
    tree = OptTree(5, width=2).draft_trees(pair, [()])[0]
    by_depth = sorted(tree.prefix(n) for n in range(1, tree.num_nodes))
    assert by_depth == [(0,), (0, 0), (0, 0, 0), (0, 1), (1,)]  # layers of 2, 2, then 1 left
    # A layer gaining less than the threshold is not added: 0.7 + 0.3 = 1 passes, 0.49 + 0.21
    # = 0.7 does not pass 0.75.
    short = OptTree(6, width=2, threshold=0.75).draft_trees(pair, [()])[0]
    assert short.num_nodes == 3


def test_policies_are_frozen_values() -> None:
    assert HeapTree(6) == HeapTree(6, max_depth=6) and hash(HeapTree(6)) == hash(HeapTree(6, 6))
    assert HeapTree(6) != HeapTree(6, max_depth=3) and HeapTree(6) != OptTree(6)
    assert OptTree(4) == OptTree(4, width=4, threshold=0, max_depth=10)
    assert len({OptTree(4), OptTree(4, width=4), OptTree(4, width=2)}) == 2
    assert repr(OptTree(4, width=2, threshold=0.5)) == "OptTree(4, width=2, threshold=0.5)"
    assert repr(HeapTree(6, max_depth=3)) == "HeapTree(6, max_depth=3)"
    with pytest.raises(AttributeError):
        HeapTree(6).budget = 3  # type: ignore[misc]
    for bad, match in [
        (lambda: HeapTree(0), "budget"),
        (lambda: HeapTree(3, max_depth=0), "max_depth"),
        (lambda: OptTree(3, width=0), "width"),
        (lambda: OptTree(3, threshold=float("nan")), "threshold"),
    ]:
        with pytest.raises(ValueError, match=match):
            bad()

    class NoTrees(policies._Policy):  # a policy must say how it drafts
        budget = 2

    with pytest.raises(TypeError, match="draft_trees"):
        NoTrees()  # type: ignore[abstract]


@pytest.mark.parametrize("threshold", [True, False])
def test_opt_tree_threshold_is_a_number_not_a_bool(threshold: bool) -> None:
    """A boolean is not taken for 1 or 0, as everywhere a number is expected."""
    with pytest.raises(ValueError, match=r"^threshold: expected a finite number >= 0, got "):
        OptTree(3, threshold=threshold)
    assert OptTree(3, threshold=1).threshold == 1.0 and OptTree(3, threshold=0).threshold == 0.0


def test_nss_on_policy_trees_is_the_closed_form() -> None:
    """NSS on a fixed tree: E[tau + 1] = 1 + sum over nodes of the target's path probability."""
    target = np.array([0.6, 0.3, 0.1])
    pair = ss.pairs.Stationary(target, [0.5, 0.4, 0.1])
    for policy in (HeapTree(4), OptTree(4, width=2)):
        tree = policy.draft_trees(pair, [()])[0]
        closed = 1 + sum(
            float(np.prod(target[list(tree.prefix(n))])) for n in range(1, tree.num_nodes)
        )
        est = sim.estimate("nss", pair, policy, 8, generator=0)
        assert abs(est.mean - closed) < 1e-12 and est.stderr < 1e-12  # RB: no variance left


def test_policies_refuse_schemes_not_exact_for_deterministic_trees() -> None:
    pair = sim.pairs.Synthetic(vocab_size=8)
    with pytest.raises(ss.UnsupportedShape, match="deterministic"):
        sim.estimate("traversal", pair, HeapTree(4), 4)
    with pytest.raises(ss.UnsupportedShape, match="deterministic"):
        sim.search_shape("specinfer", pair, 4, method="ddtree")


def test_search_returns_a_shape_an_independent_run_confirms() -> None:
    pair = sim.pairs.Synthetic(vocab_size=200, seed=3, divergence=0.7)
    best = sim.search_shape(
        "traversal",
        pair,
        budget=6,
        families=("chain", "paths", "delayed"),
        num_trees=96,
        rounds=2,
        generator=0,
    )
    last = [c for c in best.candidates if c[1].num_trees == 192]  # the second round's
    values = [value for _, _, value in last]
    assert values == sorted(values, reverse=True) and best.candidates[: len(last)] == tuple(last)
    assert best.shape == best.candidates[0][0] and len(best.shape.steps) <= 6
    # The reported figure is a fresh run, not the selection's (biased upwards) own figure.
    assert best.value == best.estimate.mean and best.estimate is not best.candidates[0][1]
    families = ("chain", "paths", "delayed")
    assert len(best.candidates) == len(sim.candidate_shapes("traversal", 6, families=families))
    check = sim.estimate("traversal", pair, best.shape, 1500, generator=12345)
    assert abs(check.mean - best.estimate.mean) <= 4.5 * np.hypot(
        check.stderr, best.estimate.stderr
    )
    assert best.shape in set(sim.candidate_shapes("traversal", 6))
    assert "E[tau+1]" in best.table()


def test_search_tokens_per_second_prefers_shorter_trees_when_drafting_is_dear() -> None:
    pair = sim.pairs.Synthetic(vocab_size=100, seed=0, divergence=0.3)
    kwargs = {"families": ("chain",), "num_trees": 64, "rounds": 1, "generator": 1}
    free = sim.search_shape(
        "standard",
        pair,
        6,
        objective="tokens-per-second",
        cost=sim.CostModel.relative(0.0),
        **kwargs,
    )
    dear = sim.search_shape(
        "standard",
        pair,
        6,
        objective="tokens-per-second",
        cost=sim.CostModel.relative(1.0),
        **kwargs,
    )
    assert free.shape.depth > dear.shape.depth
    plain_like = sim.CostModel.relative(0.0)
    assert free.value == pytest.approx(plain_like.tokens_per_second(free.estimate.mean, free.shape))


def test_ddtree_and_opt_tree_searches() -> None:
    pair = sim.pairs.Synthetic(vocab_size=300, seed=1)
    heap = sim.search_shape("nss", pair, 6, method="ddtree", num_trees=32, generator=0)
    assert heap.shape == HeapTree(6)
    # Independent value: NSS's closed form on DDTree's trees over fresh roots,
    # E[tau + 1 | tree] = 1 + sum over nodes of the target's probability of the node's path.
    roots = pair.roots(200, np.random.default_rng(99))
    closed = []
    for root, tree in zip(roots, HeapTree(6).draft_trees(pair, roots), strict=True):
        value = 1.0
        for node in range(1, tree.num_nodes):
            path = tree.prefix(node)
            value += float(
                np.prod([pair.target(root + path[:i])[path[i]] for i in range(len(path))])
            )
        closed.append(value)
    stderr = np.std(closed, ddof=1) / np.sqrt(len(closed))
    assert abs(heap.estimate.mean - np.mean(closed)) <= 4.5 * np.hypot(heap.estimate.stderr, stderr)
    opt = sim.search_shape("nss", pair, 6, method="opt-tree", num_trees=32, rounds=1, generator=0)
    assert all(isinstance(s, OptTree) for s, _, _ in opt.candidates)
    with pytest.raises(ValueError, match="method"):
        sim.search_shape("nss", pair, 6, method="beam")
    with pytest.raises(ValueError, match="cost"):
        sim.search_shape("nss", pair, 6, objective="tokens-per-second")


def test_opt_tree_search_refuses_max_depth_zero() -> None:
    """``max_depth=0`` is refused as the other methods refuse it; ``None`` is OPT-Tree's 10."""
    pair = ss.pairs.Random(3, seed=1)
    run = {"budget": 4, "method": "opt-tree", "num_trees": 4, "rounds": 1, "generator": 0}
    for method in ("opt-tree", "ddtree", "verifier"):
        with pytest.raises(ValueError, match=r"^max_depth: expected an integer >= 1, got 0"):
            sim.search_shape("nss", pair, **{**run, "method": method}, max_depth=0)
    assert {s.max_depth for s, _, _ in sim.search_shape("nss", pair, **run).candidates} == {10}
    shallow = sim.search_shape("nss", pair, **run, max_depth=2)
    assert {s.max_depth for s, _, _ in shallow.candidates} == {2}


def test_sweep_checks_its_shapes_and_flag() -> None:
    pair = ss.pairs.Random(vocab_size=3, seed=0)
    with pytest.raises(TypeError, match=r"^shapes: expected a sequence of shapes"):
        sim.sweep("standard", pair, None, 10)
    with pytest.raises(TypeError, match=r"^shapes: expected a sequence of shapes"):
        sim.sweep("standard", pair, ss.Shape.chain(2), 10)
    with pytest.raises(ValueError, match=r"^shapes: expected at least one shape, got none"):
        sim.sweep("standard", pair, [], 10)
    with pytest.raises(ValueError, match=r"^seed_per_shape: expected True or False, got 'no'"):
        sim.sweep("standard", pair, [ss.Shape.chain(1)], 10, seed_per_shape="no")
    # Any iterable of shapes, a generator expression included, is a list of shapes.
    out = sim.sweep("standard", pair, (ss.Shape.chain(n) for n in (1, 2)), 10, generator=0)
    assert [s for s, _ in out] == [ss.Shape.chain(1), ss.Shape.chain(2)]


def test_delayed_grid_and_sweep() -> None:
    grid = sim.delayed_grid((1, 2), (0, 1, 2), (0, 1))
    assert ss.Shape.paths(2, 1) in grid and ss.Shape.delayed(2, trunk=2, branch=1) in grid
    assert len(grid) == len(set(grid))
    pair = ss.pairs.Random(vocab_size=3, seed=0)
    out = sim.sweep("traversal", pair, grid[:3], num_trees=200, generator=0)
    for shape, est in out:
        exact = float(ss.expected_emitted("traversal", pair, shape))
        assert abs(est.mean - exact) <= 4.5 * est.stderr + 1e-12, shape


def test_depth_profile_shows_acceptance_falling_with_depth() -> None:
    pair = sim.pairs.Synthetic(vocab_size=400, seed=0, divergence=0.3, depth_growth=1.5)
    prof = sim.depth_profile("standard", pair, ss.Shape.chain(4), 400, generator=0)
    assert prof.distance[3] > prof.distance[0]  # divergence grows with depth
    assert prof.acceptance[3] < prof.acceptance[0]
    est = sim.estimate("standard", pair, ss.Shape.chain(4), 400, generator=0)
    assert prof.block_efficiency == pytest.approx(est.mean, abs=1e-9)  # same trees, same law
    assert "P(tau>=d)" in prof.table()


def test_simulate_command_table_json_and_plots(tmp_path, capsys) -> None:
    out_json = tmp_path / "rows.json"
    argv = ["simulate", "--vocab-size", "60", "--schemes", "traversal,nss,rsd"]
    argv += ["--shapes", "paths(2, 2)", "--budgets", "2,3", "--families", "chain,paths"]
    argv += ["--num-trees", "16", "--temperatures", "1.0,0.5", "--cost-ratio", "0.1"]
    argv += ["--json", str(out_json), "--plots", str(tmp_path / "plots"), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out_json.read_text())
    # rsd is not exact for i.i.d. paths: it appears only through its searched (chain) shapes.
    assert {(r["scheme"], r["budget"]) for r in rows if r["temperature"] == 1.0} == {
        ("traversal", None),
        ("nss", None),
        ("traversal", 2),
        ("traversal", 3),
        ("nss", 2),
        ("nss", 3),
        ("rsd", 2),
        ("rsd", 3),
    }
    assert all(r["ci"][0] <= r["block_efficiency"] <= r["ci"][1] for r in rows)
    assert "speedup" in printed and "traversal" in printed
    for name in ("block_efficiency_vs_budget", "acceptance_vs_depth", "tokens_per_second"):
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 1000


def test_simulate_command_on_a_recorded_file_and_bad_input(tmp_path, capsys) -> None:
    pair = sim.pairs.Synthetic(vocab_size=30, seed=0)
    trees = sim.RecordedTrees.from_pair(pair, ss.Shape.paths(2, 2), 40, generator=0)
    path = trees.save(tmp_path / "t.npz")
    assert (
        main(
            [
                "simulate",
                "--recorded",
                str(path),
                "--schemes",
                "traversal,specinfer",
                "--no-progress",
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    assert (tmp_path / "plots" / "acceptance_vs_depth.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "paths(2, 2)" in printed and "specinfer" in printed
    assert main(["simulate", "--schemes", "nosuch", "--vocab-size", "8"]) == 2
    assert "unknown scheme" in capsys.readouterr().err
    assert main(["simulate", "--shapes", "bad(", "--vocab-size", "8"]) == 2


def test_plots_tick_integer_axes_at_integers(tmp_path, monkeypatch) -> None:
    """Budgets and depths are counts: their axes get integer ticks only (two budgets or three
    depths would otherwise be ticked at 4.5, 5.0, ... or 1.25, 1.5, ...)."""
    from types import SimpleNamespace

    from specsampling.simulators import cli as simulate_cli

    figures = []
    monkeypatch.setattr(simulate_cli, "_save", lambda fig, path: figures.append(fig) or path)
    rows = [
        {"scheme": "nss", "temperature": 1.0, "budget": b, "block_efficiency": e, "stderr": 0.01}
        for b, e in ((4, 1.8), (8, 2.1))
    ]
    profile = SimpleNamespace(acceptance=[0.8, 0.7, 0.65], distance=[0.3, 0.35, 0.4])
    simulate_cli.plot(rows, {"nss": profile}, tmp_path)
    assert len(figures) == 2
    for fig in figures:
        ticks = fig.axes[0].get_xticks()
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
