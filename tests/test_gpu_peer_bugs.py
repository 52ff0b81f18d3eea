"""Kernel-level bugs reported against peer engines, as regressions on the torch lowering.

Each regression runs on the real code and on a buggy variant (a mutant reproducing the peer's
bug), and the same assertion must reject the variant: ``-1`` padded draft ids used as indices
(flashinfer-ai/flashinfer#879), float32 uniforms bottoming out at 2^-24
(vllm-project/vllm#43150, #37798), seeded and unseeded requests mixed and zero-draft requests
advancing their generator (vllm-project/vllm#10863, vllm-project/vllm-ascend#13608), fp16/bf16
arithmetic before the ratio test (lablup/mlxcel#992), an index from ``num_accepted - 1`` when
nothing is accepted (vllm-project/vllm#50021).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import specsampling as ss
from specsampling import gpu as ssg
from specsampling.gpu import chain as C
from specsampling.gpu import vllm
from specsampling.gpu.flashinfer import chain_speculative_sampling
from specsampling.noise import LARGEST_BELOW_ONE

REQUEST_NOISE = vllm.request_noise
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def ragged(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Chains of 0..3 drafts padded with -1; the target puts most mass on the last vocab id, so
    a -1 read as an index (wrapping to V - 1) would usually be accepted."""
    g = torch.Generator().manual_seed(0)
    batch, k, vocab = 8, 3, 6
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g), -1)
    target[..., -1] += 4.0
    target = target / target.sum(-1, keepdim=True)
    draft = torch.full((batch, k, vocab), 1 / vocab)
    tokens = torch.randint(0, vocab - 1, (batch, k), generator=g)
    lengths = [0, 1, 2, 3, 0, 1, 2, 3]
    for row, n in enumerate(lengths):
        tokens[row, n:] = -1
    return tokens.to(device), target.double().to(device), draft.double().to(device), lengths


# ---------------------------------------------------------------------- -1 padding (flashinfer#879)
def padded_engine_outputs(engine: C.StandardChain, honour_padding: bool) -> ssg.Verified:
    tokens, target, draft, _ = ragged()
    noise = C.chain_noise(8, 3, torch.Generator().manual_seed(1))
    lengths = C.draft_lengths(tokens) if honour_padding else torch.full((8,), 3)
    tables = C.padded_tables(tokens, lengths, target, draft)
    if not honour_padding:  # the peer bug: pads kept as ids, negative ids index from the end
        tables = tables._replace(draft_tokens=tokens)
    return engine.run(tables, noise)[0]


def pads_respected(out: ssg.Verified, lengths: list[int]) -> bool:
    emitted_drafts = out.num_emitted - 1
    return bool((emitted_drafts <= torch.tensor(lengths)).all())


def test_padded_draft_ids_are_never_read_or_accepted() -> None:
    tokens, target, draft, lengths = ragged()
    good = padded_engine_outputs(C.STANDARD_CHAIN, honour_padding=True)
    assert pads_respected(good, lengths)
    bad = padded_engine_outputs(C.STANDARD_CHAIN, honour_padding=False)
    assert not pads_respected(bad, lengths)  # the buggy variant accepts padding lanes
    # the public entry points: -1 padding == explicit lengths == NaN in the padded rows
    noise = C.chain_noise(8, 3, torch.Generator().manual_seed(2))
    implicit = ssg.verify_chain("standard", tokens, target, draft, noise)
    explicit = ssg.verify_chain("standard", tokens.clamp_min(0), target, draft, noise,
                                num_draft_tokens=lengths)  # fmt: skip
    poisoned = target.clone()
    for row, n in enumerate(lengths):
        poisoned[row, n + 1 :] = float("nan")
    assert torch.equal(implicit.tokens, explicit.tokens) and pads_respected(implicit, lengths)
    assert torch.equal(ssg.verify_chain("standard", tokens, poisoned, draft, noise).tokens,
                       implicit.tokens)  # fmt: skip
    _, accepted, emitted = chain_speculative_sampling(
        draft, tokens, target, generator=torch.Generator().manual_seed(3)
    )
    assert (accepted <= torch.tensor(lengths)).all() and (emitted <= torch.tensor(lengths)).all()


