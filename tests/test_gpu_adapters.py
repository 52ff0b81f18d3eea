"""The serving-engine adapters (``docs/torch.md``): ``specsampling.gpu.vllm.rejection_sample``
and ``specsampling.gpu.flashinfer.chain_speculative_sampling``.

The *cases* of vLLM's ``tests/v1/sample/test_rejection_sampler.py`` (greedy matches and
mismatches, empty drafts, seeded determinism, the target law, top-k/top-p masks, vocab-boundary
sizes) and of Hugging Face's ``test_speculative_sampling`` (tests/generation/test_utils.py), and
the FlashInfer docstring example, written against our adapters.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import specsampling as ss
from specsampling import gpu as ssg
from specsampling.gpu.flashinfer import chain_speculative_sampling
from specsampling.gpu.vllm import rejection_sample

PAD = -1


def greedy_inputs(spec: list[list[int]], output: list[list[int]], vocab: int = 100) -> tuple:
    """vLLM's greedy cases: scores whose argmax is the target's token at every draft position."""
    rows = [tokens[:-1] for tokens in output]
    scores = torch.full((sum(len(r) for r in rows), vocab), -100.0)
    flat = [t for r in rows for t in r]
    scores[torch.arange(len(flat)), torch.tensor(flat, dtype=torch.long)] = 100.0
    counts = [len(s) for s in spec]
    draft_ids = torch.tensor([t for s in spec for t in s], dtype=torch.int32)
    bonus = torch.tensor([[r[-1]] for r in output])
    return draft_ids, counts, max(counts), torch.tensor(counts).cumsum(0), scores, bonus


GREEDY_CASES = [
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # perfect match
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, PAD, PAD]]),  # early mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, PAD]]),  # multiple sequences
    ([[1]], [[1, 2]], [[1, 2]]),  # single token
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, PAD], [4, 8, PAD, PAD]]),
    ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    ([[1]], [[2, 3]], [[2, PAD]]),  # first mismatch
    ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, PAD], [3, 4, 7]]),  # mixed
]


@pytest.mark.parametrize("spec,output,expected", GREEDY_CASES)
def test_vllm_greedy_cases(spec: list, output: list, expected: list) -> None:
    draft_ids, counts, width, cu, scores, bonus = greedy_inputs(spec, output)
    out = rejection_sample(draft_ids, counts, width, cu, None, scores, bonus, all_greedy=True)
    assert out.dtype == torch.int32 and out.tolist() == expected
    # the same through the general rule: processed one-hot targets, no all_greedy flag
    one_hot = ssg.process(scores, temperature=0.0)
    again = rejection_sample(draft_ids, counts, width, cu, None, one_hot, bonus)
    assert again.tolist() == expected


def test_vllm_empty_sequence_and_zero_draft_requests() -> None:
    out = rejection_sample(
        torch.zeros(0, dtype=torch.int32), [0], 0, torch.tensor([0]), None,
        torch.zeros((0, 10)), torch.tensor([[5]]), all_greedy=True,
    )  # fmt: skip
    assert out.tolist() == [[5]]
    draft_ids, counts, width, cu, scores, bonus = greedy_inputs(
        [[1, 2], [], [3]], [[1, 2, 9], [7], [4, 8]]
    )
    out = rejection_sample(draft_ids, counts, width, cu, None, ssg.process(scores, temperature=0),
                           bonus)  # fmt: skip
    assert out.tolist() == [[1, 2, 9], [7, PAD, PAD], [4, PAD, PAD]]


def random_batch(batch: int, k: int, vocab: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    draft = torch.softmax(torch.rand(batch * k, vocab, generator=g), -1)
    target = torch.softmax(torch.rand(batch * k, vocab, generator=g) * 3, -1)
    draft_ids = torch.multinomial(draft, 1, generator=g).reshape(-1)
    bonus = torch.randint(0, vocab, (batch, 1), generator=g)
    counts = [k] * batch
    return draft_ids, counts, k, torch.tensor(counts).cumsum(0), draft, target, bonus


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
def test_vllm_deterministic_when_seeded(k: int, batch_size: int) -> None:
    draft_ids, counts, width, cu, draft, target, bonus = random_batch(batch_size, k, 200, k)
    seeded = [row for row in range(batch_size) if row % 2 == 0]
    runs = []
    for _ in range(5):
        generators = {row: torch.Generator().manual_seed(row) for row in seeded}
        runs.append(rejection_sample(draft_ids, counts, width, cu, draft, target, bonus,
                                     generators=generators))  # fmt: skip
    for row in seeded:
        assert all(torch.equal(r[row], runs[0][row]) for r in runs)


def test_vllm_seeded_request_is_independent_of_position_and_neighbours() -> None:
    draft_ids, counts, width, cu, draft, target, bonus = random_batch(6, 3, 50, 11)
    solo = rejection_sample(
        draft_ids[3:6].clone(), [3], 3, torch.tensor([3]), draft[3:6].clone(),
        target[3:6].clone(), bonus[1:2].clone(), generators={0: torch.Generator().manual_seed(9)},
    )  # fmt: skip
    batched = rejection_sample(draft_ids, counts, width, cu, draft, target, bonus,
                               generators={1: torch.Generator().manual_seed(9)})  # fmt: skip
    assert torch.equal(batched[1], solo[0])


def test_vllm_rejection_sampling_approximates_the_target() -> None:
    """vLLM's law test, as a chi-square on counts: the first token of every round (k = 2) is
    target-distributed whatever the draft (alpha 1e-4)."""
    vocab, k, draws = 10, 2, 20000
    g = torch.Generator().manual_seed(0)
    draft_row = torch.softmax(torch.rand(vocab, generator=g), -1)
    target_row = torch.softmax(torch.rand(vocab, generator=g) * 2, -1)
    draft_ids = torch.multinomial(draft_row, draws * k, replacement=True, generator=g)
    draft = draft_row.expand(draws * k, -1).contiguous()
    target = target_row.expand(draws * k, -1).contiguous()
    bonus = torch.multinomial(target_row, draws, replacement=True, generator=g)[:, None]
    counts = [k] * draws
    out = rejection_sample(draft_ids, counts, k, torch.tensor(counts).cumsum(0), draft, target,
                           bonus, generator=torch.Generator().manual_seed(1))  # fmt: skip
    observed = np.bincount(out[:, 0].numpy(), minlength=vocab)
    target_law = target_row.double().numpy()
    draft_law = draft_row.double().numpy()
    assert stats.chisquare(observed, target_law / target_law.sum() * draws).pvalue > 1e-4
    # negative control: the draft's own law is rejected
    assert stats.chisquare(observed, draft_law / draft_law.sum() * draws).pvalue < 1e-4


@pytest.mark.parametrize("top_k", [1, 5, 99])
def test_vllm_top_k_masked_targets_are_respected(top_k: int) -> None:
    """Processed probabilities with mass only on each row's top-k: no emitted draft or residual
    token lies outside (the bonus column excluded, as in vLLM's test)."""
    vocab, batch, k = 100, 30, 3
    g = torch.Generator().manual_seed(top_k)
    allowed = torch.stack([torch.randperm(vocab, generator=g)[:top_k] for _ in range(batch * k)])
    logits = torch.zeros(batch * k, vocab)
    logits.scatter_(1, allowed, 0.1)
    target = ssg.process(logits, top_k=top_k)
    draft = torch.softmax(torch.rand(batch * k, vocab, generator=g), -1)
    draft_ids = torch.multinomial(draft, 1, generator=g).reshape(-1)
    counts = [k] * batch
    out = rejection_sample(draft_ids, counts, k, torch.tensor(counts).cumsum(0), draft, target,
                           torch.zeros((batch, 1), dtype=torch.long))  # fmt: skip
    for row in range(batch):
        for pos in range(k):
            token = int(out[row, pos])
            if token != PAD:
                assert token in allowed[row * k + pos].tolist()


@pytest.mark.parametrize("no_draft_probs", [True, False])
@pytest.mark.parametrize("vocab", [100, 8193, 10000, 151936])
def test_vllm_vocab_boundary_ids_in_range(vocab: int, no_draft_probs: bool) -> None:
    """GHSA-8wr5-jm2h-8r4f's sizes: a zero tail (or all mass on the drafted token, so the
    point-mass residual is empty): every id in [0, V) with positive target mass."""
    batch, k = 2, 3
    g = torch.Generator().manual_seed(vocab)
    tail = (vocab // 8192) * 8192
    target = torch.rand(batch * k, vocab, generator=g)
    draft_ids = torch.randint(0, vocab, (batch * k,), generator=g)
    if tail:
        target[:, tail:] = 0.0
    else:
        target = torch.zeros_like(target)
        target[:, 0] = 1.0
        draft_ids = torch.zeros(batch * k, dtype=torch.long)
    target = target / target.sum(-1, keepdim=True)
    draft = torch.softmax(torch.rand(batch * k, vocab, generator=g), -1)
    counts = [k] * batch
    out = rejection_sample(draft_ids, counts, k, torch.tensor(counts).cumsum(0),
                           None if no_draft_probs else draft, target,
                           torch.zeros((batch, 1), dtype=torch.long))  # fmt: skip
    for row in range(batch):
        for pos in range(k):
            token = int(out[row, pos])
            if token != PAD:
                assert 0 <= token < vocab and float(target[row * k + pos, token]) > 0


def test_vllm_draft_id_out_of_vocab_raises_value_error() -> None:
    draft_ids, counts, width, cu, draft, target, bonus = random_batch(2, 2, 10, 0)
    for bad in (10, -1):
        ids = draft_ids.clone()
        ids[1] = bad
        with pytest.raises(ValueError, match=r"draft_token_ids\[1\]: token id"):
            rejection_sample(ids, counts, width, cu, draft, target, bonus)
    with pytest.raises(ValueError, match="cu_num_draft_tokens"):
        rejection_sample(draft_ids, counts, width, cu + 1, draft, target, bonus)
    with pytest.raises(ValueError, match="max_spec_len"):
        rejection_sample(draft_ids, counts, 1, cu, draft, target, bonus)
    with pytest.raises(ValueError, match=r"cu_num_draft_tokens: expected a torch\.Tensor"):
        rejection_sample(draft_ids, counts, width, cu.tolist(), draft, target, bonus)
    with pytest.raises(TypeError, match=r"num_draft_tokens: expected integers, got 1\.5"):
        rejection_sample(draft_ids, [1.5, 2.5], width, cu, draft, target, bonus)  # not truncated
    with pytest.raises(ValueError, match="max_spec_len: expected an integer >= 0, got -1"):
        rejection_sample(draft_ids[:0], [], -1, cu[:0], None, target[:0], bonus[:0])
    as_tensor = rejection_sample(draft_ids, torch.tensor(counts), width, cu, draft, target, bonus,
                                 generator=torch.Generator().manual_seed(0))  # fmt: skip
    as_list = rejection_sample(draft_ids, counts, width, cu, draft, target, bonus,
                               generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert torch.equal(as_tensor, as_list)
    zero = draft.clone()
    zero[1, int(draft_ids[1])] = 0.0  # the drafted token cannot have come from this row
    zero[1] /= zero[1].sum()
    with pytest.raises(ValueError, match=r"draft_probs\[1\]: the drafted token \d+ has zero"):
        rejection_sample(draft_ids, counts, width, cu, zero, target, bonus)


def test_vllm_matches_verify_chain_on_the_same_uniforms() -> None:
    """The adapter is the standard rule: with seeded per-request generators it equals
    ``verify_chain`` fed the uniforms those generators give (the bonus row one-hot on the bonus)."""
    draft_ids, counts, width, cu, draft, target, bonus = random_batch(5, 3, 30, 5)
    seeds = {row: torch.Generator().manual_seed(100 + row) for row in range(5)}
    out = rejection_sample(draft_ids, counts, width, cu, draft, target.double(), bonus,
                           generators=seeds)  # fmt: skip
    accept = torch.zeros((5, 4), dtype=torch.float64)
    sample = torch.zeros((5, 4), dtype=torch.float64)
    for row in range(5):
        draws = torch.rand(
            6, dtype=torch.float64, generator=torch.Generator().manual_seed(100 + row)
        )
        accept[row, 1:4], sample[row, :3] = draws[:3], draws[3:]
    bonus_rows = torch.nn.functional.one_hot(bonus[:, 0], 30).double()[:, None]
    chain_target = torch.cat([target.double().reshape(5, 3, 30), bonus_rows], 1)
    expect = ssg.verify_chain(
        "standard",
        draft_ids.reshape(5, 3),
        chain_target,
        draft.double().reshape(5, 3, 30),
        ssg.Noise(accept, sample),
    )
    assert torch.equal(out.long(), expect.tokens)


# --------------------------------------------------------------------------- Hugging Face
def test_hugging_face_speculative_sampling_case() -> None:
    """HF ``test_speculative_sampling``: candidates 1, 4, 5; the target accepts 1 and 4 and
    rules out 5 (mass only on 8), so the round emits [1, 4, 8] with 2 matches, for any noise."""
    low, high, inf = -10.0, 10.0, float("inf")
    candidate_logits = torch.full((3, 10), low)
    candidate_logits[0, 1] = candidate_logits[1, 4] = candidate_logits[2, 5] = high
    new_logits = torch.full((4, 10), low)
    new_logits[0, 1] = new_logits[1, 4] = high
    new_logits[2] = -inf
    new_logits[2, 8] = high
    draft = torch.softmax(candidate_logits.double(), -1)[None]  # [1, 3, 10]
    target = torch.softmax(new_logits.double(), -1)[None]  # [1, 4, 10]
    tokens = torch.tensor([[1, 4, 5]])
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        out = ssg.verify_chain("standard", tokens, target, draft, generator=g)
        assert int(out.node[0]) == 2 and out.tokens[0, :3].tolist() == [1, 4, 8]
        ids, _, emitted = chain_speculative_sampling(draft, tokens, target, generator=g)
        assert ids.tolist() == [[1, 4, 8, PAD]] and emitted.tolist() == [2]


# --------------------------------------------------------------------------- FlashInfer
def test_flashinfer_docstring_example() -> None:
    draft = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    target = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    for seed in range(10):
        ids, accepted, emitted = chain_speculative_sampling(
            draft, torch.tensor([[2, 1]], dtype=torch.int32), target,
            generator=torch.Generator().manual_seed(seed),
        )  # fmt: skip
        assert ids.dtype == torch.int32 and ids.tolist() == [[2, 0, PAD]]
        assert accepted.tolist() == [1] and emitted.tolist() == [1]


def test_flashinfer_counts_padding_and_in_place_outputs() -> None:
    g = torch.Generator().manual_seed(3)
    batch, k, vocab = 6, 4, 12
    draft = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g), -1)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    lengths = [4, 0, 2, 3, 1, 4]
    for row, n in enumerate(lengths):
        tokens[row, n:] = -1
    acc_total = torch.full((batch,), 10, dtype=torch.int32)
    emit_total = torch.zeros(batch, dtype=torch.int32)
    ids, accepted, emitted = chain_speculative_sampling(
        draft, tokens, target, acc_total, emit_total, generator=torch.Generator().manual_seed(0)
    )
    assert accepted is acc_total and emitted is emit_total
    assert ((acc_total - 10) <= torch.tensor(lengths)).all()
    assert (emit_total <= acc_total - 10).all() and (emit_total <= torch.tensor(lengths)).all()
    for row in range(batch):
        count = int(emit_total[row]) + 1
        assert ids[row, :count].tolist()[: count - 1] == tokens[row, : count - 1].tolist()
        assert (ids[row, count:] == PAD).all() and 0 <= int(ids[row, count - 1]) < vocab
        assert float(target[row, count - 1, ids[row, count - 1]]) > 0
    with pytest.raises(ValueError, match="generators"):
        chain_speculative_sampling(draft, tokens, target, seed=1, offset=0)
    bad = tokens.clone()
    bad[0, 0] = vocab
    with pytest.raises(ValueError, match=r"draft_token_ids\[0, 0\]: token id 12"):
        chain_speculative_sampling(draft, bad, target)
    bad[0, 0] = -2  # named where it is, not as a draft after padding
    with pytest.raises(ValueError, match=r"draft_token_ids\[0, 0\]: token id -2 is negative"):
        chain_speculative_sampling(draft, bad, target)


def test_flashinfer_refuses_bad_counters_and_ids_before_writing_anything() -> None:
    g = torch.Generator().manual_seed(4)
    batch, k, vocab = 3, 2, 5
    draft = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g), -1)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    good = torch.zeros(batch, dtype=torch.int32)
    bad_counters = (
        torch.zeros(1, dtype=torch.int32),  # broadcasts: silently wrong before
        torch.zeros(2, batch, dtype=torch.int32),
        torch.zeros(batch),  # float
        torch.zeros(batch, dtype=torch.bool),
        5,
    )
    for bad in bad_counters:
        with pytest.raises(ValueError, match=r"maybe_output_emitted_draft_token_num: expected an "):
            chain_speculative_sampling(draft, tokens, target, good, bad, generator=0)
        assert not good.any()  # the accepted counter was not written first
        with pytest.raises(ValueError, match=r"maybe_output_accepted_token_num: expected an "):
            chain_speculative_sampling(draft, tokens, target, bad, generator=0)
    for ids in (tokens.float(), tokens.bool(), tokens.tolist()):
        with pytest.raises(ValueError, match=r"draft_token_ids: expected an integer tensor"):
            chain_speculative_sampling(draft, ids, target, generator=0)  # type: ignore[arg-type]
    # any integer counter is incremented in place in its own dtype, and returned
    wide = torch.full((batch,), 2**40, dtype=torch.int64)
    _, accepted, _ = chain_speculative_sampling(draft, tokens, target, wide, generator=0)
    assert accepted is wide and accepted.dtype == torch.int64 and bool((wide >= 2**40).all())


