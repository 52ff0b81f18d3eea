"""The speed cost model (``specsampling.simulators.cost``): the round formula against
hand-computed costs, its identities, input checks, and timing tiny random Llamas."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import pytest

import specsampling as ss
from specsampling.simulators.cost import CostModel, _fit, level_tokens

#: Integer costs so every round below is exact: a forward costs fixed + per_token * B * n.
COSTS = CostModel(
    target_fixed=100, target_per_token=10, draft_fixed=7, draft_per_token=3, verify_per_node=1
)


# ----------------------------------------------------------------------------- the round
@pytest.mark.parametrize(
    ("shape", "levels", "nodes"),
    [
        (ss.Shape.chain(3), (1, 1, 1), 4),
        (ss.Shape.paths(2, 3), (1, 2, 2), 7),
        (ss.Shape.delayed(2, trunk=1, branch=2), (1, 1, 2), 6),
        (ss.Shape.branching((2, 2)), (1, 2), 7),
        (ss.Shape.star(3), (1,), 4),
        (ss.Shape.greedy((3, 2)), (1, 3), 10),
    ],
)
def test_level_tokens(shape, levels, nodes):
    assert level_tokens(shape) == levels
    assert 1 + len(shape.steps) == nodes


@pytest.mark.parametrize(
    ("shape", "batch_size", "expected"),
    [
        # 3 x (7 + 3 * 1) draft, 100 + 10 * 4 target, 4 verify
        (ss.Shape.chain(3), 1, 174),
        # 3 x (7 + 3 * 4), 100 + 10 * 16, 16
        (ss.Shape.chain(3), 4, 333),
        # (7 + 3) + 2 x (7 + 6), 100 + 10 * 7, 7
        (ss.Shape.paths(2, 3), 1, 213),
        # (7 + 12) + 2 x (7 + 24), 100 + 10 * 28, 28
        (ss.Shape.paths(2, 3), 4, 489),
        # trunk of 1 then two branches of 2: levels 1, 1, 2; 6 nodes
        # 2 x (7 + 3) + (7 + 6), 100 + 10 * 6, 6
        (ss.Shape.delayed(2, trunk=1, branch=2), 1, 199),
        # 2 x (7 + 12) + (7 + 24), 100 + 10 * 24, 24
        (ss.Shape.delayed(2, trunk=1, branch=2), 4, 433),
        # levels 1, 2; 1 + 2 + 4 nodes: (7 + 3) + (7 + 6), 100 + 70, 7
        (ss.Shape.branching((2, 2)), 1, 200),
        # (7 + 12) + (7 + 24), 100 + 280, 28
        (ss.Shape.branching((2, 2)), 4, 458),
    ],
)
def test_round_seconds_by_hand(shape, batch_size, expected):
    assert COSTS.round_seconds(shape, batch_size) == expected


def test_round_seconds_terms_separately():
    shape = ss.Shape.paths(2, 3)
    only = {
        "target_fixed": 1.0,  # one target forward
        "target_per_token": 7.0,  # 7 nodes
        "draft_fixed": 3.0,  # 3 levels
        "draft_per_token": 5.0,  # 1 + 2 + 2 tokens
        "verify_per_node": 7.0,
    }
    for name, expected in only.items():
        costs = {field: 0.0 for field in only} | {name: 1.0}
        if name not in ("target_fixed", "target_per_token"):
            costs["target_fixed"] = 1e-300  # a target forward must cost something
        assert CostModel(**costs).round_seconds(shape) == pytest.approx(expected, abs=1e-12)


def test_tokens_per_second_and_speedup_identities():
    shape = ss.Shape.delayed(2, trunk=1, branch=2)
    for batch_size in (1, 3):
        seconds = COSTS.round_seconds(shape, batch_size)
        fast = COSTS.tokens_per_second(2.75, shape, batch_size)
        assert fast == pytest.approx(batch_size * 2.75 / seconds, rel=1e-15)
        plain = COSTS.plain_tokens_per_second(batch_size)
        assert plain == pytest.approx(batch_size / (100 + 11 * batch_size), rel=1e-15)
        assert COSTS.speedup(2.75, shape, batch_size) == pytest.approx(fast / plain, rel=1e-15)
    # more accepted tokens per round is proportionally faster
    assert COSTS.tokens_per_second(4.0, shape) == pytest.approx(
        2 * COSTS.tokens_per_second(2.0, shape), rel=1e-15
    )


def test_relative_units_give_the_classic_chain_speedup():
    costs = CostModel.relative(draft_ratio=0.05)
    assert costs.as_dict() == {
        "target_fixed": 1.0,
        "target_per_token": 0.0,
        "draft_fixed": 0.05,
        "draft_per_token": 0.0,
        "verify_per_node": 0.0,
    }
    assert costs.plain_tokens_per_second() == 1.0
    assert costs.plain_tokens_per_second(8) == 8.0  # flat forwards: batching is free
    # Leviathan et al.: speedup = E[tau + 1] / (c * gamma + 1), gamma = 4, alpha = 0.8
    alpha, gamma = 0.8, 4
    efficiency = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    expected = efficiency / (0.05 * gamma + 1)
    assert costs.speedup(efficiency, ss.Shape.chain(gamma)) == pytest.approx(expected, rel=1e-12)


def test_relative_per_token_scales_both_models():
    costs = CostModel.relative(draft_ratio=0.5, per_token=0.1)
    assert (costs.target_fixed, costs.target_per_token) == (1.0, 0.1)
    assert (costs.draft_fixed, costs.draft_per_token) == (0.5, pytest.approx(0.05))
    # chain(2): two draft levels of 1 token, 3 target tokens
    assert costs.round_seconds(ss.Shape.chain(2)) == pytest.approx(2 * 0.55 + 1.3)
    # with per-token costs, a wide tree's speedup shrinks with the batch
    tree = ss.Shape.branching((4, 4))
    assert costs.speedup(3.0, tree, 16) < costs.speedup(3.0, tree, 1)


def test_str_prints_milliseconds():
    costs = CostModel(0.0125, 0.0005, 0.002, 0.00004, 0.000001)
    expected = (
        "CostModel(target 12.5 ms + 0.5 ms/token, draft 2 ms + 0.04 ms/token, verify 0.001 ms/node)"
    )
    assert str(costs) == repr(costs) == expected


def test_dict_round_trip_through_json():
    costs = CostModel(0.0125, 0.0005, 0.002, 0.00004, 0.000001)
    again = CostModel.from_dict(json.loads(json.dumps(costs.as_dict())))
    assert again == costs
    no_verify = {k: v for k, v in costs.as_dict().items() if k != "verify_per_node"}
    assert CostModel.from_dict(no_verify).verify_per_node == 0.0


def test_costs_are_stored_as_floats():
    costs = CostModel(1, np.float32(0.5), 0, np.int64(2))
    values = list(costs.as_dict().values())
    assert values == [1.0, 0.5, 0.0, 2.0, 0.0]
    assert all(type(v) is float for v in values)


# ----------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "field",
    ["target_fixed", "target_per_token", "draft_fixed", "draft_per_token", "verify_per_node"],
)
@pytest.mark.parametrize("value", [-1e-9, math.nan, math.inf, "1", None, True, 1j])
def test_constructor_refuses_bad_costs(field, value):
    costs = COSTS.as_dict() | {field: value}
    with pytest.raises(ValueError, match=rf"^{field}:"):
        CostModel(**costs)


def test_constructor_refuses_a_free_target():
    with pytest.raises(ValueError, match="target_fixed, target_per_token"):
        CostModel(0, 0, 1, 1)


def test_relative_refuses_negative_ratios():
    with pytest.raises(ValueError, match=r"^draft_ratio:"):
        CostModel.relative(draft_ratio=-0.1)
    with pytest.raises(ValueError, match=r"^per_token:"):
        CostModel.relative(per_token=math.nan)


@pytest.mark.parametrize("efficiency", [0.99, 0.0, 4.5, math.nan, "2", True])
def test_block_efficiency_must_be_a_possible_mean(efficiency):
    # chain(3) emits 1 to 4 tokens a round
    with pytest.raises(ValueError, match=r"^block_efficiency:"):
        COSTS.tokens_per_second(efficiency, ss.Shape.chain(3))
    with pytest.raises(ValueError, match=r"^block_efficiency:"):
        COSTS.speedup(efficiency, ss.Shape.chain(3))


def test_block_efficiency_bounds_are_inclusive():
    shape = ss.Shape.chain(3)
    assert COSTS.tokens_per_second(1, shape) == pytest.approx(1 / 174)
    assert COSTS.tokens_per_second(4, shape) == pytest.approx(4 / 174)


@pytest.mark.parametrize("batch_size", [0, -2, 1.5, True])
def test_batch_size_must_be_a_positive_int(batch_size):
    shape = ss.Shape.chain(2)
    for call in (
        lambda: COSTS.round_seconds(shape, batch_size),
        lambda: COSTS.tokens_per_second(2.0, shape, batch_size),
        lambda: COSTS.plain_tokens_per_second(batch_size),
        lambda: COSTS.speedup(2.0, shape, batch_size),
    ):
        with pytest.raises(ValueError, match=r"^batch_size:"):
            call()


def test_shape_must_be_a_shape():
    with pytest.raises(TypeError, match=r"^shape:"):
        COSTS.round_seconds("chain(3)")
    with pytest.raises(TypeError, match=r"^shape:"):
        level_tokens((3,))


def test_from_dict_names_bad_keys():
    with pytest.raises(ValueError, match=r"unknown cost\(s\) \['target'\]"):
        CostModel.from_dict(COSTS.as_dict() | {"target": 1.0})
    with pytest.raises(ValueError, match=r"missing cost\(s\) \['draft_fixed'\]"):
        CostModel.from_dict({k: v for k, v in COSTS.as_dict().items() if k != "draft_fixed"})
    with pytest.raises(ValueError, match=r"^data:"):
        CostModel.from_dict([1.0, 2.0])
    with pytest.raises(ValueError, match=r"^draft_fixed:"):
        CostModel.from_dict(COSTS.as_dict() | {"draft_fixed": -1})


# ----------------------------------------------------------------------------- the fit
def test_fit_recovers_an_exact_line():
    fixed, per_token = _fit([1, 2, 4, 8, 16], [2 + 0.5 * x for x in (1, 2, 4, 8, 16)])
    assert fixed == pytest.approx(2.0, rel=1e-12)
    assert per_token == pytest.approx(0.5, rel=1e-12)


def test_fit_keeps_both_costs_non_negative():
    # a falling line: flat at the mean time
    assert _fit([1, 2, 4], [3.0, 2.0, 1.0]) == pytest.approx((2.0, 0.0))
    # a line through below the origin: through the origin instead (sum xy / sum xx)
    xs, ys = [1, 2, 4], [0.0, 1.0, 3.0]
    assert _fit(xs, ys) == pytest.approx((0.0, 14 / 21))
    # one width: no slope to fit
    assert _fit([4, 4], [1.0, 3.0]) == pytest.approx((2.0, 0.0))


# ----------------------------------------------------------------------------- measure
@pytest.fixture
def one_thread():
    """Time on one intra-op thread: on a busy 2-core machine two threads wait on each other
    and the timings are mostly scheduling."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def llamas():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from proofs_tests.hf_models import tiny_causal_lm

    return {layers: tiny_causal_lm("llama", 0, vocab=64, layers=layers) for layers in (1, 12)}


