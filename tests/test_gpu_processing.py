"""``specsampling.gpu.processing.process`` against the reference ``ss.process``, row by row.

Float64: every row keeps exactly the reference's tokens (ties at the top-k and top-p boundaries,
``-inf``, T = 0 one-hots, tiny temperatures, ``top_p = 1``, ``top_k >= V`` included) and its
values agree to ``rtol = 1e-13`` (torch's ``exp`` and sums round differently from numpy's in the
last bit). Float32 / bf16 / fp16 inputs: within a stated bound. Known-buggy variants (mutants) must
fail the same comparison. Every test taking ``device`` also runs on CUDA when one is present.
"""

from __future__ import annotations

import functools
import itertools
import math
import re

import numpy as np
import pytest
import torch

import specsampling as ss
from specsampling.gpu import processing
from specsampling.gpu.processing import process

_TOLIST = torch.Tensor.tolist

# The cuda copies run only where a GPU is present (on CPU they would repeat the cpu runs).
DEVICES = ["cpu"] + [pytest.param("cuda", marks=pytest.mark.cuda, id="cuda")] * bool(
    torch.cuda.is_available()
)

TEMPERATURES = [0, 5e-324, 1e-308, 1e-3, 0.7, 1.0, 3.0]
TOP_KS = [None, 1, 2, 3, 6, 299, 300, 301, 10**30]
TOP_PS = [None, 0.05, 0.25, 0.5, 0.51, 0.75, 0.9, 1.0]
VOCAB_SIZES = [1, 2, 4, 7, 300]


def adversarial_rows(vocab_size: int) -> np.ndarray:
    """Rows built to break a careless lowering: ties, -inf, huge and exp-equal logits, tails."""
    rng = np.random.default_rng(vocab_size)
    ids = np.arange(vocab_size, dtype=np.float64)
    rows = [
        np.zeros(vocab_size),  # all tied
        rng.integers(0, 3, vocab_size).astype(np.float64),  # many ties at every boundary
        np.minimum(3.0, np.floor(ids / 2)),  # ties in pairs, rising to the last ids
        ids * 1e-30,  # distinct logits, equal probabilities: ties are on probabilities
        -ids * 1e-30,
        np.where(ids % 3 == 1, -math.inf, rng.normal(size=vocab_size)),  # banned tokens
        np.where(ids == vocab_size - 1, 0.0, -math.inf),  # only the last token allowed
        rng.choice([1e300, -1e300, 0.0], vocab_size),  # huge logits
        np.where(ids % 2 == 0, 1e308, -1e308),  # the max subtraction overflows to -inf
        -40.0 * ids,  # a tail far below float epsilon: top_p = 1 must keep it
        np.log(np.maximum(0.5**ids, 1e-300)),  # dyadic masses: top-p lands exactly on them
        rng.normal(size=vocab_size) * 4,
    ]
    return np.stack(rows)


@functools.cache
def grid_case(vocab_size: int):
    """Every adversarial row under every parameter combination, one row each, with the answers."""
    rows = adversarial_rows(vocab_size)
    combos = list(itertools.product(range(len(rows)), TEMPERATURES, TOP_KS, TOP_PS))
    logits = np.stack([rows[i] for i, *_ in combos])  # [n, V]
    temperature, top_k, top_p = ([c[j] for c in combos] for j in (1, 2, 3))
    expected = np.stack(
        [ss.process(rows[i], t, k, p) for i, t, k, p in combos]  # the reference, row by row
    )
    return logits, temperature, top_k, top_p, expected


def row_mismatches(got: torch.Tensor, expected: np.ndarray) -> tuple[int, int]:
    """(rows keeping other tokens than the reference, rows whose values differ beyond rtol)."""
    got = got.detach().cpu().double().numpy()
    support = ((got > 0) != (expected > 0)).any(axis=-1)
    close = np.isclose(got, expected, rtol=1e-13, atol=1e-300).all(axis=-1)
    return int(support.sum()), int((~support & ~close).sum())


