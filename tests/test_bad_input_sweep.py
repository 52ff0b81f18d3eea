"""A sweep of malformed calls on the numpy reference, the simulators, the continuous couplings and
the watermark detector: each is refused with an error whose message starts with the argument's
name (``name: problem`` or ``name[i]: problem``), never a raw ``AttributeError``/``KeyError`` from
deep inside, and never accepted silently. The torch surfaces have their own sweep in
``tests/test_gpu_input_fuzz.py``; single classes of bad input have focused tests in
``tests/test_validation.py``.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

import specsampling as ss
from specsampling import calculators
from specsampling import continuous as c
from specsampling import simulators as sim
from specsampling.keyed import watermark as wm
from specsampling.optimal import lp_acceptance

#: ``argument: problem`` or ``argument[1, 2]: problem``
CLEAR = re.compile(r"^[A-Za-z_][\w.]*(\[[0-9, ]+\])?: ")

p = [0.5, 0.3, 0.2]
q = [0.2, 0.3, 0.5]
pair = ss.pairs.Stationary(p, q)
shape = ss.Shape.chain(2)
m = np.zeros(3)
d = np.ones(3) * 0.1
rand = ss.pairs.Random(3, seed=1)
tree1 = ss.DraftTree.chain([0], law=ss.DrawLaw.IID)
tree2 = ss.DraftTree.chain([0, 1], law=ss.DrawLaw.IID)
tree7 = ss.DraftTree.chain([7], law=ss.DrawLaw.IID)


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


CALLS = [
    pytest.param(lambda: ss.process("abc"), id="process logits str"),
    pytest.param(lambda: ss.process([0.0, 1.0], temperature="x"), id="process temp str"),
    pytest.param(lambda: ss.process([0.0, 1.0], temperature=float("nan")), id="process temp nan"),
    pytest.param(lambda: ss.process([0.0, 1.0], top_k=0), id="process top_k 0"),
    pytest.param(lambda: ss.process([0.0, 1.0], top_k=1.5), id="process top_k 1.5"),
    pytest.param(lambda: ss.process([0.0, 1.0], top_p=0), id="process top_p 0"),
    pytest.param(lambda: ss.process([0.0, 1.0], top_p=2), id="process top_p 2"),
    pytest.param(lambda: ss.process([]), id="process empty"),
    pytest.param(lambda: ss.pairs.Stationary([1.5, -0.5], q[:2]), id="Stationary neg"),
    pytest.param(lambda: ss.pairs.Stationary(p, [0.5, 0.5]), id="Stationary len"),
    pytest.param(lambda: ss.pairs.Stationary([float("nan"), 1.0], [0.5, 0.5]), id="Stationary nan"),
    pytest.param(lambda: ss.pairs.Stationary("ab", "cd"), id="Stationary str"),
    pytest.param(lambda: ss.pairs.Stationary(None, None), id="Stationary None"),
    pytest.param(lambda: ss.Shape.chain(-1), id="Shape.chain -1"),
    pytest.param(lambda: ss.Shape.chain(1.5), id="Shape.chain 1.5"),
    pytest.param(lambda: ss.Shape.chain("3"), id="Shape.chain str"),
    pytest.param(lambda: ss.Shape.star(0), id="Shape.star 0"),
    pytest.param(lambda: ss.Shape.paths(0, 2), id="Shape.paths 0"),
    pytest.param(lambda: ss.Shape.branching(()), id="Shape.branching empty"),
    pytest.param(lambda: ss.Shape.branching((2, -1)), id="Shape.branching neg"),
    pytest.param(lambda: ss.speculate("nope", pair, shape, rng()), id="speculate unknown"),
    pytest.param(lambda: ss.speculate(3, pair, shape, rng()), id="speculate scheme int"),
    pytest.param(
        lambda: ss.speculate("standard", [0.5, 0.5], shape, rng()), id="speculate pair list"
    ),
    pytest.param(
        lambda: ss.speculate("standard", pair, "chain(2)", rng()), id="speculate shape str"
    ),
    pytest.param(lambda: ss.speculate("standard", pair, shape, 0), id="speculate rng int"),
    pytest.param(lambda: ss.speculate("standard", pair, shape, "x"), id="speculate rng str"),
    pytest.param(
        lambda: ss.speculate("standard", pair, shape, rng(), prefix=(-1,)),
        id="speculate prefix neg",
    ),
    pytest.param(lambda: ss.generate("standard", pair, shape, -1, rng()), id="generate length -1"),
    pytest.param(
        lambda: ss.generate("standard", pair, shape, 1.5, rng()), id="generate length 1.5"
    ),
    pytest.param(
        lambda: ss.generate("standard", pair, shape, "3", rng()), id="generate length str"
    ),
    pytest.param(lambda: ss.get_scheme(1), id="get_scheme 1"),
    pytest.param(lambda: ss.get_scheme("stndard"), id="get_scheme bad"),
    pytest.param(lambda: ss.DraftTree.chain([-1, 2]), id="DraftTree.chain neg token"),
    pytest.param(lambda: ss.DraftTree.chain([1, 2], law="x"), id="DraftTree.chain law bad"),
    pytest.param(lambda: ss.DraftTree.chain("ab"), id="DraftTree.chain str"),
    pytest.param(lambda: sim.estimate("standard", pair, "chain(2)"), id="sim.estimate shape str"),
    pytest.param(lambda: sim.compare([], pair, shape), id="sim.compare empty"),
    pytest.param(
        lambda: sim.search_shape("standard", pair, budget=0), id="sim.search_shape budget 0"
    ),
    pytest.param(
        lambda: sim.search_shape("standard", pair, budget="x"), id="sim.search_shape budget str"
    ),
    pytest.param(lambda: sim.RecordedTrees.load("/tmp"), id="RecordedTrees.load dir"),
    pytest.param(lambda: ss.acceptance("nope", p, q, 2), id="acceptance unknown"),
    pytest.param(lambda: ss.acceptance("standard", p, q, 0), id="acceptance nd 0"),
    pytest.param(lambda: ss.acceptance("standard", p, q, -1), id="acceptance nd -1"),
    pytest.param(lambda: ss.acceptance("standard", p, q, 1.5), id="acceptance nd 1.5"),
    pytest.param(lambda: ss.acceptance("standard", p, q, "2"), id="acceptance nd str"),
    pytest.param(lambda: ss.acceptance("standard", None, q, 2), id="acceptance target None"),
    pytest.param(lambda: ss.acceptance("standard", p, q[:2], 2), id="acceptance len"),
    pytest.param(lambda: ss.output_law("standard", p, q, -1), id="output_law nd -1"),
    pytest.param(
        lambda: ss.output_law("standard", [1.5, -0.5, 0], q, 1), id="output_law target neg"
    ),
    pytest.param(lambda: ss.optimal_acceptance(p, q, -1), id="optimal_acceptance nd -1"),
    pytest.param(
        lambda: ss.optimal_acceptance(p, q, 2, replacement="no"), id="optimal_acceptance repl str"
    ),
    pytest.param(lambda: lp_acceptance(p, q, 0), id="lp_acceptance nd 0"),
    pytest.param(lambda: lp_acceptance(p, q, 2, shape="x"), id="lp_acceptance shape str"),
    pytest.param(lambda: ss.lossless_error("standard", pair, 5), id="lossless_error shape int"),
    pytest.param(
        lambda: ss.lossless_error("standard", pair, shape, -1), id="lossless_error length -1"
    ),
    pytest.param(
        lambda: ss.lossless_error("standard", [0.5, 0.5], shape), id="lossless_error pair list"
    ),
    pytest.param(lambda: ss.round_law("standard", pair, None), id="round_law shape None"),
    pytest.param(
        lambda: ss.round_law("standard", pair, shape, max_trees=0), id="round_law max_trees 0"
    ),
    pytest.param(lambda: ss.stream_law("standard", pair, shape, -1), id="stream_law length -1"),
    pytest.param(lambda: ss.stream_law("standard", pair, shape, "2"), id="stream_law length str"),
    pytest.param(
        lambda: ss.expected_emitted("standard", pair, None), id="expected_emitted shape None"
    ),
    pytest.param(
        lambda: ss.expected_emitted("standard", None, shape), id="expected_emitted pair None"
    ),
    pytest.param(
        lambda: ss.expected_emitted("standard", pair, shape, prefix=(7,)),
        id="expected_emitted prefix big",
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, shape, num_trees=0), id="sim.estimate num_trees 0"
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, shape, num_trees=-3), id="sim.estimate num_trees -3"
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, shape, num_trees="x"),
        id="sim.estimate num_trees str",
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, shape, num_trees=10, method="x"),
        id="sim.estimate method bad",
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, shape, num_trees=10, generator="x"),
        id="sim.estimate gen str",
    ),
    pytest.param(
        lambda: sim.estimate("standard", None, shape, num_trees=10), id="sim.estimate source None"
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, None, num_trees=10), id="sim.estimate shape None"
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, 3, num_trees=10), id="sim.estimate shape int"
    ),
    pytest.param(
        lambda: sim.estimate("standard", pair, shape, num_trees=10, progress="x"),
        id="sim.estimate progress str",
    ),
    pytest.param(
        lambda: sim.search_shape("standard", pair, method="x"), id="sim.search_shape method"
    ),
    pytest.param(
        lambda: sim.search_shape("standard", pair, objective="x"), id="sim.search_shape objective"
    ),
    pytest.param(
        lambda: sim.search_shape("standard", pair, rounds=0), id="sim.search_shape rounds 0"
    ),
    pytest.param(
        lambda: sim.search_shape("standard", pair, max_depth=0), id="sim.search_shape max_depth 0"
    ),
    pytest.param(
        lambda: sim.search_shape("standard", pair, cost="x"), id="sim.search_shape cost str"
    ),
    pytest.param(
        lambda: sim.search_shape("standard", pair, batch_size=0), id="sim.search_shape batch 0"
    ),
    pytest.param(lambda: sim.CostModel("a", 1.0, 1.0, 1.0), id="sim.CostModel str"),
    pytest.param(lambda: c.verify("nope", m, d, 1.0, [d], rng()), id="c.verify unknown"),
    pytest.param(lambda: c.verify("reflection", m, d, 0.0, [d], rng()), id="c.verify std 0"),
    pytest.param(lambda: c.verify("reflection", m, d, -1.0, [d], rng()), id="c.verify std -1"),
    pytest.param(
        lambda: c.verify("reflection", m, d, float("nan"), [d], rng()), id="c.verify std nan"
    ),
    pytest.param(
        lambda: c.verify("reflection", np.array([np.nan, 0, 0]), d, 1.0, [d], rng()),
        id="c.verify mean nan",
    ),
    pytest.param(
        lambda: c.verify("reflection", m, np.ones(2), 1.0, [d], rng()), id="c.verify dim mismatch"
    ),
    pytest.param(
        lambda: c.verify("reflection", m, d, 1.0, [], rng()), id="c.verify children empty"
    ),
    pytest.param(
        lambda: c.verify("reflection", m, d, 1.0, [np.ones(2)], rng()), id="c.verify children dim"
    ),
    pytest.param(lambda: c.verify("reflection", m, d, 1.0, [d], 0), id="c.verify rng int"),
    pytest.param(lambda: c.verify("reflection", m, d, 1.0, [d], "x"), id="c.verify rng str"),
    pytest.param(
        lambda: c.verify("reflection", m, d, 1.0, [d, d], rng()),
        id="c.verify children 2 reflection",
    ),
    pytest.param(lambda: c.sample("reflection", m, d, 1.0, 0, rng(), 10), id="c.sample nd 0"),
    pytest.param(lambda: c.sample("reflection", m, d, 1.0, 1, rng(), 0), id="c.sample size 0"),
    pytest.param(lambda: c.sample("reflection", m, d, 1.0, 1, rng(), -1), id="c.sample size -1"),
    pytest.param(lambda: c.sample("reflection", m, d, 1.0, 1, rng(), "3"), id="c.sample size str"),
    pytest.param(lambda: c.acceptance("reflection", -1.0), id="c.acceptance delta neg"),
    pytest.param(lambda: c.acceptance("reflection", float("nan")), id="c.acceptance delta nan"),
    pytest.param(lambda: c.acceptance("reflection", "x"), id="c.acceptance delta str"),
    pytest.param(lambda: c.acceptance("reflection", 1.0, 0), id="c.acceptance nd 0"),
    pytest.param(
        lambda: c.verify_chain(np.zeros((3, 2)), np.zeros((2, 2)), 1.0, [np.zeros(2)], rng()),
        id="c.verify_chain shapes",
    ),
    pytest.param(
        lambda: c.verify_chain(np.zeros((0, 2)), np.zeros((0, 2)), 1.0, [], rng()),
        id="c.verify_chain empty",
    ),
    pytest.param(
        lambda: c.verify_block(np.zeros((2, 2)), np.zeros((1, 2)), -1.0, [np.zeros(2)], rng()),
        id="c.verify_block std neg",
    ),
    pytest.param(lambda: wm.detect([1, 2, 3], "k", vocab_size=4), id="wm.detect key str"),
    pytest.param(lambda: wm.detect([1, 2, 3], -1, vocab_size=4), id="wm.detect key neg"),
    pytest.param(lambda: wm.detect([1, 2, 9], 1, vocab_size=4), id="wm.detect token oob"),
    pytest.param(lambda: wm.detect("abc", 1, vocab_size=4), id="wm.detect tokens str"),
    pytest.param(lambda: wm.detect([1, 2, 3], 1, vocab_size=4, window=0), id="wm.detect window 0"),
    pytest.param(lambda: wm.detect([1, 2, 3], 1, vocab_size=4, start=-1), id="wm.detect start -1"),
    pytest.param(lambda: wm.detect([1, 2, 3], 1, vocab_size=4, rows=0), id="wm.detect rows 0"),
    pytest.param(lambda: wm.detect([1, 2, 3], 1, vocab_size=0), id="wm.detect vocab 0"),
    pytest.param(lambda: wm.detect([1.5, 2, 3], 1, vocab_size=4), id="wm.detect tokens float"),
    pytest.param(lambda: ss.keyed.uniforms("k", [0], [0], [0]), id="keyed.uniforms key str"),
    pytest.param(lambda: ss.Shape.chain(True), id="Shape.chain bool"),
    pytest.param(lambda: ss.Shape.star(2, replacement="no"), id="Shape.star repl str"),
    pytest.param(lambda: ss.Shape.paths(2, -1), id="Shape.paths neg"),
    pytest.param(lambda: ss.Shape.top(()), id="Shape.top empty"),
    pytest.param(lambda: ss.Shape.greedy((0,)), id="Shape.greedy bad"),
    pytest.param(
        lambda: ss.DraftTree.from_draws([(5, 1)], law="iid"), id="DraftTree.from_draws bad parent"
    ),
    pytest.param(
        lambda: ss.DraftTree.from_draws([(0, -1)], law="iid"), id="DraftTree.from_draws neg tok"
    ),
    pytest.param(lambda: ss.DraftTree.from_draws("ab", law="iid"), id="DraftTree.from_draws str"),
    pytest.param(lambda: ss.pairs.Random(0, seed=0), id="pairs.Random vocab 0"),
    pytest.param(lambda: ss.pairs.Random("3", seed=0), id="pairs.Random vocab str"),
    pytest.param(lambda: ss.pairs.Random(3, seed="x"), id="pairs.Random seed str"),
    pytest.param(
        lambda: calculators.nss_expected_accepted(None, np.full((2, 3), 1 / 3)),
        id="nss_expected_accepted tree None",
    ),
    pytest.param(
        lambda: calculators.nss_expected_accepted(tree1, np.full((2, 3), np.nan)),
        id="nss_expected_accepted table nan",
    ),
    pytest.param(
        lambda: calculators.nss_expected_accepted(tree1, np.full((2, 3), 0.9)),
        id="nss_expected_accepted table mass 2.7",
    ),
    pytest.param(
        lambda: calculators.nss_expected_accepted(tree2, np.full((1, 3), 1 / 3)),
        id="nss_expected_accepted table short",
    ),
    pytest.param(
        lambda: calculators.nss_expected_accepted(tree1, np.full((3,), 1 / 3)),
        id="nss_expected_accepted table 1-D",
    ),
    pytest.param(
        lambda: calculators.nss_expected_accepted(tree7, np.full((2, 3), 1 / 3)),
        id="nss_expected_accepted token out of range",
    ),
    pytest.param(
        lambda: calculators.chain_expected_accepted(rand, 2, (9,)),
        id="chain_expected_accepted prefix out of range",
    ),
    pytest.param(
        lambda: calculators.chain_expected_accepted(pair, 2, "ab"),
        id="chain_expected_accepted prefix str",
    ),
    pytest.param(
        lambda: calculators.chain_expected_accepted(None, 2), id="chain_expected_accepted pair None"
    ),
    pytest.param(
        lambda: calculators.chain_expected_accepted([0.5, 0.5], 2),
        id="chain_expected_accepted pair list",
    ),
    pytest.param(
        lambda: calculators.block_expected_accepted(rand, 2, (9,)),
        id="block_expected_accepted prefix out of range",
    ),
    pytest.param(
        lambda: calculators.block_expected_accepted(None, 2), id="block_expected_accepted pair None"
    ),
    pytest.param(
        lambda: calculators.block_expected_accepted([0.5, 0.5], 2),
        id="block_expected_accepted pair list",
    ),
    pytest.param(
        lambda: sim.search_shape("nss", rand, 4, method="opt-tree", max_depth=0, num_trees=4),
        id="sim.search_shape opt-tree max_depth 0",
    ),
    pytest.param(lambda: sim.sweep("standard", pair, None, 10), id="sim.sweep shapes None"),
    pytest.param(lambda: sim.sweep("standard", pair, [], 10), id="sim.sweep shapes empty"),
    pytest.param(
        lambda: sim.sweep("standard", pair, [shape], 10, seed_per_shape="no"),
        id="sim.sweep seed_per_shape str",
    ),
    pytest.param(lambda: sim.Estimate.of([1.0, np.nan]), id="sim.Estimate.of nan"),
    pytest.param(lambda: sim.Estimate.of([1.0, np.inf]), id="sim.Estimate.of inf"),
    pytest.param(lambda: sim.OptTree(3, threshold=True), id="sim.OptTree threshold bool"),
    pytest.param(
        lambda: sim.estimate("standard", pair, shape, 10, generator=-1), id="sim.estimate gen -1"
    ),
    pytest.param(
        lambda: sim.pairs.Synthetic(vocab_size=4).roots(2, "x"), id="Synthetic.roots gen str"
    ),
]


@pytest.mark.parametrize("call", CALLS)
def test_bad_input_is_refused_naming_the_argument(call) -> None:
    with pytest.raises((ValueError, TypeError, KeyError)) as info:
        call()
    assert CLEAR.match(str(info.value)), f"{type(info.value).__name__}: {info.value}"


def test_the_sweep_is_wide() -> None:
    assert len(CALLS) >= 100


def test_output_paths_are_refused_the_same_way_on_every_surface(tmp_path, capsys) -> None:
    """One check per kind of output path (``check_output_file``/``check_output_dir``): the
    simulators' ``record`` and CLI, and ``models fetch --cache``, refuse a path under a regular
    file before any work, each naming its own argument."""
    from specsampling.gpu.hf.cli import models_main
    from specsampling.simulators.cli import main as simulate_main

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"^path: no directory .* to write into"):
        sim.record(
            "no-such-model", "no-such-model", ["x"], blocker / "trees.npz", shape=ss.Shape.chain(2)
        )
    with pytest.raises(ValueError, match=r"^path: expected a path, got int 3"):
        ss.validation.check_output_file(3, "path")
    assert simulate_main(["--json", str(blocker / "out.json")]) == 2
    assert "--json: no directory" in capsys.readouterr().err
    assert simulate_main(["--plots", str(blocker / "plots")]) == 2
    assert "--plots: cannot make the directory" in capsys.readouterr().err
    assert models_main(["--cache", str(blocker / "cache"), "fetch", "smollm2-135m"]) == 2
    assert "--cache: cannot make the directory" in capsys.readouterr().err


def test_expected_length_calculators_check_like_their_neighbours() -> None:
    """``nss_expected_accepted`` checks its table as ``conditional_emitted`` does, and the chain
    calculators check ``pair`` and ``prefix`` as ``expected_emitted`` does: same messages."""
    uniform = np.full((2, 3), 1 / 3)
    for table in (np.full((2, 3), np.nan), np.full((2, 3), 0.9)):
        with pytest.raises(ss.InvalidDistribution) as want:
            sim.conditional_emitted("nss", tree1, table, uniform)
        with pytest.raises(ss.InvalidDistribution) as got:
            calculators.nss_expected_accepted(tree1, table)
        assert str(got.value) == str(want.value)
    with pytest.raises(ss.InvalidDistribution, match=r"^target_probs: expected .* shape \(3, "):
        calculators.nss_expected_accepted(tree2, np.full((1, 3), 1 / 3))
    with pytest.raises(ss.InvalidDistribution, match=r"^tree: token id 7 >= vocab_size 3"):
        calculators.nss_expected_accepted(tree7, uniform)
    with pytest.raises(TypeError, match=r"^tree: expected a DraftTree, got NoneType"):
        calculators.nss_expected_accepted(None, uniform)
    # Valid tables still answer: nested lists as arrays, Fractions exactly.
    rows = [[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]]
    chain = ss.DraftTree.chain([1, 0])
    assert calculators.nss_expected_accepted(chain, rows) == 0.625
    half = [Fraction(1, 2), Fraction(1, 2)]
    exact = np.array([half, half, half], dtype=object)
    assert calculators.nss_expected_accepted(ss.DraftTree.chain([0, 1]), exact) == Fraction(3, 4)

    with pytest.raises(ss.InvalidDistribution) as want:
        ss.expected_emitted("standard", rand, ss.Shape.chain(2), (9,))
    assert str(want.value) == "prefix[0]: id 9 out of range [0, 3)"
    for calculator in (calculators.chain_expected_accepted, calculators.block_expected_accepted):
        with pytest.raises(ss.InvalidDistribution) as got:
            calculator(rand, 2, (9,))
        assert str(got.value) == str(want.value)
        with pytest.raises(TypeError, match=r"^pair: expected a model pair"):
            calculator(None, 2)
        with pytest.raises(ValueError, match=r"^length: expected an integer >= 0"):
            calculator(rand, -1)
        # A numpy prefix is a prefix; the value is that of the tuple.
        assert calculator(rand, 2, np.array([1])) == calculator(rand, 2, (1,))