def _one_token(costs, which):
    return getattr(costs, f"{which}_fixed") + getattr(costs, f"{which}_per_token")


def test_measure_without_a_draft(llamas, one_thread, capsys):
    costs = CostModel.measure(llamas[1], None, context=16, tokens=(1, 4), repeats=2, progress=True)
    assert costs.target_fixed >= 0 and costs.target_per_token >= 0
    assert _one_token(costs, "target") > 0
    assert (costs.draft_fixed, costs.draft_per_token, costs.verify_per_node) == (0.0, 0.0, 0.0)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("measure: target [1, 1] after 16: ")
    assert lines[1].startswith("measure: target [1, 4] after 16: ")
    assert all(line.endswith(" ms") for line in lines)


def test_measure_a_deeper_target_costs_more(llamas, one_thread):
    # 12 layers against 1, medians of 7: a wide margin, so that a worker preempted by the test
    # run's other workers cannot reverse the order
    costs = CostModel.measure(llamas[12], llamas[1], context=16, tokens=(1, 4), repeats=7)
    assert min(costs.as_dict().values()) >= 0
    assert _one_token(costs, "draft") > 0
    assert _one_token(costs, "target") > _one_token(costs, "draft")
    # and the measured model predicts a chain round slower than a plain step
    assert costs.round_seconds(ss.Shape.chain(2)) > 1 / costs.plain_tokens_per_second()


