"""Input validation at every public entry point: the error type, and a message naming the argument.

The contract (``docs/architecture.md``): one validator, ``InvalidDistribution`` is a ``ValueError``,
tolerance 1e-6 for floats, exact for Fractions; ``UnsupportedShape`` instead of a silently biased
verification.
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from specsampling import calculators
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.validation import check_distribution, check_rows, check_token

GOOD = [0.5, 0.25, 0.25]
GOOD_EXACT = [F(1, 2), F(1, 4), F(1, 4)]

# (bad distribution, fragment the message must contain)
BAD_DISTRIBUTIONS = [
    pytest.param([[0.5, 0.25, 0.25]], "1-D", id="2-D"),
    pytest.param([], "non-empty", id="empty"),
    pytest.param(0.5, "1-D", id="scalar"),
    pytest.param([math.nan, 0.5, 0.5], "NaN", id="nan"),
    pytest.param([math.inf, 0.0, 0.0], "inf", id="inf"),
    pytest.param([-math.inf, 1.0, 1.0], "inf", id="-inf"),
    pytest.param([1.25, -0.25, 0.0], "negative", id="negative"),
    pytest.param([0.5, 0.6, 0.0], "mass", id="mass-over"),
    pytest.param([0.5, 0.25, 0.2], "mass", id="mass-under"),
    pytest.param([0.5, 0.25, 0.25 + 2e-6], "mass", id="mass-just-over-tolerance"),
    pytest.param([0.0, 0.0, 0.0], "mass", id="all-zero"),
    pytest.param(["a", "b", "c"], "real numbers", id="strings"),
    pytest.param([F(1, 2), F(1, 3), F(1, 7)], "exact mass", id="fraction-mass"),
    pytest.param([F(1, 2), F(1, 2), F(1, 10**12)], "exact mass", id="fraction-mass-tiny"),
    pytest.param([F(3, 2), F(-1, 2), F(0)], "negative", id="fraction-negative"),
    pytest.param([F(1, 2), math.nan, F(1, 2)], "exact", id="fraction-with-nan"),
]


def _entry_points():
    """Public calls taking ``(target, draft)``; each must validate both arguments."""
    return {
        "acceptance": lambda t, d: ss.acceptance("nss", t, d, 2),
        "acceptance-rsd": lambda t, d: ss.acceptance("rsd", t, d, 2),
        "output_law": lambda t, d: ss.output_law("specinfer", t, d, 2),
        "Stationary": lambda t, d: ss.pairs.Stationary(t, d),
        "standard_acceptance": lambda t, d: calculators.standard_acceptance(t, d),
        "nss_acceptance": lambda t, d: calculators.nss_acceptance(t, d, 2),
        "specinfer_acceptance": lambda t, d: calculators.specinfer_acceptance(t, d, 2),
        "Table": lambda t, d: ss.pairs.Table({(): (t, d)}),
    }


ENTRY_POINTS = _entry_points()


def _good_like(bad):
    """A valid distribution of the same kind (exact or float) as ``bad``."""
    exact = isinstance(bad, list) and any(isinstance(x, F) for x in bad)
    return GOOD_EXACT if exact else GOOD


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize(("bad", "fragment"), BAD_DISTRIBUTIONS)
def test_bad_target_is_named(entry, bad, fragment):
    call = ENTRY_POINTS[entry]
    with pytest.raises(ss.InvalidDistribution, match=fragment) as info:
        call(bad, _good_like(bad))
    assert "target" in str(info.value)
    assert "draft" not in str(info.value)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize(("bad", "fragment"), BAD_DISTRIBUTIONS)
def test_bad_draft_is_named(entry, bad, fragment):
    call = ENTRY_POINTS[entry]
    with pytest.raises(ss.InvalidDistribution, match=fragment) as info:
        call(_good_like(bad), bad)
    assert "draft" in str(info.value)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_vocab_mismatch_is_named(entry):
    with pytest.raises(ss.InvalidDistribution, match="vocabulary mismatch") as info:
        ENTRY_POINTS[entry]([0.5, 0.25, 0.25], [0.5, 0.5])
    assert "draft" in str(info.value)


def test_invalid_distribution_is_a_value_error():
    assert issubclass(ss.InvalidDistribution, ValueError)
    assert issubclass(ss.UnsupportedShape, ValueError)


def test_table_names_prefix_and_role():
    with pytest.raises(ss.InvalidDistribution, match=r"mapping\[\(0,\)\]\.draft"):
        ss.pairs.Table({(): (GOOD, GOOD), (0,): (GOOD, [0.5, 0.5, 0.5])})
    with pytest.raises(ss.InvalidDistribution, match="vocabulary mismatch"):
        ss.pairs.Table({(): (GOOD, GOOD), (0,): ([0.5, 0.5], [0.5, 0.5])})


def test_float_tolerance_is_one_in_a_million():
    within = [0.5, 0.25, 0.25 + 5e-7]
    assert check_distribution(within, "target").dtype == np.float64
    assert ss.pairs.Stationary(within, GOOD).vocab_size == 3
    with pytest.raises(ss.InvalidDistribution, match="target: mass"):
        check_distribution([0.5, 0.25, 0.25 - 2e-6], "target")


def test_exact_inputs_stay_exact():
    out = check_distribution([F(1, 3), F(2, 3), 0], "target")
    assert out.dtype == object
    assert all(isinstance(x, F) for x in out)
    assert sum(out) == 1


def test_mixing_exact_and_float_pairs_is_refused():
    with pytest.raises(ValueError, match="mixed"):
        ss.pairs.Stationary(GOOD_EXACT, GOOD)
    with pytest.raises(ValueError, match="mixed"):
        ss.pairs.Stationary(GOOD, GOOD_EXACT)
    with pytest.raises(ValueError, match="mixed"):
        calculators.specinfer_acceptance(GOOD_EXACT, GOOD, 2)


@pytest.mark.parametrize(
    ("token", "fragment"),
    [
        (4, "out of range"),
        (-1, "out of range"),
        (100, "out of range"),
        (True, "integers"),
        (1.0, "integers"),
        ("1", "integers"),
        (None, "integers"),
    ],
)
def test_check_token_rejects(token, fragment):
    with pytest.raises(ss.InvalidDistribution, match=f"draft_token: .*{fragment}"):
        check_token(token, "draft_token", 4)


def test_check_token_accepts_numpy_ints():
    assert check_token(np.int64(3), "token", 4) == 3
    assert type(check_token(np.int32(0), "token", 4)) is int


@pytest.mark.parametrize(
    "value", [1.0, -1e-300, -0.5, 1.5, math.nan, math.inf], ids=lambda v: repr(v)
)
def test_noise_out_of_unit_interval(value):
    with pytest.raises(ss.InvalidDistribution, match=r"noise\.accept"):
        ss.Noise.checked([0.5, value], [0.5, 0.5], 2)
    with pytest.raises(ss.InvalidDistribution, match=r"noise\.sample"):
        ss.Noise.checked([0.5, 0.5], [value, 0.5], 2)
    with pytest.raises(ss.InvalidDistribution):
        ss.Noise.constant(value, 3)


def test_noise_boundaries_and_shape():
    noise = ss.Noise.checked([0.0, LARGEST_BELOW_ONE], [LARGEST_BELOW_ONE, 0.0], 2)
    assert noise.accept[1] == LARGEST_BELOW_ONE < 1.0
    with pytest.raises(ss.InvalidDistribution, match=r"noise\.accept: expected shape \(3,\)"):
        ss.Noise.checked([0.5, 0.5], [0.5, 0.5, 0.5], 3)


NUM_DRAFTS_CALLS = {
    "acceptance": lambda k: ss.acceptance("nss", GOOD, GOOD, k),
    "output_law": lambda k: ss.output_law("nss", GOOD, GOOD, k),
    "nss_acceptance": lambda k: calculators.nss_acceptance(GOOD, GOOD, k),
    "specinfer_acceptance": lambda k: calculators.specinfer_acceptance(GOOD, GOOD, k),
    "Shape.star": lambda k: ss.Shape.star(k),
    "Shape.paths": lambda k: ss.Shape.paths(k, 2),
    "Shape.delayed": lambda k: ss.Shape.delayed(k, trunk=1, branch=1),
}


@pytest.mark.parametrize("call", sorted(NUM_DRAFTS_CALLS))
@pytest.mark.parametrize("num_drafts", [0, -1, 1.5, True, "2", None], ids=repr)
def test_bad_num_drafts(call, num_drafts):
    with pytest.raises(ValueError, match="num_drafts"):
        NUM_DRAFTS_CALLS[call](num_drafts)


def test_unknown_scheme_lists_registered_names():
    with pytest.raises(KeyError) as info:
        ss.SCHEMES["no-such-scheme"]
    message = str(info.value)
    assert "no-such-scheme" in message
    for name in ("standard", "nss", "specinfer", "rsd"):
        assert name in message
    with pytest.raises(KeyError, match="specinfer"):
        ss.acceptance("spec-infer", GOOD, GOOD, 2)
    with pytest.raises(TypeError, match="scheme"):
        ss.get_scheme(3)


STANDARD_PAIR = ss.pairs.Stationary(GOOD, [0.25, 0.25, 0.5])

UNSUPPORTED = [
    ("standard", ss.Shape.star(2)),
    ("standard", ss.Shape.star(2, replacement=False)),
    ("standard", ss.Shape.paths(2, 2)),
    ("standard", ss.Shape.top((1,))),
    ("standard", ss.Shape.top((2, 1))),
    ("rsd", ss.Shape.star(2)),
    ("rsd", ss.Shape.paths(2, 1)),
    ("rsd", ss.Shape.delayed(2, trunk=1, branch=1)),
    ("rsd", ss.Shape.top((2,))),
    ("specinfer", ss.Shape.star(2, replacement=False)),
    ("specinfer", ss.Shape.branching((2, 2))),
    ("specinfer", ss.Shape.top((2,))),
]


@pytest.mark.parametrize(("name", "shape"), UNSUPPORTED, ids=lambda x: repr(x))
def test_unsupported_shape_is_refused_everywhere(name, shape):
    scheme = ss.SCHEMES[name]
    assert scheme.supports(shape) is False
    rng = np.random.default_rng(0)
    calls = [
        lambda: ss.round_law(name, STANDARD_PAIR, shape),
        lambda: ss.expected_emitted(scheme, STANDARD_PAIR, shape),
        lambda: ss.lossless_error(name, STANDARD_PAIR, shape),
        lambda: ss.speculate(name, STANDARD_PAIR, shape, rng),
        lambda: ss.generate(name, STANDARD_PAIR, shape, 3, rng),
        lambda: list(scheme.outcomes(STANDARD_PAIR, shape, ())),
    ]
    for call in calls:
        with pytest.raises(ss.UnsupportedShape, match=name) as info:
            call()
        assert repr(shape) in str(info.value)


def test_single_position_refusals():
    with pytest.raises(ss.UnsupportedShape, match="standard"):
        ss.acceptance("standard", GOOD, GOOD, 2)
    with pytest.raises(ss.UnsupportedShape, match="standard"):
        ss.output_law("standard", GOOD, GOOD, 2)


@pytest.mark.parametrize(
    "shape",
    [ss.Shape.chain(2), ss.Shape.star(1), ss.Shape.paths(1, 2), ss.Shape.branching((1, 1))],
    ids=repr,
)
def test_every_scheme_supports_chains(shape):
    for name, scheme in ss.SCHEMES.items():
        assert scheme.supports(shape), name


def test_nss_supports_every_shape():
    nss = ss.SCHEMES["nss"]
    for _, shape in UNSUPPORTED:
        assert nss.supports(shape)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ss.Shape.chain(0),
        lambda: ss.Shape.chain(1.0),
        lambda: ss.Shape.paths(2, 0),
        lambda: ss.Shape.branching(()),
        lambda: ss.Shape.branching((2, 0)),
        lambda: ss.Shape.delayed(2, trunk=-1, branch=1),
        lambda: ss.Shape.delayed(2, trunk=1, branch=0),
        lambda: ss.Shape.top(()),
        lambda: ss.Shape.top((1, -2)),
    ],
)
def test_bad_shape_arguments(make):
    with pytest.raises(ValueError):
        make()


def test_bad_lengths_and_rng():
    pair = ss.pairs.Stationary(GOOD, GOOD)
    with pytest.raises(ValueError, match="length"):
        ss.stream_law("nss", pair, ss.Shape.chain(1), 0)
    with pytest.raises(ValueError, match="length"):
        ss.generate("nss", pair, ss.Shape.chain(1), 0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        ss.speculate("nss", pair, ss.Shape.chain(1), np.random.RandomState(0))
    with pytest.raises(ValueError, match="vocab_size"):
        ss.pairs.Random(1)
    with pytest.raises(ValueError, match="seed"):
        ss.pairs.Random(3, seed=-1)


# ---------------------------------------------------------------- bad input

NOT_REAL = [
    pytest.param(["0.5", "0.5", "0"], "a string", id="numeric-strings"),
    pytest.param([True, False, False], "a bool", id="bools"),
    pytest.param([1.0, False, 0.0], "a bool", id="bool-among-floats"),
    pytest.param(np.array([True, False, False]), "booleans", id="bool-array"),
    pytest.param([0.5 + 0j, 0.5, 0.0], "complex", id="complex"),
    pytest.param(np.array([0.5 + 1j, 0.5, 0.0]), "complex", id="complex-array"),
    pytest.param(np.array(["0.5", "0.5", "0"]), "strings", id="string-array"),
    pytest.param([F(1, 2), True, False], "a bool", id="fraction-with-bools"),
    pytest.param([F(1, 2), "1/2", 0], "a string", id="fraction-with-string"),
    pytest.param([F(1, 2), 0.5j, 0], "complex", id="fraction-with-complex"),
    pytest.param([[0.5], [0.25, 0.25]], "nested", id="ragged"),
    pytest.param(None, "None", id="none"),
    pytest.param("0.5,0.5", "str", id="string"),
    pytest.param({0: 0.5, 1: 0.5}, "dict", id="dict"),
]


@pytest.mark.parametrize(("bad", "fragment"), NOT_REAL)
def test_non_real_entries_are_refused_not_coerced(bad, fragment):
    """Strings, bools and complex numbers were silently turned into probabilities."""
    with pytest.raises(ss.InvalidDistribution, match=f"target: .*{fragment}"):
        check_distribution(bad, "target")
    for entry in ("Stationary", "acceptance", "Table"):
        with pytest.raises(ss.InvalidDistribution, match="real numbers"):
            ENTRY_POINTS[entry](GOOD, [0.5, 0.5j, 0.0])


def test_real_number_kinds_still_accepted():
    np.testing.assert_array_equal(check_distribution([1, 0], "t"), [1.0, 0.0])
    np.testing.assert_array_equal(check_distribution(np.array([1, 0]), "t"), [1.0, 0.0])
    np.testing.assert_array_equal(check_distribution([np.float32(0.5), 0.5], "t"), [0.5, 0.5])
    np.testing.assert_array_equal(check_distribution(np.array([0.5, 0.5], object), "t"), [0.5, 0.5])
    exact = check_distribution([F(1, 2), np.int64(0), F(1, 2)], "t")
    assert exact.dtype == object and list(exact) == [F(1, 2), 0, F(1, 2)]


def test_accepted_near_normalised_input_comes_back_normalised():
    """Mutation survivor: skipping the renormalisation left round laws at 1 + 4e-7."""
    rng = np.random.default_rng(0)
    for vocab_size in (3, 10, 100):
        weights = rng.dirichlet(np.ones(vocab_size)) * (1 + 4e-7)
        assert abs(weights.sum() - 1) > 1e-7
        out = check_distribution(weights, "target")
        assert abs(math.fsum(out) - 1) <= 1e-15
        np.testing.assert_allclose(out, weights / (1 + 4e-7), rtol=1e-14)
        pair = ss.pairs.Stationary(weights, weights[::-1])
        assert abs(math.fsum(pair.draft(())) - 1) <= 1e-15
        law = ss.round_law("standard", pair, ss.Shape.chain(1))
        assert abs(math.fsum(law.values()) - 1) <= 1e-14


@pytest.mark.parametrize(
    ("mass", "shown"),
    [
        (1 + 2e-6, "mass is 1.000002, not 1 (off by 2e-06, tolerance 1e-06)"),
        (1 - 3e-3, "mass is 0.997, not 1 (off by 0.003, tolerance 1e-06)"),
        (1 + 1.5e-9, "tolerance 1e-09"),
        (1.1, "mass is 1.1, not 1 (tolerance 1e-06)"),
    ],
)
def test_mass_message_is_true(mass, shown):
    """It said "mass is 1, not 1 (tolerance 1e-06)" for float32 softmax output."""
    tolerance = 1e-9 if "1e-09" in shown else 1e-6
    probs = [mass - 0.5, 0.5]
    with pytest.raises(ss.InvalidDistribution) as info:
        check_distribution(probs, "target", tolerance=tolerance)
    message = str(info.value)
    assert shown in message
    assert "mass is 1, not 1" not in message
    printed = float(message.split("mass is ")[1].split(",")[0])
    assert printed != 1.0  # enough digits to show the deviation
    if abs(mass - 1) < 0.05:
        assert "tolerance=" in message and "--tolerance" in message
    else:
        assert "tolerance=" not in message


def test_mass_far_above_one_hints_at_logits():
    with pytest.raises(ss.InvalidDistribution, match="logits"):
        check_distribution([2.0, 1.0, 0.0], "target")
    with pytest.raises(ss.InvalidDistribution, match=r"negative entry.*process"):
        check_distribution([-1.0, 2.0, 0.0], "target")


def _low_precision(dtype, vocab_size=32_000, seed=0):
    """A softmax computed in ``dtype`` throughout, as a model's output layer does."""
    logits = (np.random.default_rng(seed).normal(size=vocab_size) * 3).astype(dtype)
    probs = np.exp(logits - logits.max())
    return probs / probs.sum(dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_probabilities_pass_with_a_stated_tolerance(dtype):
    probs = _low_precision(dtype)
    error = abs(math.fsum(probs.astype(np.float64)) - 1)
    assert error > 0  # the case is real: the float64 mass is off
    if dtype == np.float16:
        assert error > 1e-6
        with pytest.raises(ss.InvalidDistribution, match=r"target: mass is .*tolerance="):
            check_distribution(probs, "target")
    loose = check_distribution(probs, "target", tolerance=1e-2)
    assert loose.dtype == np.float64 and abs(math.fsum(loose) - 1) <= 1e-12
    other = _low_precision(dtype, seed=1)
    _, draft = ss.validation.check_pair(probs, other, tolerance=1e-2)
    assert abs(math.fsum(draft) - 1) <= 1e-12
    pair = ss.pairs.Stationary(probs, other, tolerance=1e-2)
    assert abs(math.fsum(pair.target(())) - 1) <= 1e-12
    table = ss.pairs.Table({(): (probs, other)}, tolerance=1e-2)
    np.testing.assert_array_equal(table.target(()), pair.target(()))


def test_bf16_sized_error_is_refused_by_default_and_named():
    probs = np.full(4, 0.25)
    probs[0] += 2e-3  # bf16 softmax over 150k tokens is off by up to ~3e-3
    with pytest.raises(ss.InvalidDistribution, match=r"target: mass is 1\.002, not 1") as info:
        ss.pairs.Stationary(probs, [*GOOD, 0.0])
    assert "tolerance=0.01" in str(info.value)
    assert ss.pairs.Stationary(probs, [*GOOD, 0.0], tolerance=1e-2).vocab_size == 4
    with pytest.raises(ss.InvalidDistribution, match=r"tolerance 0\.001"):
        check_distribution(probs, "target", tolerance=1e-3)


def test_exact_input_ignores_the_tolerance():
    with pytest.raises(ss.InvalidDistribution, match="exact mass"):
        check_distribution([F(1, 2), F(1, 2), F(1, 10**9)], "target", tolerance=1e-2)


@pytest.mark.parametrize("tolerance", [-1e-6, math.nan, "1e-3", None, True])
def test_bad_tolerance(tolerance):
    with pytest.raises(ValueError, match="tolerance"):
        check_distribution(GOOD, "target", tolerance=tolerance)
    with pytest.raises(ValueError, match="tolerance"):
        ss.pairs.Stationary(GOOD, GOOD, tolerance=tolerance)


# ---------------------------------------------------------------- check_rows


def test_check_rows_accepts_tables_without_copying():
    table = np.array([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    before = table.copy()
    assert check_rows(table, "target_probs", 3) is None
    np.testing.assert_array_equal(table, before)
    check_rows(table.astype(np.float32), "target_probs")
    check_rows(np.array([[1, 0], [0, 1]]), "target_probs")
    check_rows(np.array([[0.5, 0.5 + 5e-7]]), "target_probs")
    check_rows(np.array([[0.5, 0.5 + 5e-4]]), "target_probs", tolerance=1e-3)
    check_rows(np.array([[F(1, 3), F(2, 3)], [F(1), F(0)]], dtype=object), "draft_probs", 2)
    check_rows(np.empty((0, 3)), "target_probs")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([[0.5, 0.5], [math.nan, 1.0]], r"target_probs\[1\]: NaN or inf at index 0"),
        ([[0.5, 0.5], [0.5, math.inf]], r"target_probs\[1\]: NaN or inf at index 1"),
        ([[0.5, 0.5], [1.5, -0.5]], r"target_probs\[1\]: negative entry at index 1 .*logits"),
        ([[2.3, -0.7], [0.5, 0.5]], r"target_probs\[0\]: negative"),  # raw logits
        ([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [5.0, 5.0]], r"target_probs\[3\]: mass is 10,"),
        ([[0.5, 0.5], [0.5, 0.5 + 2e-6]], r"target_probs\[1\]: mass is 1.000002"),
        ([[0.0, 0.0]], r"target_probs\[0\]: mass is 0"),
        ([0.5, 0.5], r"expected shape \(num_rows, vocab_size\)"),
        ([[[0.5, 0.5]]], r"expected shape \(num_rows, vocab_size\)"),
        (np.zeros((2, 0)), r"expected shape \(num_rows, vocab_size\)"),
        ([[0.5, 0.25, 0.25]], "vocabulary mismatch, 3 columns but vocab_size is 2"),
        (np.array([[True, False]]), "real numbers"),
        (np.array([[0.5 + 0j, 0.5]]), "complex"),
        ([["0.5", "0.5"]], "real numbers"),
        (np.array([[F(1, 2), F(1, 3)]], dtype=object), r"target_probs\[0\]: exact mass is 5/6"),
        (np.array([[F(3, 2), F(-1, 2)]], dtype=object), r"target_probs\[0\]: negative"),
        (np.array([[F(1, 2), 0.5]], dtype=object), "mixes exact"),
    ],
)
def test_check_rows_names_the_row_and_the_defect(table, message):
    if isinstance(table, list):
        table = np.array(table)
    with pytest.raises(ss.InvalidDistribution, match=message):
        check_rows(table, "target_probs", 2)


def test_check_rows_reports_the_first_bad_row():
    table = np.full((6, 4), 0.25)
    table[4] = [1.0, 1.0, 1.0, 1.0]
    table[2, 1] = math.nan
    with pytest.raises(ss.InvalidDistribution, match=r"draft_probs\[2\]: NaN"):
        check_rows(table, "draft_probs")


def test_torch_tensors_are_read_and_bf16_is_named():
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(check_distribution(torch.tensor(GOOD), "target"), GOOD)
    with pytest.raises(ss.InvalidDistribution, match=r"target: cannot convert .*float\(\)"):
        check_distribution(torch.tensor(GOOD, dtype=torch.bfloat16), "target")


# ----------------------------------------------------------------- one check per kind of argument
def test_a_prefix_is_checked_alike_on_every_surface() -> None:
    """A prefix with an id >= V (or a string) is refused by the numpy reference, the torch
    backend and the simulators, with the same message from one helper."""
    torch = pytest.importorskip("torch")
    import specsampling.gpu as ssg
    from specsampling import simulators as sim

    pair = ss.pairs.Random(vocab_size=4, seed=0)
    shape = ss.Shape.chain(2)
    rng = np.random.default_rng(0)
    calls = {
        "ss.speculate": lambda p: ss.speculate("standard", pair, shape, rng, prefix=p),
        "ss.generate": lambda p: ss.generate("standard", pair, shape, 3, rng, prefix=p),
        "ssg.speculate": lambda p: ssg.speculate(
            "standard", pair, shape, 1, torch.Generator().manual_seed(0), p, 1
        ),
        "ssg.generate": lambda p: ssg.generate("gumbel", pair, shape, 3, key=1, prefix=p),
        "sim.estimate": lambda p: sim.estimate(
            "standard", pair, shape, num_trees=4, generator=0, prefix=p, progress=False
        ),
    }
    for label, call in calls.items():
        with pytest.raises(
            ss.InvalidDistribution, match=r"prefix\[1\]: id 9 out of range \[0, 4\)"
        ):
            call([1, 9])
        with pytest.raises(TypeError, match="prefix: expected a sequence of token ids"):
            call("ab")
        assert call([1, 2]) is not None, label


def test_one_name_is_never_iterated_per_character() -> None:
    from specsampling import simulators as sim

    pair = ss.pairs.Random(vocab_size=4, seed=0)
    out = sim.compare(
        "traversal", pair, ss.Shape.chain(2), num_trees=4, generator=0, progress=False
    )
    assert list(out.estimates) == ["traversal"]
    chains = sim.candidate_shapes("traversal", 3, families="chain")
    assert [repr(s) for s in chains] == ["chain(1)", "chain(2)", "chain(3)"]
    with pytest.raises(ValueError, match="schemes: expected at least one"):
        sim.compare([], pair, ss.Shape.chain(2), num_trees=4)


def test_empty_batches_grids_and_recorded_searches_are_refused() -> None:
    from specsampling import simulators as sim

    pair = ss.pairs.Random(vocab_size=4, seed=0)
    with pytest.raises(ValueError, match="batch_size: expected an integer >= 1"):
        sim.estimate("nss", pair, ss.Shape.chain(2), num_trees=4, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="delayed_grid: no shape"):
        sim.delayed_grid([0], [0], [0])
    recorded = sim.RecordedTrees.from_pair(pair, ss.Shape.paths(2, 2), 8, generator=0)
    with pytest.raises(ValueError, match=r"source: recorded trees hold one drafted shape"):
        sim.search_shape("traversal", recorded, budget=4)


def test_an_unknown_scheme_names_the_argument_and_is_both_error_kinds() -> None:
    """``get_scheme`` (and every entry point that resolves a name) says ``scheme:`` and lists
    the registered names; the error is a ``KeyError`` (mapping lookups) and a ``ValueError``
    (argument checks), printed without the quotes ``KeyError`` adds."""
    for call in (
        lambda: ss.get_scheme("stndard"),
        lambda: ss.speculate("stndard", ss.pairs.Random(3, seed=0), ss.Shape.chain(1), 0),
        lambda: ss.acceptance("stndard", GOOD, GOOD, 2),
    ):
        with pytest.raises(KeyError) as info:
            call()
        assert isinstance(info.value, ValueError)
        assert str(info.value).startswith("scheme: unknown scheme 'stndard'; registered: [")
        assert "'standard'" in str(info.value)


def test_exact_engines_check_shape_and_prefix() -> None:
    """A shape that is not a Shape, and a prefix holding an id >= V, are refused by the exact
    engines before any work (they used to fail on ``shape.depth`` or ignore the prefix)."""
    from specsampling.optimal import lp_acceptance

    pair = ss.pairs.Stationary(GOOD, [0.2, 0.3, 0.5])
    shape = ss.Shape.chain(2)
    with pytest.raises(TypeError, match=r"^shape: expected a specsampling.Shape, got 5$"):
        ss.lossless_error("standard", pair, 5)
    with pytest.raises(TypeError, match=r"^shape: expected a specsampling.Shape, got 'x'$"):
        lp_acceptance(GOOD, GOOD, 2, shape="x")
    for call in (
        lambda: ss.expected_emitted("standard", pair, shape, prefix=(7,)),
        lambda: ss.round_law("standard", pair, shape, (0, 3)),
        lambda: ss.lossless_error("standard", pair, shape, prefix=(7,)),
        lambda: ss.stream_law("standard", pair, shape, 2, prefix=(7,)),
    ):
        with pytest.raises(ss.InvalidDistribution, match=r"^prefix\[\d\]: id [37] out of range"):
            call()
    assert ss.expected_emitted("standard", pair, shape, prefix=(2,)) > 1


def test_simulator_flags_and_unused_costs_are_refused() -> None:
    """``progress="no"`` (truthy) and a cost model the objective never reads were accepted
    silently; ``batch_size=0`` in the shape search too."""
    from specsampling import simulators as sim

    pair = ss.pairs.Random(vocab_size=4, seed=0)
    shape = ss.Shape.chain(2)
    with pytest.raises(ValueError, match=r"^progress: expected True, False or None, got 'no'$"):
        sim.estimate("nss", pair, shape, num_trees=4, progress="no")
    with pytest.raises(ValueError, match=r"^progress: expected True, False or None"):
        sim.search_shape("nss", pair, budget=2, progress="no")
    cost = sim.CostModel(1.0, 0.1, 0.5, 0.05)
    with pytest.raises(ValueError, match=r"^cost: only the tokens-per-second objective uses"):
        sim.search_shape("nss", pair, budget=2, cost=cost)
    with pytest.raises(TypeError, match=r"^cost: expected a specsampling.simulators.CostModel"):
        sim.search_shape("nss", pair, budget=2, objective="tokens-per-second", cost="x")
    with pytest.raises(ValueError, match=r"^batch_size: expected an integer >= 1, got 0$"):
        sim.search_shape("nss", pair, budget=2, batch_size=0)


@pytest.mark.parametrize(
    ("draws", "says"),
    [
        ("ab", r"^draws: expected \(parent_node, token\) pairs, got 'ab'$"),
        ([(0, 1), 3], r"^draws\[1\]: expected a \(parent_node, token\) pair, got 3$"),
        ([(0, 1, 2)], r"^draws\[0\]: expected a \(parent_node, token\) pair"),
        (["ab"], r"^draws\[0\]: expected a \(parent_node, token\) pair, got 'ab'$"),
    ],
)
def test_draws_that_are_not_pairs_are_named(draws, says) -> None:
    """A string of draws was unpacked per character ("not enough values to unpack")."""
    with pytest.raises(TypeError, match=says):
        ss.DraftTree.from_draws(draws, law="iid")