def test_flashinfer_accepted_num_counts_each_draft_independently() -> None:
    """``accepted_num`` is a sum of each draft's own accept test: one draft of acceptance 1/2
    counts 1/2 on average (FlashInfer's kernel tests the rejected draft again with a fresh
    uniform, 3/4 on average; its docstring's meaning is the independent count)."""
    draws = 40_000
    draft = torch.tensor([0.5, 0.5]).expand(draws, 1, 2).contiguous()
    target = torch.tensor([0.25, 0.75]).expand(draws, 2, 2).contiguous()
    tokens = torch.zeros(draws, 1, dtype=torch.long)  # p / q = 1/2 at the drafted token
    _, accepted, emitted = chain_speculative_sampling(draft, tokens, target, generator=7)
    mean = float(accepted.double().mean())
    assert abs(mean - 0.5) < 4 * 0.5 / draws**0.5, mean  # 3/4 is 100 sigma away
    assert torch.equal(accepted, emitted)  # one draft: its test is the chain's


def test_flashinfer_per_row_generators_do_not_depend_on_position() -> None:
    g = torch.Generator().manual_seed(5)
    batch, k, vocab = 4, 3, 20
    draft = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g), -1)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    gens = [torch.Generator().manual_seed(40 + r) for r in range(batch)]
    ids, _, _ = chain_speculative_sampling(draft, tokens, target, generators=gens)
    order = [2, 0, 3, 1]
    gens = [torch.Generator().manual_seed(40 + r) for r in order]
    shuffled, _, _ = chain_speculative_sampling(
        draft[order], tokens[order], target[order], generators=gens
    )
    assert torch.equal(shuffled, ids[order])
    solo, _, _ = chain_speculative_sampling(
        draft[2:3], tokens[2:3], target[2:3], generators=[torch.Generator().manual_seed(42)]
    )
    assert torch.equal(solo[0], ids[2])