def test_measure_times_cached_forwards_after_the_context(llamas, one_thread):
    """Every forward after the prefill sees exactly ``context`` cached tokens and the positions
    after them: the cache is cropped back each time."""
    import torch

    from specsampling.gpu.hf.attention import forward_kwarg

    model = llamas[1]
    kwarg = forward_kwarg(model)
    seen, masks = [], []

    def record(module, args, kwargs):
        ids = kwargs["input_ids"]
        masks.append(kwargs["attention_mask"])
        seen.append(
            (
                tuple(ids.shape),
                kwargs[kwarg].get_seq_length(),
                kwargs["position_ids"][0].tolist(),
                int(ids.max()),
            )
        )

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        CostModel.measure(model, None, context=5, tokens=(1, 3), batch_size=2, repeats=2)
    finally:
        handle.remove()
    prefill = ((2, 5), 0, [0, 1, 2, 3, 4])
    ones = [((2, 1), 5, [5])] * 3  # a warm-up, then 2 timed
    threes = [((2, 3), 5, [5, 6, 7])] * 3
    assert [s[:3] for s in seen] == [prefill, *ones, *threes]
    assert max(s[3] for s in seen) < 64  # ids below the vocabulary
    # the decoder's kind of mask: additive, 4D, every cached slot visible, causal among the new
    visible = masks[-1] == 0  # [B, 1, 3, 5 + 3]
    assert visible.shape == (2, 1, 3, 8)
    expected = torch.ones((3, 8), dtype=torch.bool).tril(5)
    assert bool((visible == expected).all())
    assert bool((masks[0] == 0).squeeze(1)[0].equal(torch.ones((5, 5), dtype=torch.bool).tril()))