def test_out_of_range_ids_fail_validation() -> None:
    tokens, target, draft, _ = ragged()
    for value, lane in ((6, 0), (-2, 2)):
        bad = tokens.clone()
        bad[3, lane] = value
        with pytest.raises(ss.InvalidDistribution, match=rf"draft_tokens\[3, {lane}\]"):
            ssg.verify_chain("standard", bad, target, draft)
    with pytest.raises(ValueError, match="a draft after -1 padding"):
        bad = tokens.clone()
        bad[0, 2] = 1  # row 0 has no drafts: a real id after a pad is ambiguous
        chain_speculative_sampling(draft, bad, target)


# ----------------------------------------------------------------------- float32 noise (vllm#43150)
def fine_resolution(noise: ssg.Noise) -> bool:
    """float64 uniforms with bits below 2^-24 (float32 draws are all multiples of 2^-24)."""
    values = torch.cat([noise.accept.reshape(-1), noise.sample.reshape(-1)])
    coarse = (values * 2**24) == torch.floor(values * 2**24)
    return values.dtype == torch.float64 and float(coarse.double().mean()) < 0.01


def float32_noise(batch: int, gamma: int, generator: Any = None, device: Any = None) -> ssg.Noise:
    """The peer bug: float32 uniforms, upcast afterwards."""
    shape = (batch, gamma + 1)
    return ssg.Noise(torch.rand(shape, generator=generator).double(),
                     torch.rand(shape, generator=generator).double())  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_uniforms_are_float64_on_every_device(device: str) -> None:
    generator = torch.Generator(device=device).manual_seed(0)
    assert fine_resolution(C.chain_noise(64, 8, generator, device))
    assert not fine_resolution(float32_noise(64, 8, torch.Generator().manual_seed(0)))
    # the request streams of the adapters too
    counts = [3] * 16
    assert fine_resolution(vllm.request_noise(counts, 3, {}, None, device))
    # and the verify path uses them: noise=None with a seed == chain_noise with that seed
    tokens, target, draft, _ = ragged(device)
    fresh = ssg.verify_chain(
        "standard", tokens, target, draft, generator=torch.Generator(device=device).manual_seed(4)
    )
    given = ssg.verify_chain("standard", tokens, target, draft,
                             C.chain_noise(8, 3, torch.Generator(device=device).manual_seed(4),
                                           device))  # fmt: skip
    assert torch.equal(fresh.tokens, given.tokens)


class Float32Tests(C.StandardChain):
    """The peer bug on explicit noise: uniforms cast to float32 before the accept test."""

    def tests(self, tables: C.ChainTables, accept_uniforms: torch.Tensor) -> torch.Tensor:
        return super().tests(tables, accept_uniforms.float().double())


def accepts_at_the_top(engine: C.StandardChain, host: bool = False) -> bool:
    """p(x) == q(x): accepted for every u < 1, the largest float64 below 1 included (on the
    batched route, or the CPU's host route for a few rows)."""
    target = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]], dtype=torch.float64)
    draft = target[:, :1].clone()
    top = torch.tensor([[0.0, LARGEST_BELOW_ONE]], dtype=torch.float64)
    tables = C.padded_tables(torch.tensor([[1]]), torch.tensor([1]), target, draft)
    run = engine.host_run if host else engine.batched_run
    return int(run(tables, ssg.Noise(top, top))[0].node[0]) == 1


def test_explicit_uniforms_are_not_rounded() -> None:
    assert accepts_at_the_top(C.STANDARD_CHAIN)
    assert accepts_at_the_top(C.STANDARD_CHAIN, host=True)
    assert not accepts_at_the_top(Float32Tests())


