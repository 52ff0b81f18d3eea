"""The fast paths of ``specsampling.gpu.processing.process``: the fused softmax, and top-k / top-p
from a partial sort (``torch.topk`` of ``m`` ranks) with an exact fallback to the full sort.

Checked here, with ``m`` patched small so that every branch runs at small vocabularies too:

* float64 keeps exactly the reference's tokens (``ss.process``) and its values to ``rtol = 1e-13``
  on a fuzzed grid (ties, equal probabilities, thresholds hit exactly by dyadic masses, tiny and
  huge temperatures, ``top_p`` near 0 and 1, top-k with top-p, per-row parameters, flat rows
  whose nucleus is most of the vocabulary, so that the fallback runs);
* the fast path (``validate=True``, and ``validate=False`` on the CPU) equals the full sort
  (``validate=False`` on an accelerator, :func:`full_sort`) bit for bit, in
  float64 and in float32, and both the prefix and the fallback actually decide rows;
* mutants of the threshold that keep one token too many are caught by these checks;
* float32 agrees with float64 within the documented bound, and the fused softmax neither
  overflows nor loses the greedy rows;
* top-k alone below float64 (from the logits, no full softmax) keeps the reference's tokens,
  its two routes (top-k indices after one host read; the threshold rule, sync-free) agree bit
  for bit, and a route keeping one token too many is caught; the same for top-k with top-p
  (top-p counted inside the top-k set), where only cuts within float32 rounding of ``top_p``
  may differ from the reference.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from unittest import mock

import numpy as np
import pytest
import torch

import specsampling as ss
from specsampling.gpu import processing
from specsampling.gpu.processing import process

TEMPERATURES = [0.0, 1e-300, 1e-3, 0.5, 1.0, 2.0, 1e6]
TOP_KS = [None, 1, 2, 3, 5, 17, 10**9]
TOP_PS = [None, 1e-12, 0.05, 0.25, 0.5, 0.75, 0.9, 0.999999, 1.0 - 2.0**-40, 1.0]
PREFIX_SIZES = [1, 2, 5, 16, None]  # None: the library's own choice


def fuzzed_rows(vocab_size: int, seed: int) -> np.ndarray:
    """Logit rows with ties, equal probabilities, dyadic masses, banned tokens and flat rows."""
    rng = np.random.default_rng([vocab_size, seed])
    ids = np.arange(vocab_size, dtype=np.float64)
    rows = [
        np.zeros(vocab_size),  # flat: the nucleus is most of the vocabulary
        rng.integers(0, 3, vocab_size).astype(np.float64),  # many ties at every boundary
        np.minimum(3.0, np.floor(ids / 2)),
        ids * 1e-30,  # distinct logits, equal probabilities
        np.log(np.maximum(0.5 ** (ids + 1), 1e-300)),  # dyadic: top_p = 0.5 hits a mass exactly
        np.log(np.where(ids < 4, 0.25, 1e-300)),  # four tokens of 1/4 each, then nothing
        np.where(ids % 3 == 1, -math.inf, rng.normal(size=vocab_size)),
        rng.normal(size=vocab_size) * 0.01,  # nearly flat
        rng.normal(size=vocab_size) * 3,
        -40.0 * ids,
    ]
    return np.stack(rows)


def grid(vocab_size: int, seed: int):
    """Every fuzzed row under random per-row parameters (each row with its own values)."""
    rows = fuzzed_rows(vocab_size, seed)
    rng = np.random.default_rng([seed, vocab_size, 1])
    repeats = 24
    logits = np.repeat(rows, repeats, axis=0)  # [n, V]
    n = len(logits)
    temperature = [TEMPERATURES[i] for i in rng.integers(0, len(TEMPERATURES), n)]
    top_k = [TOP_KS[i] for i in rng.integers(0, len(TOP_KS), n)]
    top_p = [TOP_PS[i] for i in rng.integers(0, len(TOP_PS), n)]
    top_p[::3] = [0.5] * len(top_p[::3])  # exact dyadic thresholds, often
    expected = np.stack(
        [ss.process(*row) for row in zip(logits, temperature, top_k, top_p, strict=True)]
    )
    return logits, temperature, top_k, top_p, expected


def mismatches(got: torch.Tensor, expected: np.ndarray) -> tuple[int, int]:
    """(rows keeping other tokens than the reference, rows whose values differ beyond rtol)."""
    got = got.detach().cpu().double().numpy()
    support = ((got > 0) != (expected > 0)).any(axis=-1)
    close = np.isclose(got, expected, rtol=1e-13, atol=1e-300).all(axis=-1)
    return int(support.sum()), int((~support & ~close).sum())


def full_sort(*args):
    """``process`` by the full stable sort of every row: the route ``validate=False`` takes on an
    accelerator (on the CPU it keeps the partial sort, host reads being free there)."""
    with mock.patch.object(processing, "_reads_are_free", lambda device: False):
        return process(*args, validate=False)


@pytest.fixture
def prefix_size(request, monkeypatch):
    """Patch the partial sort's length to ``request.param`` (None: leave it)."""
    size = request.param
    if size is not None:
        monkeypatch.setattr(processing, "_prefix_size", lambda vocab_size: min(size, vocab_size))
    return size


class RowCounter:
    """Counts the rows that reach the full sort from the fast path."""

    def __init__(self, monkeypatch):
        self.rows = 0
        original = processing._keep_sorted

        def counted(probs, counts, masses):
            self.rows += probs.shape[0]
            return original(probs, counts, masses)

        counted.rows = lambda: self.rows
        monkeypatch.setattr(processing, "_keep_sorted", counted)


def check_float64_against_reference(vocab_size: int, seed: int) -> int:
    """Assert the fast path keeps the reference's tokens on the fuzzed grid; rows in the grid."""
    logits, temperature, top_k, top_p, expected = grid(vocab_size, seed)
    got = process(torch.tensor(logits), temperature, top_k, top_p)
    assert mismatches(got, expected) == (0, 0)
    return len(logits)


@pytest.mark.parametrize("prefix_size", PREFIX_SIZES, indirect=True)
@pytest.mark.parametrize("vocab_size", [1, 2, 7, 40, 300])
def test_float64_fast_path_keeps_the_reference_tokens(prefix_size, vocab_size, monkeypatch):
    counter = RowCounter(monkeypatch)
    num_rows = check_float64_against_reference(vocab_size, seed=0)
    if prefix_size is not None and prefix_size < vocab_size:
        # Both routes decide rows: the prefix alone, and the full sort behind it.
        assert 0 < counter.rows < num_rows