def test_measure_drops_the_warm_up(llamas, one_thread):
    """A slow first forward per width (compilation, allocation) is not timed."""

    model = llamas[1]
    calls = []

    def slow_warm_up(module, args, kwargs):
        width = kwargs["input_ids"].shape[1]
        if width != (calls[-1] if calls else None) and len(calls) > 0:
            time.sleep(0.2)
        calls.append(width)

    handle = model.register_forward_pre_hook(slow_warm_up, with_kwargs=True)
    try:
        costs = CostModel.measure(model, None, context=4, tokens=(1, 2), repeats=1)
    finally:
        handle.remove()
    assert calls == [4, 1, 1, 2, 2]  # prefill, then a warm-up and one timed forward per width
    assert _one_token(costs, "target") < 0.05


def test_measure_checks_its_arguments(llamas):
    model = llamas[1]
    for kwargs, name in [
        ({"tokens": ()}, "tokens"),
        ({"tokens": 4}, "tokens"),
        ({"tokens": (1, 0)}, r"tokens\[1\]"),
        ({"context": 0}, "context"),
        ({"batch_size": 0}, "batch_size"),
        ({"repeats": 0}, "repeats"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            CostModel.measure(model, None, **kwargs)
    with pytest.raises(TypeError, match="causal LM"):
        CostModel.measure(object(), None, context=4, tokens=(1,), repeats=1)


def test_measured_model_is_an_ordinary_cost_model(llamas, one_thread):
    costs = CostModel.measure(llamas[1], llamas[1], context=8, tokens=(1, 2), repeats=1)
    with_verifier = dataclasses.replace(costs, verify_per_node=1e-4)
    shape = ss.Shape.chain(3)
    assert with_verifier.round_seconds(shape) == pytest.approx(
        costs.round_seconds(shape) + 4e-4, rel=1e-12
    )
    assert CostModel.from_dict(costs.as_dict()) == costs