def test_flashinfer_law_is_the_target() -> None:
    """Chi-square on counts of the first emitted token (alpha 1e-4), and of the reference
    round law: the exact engine's first-token marginal is the target too."""
    vocab, k, draws = 6, 3, 12000
    pair = ss.pairs.Random(vocab, seed=8)
    p, q = pair.target(()), pair.draft(())
    g = torch.Generator().manual_seed(2)
    draft = torch.tensor(q).expand(draws, k, -1).contiguous()
    target = torch.tensor(p).expand(draws, k + 1, -1).contiguous()
    tokens = torch.multinomial(torch.tensor(q), draws * k, replacement=True, generator=g)
    ids, _, _ = chain_speculative_sampling(draft, tokens.reshape(draws, k), target, generator=g)
    observed = np.bincount(ids[:, 0].numpy(), minlength=vocab)
    assert stats.chisquare(observed, p * draws).pvalue > 1e-4


def test_every_generator_argument_takes_an_int_seed_or_says_what_it_wants() -> None:
    """``generator=0`` seeds a CPU generator (numpy-style) on every entry point, the same as
    passing ``torch.Generator().manual_seed(0)``; a string is refused naming the argument."""
    from specsampling.gpu.noise import check_generator

    tokens = torch.tensor([[1, 2]])
    target = torch.full((1, 3, 4), 0.25)
    draft = torch.full((1, 2, 4), 0.25)
    seeded = ssg.verify_chain("standard", tokens, target, draft, generator=0)
    by_hand = ssg.verify_chain(
        "standard", tokens, target, draft, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(seeded.tokens, by_hand.tokens)
    for bad in ("0", 1.5):
        with pytest.raises(TypeError, match=r"generator: expected a torch\.Generator, an int seed"):
            ssg.verify_chain("standard", tokens, target, draft, generator=bad)
    with pytest.raises(ValueError, match="generator: a seed is an integer >= 0"):
        check_generator(-1)
    with pytest.raises(TypeError, match=r"generators\[1\]: expected a torch\.Generator"):
        ssg.flashinfer.chain_speculative_sampling(
            draft.expand(2, -1, -1),
            tokens.expand(2, -1),
            target.expand(2, -1, -1),
            generators=[None, "x"],
        )


def test_batches_tables_and_noise_of_the_wrong_kind_say_what_they_expect() -> None:
    import specsampling as ss

    tree = ss.Shape.chain(2).draft(ss.pairs.Random(vocab_size=4, seed=0), np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"trees: expected a sequence of DraftTrees, got one"):
        ssg.TreeBatch.from_trees(tree)
    with pytest.raises(TypeError, match="trees: expected a sequence of DraftTrees, got None"):
        ssg.TreeBatch.from_trees(None)
    with pytest.raises(ValueError, match="target_tables: expected one"):
        ssg.tables_batch([], [])
    with pytest.raises(ValueError, match=r"draft_tables: 1 tables, but target_tables has 2"):
        ssg.tables_batch([np.eye(3)[:1]] * 2, [np.eye(3)[:1]])
    batch = ssg.TreeBatch.from_trees([tree])
    target = torch.full((1, 3, 4), 0.25, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"noise: expected a specsampling\.gpu\.Noise"):
        ssg.verify("standard", batch, target, target, noise=(0.5, 0.5))
    with pytest.raises(TypeError, match=r"noise: expected a specsampling\.gpu\.Noise"):
        ssg.verify_chain("standard", torch.tensor([[1, 2]]), target, target[:, :2], noise=(1, 2))


def test_hand_built_batches_that_are_not_trees_are_refused_naming_the_field() -> None:
    """``verify(..., validate=True)`` checks a batch's structure, not only its token range: a
    hand-built batch whose candidates, parents, depths, counts or host metadata disagree sent
    the walk to nodes that are not there (a -1 stop token, verdicts read from padding)."""
    import dataclasses

    good = ssg.TreeBatch.from_trees([ss.DraftTree.chain([2, 1], law="iid")])
    target, draft = ssg.tables_batch([np.full((3, 5), 0.2)], [np.full((3, 5), 0.2)])
    noise = ssg.Noise.from_reference([ss.Noise.constant(0.1, 3)])
    broken = {
        r"batch\.candidates\[0, 1\]: lists a node that is not a real child": {
            "candidates": torch.tensor([[[1], [1], [-1]]])
        },
        r"batch\.tokens\[0, 1\]: negative token": {"tokens": torch.tensor([[-1, -3, 1]])},
        r"batch\.num_nodes\[0\]: outside \[1, N\]": {"num_nodes": torch.tensor([5])},
        r"batch\.parents\[0, 2\]: not a node before it": {"parents": torch.tensor([[-1, 0, 9]])},
        r"batch\.depth\[0, 2\]": {"depth": torch.tensor([[0, 1, 1]])},
        r"batch\.max_depth/level_slots/chains": {"max_depth": 1, "level_slots": (1, 1)},
    }
    for message, fields in broken.items():
        batch = dataclasses.replace(good, **fields)
        for name in ("standard", "nss", "block"):
            with pytest.raises(ss.InvalidDistribution, match=message):
                ssg.verify(name, batch, target, draft, noise)
    assert ssg.verify("standard", good, target, draft, noise).tokens.tolist() == [[2, 1, 0]]
    as_int32 = dataclasses.replace(good, parents=good.parents.int(), tokens=good.tokens.int())
    assert torch.equal(ssg.verify("standard", as_int32, target, draft, noise).tokens,
                       ssg.verify("standard", good, target, draft, noise).tokens)  # fmt: skip
    with pytest.raises(ValueError, match="TreeBatch: candidates must be an integer tensor"):
        dataclasses.replace(good, candidates=good.candidates.float())
    assert ssg.TreeBatch.roots(0).num_nodes.shape == (0,)
    with pytest.raises(ValueError, match="batch_size: expected an integer >= 0, got -1"):
        ssg.TreeBatch.roots(-1)


def test_tables_batch_names_what_is_wrong() -> None:
    table = np.full((3, 5), 0.2)
    from fractions import Fraction

    exact = np.array([[Fraction(1, 5)] * 5] * 3, dtype=object)  # an exact pair's table
    assert ssg.tables_batch([exact], [exact])[0].dtype == torch.float64
    refused = [
        (
            ([0.5], [0.5]),
            {},
            r"target_tables\[0\]: expected a \(num_nodes, V\) table, got shape \(\)",
        ),
        (([table + 1j], [table]), {}, r"target_tables\[0\]: expected real numbers, got .*complex"),
        (([table], [table]), {"dtype": torch.long}, "dtype: expected a torch float dtype"),
        (([table], [np.full((3, 4), 0.25)]), {}, r"draft_tables\[0\]: shape \(3, 4\), but"),
        (([table], [np.full((2, 5), 0.2)]), {}, r"draft_tables\[0\]: shape \(2, 5\), but"),
        (([[[0.5, 0.5], [0.2]]], [table]), {}, r"target_tables\[0\]: not a \(num_nodes, V\)"),
    ]
    for args, kwargs, message in refused:
        with pytest.raises(ValueError, match=message):
            ssg.tables_batch(*args, **kwargs)


def test_vllm_adapter_names_the_argument_at_fault() -> None:
    """A NaN or a mass of 2 in ``draft_probs`` is blamed on ``draft_probs``, not on
    ``target_probs``, by its flat row (``draft_probs[1]``, not ``[1, 0]``, which reads as an
    element); a Python list of draft ids or bonus ids is told it must be a tensor; float, bool
    ids and float cumulative counts are refused (``.long()`` truncated them); a mass error
    names the torch ``process`` and suggests no tolerance (this function takes none)."""
    target = torch.full((3, 4), 0.25)
    args = {
        "draft_token_ids": torch.tensor([1, 2, 3]),
        "num_draft_tokens": [3],
        "max_spec_len": 3,
        "cu_num_draft_tokens": torch.tensor([3]),
        "target_probs": target,
        "bonus_token_ids": torch.tensor([[0]]),
    }
    for defect, message in ((float("nan"), "NaN or inf"), (0.5, "mass")):
        draft = target.clone()
        draft[1, 2] = defect if defect != 0.5 else 1.25  # NaN, or a row of mass 2
        with pytest.raises(ss.InvalidDistribution, match=rf"^draft_probs\[1\]: .*{message}"):
            ssg.vllm.rejection_sample(draft_probs=draft, **args)
    nan_target = target.clone()
    nan_target[2, 3] = float("nan")
    with pytest.raises(ss.InvalidDistribution, match=r"^target_probs\[2\]: NaN or inf at index 3"):
        ssg.vllm.rejection_sample(draft_probs=None, **{**args, "target_probs": nan_target})
    with pytest.raises(ss.InvalidDistribution) as raised:
        ssg.vllm.rejection_sample(draft_probs=None, **{**args, "target_probs": target * 4})
    assert "specsampling.gpu.process" in str(raised.value) and "CLI" not in str(raised.value)
    with pytest.raises(ss.InvalidDistribution) as raised:
        ssg.vllm.rejection_sample(draft_probs=None, **{**args, "target_probs": target * 1.01})
    assert "tolerance=" not in str(raised.value), raised.value
    with pytest.raises(ss.InvalidDistribution, match=r"draft_token_ids: expected a torch\.Tensor"):
        ssg.vllm.rejection_sample(draft_probs=None, **{**args, "draft_token_ids": [1, 2, 3]})
    with pytest.raises(ss.InvalidDistribution, match=r"^bonus_token_ids: expected a torch\.Tensor"):
        ssg.vllm.rejection_sample(draft_probs=None, **{**args, "bonus_token_ids": [[0]]})
    bad_dtypes = {
        "draft_token_ids": torch.tensor([1.5, 2.5, 3.5]),
        "bonus_token_ids": torch.tensor([[True]]),
        "cu_num_draft_tokens": torch.tensor([3.0]),
    }
    for name, value in bad_dtypes.items():
        with pytest.raises(ss.InvalidDistribution, match=rf"^{name}: expected an integer tensor"):
            ssg.vllm.rejection_sample(draft_probs=None, **{**args, name: value})
    int32 = {name: args[name].to(torch.int32) for name in bad_dtypes}  # what vLLM passes
    assert ssg.vllm.rejection_sample(draft_probs=None, **{**args, **int32}).shape == (1, 4)


def test_gpu_mass_errors_name_the_torch_process() -> None:
    """The torch entry points' mass errors point at ``specsampling.gpu.process`` (not the
    reference's CLI flag) and suggest a ``tolerance=`` they take."""
    tokens = torch.tensor([[1, 2]])
    target = torch.full((1, 3, 4), 0.25)
    with pytest.raises(ss.InvalidDistribution) as raised:
        ssg.verify_chain("standard", tokens, target * 4, target[:, :2])
    assert "specsampling.gpu.process first" in str(raised.value), raised.value
    assert "CLI" not in str(raised.value)
    with pytest.raises(ss.InvalidDistribution) as raised:
        ssg.verify_chain("standard", tokens, target * 1.01, target[:, :2])
    assert "e.g. tolerance=0.01, and are renormalised" in str(raised.value), raised.value


def test_a_negative_tolerance_is_refused_as_such() -> None:
    tokens = torch.tensor([[1, 2]])
    target = torch.full((1, 3, 4), 0.25)
    for bad in (-1, float("nan"), "1e-3"):
        with pytest.raises(ValueError, match="tolerance: expected None or a finite number"):
            ssg.verify_chain("standard", tokens, target, target[:, :2], tolerance=bad)
    assert ssg.verify_chain("standard", tokens, target, target[:, :2], tolerance=0.0).tokens.shape