# ------------------------------------------------------ seeded rows (vllm#10863, vllm-ascend#13608)
def mixed_batch(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    counts, vocab = [3, 0, 2, 3, 0, 1], 40
    total = sum(counts)
    draft = torch.softmax(torch.randn(total, vocab, generator=g), -1)
    target = torch.softmax(torch.randn(total, vocab, generator=g), -1)
    ids = torch.multinomial(draft, 1, generator=g).reshape(-1)
    bonus = torch.randint(0, vocab, (len(counts), 1), generator=g)
    return ids, counts, 3, torch.tensor(counts).cumsum(0), draft, target, bonus


def solo(args: tuple, row: int, generator: torch.Generator) -> torch.Tensor:
    ids, counts, width, cu, draft, target, bonus = args
    start = int(cu[row]) - counts[row]
    rows = slice(start, start + counts[row])
    return vllm.rejection_sample(
        ids[rows], [counts[row]], width, torch.tensor([counts[row]]), draft[rows], target[rows],
        bonus[row : row + 1], generators={0: generator},
    )[0]  # fmt: skip


def test_seeded_rows_reproduce_their_solo_runs_in_a_mixed_batch() -> None:
    args = mixed_batch(0)
    seeded = {0: 10, 3: 13, 5: 15}
    for neighbours in range(3):  # unseeded neighbours drawn from different streams
        out = vllm.rejection_sample(
            *args, generators={r: torch.Generator().manual_seed(s) for r, s in seeded.items()},
            generator=torch.Generator().manual_seed(neighbours),
        )  # fmt: skip
        for row, seed in seeded.items():
            assert torch.equal(out[row], solo(args, row, torch.Generator().manual_seed(seed)))
        assert all(int(out[row, 0]) >= 0 for row in range(6))  # no garbage (the peer's "!!!")


def advancing_request_noise(counts: Any, width: int, generators: Any, generator: Any,
                            device: Any) -> ssg.Noise:  # fmt: skip
    """The peer bug of vllm-project/vllm-ascend#13608: every seeded request draws, drafts or
    not."""
    for row, own in generators.items():
        if counts[row] == 0:
            torch.rand(2, dtype=torch.float64, generator=own)
    return REQUEST_NOISE(counts, width, generators, generator, device)


def empty_round_is_invisible(noise_fn: Callable[..., ssg.Noise], monkeypatch: Any) -> bool:
    """A request's outputs are the same whether or not an empty (zero-draft) round came first,
    and its generator state is untouched by that round."""
    monkeypatch.setattr(vllm, "request_noise", noise_fn)
    args = mixed_batch(1)
    empty = (torch.zeros(0, dtype=torch.long), [0], 3, torch.tensor([0]), torch.zeros((0, 40)),
             torch.zeros((0, 40)), torch.tensor([[7]]))  # fmt: skip
    plain = torch.Generator().manual_seed(21)
    first = solo(args, 0, plain)
    delayed = torch.Generator().manual_seed(21)
    before = delayed.get_state().clone()
    out = vllm.rejection_sample(*empty[:4], None, empty[5], empty[6], generators={0: delayed})
    untouched = torch.equal(delayed.get_state(), before) and out.tolist() == [[7, -1, -1, -1]]
    # a zero-draft request inside a batch (T > 0) must not draw either
    inner = torch.Generator().manual_seed(21)
    state = inner.get_state().clone()
    vllm.rejection_sample(*args, generators={1: inner})
    untouched = untouched and torch.equal(inner.get_state(), state)
    return untouched and torch.equal(solo(args, 0, delayed), first)


def test_zero_draft_requests_do_not_advance_their_generator(monkeypatch: Any) -> None:
    assert empty_round_is_invisible(REQUEST_NOISE, monkeypatch)
    assert not empty_round_is_invisible(advancing_request_noise, monkeypatch)


# ---------------------------------------------------------------------- half precision (mlxcel#992)
class InputDtypeTests(C.StandardChain):
    """The peer bug: the accept test in the tables' own (fp16/bf16) precision."""

    def tests(self, tables: C.ChainTables, accept_uniforms: torch.Tensor) -> torch.Tensor:
        gamma = tables.draft_tokens.shape[1]
        real = torch.arange(gamma)[None] < tables.num_drafts[:, None]
        target_x = tables.target_flat[tables.target_index[:, :gamma], tables.draft_tokens]
        draft_x = tables.draft_flat[tables.draft_index, tables.draft_tokens]
        dtype = tables.target_flat.dtype
        return real & (accept_uniforms.to(dtype) * draft_x < target_x)


def tiny_q_accepted(engine: C.StandardChain, dtype: torch.dtype, host: bool = False) -> bool:
    """A drafted token whose tiny q equals p (fp16: a subnormal; bf16: 1e-30) is accepted for
    u just below 1, as in float64 arithmetic."""
    tiny = 6e-8 if dtype == torch.float16 else 1e-30
    target = torch.tensor([[[1 - tiny, tiny], [0.5, 0.5]]], dtype=torch.float64).to(dtype)
    draft = target[:, :1].clone()
    u = torch.tensor([[0.0, 0.9999]], dtype=torch.float64)
    tables = C.padded_tables(torch.tensor([[1]]), torch.tensor([1]), target, draft)
    run = engine.host_run if host else engine.batched_run
    out = run(tables, ssg.Noise(u, u))[0]
    return int(out.node[0]) == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_is_upcast_before_the_ratio(dtype: torch.dtype) -> None:
    assert tiny_q_accepted(C.STANDARD_CHAIN, dtype)
    assert tiny_q_accepted(C.STANDARD_CHAIN, dtype, host=True)
    assert not tiny_q_accepted(InputDtypeTests(), dtype)
    # through the entry point, and a drafted token whose q underflowed to 0 is reported
    tiny = 6e-8 if dtype == torch.float16 else 1e-30
    target = torch.tensor([[[1 - tiny, tiny], [0.5, 0.5]]], dtype=torch.float64).to(dtype)
    u = torch.tensor([[0.0, 0.9999]], dtype=torch.float64)
    out = ssg.verify_chain("standard", torch.tensor([[1]]), target, target[:, :1].clone(),
                           ssg.Noise(u, u))  # fmt: skip
    assert int(out.node[0]) == 1
    underflowed = torch.tensor([[[1.0, 0.0]]], dtype=dtype)
    with pytest.raises(ss.InvalidDistribution, match="zero draft probability"):
        ssg.verify_chain("standard", torch.tensor([[1]]), target, underflowed)


# -------------------------------------------------------------------- nothing accepted (vllm#50021)
class LastAcceptedIndex(C.StandardChain):
    """The peer bug: packing writes the last accepted draft at ``num_accepted - 1`` (unbounded:
    -1, the last column, when nothing is accepted)."""

    def pack(self, tables: C.ChainTables, num_accepted: Any, token: Any) -> ssg.Verified:
        out = super().pack(tables, num_accepted, token)
        rows = torch.arange(token.shape[0])
        gamma = tables.draft_tokens.shape[1]
        tokens = out.tokens.clone()
        tokens[rows, num_accepted - 1] = tables.draft_tokens[rows, (num_accepted - 1) % gamma]
        return out._replace(tokens=tokens)


def zero_accept_rows_are_clean(engine: C.StandardChain) -> bool:
    """Every row rejects its first draft (p(x) = 0): one emitted token, -1 everywhere after."""
    batch, k, vocab = 5, 3, 4
    target = torch.full((batch, k + 1, vocab), 1 / 3, dtype=torch.float64)
    target[..., 0] = 0.0
    draft = torch.full((batch, k, vocab), 0.25, dtype=torch.float64)
    tokens = torch.zeros((batch, k), dtype=torch.long)
    noise = C.chain_noise(batch, k, torch.Generator().manual_seed(0))
    out, _ = engine.run(C.padded_tables(tokens, torch.full((batch,), k), target, draft), noise)
    return (
        bool((out.node == 0).all())
        and bool((out.num_emitted == 1).all())
        and bool((out.tokens[:, 1:] == -1).all())
        and bool((out.tokens[:, 0] > 0).all())
    )


def test_no_index_from_num_accepted_minus_one() -> None:
    assert zero_accept_rows_are_clean(C.STANDARD_CHAIN)
    assert not zero_accept_rows_are_clean(LastAcceptedIndex())
    # the adapters' bookkeeping on zero-accept rows
    target = torch.full((2, 3, 4), 1 / 3, dtype=torch.float64)
    target[..., 0] = 0.0
    draft = torch.full((2, 2, 4), 0.25, dtype=torch.float64)
    ids, accepted, emitted = chain_speculative_sampling(
        draft, torch.zeros((2, 2), dtype=torch.long), target
    )
    assert emitted.tolist() == [0, 0] and accepted.tolist() == [0, 0]
    assert (ids[:, 1:] == -1).all() and (ids[:, 0] > 0).all()
    out = vllm.rejection_sample(torch.zeros(4, dtype=torch.long), [2, 2], 2, torch.tensor([2, 4]),
                                draft.reshape(4, 4), target[:, :2].reshape(4, 4),
                                torch.tensor([[1], [2]]))  # fmt: skip
    assert (out[:, 1:] == -1).all() and (out[:, 0] > 0).all()
