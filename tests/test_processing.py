"""``ss.process``: temperature, top-k, top-p, checked against an independent pure-Python version.

Peer bugs covered: one processing function, same order for target and draft
(vllm-project/vllm#10198); 1-D and batched 2-D inputs give identical rows (SafeAILab/EAGLE#215).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import specsampling as ss


def reference_process(logits, temperature=1.0, top_k=None, top_p=None):
    """Pure-Python processing of one row, written from the docstring, for comparison.

    Softmax of ``logits / temperature``; keep the ``top_k`` most probable tokens (ties: lower id);
    renormalise; keep the smallest prefix of the ranking whose mass reaches ``top_p``; renormalise.
    """
    logits = [float(x) for x in logits]
    if temperature == 0:
        best = max(range(len(logits)), key=lambda i: (logits[i], -i))
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    finite = [x for x in logits if x != -math.inf]
    top = max(finite)
    weights = [0.0 if x == -math.inf else math.exp((x - top) / temperature) for x in logits]
    probs = [w / math.fsum(weights) for w in weights]
    ranking = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    kept = [i for i in ranking if probs[i] > 0]
    if top_k is not None:
        kept = kept[:top_k]
    if top_p is not None:
        mass = math.fsum(probs[i] for i in kept)
        chosen, acc = [], 0.0
        for i in kept:
            chosen.append(i)
            acc += probs[i] / mass
            if acc >= top_p - 1e-12:
                break
        kept = chosen
    total = math.fsum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


LOGITS = [0.3, -1.2, 2.0, 0.0, 1.1, -0.4]


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 1.9, 10.0])
def test_softmax_matches_formula(temperature):
    got = ss.process(LOGITS, temperature=temperature)
    expected = np.exp(np.array(LOGITS) / temperature)
    expected /= expected.sum()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(got, reference_process(LOGITS, temperature), rtol=1e-12)


def test_softmax_is_shift_invariant_and_handles_huge_logits():
    shifted = ss.process(np.array(LOGITS) + 700.0)
    np.testing.assert_allclose(shifted, ss.process(LOGITS), rtol=1e-12)
    out = ss.process([1000.0, 0.0, -1000.0])
    assert np.all(np.isfinite(out))
    assert out[0] == 1.0


def test_temperature_zero_is_one_hot_on_argmax():
    np.testing.assert_array_equal(ss.process(LOGITS, temperature=0), [0, 0, 1, 0, 0, 0])
    # Ties go to the lowest id.
    np.testing.assert_array_equal(ss.process([1.0, 3.0, 3.0, 3.0], temperature=0), [0, 1, 0, 0])
    np.testing.assert_array_equal(ss.process([-math.inf, 0.0, 0.0], temperature=0), [0, 1, 0])
    # Top-k and top-p cannot move a one-hot.
    np.testing.assert_array_equal(ss.process(LOGITS, 0, top_k=3, top_p=0.1), [0, 0, 1, 0, 0, 0])


def test_tiny_temperature_is_finite_and_greedy():
    """Dividing first overflows to inf and inf - inf = NaN; the result must stay a distribution."""
    out = ss.process([0.0, 2.0, 1.0], temperature=1e-308)
    assert np.all(np.isfinite(out)), out
    np.testing.assert_array_equal(out, [0.0, 1.0, 0.0])


@pytest.mark.parametrize("top_k", [1, 2, 3, 5, 6, 50])
def test_top_k(top_k):
    got = ss.process(LOGITS, top_k=top_k)
    assert np.count_nonzero(got) == min(top_k, len(LOGITS))
    np.testing.assert_allclose(got, reference_process(LOGITS, top_k=top_k), rtol=1e-12)
    # The kept tokens are the most probable ones.
    ranking = np.argsort(-np.array(LOGITS), kind="stable")
    assert set(np.flatnonzero(got)) == set(ranking[:top_k].tolist())


def test_top_k_ties_keep_lower_ids():
    np.testing.assert_array_equal(ss.process([0.0, 0.0, 0.0, 0.0], top_k=2), [0.5, 0.5, 0, 0])
    np.testing.assert_array_equal(ss.process([0.0, 1.0, 1.0, 1.0], top_k=2), [0, 0.5, 0.5, 0])


@pytest.mark.parametrize("kwargs", [{"top_k": 7}, {"top_k": 150}, {"top_p": 0.3}, {"top_p": 0.8}])
def test_ties_keep_lower_ids_over_a_large_vocabulary(kwargs):
    """Many ties need a stable ranking; an unstable sort keeps arbitrary tied ids."""
    logits = np.random.default_rng(0).integers(0, 3, 300).astype(np.float64)
    got = ss.process(logits, **kwargs)
    np.testing.assert_allclose(got, reference_process(logits, **kwargs), rtol=1e-12)
    np.testing.assert_array_equal(ss.process(np.stack([logits, logits]), **kwargs)[1], got)


def test_top_p_smallest_set_reaching_the_mass():
    logits = np.log([0.5, 0.3, 0.2])
    keep = [np.flatnonzero(ss.process(logits, top_p=p)).tolist() for p in (0.2, 0.49, 0.6, 0.79)]
    assert keep == [[0], [0], [0, 1], [0, 1]]
    assert np.flatnonzero(ss.process(logits, top_p=0.81)).tolist() == [0, 1, 2]
    np.testing.assert_allclose(ss.process(logits, top_p=0.6), [0.625, 0.375, 0.0], rtol=1e-12)
    # Exactly reaching the mass stops: four equal tokens, top_p = 1/2 keeps two (lower ids).
    np.testing.assert_array_equal(ss.process([0.0] * 4, top_p=0.5), [0.5, 0.5, 0, 0])
    np.testing.assert_allclose(ss.process([0.0] * 4, top_p=0.51), [1 / 3, 1 / 3, 1 / 3, 0])


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.55, 0.8, 0.95, 0.999])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_top_p_matches_reference(top_p, temperature):
    got = ss.process(LOGITS, temperature=temperature, top_p=top_p)
    np.testing.assert_allclose(got, reference_process(LOGITS, temperature, top_p=top_p), rtol=1e-12)


def test_top_p_one_keeps_every_token():
    """``top_p = 1`` is the whole support, tokens below float epsilon included."""
    logits = [0.0, -40.0, -45.0]
    np.testing.assert_array_equal(ss.process(logits, top_p=1.0) > 0, [True, True, True])
    np.testing.assert_array_equal(ss.process(logits, top_p=1.0), ss.process(logits))


def test_top_k_applies_before_top_p():
    """Renormalised after top-k, (0.625, 0.375) needs only token 0 to reach 0.6."""
    logits = np.log([0.5, 0.3, 0.2])
    np.testing.assert_array_equal(ss.process(logits, top_k=2, top_p=0.6), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(
        ss.process(LOGITS, 0.8, top_k=4, top_p=0.7), reference_process(LOGITS, 0.8, 4, 0.7)
    )


def test_negative_infinity_bans_tokens():
    logits = [0.0, -math.inf, 1.0, -math.inf]
    out = ss.process(logits)
    assert out[1] == 0 and out[3] == 0
    np.testing.assert_allclose(out[[0, 2]], [1 / (1 + math.e), math.e / (1 + math.e)], rtol=1e-12)
    # top-k larger than the allowed set never revives a banned token.
    np.testing.assert_array_equal(ss.process(logits, top_k=3) > 0, [True, False, True, False])
    np.testing.assert_array_equal(ss.process(logits, top_p=1.0) > 0, [True, False, True, False])


SETTINGS = [
    {},
    {"temperature": 0},
    {"temperature": 0.6},
    {"top_k": 2},
    {"top_p": 0.7},
    {"temperature": 1.3, "top_k": 4, "top_p": 0.9},
]


@pytest.mark.parametrize("kwargs", SETTINGS, ids=repr)
def test_batched_equals_row_by_row(kwargs):
    """SafeAILab/EAGLE#215: a processor applied to 1-D and to batched 2-D input must agree."""
    rng = np.random.default_rng(5)
    batch = rng.normal(size=(3, 4, 7)) * 2
    batch[0, 1, 3] = -math.inf
    batch[2, 0, :5] = -math.inf
    batch[1, 2, :] = 0.5  # all ties
    out = ss.process(batch, **kwargs)
    assert out.shape == batch.shape
    for i in range(3):
        np.testing.assert_array_equal(ss.process(batch[i], **kwargs), out[i])
        for j in range(4):
            row = ss.process(batch[i, j], **kwargs)
            np.testing.assert_array_equal(row, out[i, j])
            np.testing.assert_allclose(row, reference_process(batch[i, j], **kwargs), rtol=1e-12)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-14)