@pytest.mark.parametrize("prefix_size", PREFIX_SIZES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("vocab_size", [3, 40, 300])
def test_fast_path_equals_the_full_sort_bit_for_bit(prefix_size, dtype, vocab_size):
    """validate=True (partial sort + fallback) against one full stable sort; validate=False on
    the CPU takes the partial sort too."""
    logits, temperature, top_k, top_p, _ = grid(vocab_size, seed=1)
    x = torch.tensor(logits).to(dtype)
    fast = process(x, temperature, top_k, top_p)
    full = full_sort(x, temperature, top_k, top_p)
    assert torch.equal(process(x, temperature, top_k, top_p, validate=False), fast)
    assert torch.equal(fast, full)
    for k, p in [(None, 0.5), (3, 0.9), (5, None), (None, 1e-12)]:  # host scalars: other routes
        fast = process(x, 0.7, k, p)
        assert torch.equal(fast, full_sort(x, 0.7, k, p)), (k, p)


def test_large_vocabulary_with_flat_rows_and_exact_thresholds(monkeypatch):
    """V = 50,000 at the library's own m (6,250): nuclei far beyond m go to the fallback."""
    counter = RowCounter(monkeypatch)
    vocab_size = 50_000
    rng = np.random.default_rng(5)
    ids = np.arange(vocab_size)
    logits = np.stack(
        [
            np.zeros(vocab_size),  # flat: the nucleus of 0.9 is 45,000 tokens
            rng.normal(size=vocab_size) * 0.1,
            rng.normal(size=vocab_size) * 3,
            np.log(np.maximum(0.5 ** (ids + 1.0), 1e-300)),  # dyadic
            rng.integers(0, 4, vocab_size).astype(np.float64),
            np.where(ids < 8000, 0.0, -math.inf),  # 8,000 equal masses: 1/8000 each
        ]
    )
    top_p = [0.9, 0.9, 0.9, 0.5, 0.3, 0.5]
    top_k = [None, 40_000, None, None, 5_000, 50]
    expected = np.stack(
        [ss.process(row, 1.0, k, p) for row, k, p in zip(logits, top_k, top_p, strict=True)]
    )
    got = process(torch.tensor(logits), 1.0, top_k, top_p)
    assert mismatches(got, expected) == (0, 0)
    assert 0 < counter.rows < len(logits)
    x32 = torch.tensor(logits, dtype=torch.float32)
    fast = process(x32, 1.0, top_k, top_p)
    assert torch.equal(fast, full_sort(x32, 1.0, top_k, top_p))


# ----------------------------------------------------------------------------------------------
# Top-p alone: the candidates of a radix histogram (``_nucleus_candidates``)


def check_candidates_route(vocab_size: int, dtype: torch.dtype, seed: int) -> tuple[int, int]:
    """Assert top-p alone (per-row ``top_p``, top-k off) keeps the full sort's tokens bit for bit
    and, in float64, the reference's; returns (rows in the grid, rows of the fast call that
    reached the full sort, where a :class:`RowCounter` is installed)."""
    logits, temperature, _, top_p, _ = grid(vocab_size, seed)
    x = torch.tensor(logits).to(dtype)
    before = getattr(processing._keep_sorted, "rows", lambda: 0)()
    fast = process(x, temperature, None, top_p)
    fallback = getattr(processing._keep_sorted, "rows", lambda: 0)() - before
    assert torch.equal(fast, full_sort(x, temperature, None, top_p))
    if dtype == torch.float64:
        rows = zip(logits, temperature, top_p, strict=True)
        expected = np.stack([ss.process(row, t, None, p) for row, t, p in rows])
        assert mismatches(fast, expected) == (0, 0)
    return len(logits), fallback


class CandidateCounter:
    """Counts the calls of the candidates' route."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = processing._nucleus_candidates

        def counted(probs, masses):
            self.calls += 1
            return original(probs, masses)

        monkeypatch.setattr(processing, "_nucleus_candidates", counted)


class NucleusCounter:
    """Counts the calls of the radix select (top-p alone below float64)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = processing._keep_nucleus

        def counted(probs, masses):
            self.calls += 1
            return original(probs, masses)

        monkeypatch.setattr(processing, "_keep_nucleus", counted)


@pytest.mark.parametrize("margin", [1e-3, -0.5, 0.0])
@pytest.mark.parametrize("chunk", [None, 64])
@pytest.mark.parametrize("vocab_size", [1, 2, 7, 40, 300])
def test_top_p_alone_by_candidates_keeps_the_sorted_tokens(margin, chunk, vocab_size, monkeypatch):
    """Float64: every guess of the histogram is sound: a short one (margin -0.5: the candidates
    hold half the needed mass) sends rows to the full sort, a tight one (0) decides them at the
    edge. ``chunk = 64`` elements: many row chunks, the last one ragged."""
    monkeypatch.setattr(processing, "_CANDIDATE_MARGIN", margin)
    if chunk is not None:
        monkeypatch.setattr(processing, "_CHUNK_ELEMENTS", chunk)
    route = CandidateCounter(monkeypatch)
    RowCounter(monkeypatch)
    num_rows, fallback = check_candidates_route(vocab_size, torch.float64, seed=2)
    assert route.calls == 1
    if margin < 0 and vocab_size > 2:
        assert 0 < fallback < num_rows  # both the candidates and the full sort decide rows


@pytest.mark.parametrize("chunk", [None, 64, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab_size", [1, 2, 7, 40, 300])
def test_top_p_alone_by_radix_select_keeps_the_sorted_tokens(chunk, dtype, vocab_size, monkeypatch):
    """Below float64, top-p alone is the radix select: the full sort's tokens bit for bit on the
    fuzzed grid (ties cut at the last kept value, flat rows, dyadic masses, per-row top_p, top-p
    off on some rows), the full sort never called. ``chunk``: many row chunks, one row each."""
    if chunk is not None:
        monkeypatch.setattr(processing, "_NUCLEUS_CHUNK_ELEMENTS", chunk)
        monkeypatch.setattr(processing, "_CHUNK_ELEMENTS", chunk)
    route = NucleusCounter(monkeypatch)
    RowCounter(monkeypatch)
    _, rows_sorted = check_candidates_route(vocab_size, dtype, seed=2)
    assert route.calls == 1
    assert rows_sorted == 0


@pytest.mark.parametrize("prefix", [2, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_size", [300, 5000])
def test_top_p_alone_on_peaked_rows_keeps_the_sorted_tokens(prefix, dtype, vocab_size, monkeypatch):
    """Below float64, top-p alone first tries a partial sort of the first ``prefix`` ranks on
    rows whose block bound reaches ``top_p``. On the fuzzed grid, with the prefix short, it
    decides some rows and hands the others (flat rows, nuclei past the prefix) to the radix
    select: the full sort's tokens bit for bit, the full sort never called."""
    monkeypatch.setattr(processing, "_PEAKED_PREFIX", prefix)
    monkeypatch.setattr(processing, "_PEAKED_SHARE", 0.0)  # the prefix once any row is peaked
    radix_rows = []
    original = processing._keep_nucleus
    monkeypatch.setattr(
        processing,
        "_keep_nucleus",
        lambda probs, masses: radix_rows.append(len(probs)) or original(probs, masses),
    )
    RowCounter(monkeypatch)
    num_rows, rows_sorted = check_candidates_route(vocab_size, dtype, seed=3)
    assert rows_sorted == 0
    assert len(radix_rows) == 1 and 0 < radix_rows[0] < num_rows  # both routes decide rows


def exact_fixed_total(row: np.ndarray) -> int:
    """The integer total of a float32 row, sum of floor(p 2**s), in Python integers."""
    shift = 62 - len(row).bit_length()
    return sum(math.floor(float(p) * 2**shift) for p in row)


def band_rows(vocab_size: int) -> torch.Tensor:
    """Float32 rows whose float sums err: a 1 followed by values lost when added to it, equal
    values that do not sum to 1 exactly, a softmax, a one-hot, a Dirichlet draw."""
    rng = np.random.default_rng(vocab_size)
    lost = np.full(vocab_size, 1e-9)
    lost[0] = 1.0
    rows = [
        lost,
        np.full(vocab_size, 1.0 / vocab_size),
        np.full(vocab_size, 0.1),
        torch.softmax(torch.tensor(rng.normal(size=vocab_size) * 3), -1).numpy(),
        np.eye(1, vocab_size, 7)[0],
        rng.dirichlet(np.full(vocab_size, 0.01)),
    ]
    return torch.tensor(np.stack(rows), dtype=torch.float32)


@pytest.mark.parametrize("vocab_size", [300, 5000])
def test_fixed_total_band_holds_the_exact_total(vocab_size):
    """The row totals' bounds hold the exact integer total (Python integers) and are narrow
    (3e-5 of the scale: 127 roundings of a block sum, each way), and a band without the
    rounding slack misses it on a row whose float sum drops terms."""
    rows = band_rows(vocab_size)
    scale = 2 ** (62 - vocab_size.bit_length())
    for width, relative in [(128, 4e-5), (16, 5e-6)]:  # the default; top-p alone's bound blocks
        sums = processing.ops.block_sums(rows, width)
        low, high = processing._fixed_total_band(rows, sums, width)
        for row, lo, hi in zip(rows.numpy(), low.tolist(), high.tolist(), strict=True):
            total = exact_fixed_total(row)
            assert lo <= total <= hi
            assert hi - lo <= relative * max(total, scale) + 2 * vocab_size
    mutant = mutated(processing._fixed_total_band, ("slack = 2 * (", "slack = 0 * ("))
    low, high = mutant(rows)
    missed = [
        not lo <= exact_fixed_total(row) <= hi
        for row, lo, hi in zip(rows.numpy(), low.tolist(), high.tolist(), strict=True)
    ]
    assert missed[0]  # the 1 with the lost terms


def peaked_and_flat_rows(vocab_size: int) -> torch.Tensor:
    """Float32 logits: peaked rows (nuclei of a few tokens, one with a tie cut at its edge) and
    flat ones (nuclei of most of the vocabulary)."""
    g = torch.Generator().manual_seed(vocab_size)
    peaked = torch.randn(4, vocab_size, generator=g) * 10
    peaked[3, :] = -30.0
    peaked[3, [5, 9, 40, 41]] = torch.tensor([2.0, 1.0, 1.0, 1.0])  # ties straddle the cut
    flat = torch.randn(2, vocab_size, generator=g) * 0.1
    return torch.cat([peaked, flat])


@pytest.mark.parametrize("vocab_size", [5000, 20_000])  # the bound's short and long blocks
def test_top_p_alone_peaked_rows_skip_the_radix_select_and_flat_rows_the_prefix(
    monkeypatch, vocab_size
):
    """Rows the prefix decides never reach the radix select; rows the bound rules out never pay
    for the prefix (nor do peaked rows in a batch of mostly flat ones); the kept tokens are the
    integer-mass rule's (an independent implementation) and the full sort's either way."""
    x = peaked_and_flat_rows(vocab_size)
    calls = {"radix": 0, "prefix": 0}
    radix, topk = processing._keep_nucleus, processing.ops.topk_blocks

    def counted_radix(probs, masses):
        calls["radix"] += len(probs)
        return radix(probs, masses)

    def counted_topk(rows, m):
        calls["prefix"] += len(rows)
        return topk(rows, m)

    monkeypatch.setattr(processing, "_keep_nucleus", counted_radix)
    monkeypatch.setattr(processing.ops, "topk_blocks", counted_topk)
    for rows, top_p, radix_rows, prefix_rows in [
        (x[:4], 0.9, 0, 4),  # peaked only: decided by the prefix
        (x[4:], 0.9, 2, 0),  # flat only: the bound sends them straight to the radix select
        (x, [0.9, 0.5, 0.99, 0.8, 0.9, None], 1, 6),  # mixed: the flat row with top-p on
        (x[3:], 0.9, 3, 0),  # under half of the rows peaked: the radix select on every row
    ]:
        calls.update(radix=0, prefix=0)
        got = process(rows, 1.0, None, top_p)
        assert (calls["radix"], calls["prefix"]) == (radix_rows, prefix_rows), top_p
        assert torch.equal(got, full_sort(rows, 1.0, None, top_p))
        ps = top_p if isinstance(top_p, list) else [top_p] * len(rows)
        probs = torch.softmax(rows, -1).numpy()
        for row, p, kept in zip(probs, ps, got.numpy() > 0, strict=True):
            want = np.ones(len(row), bool) if p is None else integer_nucleus(row, p)
            assert np.array_equal(kept, want), p
    tied = process(x[3:4], 1.0, None, 0.5)  # 2.0 then three tokens at 1.0: the cut is a tie
    assert (tied[0] > 0).nonzero()[:, 0].tolist() == [5, 9]


def test_top_p_alone_escalates_undecided_rows_before_the_radix_select(monkeypatch):
    """Rows whose nucleus is longer than the partial sort's ranks are decided by a partial sort
    of twice, four times, ... as many (while the vocabulary holds 64 blocks of it and the bound
    says such rows may be decided), never reaching the radix select; flat rows in a peaked batch
    go to the radix select without escalating. The kept tokens are the integer-mass rule's and
    the full sort's either way."""
    monkeypatch.setattr(processing, "_PEAKED_PREFIX", 8)
    g = torch.Generator().manual_seed(5)
    rows = torch.cat(
        [torch.randn(6, 5000, generator=g) * 6.0, torch.randn(6, 5000, generator=g) * 5.0]
    )  # nuclei of 1-19 and 1-22 tokens: some rows past 8 ranks, none past 32
    flat = torch.randn(1, 5000, generator=g) * 0.1
    calls = {"radix": 0, "sizes": []}
    radix, topk = processing._keep_nucleus, processing.ops.topk_blocks

    def counted_radix(probs, masses):
        calls["radix"] += len(probs)
        return radix(probs, masses)

    def counted_topk(part, m):
        calls["sizes"].append((len(part), m))
        return topk(part, m)

    monkeypatch.setattr(processing, "_keep_nucleus", counted_radix)
    monkeypatch.setattr(processing.ops, "topk_blocks", counted_topk)
    for table, radix_rows in [(rows, 0), (torch.cat([rows, flat]), 1)]:
        calls.update(radix=0, sizes=[])
        got = process(table, 1.0, None, 0.9)
        assert calls["radix"] == radix_rows
        sizes = [m for _, m in calls["sizes"]]
        assert sizes[0] == 8 and len(sizes) > 1 and sizes == [8 * 2**i for i in range(len(sizes))]
        assert calls["sizes"][1][0] < len(table)  # only the rows left undecided escalate
        assert torch.equal(got, full_sort(table, 1.0, None, 0.9))
        probs = torch.softmax(table, -1).numpy()
        expected = np.stack([integer_nucleus(row, 0.9) for row in probs])
        assert np.array_equal(got.numpy() > 0, expected)


def test_top_p_alone_on_peaked_rows_reads_the_host_twice(monkeypatch):
    """Top-p alone on peaked rows, unchecked: two host reads (how many rows are peaked, the
    prefix's flags), none for the row totals, which the bound's block sums give."""
    x = peaked_and_flat_rows(5000)[:4]
    expected = process(x, 1.0, None, 0.9, validate=False)
    reads = []
    for name in ["item", "tolist", "__bool__", "__int__", "__float__"]:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    got = process(x, 1.0, None, 0.9, validate=False)
    monkeypatch.undo()
    assert torch.equal(got, expected)
    assert reads == ["__int__", "tolist"], reads


def test_top_p_alone_prefix_mutant_is_caught(monkeypatch):
    """The peaked rows' prefix keeping one rank too many fails the full sort comparison."""
    prefix, _ = one_more_mutant()
    monkeypatch.setattr(processing, "_top_p_prefix", prefix)
    x = peaked_and_flat_rows(5000)[:4]
    assert not torch.equal(process(x, 1.0, None, 0.9), full_sort(x, 1.0, None, 0.9))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_validate_false_keeps_the_partial_sort_on_the_cpu_only(dtype, monkeypatch):
    """On the CPU ``validate=False`` still takes the candidates (float64) or the radix select
    (below float64): host reads are free there; the accelerator route (no host read) takes the
    full sort; both keep the same tokens."""
    route = CandidateCounter(monkeypatch) if dtype == torch.float64 else NucleusCounter(monkeypatch)
    x = torch.tensor(np.random.default_rng(3).normal(size=(6, 500)) * 3, dtype=dtype)
    fast = process(x, 1.0, None, 0.9, validate=False)
    assert route.calls == 1
    monkeypatch.setattr(processing, "_reads_are_free", lambda device: False)
    assert torch.equal(process(x, 1.0, None, 0.9, validate=False), fast)
    assert route.calls == 1


def integer_nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """The documented float32 top-p rule, spelled out independently with Python integers: stable
    ranking, masses floor(p 2**s) with s = 62 - bit_length(V), a rank kept while its mass-before
    is below ceil(top_p * T) (the product in float64)."""
    vocab_size = len(probs)
    shift = 62 - vocab_size.bit_length()
    units = [math.floor(float(p) * 2**shift) for p in probs]  # float32 -> exact float64
    threshold = math.ceil(top_p * float(sum(units)))
    order = sorted(range(vocab_size), key=lambda i: (-float(probs[i]), i))
    keep = np.zeros(vocab_size, dtype=bool)
    before = 0
    for token in order:
        if before >= threshold:
            break
        keep[token] = True
        before += units[token]
    return keep


@pytest.mark.parametrize("vocab_size", [7, 300, 5000])
def test_float32_top_p_keeps_the_integer_mass_nucleus(vocab_size):
    """Below float64 a token is kept by its integer mass-before (order-independent sums): the
    kept sets of the radix select, of the partial sort (top-k on) and of the full sort equal an
    independent implementation of the rule, on rows with ties and thresholds hit exactly."""
    rng = np.random.default_rng(vocab_size)
    ids = np.arange(vocab_size)
    rows = np.stack(
        [
            rng.normal(size=vocab_size) * 3,
            rng.integers(0, 3, vocab_size).astype(np.float64),  # ties at every boundary
            np.log(np.maximum(0.5 ** (ids + 1.0), 1e-30)),  # dyadic: 0.5 hit exactly
            np.zeros(vocab_size),  # flat
        ]
    )
    x = torch.tensor(rows, dtype=torch.float32)
    for top_p in [0.5, 0.9, 0.3, 1e-9]:
        probs = torch.softmax(x, -1).numpy()
        expected = np.stack([integer_nucleus(row, top_p) for row in probs])
        for top_k in [None, vocab_size + 1, [None, vocab_size, 10**9, None]]:
            got = process(x, 1.0, top_k, top_p) > 0
            assert np.array_equal(got.numpy(), expected), (top_p, top_k)
        assert np.array_equal(full_sort(x, 1.0, None, top_p).numpy() > 0, expected)


def mass_divided(probs: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The documented float32 values of a top-p row, spelled out independently: each kept
    probability divided, in float32, by float32(M 2**-s), M the kept tokens' integer mass
    (floor(p 2**s), s = 62 - bit_length(V), in Python integers), every other token 0."""
    shift = 62 - len(probs).bit_length()
    mass = sum(math.floor(float(p) * 2**shift) for p in probs[keep])
    divisor = np.float32(mass * 2.0**-shift)  # exact in float64 (mass < 2**53), rounded once
    return np.where(keep, probs / divisor, np.float32(0)).astype(np.float32)


def mixed_top_p_rows(vocab_size: int, seed: int) -> torch.Tensor:
    """Float32 logits: peaked rows (nuclei of a few tokens), a flat one, ties at the boundary."""
    rng = np.random.default_rng([vocab_size, seed])
    rows = [rng.normal(size=vocab_size) * 8 for _ in range(5)]
    rows += [rng.normal(size=vocab_size) * 3, rng.integers(0, 3, vocab_size) * 6.0]
    rows += [np.where(np.arange(vocab_size) < 3, 10.0, rng.normal(size=vocab_size))]  # 3 tied
    return torch.tensor(np.stack(rows), dtype=torch.float32)


@pytest.mark.parametrize("vocab_size", [300, 5000, 40_000])
def test_float32_top_p_values_are_divided_by_the_kept_integer_mass(vocab_size, monkeypatch):
    """Below float64 the kept probabilities are divided by the kept integer mass (a function of
    the kept set alone): every route (radix select, peaked rows' partial sort writing the kept
    tokens by id, with undecided rows masked, the threshold pass, the full sort) gives the
    independently spelled-out values bit for bit, per-row top_p with top-p off on some rows
    included (those rows the softmax itself, undivided, as when processed alone)."""
    monkeypatch.setattr(processing, "_PEAKED_PREFIX", 8)  # some peaked rows left undecided
    x = mixed_top_p_rows(vocab_size, seed=1)
    probs = torch.softmax(x, -1).numpy()
    off = [0.9, None, 0.5, 0.9, 1.0, 0.9, 0.7, 0.95]
    for top_p in [0.9, 0.5, off]:
        row_p = top_p if isinstance(top_p, list) else [top_p] * len(x)
        expected = np.stack(
            [
                row if p in (None, 1.0) else mass_divided(row, integer_nucleus(row, p))
                for row, p in zip(probs, row_p, strict=True)
            ]
        )  # top-p off (None, 1.0): the softmax row, untouched
        for masked_share in [processing._MASKED_SHARE, 1.0, -1.0]:  # by ids where it may
            monkeypatch.setattr(processing, "_MASKED_SHARE", masked_share)
            for got in [process(x, 1.0, None, top_p), process(x, 1.0, None, top_p, validate=False)]:
                assert np.array_equal(got.numpy(), expected), (top_p, masked_share)
        assert np.array_equal(full_sort(x, 1.0, None, top_p).numpy(), expected), top_p


class ZeroingSpy:
    """Records, for each ``_zero_dropped`` call, whether it wrote the kept tokens by id and how
    many rows were masked."""

    def __init__(self, monkeypatch):
        self.calls = []
        self.original = original = processing._zero_dropped

        def spied(probs, kept):
            masked = 0 if kept.index is None else len(kept.index)
            self.calls.append((kept.ids is not None, masked))
            return original(probs, kept)

        monkeypatch.setattr(processing, "_zero_dropped", spied)


def test_top_p_peaked_rows_by_ids_equal_the_threshold_pass(monkeypatch):
    """Peaked rows decided by the partial sort are written by id into a zero table, the rows it
    leaves to the radix select masked first and written back: the same table bit for bit as the
    threshold pass. A mutant that forgets to write the masked rows back is caught."""
    monkeypatch.setattr(processing, "_PEAKED_PREFIX", 8)
    monkeypatch.setattr(processing, "_MASKED_SHARE", 1.0)
    x = mixed_top_p_rows(5000, seed=2)
    spy = ZeroingSpy(monkeypatch)
    by_ids = process(x, 1.0, None, 0.9)
    assert spy.calls == [(True, spy.calls[0][1])] and spy.calls[0][1] > 0  # ids, some masked
    monkeypatch.setattr(processing, "_MASKED_SHARE", -1.0)  # never by ids
    spy.calls.clear()
    assert torch.equal(process(x, 1.0, None, 0.9), by_ids)
    assert spy.calls[0][0] is False
    assert torch.equal(process(x, 1.0, None, 0.9, validate=False), by_ids)  # threshold pass
    monkeypatch.setattr(processing, "_MASKED_SHARE", 1.0)
    forgetful = mutated(spy.original, ("probs[kept.index] = masked", "pass"))
    monkeypatch.setattr(processing, "_zero_dropped", forgetful)
    assert not torch.equal(process(x, 1.0, None, 0.9), by_ids)


def test_top_p_by_ids_into_out_overwrites_every_entry(monkeypatch):
    """The kept tokens written by id into ``out=`` (a zero table first): every entry of the
    buffer's garbage is overwritten, the values are the call's without ``out=``, and with rows
    masked (left to the radix select) too."""
    x = mixed_top_p_rows(5000, seed=4)
    spy = ZeroingSpy(monkeypatch)
    for rows, prefix, masked_share in [(x[:5], 64, 0.0), (x, 8, 1.0)]:  # peaked; all rows
        monkeypatch.setattr(processing, "_PEAKED_PREFIX", prefix)
        monkeypatch.setattr(processing, "_MASKED_SHARE", masked_share)
        expected = process(rows, 1.0, None, 0.9)
        out = torch.full_like(expected, float("nan"))
        spy.calls.clear()
        assert process(rows, 1.0, None, 0.9, out=out) is out
        assert spy.calls[0][0] is True  # by ids
        assert torch.equal(out, expected)


@pytest.mark.parametrize("vocab_size", [5000, 151_936])
def test_float32_top_p_is_row_local_bit_for_bit(vocab_size):
    """A row's float32 top-p probabilities are the same bit for bit processed alone or in its
    table (kept set and divisor are functions of the row alone), on whichever route each call
    takes: peaked tables, flat rows, one long row histogrammed in pieces, per-row top_p."""
    x = mixed_top_p_rows(vocab_size, seed=3)
    for top_p in [0.9, [0.9, 0.5, 0.9, 0.99, 0.3, 0.9, 0.8, 0.9]]:
        table = process(x, 0.8, None, top_p)
        per_row = top_p if isinstance(top_p, list) else [top_p] * len(x)
        for row in range(len(x)):
            alone = process(x[row : row + 1], 0.8, None, per_row[row : row + 1])
            assert torch.equal(alone[0], table[row]), (top_p, row)
            pair = process(x[row : row + 2], 0.8, None, per_row[row : row + 2])
            assert torch.equal(pair[0], table[row]), (top_p, row)


def test_float32_rows_do_not_depend_on_their_neighbours_settings():
    """A row's probabilities below float64 are the same bit for bit alone or beside rows of
    other settings: a row with top-k and top-p off is the softmax itself, undivided, whatever
    its neighbours cut (it was divided by its integer total, or by its row sum, beside rows
    that cut), and a row's temperature decides its formula alone (a T >= 1 row beside T < 1
    rows was shifted by its maximum, which moved its last bits)."""
    vocab_size = 5000
    x = mixed_top_p_rows(vocab_size, seed=4)[:4]
    for top_p in [None, 0.9]:
        for temperature in [1.0, 1.5, 0.7]:
            alone = process(x[:1], temperature, None, top_p)
            assert torch.equal(alone[0], process(x[:1], [temperature], None, [top_p])[0])
            neighbours = [
                (temperature, None, [top_p, 0.9, 0.5, None]),  # top-p on beside it
                (temperature, torch.tensor([vocab_size, 50, 7, vocab_size]), top_p),  # top-k
                ([temperature, 0.7, 2.0, 0.3], None, top_p),  # other temperatures
                (torch.tensor([temperature, 0.5, 1.0, 3.0]), None, [top_p, 0.9, None, 0.3]),
            ]
            for settings in neighbours:
                got = process(x, *settings)[0]
                assert torch.equal(got, alone[0]), (top_p, temperature, settings)
    plain = process(x, 1.0, None, [None, 0.9, None, 0.5])
    assert torch.equal(plain[0], torch.softmax(x[0], -1))  # off rows: the softmax row itself
    assert torch.equal(plain[2], torch.softmax(x[2], -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_column_major_logits_give_the_contiguous_result(dtype):
    """Logits whose rows are not contiguous in memory (a transposed table, a permuted batch)
    give the probabilities of their contiguous copy bit for bit on every route: the softmax
    written in place into a column-major buffer scrambled rows below float64."""
    g = torch.Generator().manual_seed(5)
    table = (torch.randn(300, 6, generator=g) * 3).to(dtype).T  # [6, 300], strides (1, 6)
    batch = (torch.randn(300, 2, 3, generator=g) * 3).to(dtype).permute(1, 2, 0)  # [2, 3, 300]
    for logits in (table, batch):
        assert not logits.is_contiguous()
        for temperature, top_k, top_p in [
            (0.7, None, None),
            (1.5, None, None),
            (1.0, None, 0.9),
            (0.001, None, 0.9),
            (0.8, 50, 0.9),
            (0.8, 400, 0.5),
            ([0.5, 1.3, 0.0, 1.0, 2.0, 0.9][: logits.shape[-2]], None, 0.8),
        ]:
            want = process(logits.contiguous(), temperature, top_k, top_p)
            got = process(logits, temperature, top_k, top_p)
            assert torch.equal(got, want), (logits.shape, temperature, top_k, top_p)
            assert not got.isnan().any()


def test_radix_select_splits_few_long_rows_into_pieces_exactly():
    """A chunk of one or two long rows is histogrammed in pieces (the CPU's threads scatter
    row by row): the kept sets still equal the integer-mass rule's, ties and all."""
    vocab_size = 65_536
    assert processing._histogram_pieces(1, vocab_size, torch.device("cpu")) > 1
    assert processing._histogram_pieces(1, vocab_size + 1, torch.device("cpu")) == 1  # odd V
    rng = np.random.default_rng(11)
    rows = np.stack(
        [rng.normal(size=vocab_size) * 3, rng.integers(0, 4, vocab_size).astype(np.float64)]
    )
    x = torch.tensor(rows, dtype=torch.float32)
    probs = torch.softmax(x, -1)
    for top_p in [0.9, 0.5]:
        expected = np.stack([integer_nucleus(row, top_p) for row in probs.numpy()])
        for part in (slice(0, 1), slice(0, 2)):
            masses = torch.full((len(rows[part]),), top_p, dtype=torch.float64)
            kept = processing._keep_nucleus(probs[part].clone(), masses)
            got = probs[part].clone()
            processing._zero_dropped(got, kept)
            assert np.array_equal(got.numpy() > 0, expected[part]), (top_p, part)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_validate_false_gives_nan_rows_for_nan_logits_not_an_error(dtype):
    """Unchecked NaN logits (negative NaNs included) give NaN rows on the candidates' route, as
    the contract of validate=False says, not an index error from their radix keys."""
    x = torch.randn(4, 300, dtype=dtype)
    x[1, 5], x[2, 7] = math.nan, -math.nan
    got = process(x, 1.0, None, 0.9, validate=False)
    assert got.shape == x.shape
    assert torch.isnan(got[1:3]).all(-1).all()


def test_candidates_are_the_top_of_the_ranking():
    """Each row's candidates are its ``valid`` largest values, sorted, then zeros, and hold at
    least ``top_p`` of its mass (within the histogram's rounding); top-p off: none."""
    rng = np.random.default_rng(4)
    for dtype in [torch.float32, torch.float64]:
        probs = torch.tensor(rng.dirichlet(np.full(500, 0.05), size=12)).to(dtype)
        masses = torch.tensor([0.9, 0.5, 1e-9, 0.999, math.inf, 0.3] * 2, dtype=torch.float64)
        values, valid = processing._nucleus_candidates(probs, masses)
        ranked = probs.sort(-1, descending=True).values
        for row in range(12):
            count = int(valid[row])
            assert torch.equal(values[row, :count], ranked[row, :count])
            assert (values[row, count:] == 0).all()
            if masses[row] == math.inf:
                assert count == 0
            else:
                assert ranked[row, :count].double().sum() >= masses[row] * (1 - 1e-5)
                assert count < 500 or masses[row] > 0.99


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(0, 5), (3, 0, 5), (0, 1), (4, 1)])
def test_candidates_route_on_empty_batches_and_one_token(shape, dtype):
    """No rows (an empty batch) and one-token vocabularies: each route returns the softmax's
    shape, one-token rows keep their token."""
    x = torch.zeros(shape, dtype=dtype)
    for k, p in [(None, 0.5), (None, [0.5] * shape[0] if len(shape) == 2 else 0.5), (2, 0.5)]:
        got = process(x, 1.0, k, p)
        assert got.shape == shape and got.dtype == dtype
        assert torch.equal(got, torch.ones(shape, dtype=dtype))
    values, valid = processing._nucleus_candidates(
        torch.zeros(0, 7, dtype=dtype), torch.zeros(0, dtype=torch.float64)
    )
    assert values.shape[0] == 0 and valid.shape == (0,)


def test_float32_at_large_vocabularies_by_radix_select(monkeypatch):
    """V = 32,000 and 151,936 with nuclei of thousands of tokens, tied masses and flat rows:
    the radix select decides every row, equal to the full sort bit for bit."""
    fallback = RowCounter(monkeypatch)
    fast_rows = 0
    rng = np.random.default_rng(7)
    for vocab_size in [32_000, 151_936]:
        rows = [
            rng.normal(size=vocab_size) * 3,
            rng.normal(size=vocab_size),
            np.zeros(vocab_size),  # flat: every token ties
            rng.integers(0, 3, vocab_size).astype(np.float64),  # three tie groups
        ]
        x = torch.tensor(np.stack(rows), dtype=torch.float32)
        for top_p in [0.9, 0.5, [0.95, 0.3, 0.75, 0.6]]:
            before = fallback.rows
            fast = process(x, 1.0, None, top_p)
            fast_rows += fallback.rows - before
            assert torch.equal(fast, full_sort(x, 1.0, None, top_p))
    assert fast_rows == 0


# ----------------------------------------------------------------------------------------------
# Mutants of the threshold: one token too many must be caught


def mutated(function, *replacements):
    """``function`` recompiled with its source edited by ``(old, new)`` pairs (each must apply)."""
    source = textwrap.dedent(inspect.getsource(function))
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    namespace = dict(vars(processing))
    exec(compile(source, "<mutant>", "exec"), namespace)
    return namespace[function.__name__]


def less_or_equal_mutant():
    """The partial sort and the radix select with ``mass_before <= threshold`` as "kept" (a tie
    on the threshold kept)."""
    prefix = mutated(
        processing._top_p_prefix,
        ("sure_in = mass_before < low", "sure_in = mass_before <= low"),
        ("sure_in = mass_before < below", "sure_in = mass_before <= below"),
    )
    nucleus = mutated(
        processing._keep_nucleus, ("(mass_before < torch.cat", "(mass_before <= torch.cat")
    )
    return prefix, nucleus


def one_more_mutant():
    """The partial sort and the radix select keeping the first dropped rank too (``r + 1``)."""
    original = processing._top_p_prefix

    def prefix(probs, counts, masses, values, valid, band=None):
        last_value, num_kept, decided, partial, mass = original(
            probs, counts, masses, values, valid, band
        )
        more = torch.minimum(num_kept + 1, valid.clamp(min=1))
        last_value = torch.where(last_value < 0, last_value, values.gather(-1, more[:, None] - 1))
        return last_value, more, decided, torch.ones_like(partial), mass

    nucleus = mutated(
        processing._keep_nucleus,
        ("[:, None])).sum(-1)  # [R]", "[:, None])).sum(-1)\n    num_kept += num_kept < valid"),
    )
    return prefix, nucleus


@pytest.mark.parametrize("make_mutant", [less_or_equal_mutant, one_more_mutant])
def test_threshold_mutants_are_caught(make_mutant, monkeypatch):
    prefix, nucleus = make_mutant()
    monkeypatch.setattr(processing, "_top_p_prefix", prefix)
    monkeypatch.setattr(processing, "_keep_nucleus", nucleus)
    monkeypatch.setattr(processing, "_prefix_size", lambda vocab_size: min(16, vocab_size))
    with pytest.raises(AssertionError):
        check_float64_against_reference(40, seed=0)
    with pytest.raises(AssertionError):
        test_fast_path_equals_the_full_sort_bit_for_bit(16, torch.float32, 40)
    # Top-p alone (float64: the radix candidates; float32: the radix select). In float64 with
    # top-k off a mass-before within a band around the threshold goes to the full sort, so "<="
    # differs from "<" only in float32.
    dtypes = [torch.float32] + [torch.float64] * (make_mutant is one_more_mutant)
    for dtype in dtypes:
        with pytest.raises(AssertionError):
            check_candidates_route(40, dtype, seed=0)


# ----------------------------------------------------------------------------------------------
# Float32 against float64; the fused softmax


@pytest.mark.parametrize(("seed", "largest_k"), [(9, 2000), (11, 1999)])
def test_float32_agrees_with_float64(seed, largest_k):
    """Same (float32-representable) logits: at most 1% of rows keep other tokens (a boundary
    within float32 rounding), and the rest agree to ``atol = 1e-6`` (plus ``rtol = 1e-4``).
    With every ``k < V`` (1999) below float64 top-p runs inside the top-k set, from the logits;
    with top-k off on some rows (2000 = V) on the softmax."""
    rng = np.random.default_rng(seed)
    num_rows, vocab_size = 400, 2000
    logits = torch.tensor(rng.normal(size=(num_rows, vocab_size)) * 3, dtype=torch.float32)
    temperature = rng.choice([0.0, 0.5, 1.0, 1.5], num_rows)
    top_k = rng.choice([1, 20, 300, largest_k], num_rows)
    top_p = rng.choice([0.3, 0.8, 0.95, 1.0], num_rows)
    low = process(logits, temperature, top_k, top_p).double().numpy()
    high = process(logits.double(), temperature, top_k, top_p).numpy()
    support = ((low > 0) != (high > 0)).any(axis=-1)
    assert support.sum() <= 0.01 * num_rows
    np.testing.assert_allclose(low[~support], high[~support], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_softmax_temperatures(dtype):
    rng = np.random.default_rng(2)
    logits = torch.tensor(rng.normal(size=(6, 50)) * 4).to(dtype)
    rounded = logits.double().numpy()
    for temperature in [1.0, 2.5, 0.3, [0.0, 1.0, 2.5, 0.3, 1e-30, 7.0]]:
        got = process(logits, temperature).double().numpy()
        rows = temperature if isinstance(temperature, list) else [temperature] * 6
        want = np.stack([ss.process(r, t) for r, t in zip(rounded, rows, strict=True)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_fused_softmax_does_not_overflow():
    """Logits near the float32 maximum: dividing first would give inf - inf (NaN)."""
    logits = torch.tensor([[3e38, -3e38, 1e38], [0.0, 1.0, 3.3e38]])
    for temperature in [0.5, 1.0, 2.0, 1e-30, [0.5, 2.0]]:
        got = process(logits, temperature)
        assert torch.isfinite(got).all() and torch.allclose(got.sum(-1), torch.ones(2))
        assert got.argmax(-1).tolist() == [0, 2]


def test_low_temperature_rows_divide_unless_they_could_overflow():
    """Below T = 1 a row is ``softmax(x / T)`` unless its largest logit ``m`` has ``|m|`` above
    half the float32 maximum times T, where it is ``softmax((x - m) / T)``: decided per row, so a
    row alone (one division over the table), beside a row near the float32 maximum (the
    per-row route) and on the sync-free route of an accelerator is the same bit for bit; -inf
    entries stay 0, and the huge row stays finite."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 4000, generator=g) * 4
    x[1, ::7] = -math.inf
    big = torch.full((1, 4000), -3e38)
    big[0, 5] = 3.2e38  # x / 0.5 would overflow: this row subtracts its maximum
    bound = torch.finfo(torch.float32).max / 2
    edge = torch.full((1, 4000), -1.0)
    edge[0, 0] = bound * 0.5  # exactly at F T / 2 for T = 0.5: divides
    for temperature in (0.5, 0.7, [0.5, 0.9, 0.3]):
        rows = temperature if isinstance(temperature, list) else [temperature] * 3
        alone = process(x, temperature)
        want = torch.stack([torch.softmax(x[r] / t, -1) for r, t in enumerate(rows)])
        assert torch.equal(alone, want)  # the division then torch's softmax, nothing else
        beside = process(torch.cat([x, big]), [*rows, 0.5])
        assert torch.equal(beside[:3], alone)
        assert torch.isfinite(beside).all() and int(beside[3].argmax()) == 5
        assert torch.equal(sync_free(torch.cat([x, big]), [*rows, 0.5]), beside)
        assert (alone[1, ::7] == 0).all()
    at_edge = process(torch.cat([edge, x[:1]]), 0.5)
    assert torch.isfinite(at_edge).all() and int(at_edge[0].argmax()) == 0
    assert torch.equal(at_edge[1], process(x[:1], 0.5)[0])


@pytest.mark.slow
def test_temperature_compiles_without_graph_breaks():
    """Under ``torch.compile`` the temperature route reads nothing on the host: the per-row
    formula, the same values as eager."""
    x = torch.randn(3, 100, generator=torch.Generator().manual_seed(1)) * 4
    compiled = torch.compile(lambda t: process(t, 0.7, validate=False), fullgraph=True)
    # inductor fuses its own exp: a few ulps apart
    assert torch.allclose(compiled(x), process(x, 0.7, validate=False), rtol=1e-5, atol=0)


# ----------------------------------------------------------------------------------------------
# Top-k alone below float64: ranked by the logits, no softmax of the whole row


def top_k_rows(vocab_size: int, seed: int) -> torch.Tensor:
    """Float32 logit rows: distinct values, and exact ties at and around every boundary."""
    rng = np.random.default_rng([vocab_size, seed, 2])
    rows = [
        rng.normal(size=vocab_size) * 3,
        rng.integers(0, 3, vocab_size).astype(np.float64),  # ties cut at most k
        np.repeat(rng.normal(size=vocab_size // 4 + 1), 4)[:vocab_size],  # groups of four
        np.where(np.arange(vocab_size) % 3 == 1, -math.inf, rng.normal(size=vocab_size)),
        np.zeros(vocab_size),
    ]
    return torch.tensor(np.stack(rows * 4), dtype=torch.float32)


def sync_free(*args, **kwargs):
    with mock.patch.object(processing, "_reads_are_free", lambda device: False):
        return process(*args, **kwargs, validate=False)


@pytest.mark.parametrize("vocab_size", [6, 40, 300])
def test_float32_top_k_alone_keeps_the_reference_tokens(vocab_size):
    """The reference's kept tokens exactly (ties to the lower ids, ``-inf`` never above a finite
    logit) and its values to float32 rounding, for host and per-row ``k`` and temperatures."""
    x = top_k_rows(vocab_size, 0)
    rounded = x.double().numpy()
    rng = np.random.default_rng(vocab_size)
    per_row_t = rng.choice([0.0, 0.3, 1.0, 2.5], len(x)).tolist()
    for temperature, k in [
        (1.0, 1),
        (0.7, 3),
        (per_row_t, 5),
        (per_row_t, rng.integers(1, vocab_size, len(x)).tolist()),
    ]:
        got = process(x, temperature, k).double().numpy()
        temps = temperature if isinstance(temperature, list) else [temperature] * len(x)
        ks = k if isinstance(k, list) else [k] * len(x)
        want = np.stack([ss.process(r, t, kk) for r, t, kk in zip(rounded, temps, ks, strict=True)])
        assert ((got > 0) == (want > 0)).all(), (temperature, k)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_float32_top_k_alone_routes_agree_bit_for_bit(monkeypatch):
    """The CPU route (top-k indices, the tied rows by the threshold rule after one host read)
    equals the sync-free route (every row by the threshold rule, no host read) bit for bit;
    rows of both kinds occur."""
    x = top_k_rows(40, 1)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0] * (len(x) // 4))
    for k in [1, 4, 9, [1, 4, 9, 39] * (len(x) // 4)]:
        fast = process(x, temperature, k)
        assert torch.equal(process(x, temperature, k, validate=False), fast)
        tolist = torch.Tensor.tolist
        monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("a host read"))
        free = sync_free(x, temperature, k)
        monkeypatch.setattr(torch.Tensor, "tolist", tolist)
        assert torch.equal(free, fast), k
    calls = []
    original = processing._top_k_from_kth
    monkeypatch.setattr(
        processing, "_top_k_from_kth", lambda *a: calls.append(a[0].shape[0]) or original(*a)
    )
    process(x, 1.0, 4)
    assert 0 < calls[0] < len(x)  # the tied rows only


def test_float32_top_k_count_mutant_is_caught(monkeypatch):
    """A route keeping one token too many fails the reference comparison."""
    parse = processing._Parameter.parse

    def one_more(value, name, batch_shape, device):
        made = parse(value, name, batch_shape, device)
        if name == "top_k" and made.host:
            made.rows = made.rows + 1
        return made

    monkeypatch.setattr(processing._Parameter, "parse", staticmethod(one_more))
    with pytest.raises(AssertionError):
        test_float32_top_k_alone_keeps_the_reference_tokens(40)


# ----------------------------------------------------------------------------------------------
# Top-k with top-p below float64: top-p inside the top-k set, from the logits


def near_threshold(top_k_probs: np.ndarray, top_p: float, tol: float = 1e-6) -> bool:
    """Whether a rank's mass-before in ``top_k_probs`` (the reference's top-k distribution
    :math:`p_K`, float64, stable ranking) lies within ``tol`` of ``top_p``: a cut that float32
    rounding may move."""
    order = sorted(range(len(top_k_probs)), key=lambda i: (-top_k_probs[i], i))
    ranked = top_k_probs[order]
    before = np.concatenate([[0.0], np.cumsum(ranked[ranked > 0])[:-1]])
    return bool((np.abs(before - top_p) <= tol).any())


def check_top_k_with_top_p(x: torch.Tensor, temperature, top_k, top_p) -> tuple[int, int]:
    """``process`` against the float64 reference row by row: a row keeps the reference's tokens
    (and its values to float32 rounding) unless its cut lies within rounding of ``top_p``.
    Returns (rows checked exactly, rows excused)."""
    got = process(x, temperature, top_k, top_p).double().numpy()
    rounded = x.double().numpy()
    n = len(x)
    temps, ks, ps = (v if isinstance(v, list) else [v] * n for v in (temperature, top_k, top_p))
    exact = excused = 0
    for row, logits, t, k, p in zip(got, rounded, temps, ks, ps, strict=True):
        want = ss.process(logits, t, k, p)
        if ((row > 0) == (want > 0)).all():
            np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-7)
            exact += 1
        else:
            assert p is not None and t > 0, (t, k, p)
            assert near_threshold(ss.process(logits, t, k), p), (t, k, p)
            excused += 1
    return exact, excused


@pytest.mark.parametrize("vocab_size", [6, 40, 300, 5000])
def test_float32_top_k_with_top_p_keeps_the_reference_tokens(vocab_size, monkeypatch):
    """Top-p inside a host-known top-k from the logits (no softmax of the whole row, no partial
    sort): the reference's tokens on rows with ties at every boundary, per-row parameters
    included; only cuts within float32 rounding of ``top_p`` may differ (none did when this was
    written; at most a few are allowed)."""
    calls = []
    original = processing._nucleus_count
    monkeypatch.setattr(processing, "_nucleus_count", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr(processing, "_keep", lambda *a: pytest.fail("the partial sort ran"))
    x = top_k_rows(vocab_size, 3)
    rng = np.random.default_rng([vocab_size, 3])
    n = len(x)
    per_row_t = rng.choice([0.0, 0.3, 1.0, 2.5], n).tolist()
    per_row_p = [[None, 0.05, 0.3, 0.5, 0.9, 0.999][i] for i in rng.integers(0, 6, n)]
    per_row_k = rng.integers(1, vocab_size, n).tolist()
    exact = excused = 0
    for temperature, k, p in [
        (1.0, 3, 0.5),
        (0.7, min(17, vocab_size - 1), 0.9),
        (per_row_t, 5, per_row_p),
        (per_row_t, per_row_k, per_row_p),
        (1.0, vocab_size - 1, 0.3),
    ]:
        rows_exact, rows_excused = check_top_k_with_top_p(x, temperature, k, p)
        exact, excused = exact + rows_exact, excused + rows_excused
    assert len(calls) == 5
    assert excused <= 0.02 * (exact + excused)


@pytest.mark.parametrize("vocab_size", [40, 5000])
def test_float32_top_k_with_top_p_routes_agree_bit_for_bit(vocab_size, monkeypatch):
    """The CPU route (the cut rows after one host read) equals the sync-free route (every row by
    the threshold rule) bit for bit, top-p cutting inside tie groups on some rows; at V = 5000
    the largest logits come from the blocks of ``ops.topk_blocks``, with no host read either."""
    x = top_k_rows(vocab_size, 4)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0] * (len(x) // 4))
    cut = []
    original = processing._top_k_from_kth
    monkeypatch.setattr(
        processing, "_top_k_from_kth", lambda *a: cut.append(a[0].shape[0]) or original(*a)
    )
    for k, p in [(9, 0.5), (20, 0.9), ([1, 4, 9, 39] * (len(x) // 4), [0.3, None, 0.9, 0.6] * 5)]:
        fast = process(x, temperature, k, p)
        assert torch.equal(process(x, temperature, k, p, validate=False), fast)
        tolist = torch.Tensor.tolist
        monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("a host read"))
        free = sync_free(x, temperature, k, p)
        monkeypatch.setattr(torch.Tensor, "tolist", tolist)
        assert torch.equal(free, fast), (k, p)
    assert any(0 < rows < len(x) for rows in cut)  # the host route cut some rows, not all


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_batches_with_per_row_top_k_and_top_p(dtype):
    """An empty batch of per-row ``top_k`` (no largest ``k``) with top-p on returns an empty
    table, on every route (it used to reach the top-k route and fail on ``int(-inf)``)."""
    for top_k, top_p in [([], 0.5), ([], []), (3, 0.5), ([], None)]:
        got = process(torch.zeros(0, 10, dtype=dtype), 0.7, top_k, top_p)
        assert got.shape == (0, 10), (top_k, top_p)
        assert sync_free(torch.zeros(0, 10, dtype=dtype), 0.7, top_k, top_p).shape == (0, 10)


def test_float32_top_k_with_top_p_one_more_mutant_is_caught(monkeypatch):
    """Top-p keeping the first dropped rank of the top-k set too fails the reference check."""
    original = processing._nucleus_count

    def one_more(units, counts, masses):
        return torch.minimum(original(units, counts, masses) + 1, counts)

    monkeypatch.setattr(processing, "_nucleus_count", one_more)
    with pytest.raises(AssertionError):
        check_top_k_with_top_p(top_k_rows(300, 3), 1.0, 17, 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unchecked_plain_softmax_equals_the_general_route(dtype, monkeypatch):
    """``validate=False`` at temperature 1 with top-k and top-p off skips the parameters' parsing:
    float32 values bit for bit those of the checked call; anything else takes the general route."""
    x = torch.randn(3, 4, 300, generator=torch.Generator().manual_seed(0)).to(dtype)
    for temperature in (1, 1.0):
        fast = process(x, temperature, validate=False)
        assert fast.dtype == torch.float32 and torch.equal(fast, process(x, temperature))
    general = []
    original = processing._Parameter.parse
    monkeypatch.setattr(
        processing._Parameter,
        "parse",
        classmethod(lambda cls, *args: general.append(args[1]) or original(*args)),
    )
    process(x, validate=False)
    assert general == []
    for kwargs in ({"temperature": 0.5}, {"top_k": 5}, {"top_p": 0.9}, {"temperature": [1.0] * 3}):
        process(x[:, 0], validate=False, **kwargs)
    process(x.double(), validate=False)
    assert len(general) == 5 * 3


def test_top_k_route_rows_are_the_same_alone_and_in_any_batch():
    """On the top-k route a row's values are a function of its own logits and parameters: its
    normaliser is an integer sum (the batch's largest ``k`` padded the sum, and torch split a
    long row's sum over threads, so a row alone and in a batch differed in the last bits)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1000, generator=generator)
    for temperature, top_p in [(0.7, None), (1.0, 0.8), ([0.7, 1.3, 0.0], [0.9, None, 0.5])]:
        batch = process(x, temperature, [5, 50, 999], top_p)
        for row in range(3):
            t = temperature[row] if isinstance(temperature, list) else temperature
            p = top_p[row] if isinstance(top_p, list) else top_p
            alone = process(x[row], t, [5, 50, 999][row], p)
            assert torch.equal(alone, batch[row]), (temperature, top_p, row)
    wide = torch.randn(3, 151_936, generator=generator)
    batch = process(wide, 0.8, 40_000)
    for row in range(3):
        assert torch.equal(process(wide[row], 0.8, 40_000), batch[row]), row
    assert torch.equal(process(wide, 0.8, 40_000, validate=False), batch)