def encoded(values: list, off) -> list:
    """Per-row values with ``None`` spelled as the equivalent number (for tensors)."""
    return [off if v is None else min(v, off) for v in values]


# ----------------------------------------------------------------------------------------------
# Float64: equal to the reference on every row


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_adversarial_rows_with_per_row_parameters(device, vocab_size):
    logits, temperature, top_k, top_p, expected = grid_case(vocab_size)
    x = torch.tensor(logits, device=device)
    # Per-row parameters as Python lists (None per row) and as tensors (None as V+ / 1).
    got = process(x, temperature, top_k, top_p)
    assert got.dtype == torch.float64 and got.device == x.device
    assert row_mismatches(got, expected) == (0, 0)
    as_tensors = process(
        x,
        torch.tensor(temperature, dtype=torch.float64, device=device),
        torch.tensor(encoded(top_k, 2**62), device=device),
        torch.tensor(encoded(top_p, 1.0), dtype=torch.float64, device=device),
    )
    assert row_mismatches(as_tensors, expected) == (0, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_adversarial_rows_with_scalar_parameters(device, vocab_size):
    """Scalars take the shortcuts (no sort when off, top-k by threshold): same answers."""
    rows = torch.tensor(adversarial_rows(vocab_size), device=device)
    _, temperature, top_k, top_p, expected = grid_case(vocab_size)
    per_combo = len(TEMPERATURES) * len(TOP_KS) * len(TOP_PS)
    for c, (t, k, p) in enumerate(itertools.product(TEMPERATURES, TOP_KS, TOP_PS)):
        want = expected[c::per_combo]  # the rows of this combination, in row order
        assert (temperature[c], top_k[c], top_p[c]) == (t, k, p)
        assert row_mismatches(process(rows, t, k, p), want) == (0, 0), (t, k, p)


def test_reference_tie_rules_spelled_out():
    """The rules the grid checks, on rows small enough to read."""
    f64 = functools.partial(torch.tensor, dtype=torch.float64)
    assert process(f64([1.0, 3.0, 3.0, 3.0]), 0).tolist() == [0, 1, 0, 0]
    assert process(f64([-math.inf, 0.0, 0.0]), 0).tolist() == [0, 1, 0]
    # Greedy is the argmax of the logits; top_k = 1 ranks equal probabilities by id.
    assert process(f64([-1e-20, 0.0]), 0).tolist() == [0.0, 1.0]
    assert process(f64([-1e-20, 0.0]), top_k=1).tolist() == [1.0, 0.0]
    assert process(f64([0.0, 1.0, 1.0, 1.0]), top_k=2).tolist() == [0, 0.5, 0.5, 0]
    assert process(f64([0.0] * 4), top_p=0.5).tolist() == [0.5, 0.5, 0, 0]
    assert process(f64([0.0, 2.0, 2.0]), temperature=1e-308).tolist() == [0, 0.5, 0.5]
    assert (process(f64([0.0, -40.0, -45.0]), top_p=1.0) > 0).all()
    logits = np.log([0.5, 0.3, 0.2])  # top-k first: (0.625, 0.375) reaches 0.6 with token 0
    assert process(f64(logits), top_k=2, top_p=0.6).tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab_size", [7, 100, 1000])
def test_random_rows_with_random_parameters(device, vocab_size):
    rng = np.random.default_rng(vocab_size)
    num_rows = 400
    scale = rng.choice([0.01, 1.0, 5.0, 100.0], (num_rows, 1))
    logits = rng.normal(size=(num_rows, vocab_size)) * scale
    tied = rng.random(num_rows) < 0.3
    logits[tied] = np.round(logits[tied])  # integer logits: ties
    logits[rng.random((num_rows, vocab_size)) < 0.05] = -math.inf
    logits[:, 0] = np.where(np.isneginf(logits).all(-1), 0.0, logits[:, 0])
    temperature = rng.choice([0.0, 1e-300, 0.2, 1.0, 1.7], num_rows)
    top_k = rng.integers(1, vocab_size + 3, num_rows)
    top_p = rng.choice([0.1, 0.5, 0.8, 0.95, 1.0], num_rows) * rng.choice([1.0, 0.999], num_rows)
    expected = np.stack(
        [ss.process(*row) for row in zip(logits, temperature, top_k, top_p, strict=True)]
    )
    to = functools.partial(torch.tensor, device=device)
    got = process(to(logits), to(temperature), to(top_k), to(top_p))
    assert row_mismatches(got, expected) == (0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_large_vocabulary(device):
    vocab_size = 50_000
    rng = np.random.default_rng(7)
    logits = np.stack(
        [
            rng.normal(size=vocab_size) * 3,
            rng.integers(0, 4, vocab_size).astype(np.float64),  # ~12,500 ties per level
            np.zeros(vocab_size),
            np.where(rng.random(vocab_size) < 0.5, -math.inf, rng.normal(size=vocab_size)),
            -np.arange(vocab_size) * 1e-3,
            rng.standard_cauchy(vocab_size),
        ]
    )
    temperature = [0.8, 1.0, 1.0, 0.0, 2.0, 0.5]
    for top_k, top_p in [
        ([50, 12_600, 30_000, None, 49_999, 1000], [0.9, 0.5, 0.3, 1.0, 0.999, None]),
        ([None] * 6, [0.9, 0.26, 0.3, 1.0, 0.999, 0.75]),
        ([50, 12_600, 30_000, 7, 49_999, 1000], [None] * 6),
    ]:
        expected = np.stack(
            [ss.process(*row) for row in zip(logits, temperature, top_k, top_p, strict=True)]
        )
        got = process(torch.tensor(logits, device=device), temperature, top_k, top_p)
        assert row_mismatches(got, expected) == (0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_shapes_broadcasting_and_parameter_kinds(device):
    """[B, N, V] logits with [B, N] / [B, 1] parameters as lists, numpy arrays and tensors."""
    rng = np.random.default_rng(3)
    logits = rng.integers(-2, 3, (3, 4, 9)).astype(np.float64)
    logits[0, 1, 3] = -math.inf
    temperature = np.array([[0.0, 0.5, 1.0, 2.0], [1.0, 0.0, 1e-308, 1.0], [0.3] * 4])
    top_k = torch.tensor([[2], [5], [9]], device=device)  # [B, 1]: one k per sequence
    top_p = [[0.5, None, 0.9, 1.0], [0.3, 0.3, 0.7, None], [None, 0.2, 0.4, 0.6]]
    got = process(torch.tensor(logits, device=device), temperature, top_k, top_p)
    assert got.shape == logits.shape
    for b, n in np.ndindex(3, 4):
        want = ss.process(logits[b, n], temperature[b, n], int(top_k[b, 0]), top_p[b][n])
        assert row_mismatches(got[b, n], want) == (0, 0), (b, n)
    # A per-row value equal on every row is the scalar.
    x = torch.tensor(logits, device=device)
    same = process(
        x, torch.full((3, 4), 0.7, dtype=torch.float64), np.full((3, 4), 3), [[0.8] * 4] * 3
    )
    assert torch.equal(same, process(x, 0.7, 3, 0.8))
    # 1-D logits, an empty batch, array-like logits.
    assert process(torch.zeros(3, dtype=torch.float64), top_k=1).tolist() == [1.0, 0.0, 0.0]
    assert process(torch.zeros(0, 5), temperature=[]).shape == (0, 5)
    assert process([[0.0, 0.0]], top_p=[0.5]).tolist() == [[1.0, 0.0]]


# ----------------------------------------------------------------------------------------------
# Dtypes


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_rule(device):
    x = torch.tensor([[0.0, 1.0, 2.0]], device=device)
    assert process(x.double()).dtype == torch.float64
    for low in (torch.float32, torch.float16, torch.bfloat16):
        assert process(x.to(low), 0.5, 2, 0.9).dtype == torch.float32
    assert process(x.long()).dtype == torch.float64
    assert process([0, 1]).dtype == torch.float64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_within_stated_bound(device, dtype):
    """Float32 computation against the reference on the same (rounded) input values.

    Bound: at most 1% of rows keep other tokens than the reference (a top-p or top-k boundary
    within float32 rounding, ties that float32 probabilities create or break), and rows keeping
    the same tokens agree to ``atol = 1e-6`` (plus ``rtol = 1e-4``); measured: 0 rows, 1.5e-7.
    """
    rng = np.random.default_rng(11)
    num_rows, vocab_size = 600, 512
    logits = torch.tensor(rng.normal(size=(num_rows, vocab_size)) * 3, device=device).to(dtype)
    logits[:, 5] = -math.inf
    temperature = rng.choice([0.0, 0.5, 1.0, 1.5], num_rows)
    top_k = rng.choice([1, 10, 100, vocab_size], num_rows)
    top_p = rng.choice([0.3, 0.8, 0.95, 1.0], num_rows)
    got = process(logits, temperature, top_k, top_p).cpu().double().numpy()
    rounded = logits.cpu().double().numpy()
    expected = np.stack(
        [ss.process(*row) for row in zip(rounded, temperature, top_k, top_p, strict=True)]
    )
    support = ((got > 0) != (expected > 0)).any(axis=-1)
    assert support.sum() <= 0.01 * num_rows
    np.testing.assert_allclose(got[~support], expected[~support], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# Errors: the reference's messages, and per-row values checked too

BAD_SCALARS = [
    {"temperature": -0.1},
    {"temperature": math.nan},
    {"temperature": math.inf},
    {"temperature": None},
    {"temperature": "1"},
    {"temperature": 1j},
    {"temperature": True},
    {"top_k": 0},
    {"top_k": -2},
    {"top_k": 1.5},
    {"top_k": True},
    {"top_k": math.nan},
    {"top_k": math.inf},
    {"top_k": "2"},
    {"top_p": 0.0},
    {"top_p": -0.5},
    {"top_p": 1.5},
    {"top_p": math.nan},
    {"top_p": "0.5"},
    {"top_p": True},
]


@pytest.mark.parametrize("kwargs", BAD_SCALARS, ids=repr)
def test_bad_scalar_parameters_give_the_reference_message(kwargs):
    with pytest.raises(ValueError) as reference:
        ss.process([0.0, 1.0], **kwargs)
    with pytest.raises(ValueError, match=f"^{re.escape(str(reference.value))}$"):
        process(torch.tensor([0.0, 1.0]), **kwargs)


@pytest.mark.parametrize(
    "logits",
    [[0.0, math.nan], [0.0, math.inf], [-math.inf, -math.inf], [[0.0, 1.0], [-math.inf] * 2], 1.0],
    ids=repr,
)
def test_bad_logits_give_the_reference_message(logits):
    with pytest.raises(ss.InvalidDistribution) as reference:
        ss.process(logits)
    message = f"^{re.escape(str(reference.value))}$"
    with pytest.raises(ss.InvalidDistribution, match=message):
        process(torch.tensor(logits, dtype=torch.bfloat16))
    with pytest.raises(ss.InvalidDistribution, match=message):
        process(logits)


@pytest.mark.parametrize(
    ("logits", "fragment"),
    [
        (torch.zeros(2, 0), "shape"),
        (torch.tensor([True, False]), "booleans"),
        (torch.tensor([1j, 0]), "complex"),
        (["a", "b"], "a string"),
    ],
    ids=repr,
)
def test_malformed_logits_are_named(logits, fragment):
    with pytest.raises(ss.InvalidDistribution, match=f"^logits: .*{fragment}"):
        process(logits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("kwargs", "name", "row"),
    [
        ({"temperature": [1.0, -1.0, 1.0]}, "temperature", 1),
        ({"temperature": [1.0, None, 1.0]}, "temperature", 1),
        ({"temperature": np.array([1.0, 1.0, math.nan])}, "temperature", 2),
        ({"temperature": torch.tensor([1.0, 1.0, math.inf])}, "temperature", 2),
        ({"temperature": torch.tensor([1, -3, 1])}, "temperature", 1),
        ({"top_k": [1, 0, 2]}, "top_k", 1),
        ({"top_k": [1, 2, 2.5]}, "top_k", 2),
        ({"top_k": [True, 2, 2]}, "top_k", 0),
        ({"top_k": torch.tensor([0, 2, 2])}, "top_k", 0),
        ({"top_k": torch.tensor([3.0, 2.5, 2.0])}, "top_k", 1),
        ({"top_p": [0.5, 0.0, 1.0]}, "top_p", 1),
        ({"top_p": ["0.5", 0.5, 1.0]}, "top_p", 0),
        ({"top_p": torch.tensor([0.5, 1.0, 1.5])}, "top_p", 2),
        ({"top_p": torch.tensor([math.nan, 1.0, 1.0])}, "top_p", 0),
    ],
    ids=repr,
)
def test_bad_per_row_values_name_the_argument_and_row(device, kwargs, name, row):
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=rf"^{name}: expected .* at row \({row},\)$"):
        process(torch.zeros(3, 4, device=device), **kwargs)


@pytest.mark.parametrize(
    ("shape", "kwargs", "name"),
    [
        ((3, 4), {"temperature": [1.0, 1.0]}, "temperature"),
        ((3, 4), {"top_k": torch.ones(3, 2, dtype=torch.int64)}, "top_k"),
        ((4,), {"top_p": [0.5]}, "top_p"),  # one row: a length-1 list is not a scalar
        ((3, 4), {"top_p": torch.tensor([True, True, True])}, "top_p"),
        ((2, 4), {"top_k": [[1, 2], [3]]}, "top_k"),
    ],
    ids=repr,
)
def test_per_row_values_of_the_wrong_shape_or_kind(shape, kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        process(torch.zeros(shape), **kwargs)


# ----------------------------------------------------------------------------------------------
# No host synchronisation with validate=False on an accelerator; one read with validate=True
# (two with top-p)


@pytest.mark.parametrize("device", DEVICES)
def test_no_host_sync_without_validation_and_few_reads_with_it(device, monkeypatch):
    """validate=False never reads the host on an accelerator (checked on the CPU too, through
    the accelerator's route: the CPU itself keeps the partial sort, whose reads are free)."""
    monkeypatch.setattr(processing, "_reads_are_free", lambda device: False)
    monkeypatch.setattr(processing.ops, "host_reads_free", lambda tensor: False)  # the replay
    x = torch.randn(4, 50, dtype=torch.float64, device=device)
    params = {
        "temperature": torch.tensor([0.0, 0.5, 1.0, 2.0], device=device),
        "top_k": torch.tensor([1, 5, 50, 60], device=device),
        "top_p": torch.tensor([0.5, 0.9, 1.0, 0.3], dtype=torch.float64, device=device),
    }
    expected = process(x, **params)
    reads = []

    def forbidden(name):
        def call(self, *args, **kwargs):
            reads.append(name)
            raise AssertionError(f"host read: Tensor.{name}")

        return call

    for name in ["item", "tolist", "numpy", "__bool__", "__int__", "__float__", "cpu"]:
        monkeypatch.setattr(torch.Tensor, name, forbidden(name))
    if x.is_cuda:
        torch.cuda.set_sync_debug_mode("error")
    try:
        for kwargs in [params, {"temperature": 0.7, "top_k": 5}, {"top_p": [0.5, 0.9, 1.0, 0.3]}]:
            process(x, **kwargs, validate=False)
        got = process(x, **params, validate=False)
    finally:
        if x.is_cuda:
            torch.cuda.set_sync_debug_mode("default")
    assert reads == []
    assert torch.equal(got, expected)

    def counted(self):
        reads.append("tolist")
        return _TOLIST(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    assert torch.equal(process(x, **params), expected)
    # Validation, then which rows the partial sort of top-k / top-p leaves to the full sort.
    assert reads == ["tolist", "tolist"]
    reads.clear()
    process(x, params["temperature"])
    assert reads == ["tolist"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_validation_s_row_maxima_give_the_unchecked_probabilities(dtype):
    """With validate=True the softmax shifts each row by the maximum validation read; rows whose
    scales differ by far more than exp's range come out as without validation, bit for bit (a
    maximum taken from another row, or from all of them, empties a row or overflows it)."""
    x = torch.randn(2, 3, 40, dtype=torch.float64)
    x[0, 1] += 3e4
    x[1, 0] -= 5e4
    x[1, 2, ::3] = -math.inf
    x = x.to(dtype)
    for temperature in [0.5, 2.0, [[0.7, 0.0, 1.5], [0.3, 1.0, 0.0]]]:
        got = process(x, temperature)
        assert torch.equal(got, process(x, temperature, validate=False)), temperature
        assert torch.isfinite(got).all()
        assert torch.allclose(got.sum(-1).double(), torch.ones(2, 3, dtype=torch.float64))


# ----------------------------------------------------------------------------------------------
# Mutants: known-buggy variants must fail the float64 comparison (on the tokens they keep)


def _rows(values, num_rows):
    return list(values) if isinstance(values, list) else [values] * num_rows


def ties_to_highest_id(logits, temperature, top_k, top_p):
    return process(logits.flip(-1), temperature, top_k, top_p).flip(-1)


def top_p_before_top_k(logits, temperature, top_k, top_p):
    first = process(logits, temperature, top_p=top_p)
    return process(first.log(), 1.0, top_k=top_k)


def top_p_one_as_a_threshold(logits, temperature, top_k, top_p):
    below_one = 1.0 - 2.0**-53
    top_p = [below_one if p is None or p >= 1 else p for p in _rows(top_p, len(logits))]
    return process(logits, temperature, top_k, top_p)


def greedy_as_top_k_1(logits, temperature, top_k, top_p):
    temperature = _rows(temperature, len(logits))
    top_k = [
        1 if t == 0 else k for t, k in zip(temperature, _rows(top_k, len(logits)), strict=True)
    ]
    return process(logits, [1.0 if t == 0 else t for t in temperature], top_k, top_p)


def divide_before_subtracting_max(logits, temperature, top_k, top_p):
    temperature = torch.tensor(_rows(temperature, len(logits)), dtype=torch.float64)
    scaled = logits / torch.where(temperature == 0, 1.0, temperature)[:, None]
    return process(scaled, torch.where(temperature == 0, 0.0, 1.0), top_k, top_p, validate=False)


MUTANTS = [
    ties_to_highest_id,
    top_p_before_top_k,
    top_p_one_as_a_threshold,
    greedy_as_top_k_1,
    divide_before_subtracting_max,
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda f: f.__name__)
def test_mutants_are_caught(mutant):
    caught = 0
    for vocab_size in VOCAB_SIZES:
        logits, temperature, top_k, top_p, expected = grid_case(vocab_size)
        with torch.no_grad():
            got = mutant(torch.tensor(logits), temperature, top_k, top_p)
        caught += row_mismatches(got, expected)[0]
    assert caught > 0, f"{mutant.__name__} keeps the reference's tokens on every row"


# ---------------------------------------------------------------------------- out=
OUT_CASES = [
    dict(),
    dict(temperature=0),
    dict(temperature=0.7),
    dict(temperature=3.0),
    dict(temperature=[0.0, 1.0, 0.5]),
    dict(top_k=3),
    dict(top_k=[1, None, 40]),
    dict(top_k=5, top_p=0.6),
    dict(top_p=0.9),
    dict(top_p=[0.3, None, 0.95], temperature=[0.5, 0.0, 2.0]),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize(
    "kwargs", OUT_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "plain"
)
def test_out_gets_every_route_s_values(kwargs: dict, validate: bool, dtype: torch.dtype) -> None:
    """``out=`` is returned itself, holding exactly the values of the call without it, on every
    route (plain softmax, temperatures, greedy rows, top-k with and without top-p, top-p alone),
    for every input dtype; nothing of the garbage it held survives."""
    generator = torch.Generator().manual_seed(2)
    logits = (3 * torch.randn(3, 300, generator=generator, dtype=torch.float64)).to(dtype)
    logits[1, 7] = logits[1, 8] = logits[1].max()  # a tie at the top
    expected = process(logits, validate=validate, **kwargs)
    out = torch.full_like(expected, float("nan"))
    got = process(logits, validate=validate, out=out, **kwargs)
    assert got is out
    assert torch.equal(out, expected)
    batched = logits.reshape(1, 3, 300)
    out3 = torch.full((1, 3, 300), float("nan"), dtype=expected.dtype)
    per_row = {k: [v] if isinstance(v, list) else v for k, v in kwargs.items()}
    assert process(batched, validate=validate, out=out3, **per_row) is out3
    assert torch.equal(out3[0], expected)


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize(
    "kwargs", OUT_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "plain"
)
def test_logits_that_require_grad_are_read_detached(kwargs: dict, validate: bool) -> None:
    """Logits (and per-row parameter tensors) that require grad give the detached values'
    probabilities on every route, without a gradient and without an error (the routes that
    write into buffers cannot carry one), with and without ``out=``."""
    generator = torch.Generator().manual_seed(3)
    logits = 3 * torch.randn(3, 300, generator=generator)
    expected = process(logits, validate=validate, **kwargs)
    tracked = {
        k: torch.tensor(v, requires_grad=True) if isinstance(v, list) and None not in v else v
        for k, v in kwargs.items()
    }
    got = process(logits.clone().requires_grad_(), validate=validate, **tracked)
    assert not got.requires_grad
    assert torch.equal(got, expected)
    out = torch.empty_like(expected)
    assert process(logits.clone().requires_grad_(), validate=validate, out=out, **kwargs) is out
    assert torch.equal(out, expected)


def test_bad_out_is_named() -> None:
    logits = torch.zeros(2, 5)
    cases = [
        (torch.zeros(2, 4), r"out: shape \(2, 4\) \(logits: \(2, 5\)\)"),
        (
            torch.zeros(2, 5, dtype=torch.float64),
            r"out: dtype torch.float64 \(the result's: torch.float32\)",
        ),
        (torch.zeros(5, 2).t(), "out: not contiguous"),
        (torch.zeros(2, 5, requires_grad=True), "out: requires grad"),
        (logits, "out: shares memory with logits"),
    ]
    for validate in (True, False):
        for out, message in cases:
            with pytest.raises(ValueError, match=message):
                process(logits, validate=validate, out=out)
        with pytest.raises(TypeError, match=r"out: expected a torch\.Tensor, got list"):
            process(logits, validate=validate, out=[0.0] * 10)
    with pytest.raises(
        ValueError, match=r"out: dtype torch.float32 \(the result's: torch.float64\)"
    ):
        process(logits.double(), out=torch.zeros(2, 5))


def test_out_overlap_is_judged_by_the_bytes_used() -> None:
    """Two halves of one buffer may be logits and ``out``; views that overlap are refused, also
    when they come from different tensors over one numpy array."""
    buffer = torch.zeros(2, 10)
    logits, out = buffer[0:1], buffer[1:2]
    logits.normal_(generator=torch.Generator().manual_seed(0))
    assert process(logits, out=out) is out
    assert torch.equal(out, process(logits))
    array = np.zeros(30, dtype=np.float32)
    first, second = (
        torch.from_numpy(array[:20]).view(2, 10),
        torch.from_numpy(array[10:]).view(2, 10),
    )
    with pytest.raises(ValueError, match="out: shares memory with logits"):
        process(first, out=second)