def test_input_is_not_modified():
    logits = np.array(LOGITS)
    before = logits.copy()
    ss.process(logits, temperature=0.5, top_k=3, top_p=0.8)
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize(
    ("logits", "fragment"),
    [
        ([0.0, math.nan], "NaN"),
        ([0.0, math.inf], r"\+inf"),
        ([-math.inf, -math.inf], "every entry -inf"),
        ([[0.0, 1.0], [-math.inf, -math.inf]], "every entry -inf"),
        ([[0.0, 1.0], [math.nan, 1.0]], "NaN"),
        (1.0, "shape"),
        ([], "shape"),
    ],
)
def test_bad_logits(logits, fragment):
    with pytest.raises(ss.InvalidDistribution, match=f"logits: .*{fragment}"):
        ss.process(logits)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
    ],
    ids=repr,
)
def test_bad_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ss.process(LOGITS, **kwargs)


def test_output_is_a_valid_distribution_for_the_validator():
    out = ss.process(LOGITS, temperature=0.9, top_k=5, top_p=0.9)
    checked = ss.validation.check_distribution(out, "target")
    assert checked.shape == (len(LOGITS),)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": None}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"temperature": 1j}, "temperature"),
        ({"temperature": np.array([1.0, 2.0])}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_k": math.nan}, "top_k"),
        ({"top_k": math.inf}, "top_k"),
        ({"top_k": "2"}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": "0.5"}, "top_p"),
        ({"top_p": True}, "top_p"),
        ({"top_p": [0.5]}, "top_p"),
    ],
    ids=repr,
)
def test_badly_typed_parameters_are_named(kwargs, name):
    """These gave raw numpy/TypeError/OverflowError messages."""
    with pytest.raises(ValueError, match=f"^{name}: expected") as info:
        ss.process(LOGITS, **kwargs)
    assert "ufunc" not in str(info.value) and "convert" not in str(info.value)


@pytest.mark.parametrize(
    ("logits", "fragment"),
    [
        (["a", "b"], "a string"),
        ([1j, 0.0], "complex"),
        ([True, False], "a bool"),
        ([[1.0], [1.0, 2.0]], "nested"),
        (None, "None"),
    ],
)
def test_non_real_logits_are_named(logits, fragment):
    with pytest.raises(ss.InvalidDistribution, match=f"logits: .*{fragment}"):
        ss.process(logits)


def test_numeric_parameter_kinds_still_accepted():
    """Integral floats, numpy scalars and big integers keep their meaning."""
    base = ss.process(LOGITS, temperature=0.7, top_k=3, top_p=0.9)
    same = ss.process(LOGITS, temperature=np.float32(0.7), top_k=3.0, top_p=np.float64(0.9))
    np.testing.assert_allclose(same, base, rtol=1e-6)
    np.testing.assert_array_equal(
        ss.process(LOGITS, top_k=np.int64(3)), ss.process(LOGITS, top_k=3)
    )
    np.testing.assert_array_equal(ss.process(LOGITS, top_k=10**30), ss.process(LOGITS))
    assert ss.process(np.array(LOGITS, np.float32)).dtype == np.float64
