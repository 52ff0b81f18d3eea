"""``ops.argmax_blocks`` (block maxima, then one block) returns ``torch.argmax``'s index: the
lowest index of each row's maximum, on ties, masked rows, NaN, every dtype and ragged tails.
``ops.topk_blocks`` (the blocks with the largest maxima, then ``torch.topk`` of their entries)
returns ``torch.topk``'s values, with distinct ids holding them."""

from __future__ import annotations

import inspect
import textwrap
from unittest import mock

import pytest
import torch

from specsampling.gpu import ops

VOCABS = [1, 5, 127, 128, 129, 256, 300, 1000, 32000, 49152, 50257]


def tied_rows(vocab_size: int, seed: int) -> torch.Tensor:
    """Rows with a few values only (many ties at the maximum), -inf masks and flat rows."""
    g = torch.Generator().manual_seed(vocab_size * 100 + seed)
    rows = torch.randint(0, 4, (12, vocab_size), generator=g).to(torch.float64)
    rows[1] = 0.0  # all tied: index 0
    rows[2] = float("-inf")  # fully masked: index 0
    rows[3, : vocab_size // 2] = float("-inf")
    rows[4] = torch.randn(vocab_size, generator=g, dtype=torch.float64)
    rows[5, -1] = 10.0  # the maximum in the ragged tail
    rows[6, : vocab_size - 1] = -1.0  # the maximum is the last token alone
    rows[6, -1] = 0.0
    return rows


@pytest.mark.parametrize("vocab_size", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_argmax_blocks_equals_torch_argmax(vocab_size, dtype):
    for seed in range(3):
        rows = tied_rows(vocab_size, seed).to(dtype)
        assert torch.equal(ops.argmax_blocks(rows), rows.argmax(-1)), (vocab_size, seed)


def test_argmax_blocks_keeps_leading_shape_and_nan():
    values = torch.randn(3, 4, 700)
    assert torch.equal(ops.argmax_blocks(values), values.argmax(-1))
    values[1, 2, 400] = float("nan")
    values[1, 2, 650] = float("nan")
    assert ops.argmax_blocks(values)[1, 2] == values.argmax(-1)[1, 2] == 400
    empty = torch.zeros(0, 500)
    assert ops.argmax_blocks(empty).shape == (0,)


def test_the_rows_catch_a_last_block_mutant():
    """A version that takes the *last* block holding the maximum is wrong on ties across
    blocks; the rows above tell it from torch.argmax."""

    def last_block(values: torch.Tensor) -> torch.Tensor:
        return ops.argmax_blocks(values.flip(-1).contiguous())  # lowest index of the flip

    mutant_misses = []
    for vocab_size in VOCABS:
        rows = tied_rows(vocab_size, 0)
        mutant = rows.shape[-1] - 1 - last_block(rows)
        mutant_misses.append(not torch.equal(mutant, rows.argmax(-1)))
    assert sum(mutant_misses) >= len(VOCABS) - 2


@pytest.mark.parametrize("vocab_size", VOCABS)
def test_max_off_token_equals_the_masked_maximum(vocab_size):
    """``ops.max_off_token`` against the plain masked maximum (a copy with the token set to
    -inf): tokens in the ragged tail, rows whose only other mass is tiny, all-zero rows."""
    for seed in range(3):
        rows = tied_rows(vocab_size, seed).clamp_min(0.0)
        rows[7] = 0.0
        rows[8] = 0.0
        rows[8, -1] = 1e-300  # the only other entry, in the tail
        g = torch.Generator().manual_seed(seed)
        token = torch.randint(0, vocab_size, (rows.shape[0],), generator=g)
        token[8] = 0
        token[5] = vocab_size - 1  # the tail's maximum is the token itself
        masked = rows.scatter(1, token[:, None], float("-inf")).amax(-1)
        assert torch.equal(ops.max_off_token(rows, token), masked), (vocab_size, seed)
        assert torch.equal(ops.max_off_token(rows.float(), token), masked.float())


def check_topk_blocks(rows: torch.Tensor, m: int) -> None:
    values, index = ops.topk_blocks(rows, m)
    assert torch.equal(values, torch.topk(rows, m, dim=-1).values), (rows.shape, m)
    assert torch.equal(rows.gather(-1, index), values)
    assert all(len(set(row)) == m for row in index.tolist())  # distinct ids


TOPK_CASES = [(v, m) for v in [5, 300, 1000, 5000, 32000, 32003, 151936] for m in [1, 3, 51, 200]]


@pytest.mark.parametrize(("vocab_size", "m"), [(v, m) for v, m in TOPK_CASES if m <= v])
def test_topk_blocks_equals_torch_topk(vocab_size, m):
    """Ties across and inside blocks, -inf masks, flat rows, the maximum in the ragged tail."""
    for dtype in [torch.float32, torch.float64]:
        check_topk_blocks(tied_rows(vocab_size, 1).to(dtype), m)


def test_topk_blocks_on_strided_rows_and_the_fallback():
    table = torch.randn(6, 40_000)[:, 1:]  # rows not contiguous in memory, a ragged tail
    check_topk_blocks(table, 50)
    check_topk_blocks(table[::2], 7)
    check_topk_blocks(torch.randn(3, 200), 60)  # too few blocks to narrow: torch.topk
    values, index = ops.topk_blocks(torch.zeros(0, 5000), 4)
    assert values.shape == index.shape == (0, 4)


def test_topk_blocks_catches_a_one_block_short_mutant():
    """Reading one block fewer than ``m`` (the first chosen block twice instead) loses a value
    when the top ``m`` fill ``m`` blocks."""
    source = textwrap.dedent(inspect.getsource(ops.topk_blocks))
    old = "chosen = blocks.amax(-1).topk(m, dim=-1).indices"
    assert old in source
    namespace = dict(vars(ops))
    mutant_source = source.replace(old, old + "\n    chosen[:, -1] = chosen[:, 0]")
    exec(compile(mutant_source, "<mutant>", "exec"), namespace)
    rows = torch.zeros(1, 4096)
    rows[0, ::64] = torch.arange(64, 0, -1, dtype=torch.float32)  # one large value per block
    check_topk_blocks(rows, 5)
    with mock.patch.object(ops, "topk_blocks", namespace["topk_blocks"]):
        with pytest.raises(AssertionError):
            check_topk_blocks(rows, 5)
