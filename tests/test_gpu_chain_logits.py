"""``ssg.verify_chain_logits``: chain verification from logits, forming on the CPU only the
probability rows the walk reads. Its verdicts must be ``verify_chain``'s on the processed tables
(the same noise from the same generator), on the host walk and on the whole-table route alike."""

from __future__ import annotations

import random

import pytest
import torch

from specsampling import gpu as ssg
from specsampling.errors import InvalidDistribution
from specsampling.gpu import chain_logits as L

#: The schemes whose chains take the standard rule, greedy and nss (the host walks on rows formed
#: on read; nss reads no draft row).
STANDARD_FAMILY = [
    "standard",
    "specinfer",
    "rsd",
    "spectr",
    "resispec",
    "spechub",
    "ot_optimal",
    "ot_binned",
    "khisti",
    "greedy",
    "nss",
]


def round_inputs(
    seed: int,
    batch: int,
    gamma: int,
    vocab: int,
    dtype: torch.dtype,
    temp: float,
    top_p: float | None = None,
    top_k: int | None = None,
):
    """Correlated logits, tokens drawn from the processed draft, some ``-inf`` columns."""
    generator = torch.Generator().manual_seed(seed)
    scale = (0.5, 3.0, 10.0)[seed % 3]
    target = scale * torch.randn(batch, gamma + 1, vocab, generator=generator, dtype=dtype)
    spread = (0.0, 0.05, 1.0)[seed % 3]
    noise = torch.randn(batch, gamma, vocab, generator=generator, dtype=dtype)
    draft = target[:, :gamma] + spread * noise
    if seed % 5 == 0:
        target[..., : vocab // 3] = -float("inf")
        draft[..., : vocab // 3] = -float("inf")
    probs = ssg.process(draft, temp, top_k, top_p, validate=False)
    probs = probs.reshape(-1, vocab).float()
    tokens = torch.multinomial(probs, 1, generator=generator).view(batch, gamma)
    if seed % 4 == 1:  # a point-mass draft row on lane 0 (greedy's covering lane)
        point = torch.full_like(draft[:, 0], -float("inf"))
        draft[:, 0] = point.scatter(1, tokens[:, :1], 0.0)
    return target, draft, tokens


def chunk_end(lane: int, lanes: int) -> int:
    """The rows formed up to ``lane``: chunks of lanes [0, 2), [2, 6), [6, 14), ..."""
    end = 2
    while end <= lane:
        end = 2 * end + 2
    return min(end, lanes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_on_read_give_verify_chain_verdicts(dtype: torch.dtype) -> None:
    """The host walk on rows formed on read returns ``verify_chain``'s verdicts on the whole
    processed tables, bit for bit, for every scheme of the standard family (resispec's shaped
    test included), greedy (point-mass draft rows included: its covering lanes) and nss: one
    and two rows, 1-8 drafts, ragged lengths, vocabularies from 2 to 40,000, temperatures
    0.05-2, top-k off or 1-300, top-p off or 0.3-1, given noise and noise drawn from a
    generator. It processes only the chunks of rows holding the lanes it reads (counted; nss
    reads no draft row)."""
    checked = 0
    for seed in range(160):
        rng = random.Random(seed)
        batch, gamma = rng.choice([1, 2]), rng.randint(1, 8)
        vocab = rng.choice([2, 3, 127, 129, 1000, 40_000])
        temp = rng.choice([1.0, 0.7, 1.3, 0.05, 2.0])
        top_p = rng.choice([None, None, 0.9, 0.5, 0.3, 0.99, 1.0])
        top_k = rng.choice([None, None, None, 1, 5, 50, 300, vocab + 1])
        target, draft, tokens = round_inputs(seed, batch, gamma, vocab, dtype, temp, top_p, top_k)
        lengths = torch.randint(0, gamma + 1, (batch,)) if seed % 3 == 0 else None
        name = STANDARD_FAMILY[seed % len(STANDARD_FAMILY)]
        given = seed % 2 == 0
        noise = ssg.chain.chain_noise(batch, gamma, torch.Generator().manual_seed(seed + 7))

        def generator(seed: int = seed, given: bool = given) -> torch.Generator | None:
            return None if given else torch.Generator().manual_seed(seed)

        use = noise if given else None
        walked, formed = L.rows_on_read(
            name, tokens, target, draft, use, temp, generator(), lengths, top_p, top_k
        )
        public = ssg.verify_chain_logits(
            name,
            tokens,
            target,
            draft,
            use,
            temperature=temp,
            top_k=top_k,
            top_p=top_p,
            generator=generator(),
            validate=False,
            num_draft_tokens=lengths,
        )
        expected = ssg.verify_chain(
            name,
            tokens,
            ssg.process(target, temp, top_k, top_p, validate=False),
            ssg.process(draft, temp, top_k, top_p, validate=False),
            use,
            generator=generator(),
            validate=False,
            num_draft_tokens=lengths,
        )
        for got in (walked, public):
            for a, b in zip(got, expected, strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b), (seed, name)
        ends = lengths.tolist() if lengths is not None else [gamma] * batch
        reads_draft = name != "nss"
        rows = sum(
            chunk_end(k, gamma + 1)
            + (chunk_end(min(k, end - 1), gamma) if end > 0 and reads_draft else 0)
            for k, end in zip(expected.node.tolist(), ends, strict=True)
        )
        assert formed == rows, (seed, formed, rows)
        checked += 1
    assert checked == 160


def test_a_first_draft_rejected_forms_two_rows_of_each_table() -> None:
    """At V = 50,000 and γ = 8 a round that rejects its first draft (a token the draft favours
    and the target all but excludes) processes 2 of the 9 target rows and 2 of the 8 draft
    rows."""
    target, draft, tokens = round_inputs(1, 1, 8, 50_000, torch.float32, 1.0)
    token = int(tokens[0, 0])
    target[0, 0, token], draft[0, 0, token] = -20.0, 20.0
    noise = ssg.Noise(
        torch.full((1, 9), 0.5, dtype=torch.float64), torch.rand(1, 9, dtype=torch.float64)
    )
    verdicts, formed = L.rows_on_read("standard", tokens, target, draft, noise, 1.0)
    assert int(verdicts.node[0]) == 0
    assert formed == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_process_is_row_local(dtype: torch.dtype) -> None:
    """The premise of rows formed on read: ``ssg.process`` of a few rows gives the rows of the
    whole table's result bit for bit (temperatures below, at and above 1; top-k off, small and
    just below ``ROW_LOCAL_TOP_K``; top-p off and on; odd vocabularies)."""
    generator = torch.Generator().manual_seed(2)
    settings = [(0.3, None, None), (1.0, None, None), (1.7, None, None), (1.0, None, 0.9)]
    settings += [
        (0.7, None, 0.5),
        (1.0, 50, None),
        (0.7, 5, 0.9),
        (1.0, L.ROW_LOCAL_TOP_K - 1, 0.9),
    ]
    for vocab in (3, 129, 32_000, 151_936):
        logits = 4 * torch.randn(2, 9, vocab, generator=generator, dtype=dtype)
        logits[1] *= 3  # peaked rows: top-p's partial sort where a call's rows are mostly these
        flat = logits.reshape(18, vocab)
        for temp, top_k, top_p in settings:
            whole = ssg.process(logits, temp, top_k, top_p, validate=False).reshape(18, vocab)
            for start, stop in ((0, 1), (1, 3), (3, 7), (9, 18), (17, 18), (8, 10)):
                part = ssg.process(flat[start:stop], temp, top_k, top_p, validate=False)
                assert torch.equal(part, whole[start:stop]), (vocab, temp, top_k, top_p, start)


def test_other_routes_process_the_whole_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches beyond the host walk, schemes of other engines, per-row temperatures or top-p,
    bf16 logits and ``validate=True`` take ``verify_chain`` on the processed tables (the walk
    on read is never entered): its verdicts."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the walk on read was taken")

    monkeypatch.setattr(L, "_walk_on_read", refuse)
    target, draft, tokens = round_inputs(3, 3, 4, 300, torch.float32, 1.0)
    per_row = torch.tensor([[0.8], [1.0], [1.6]])  # one per sequence: both tables' rows
    one = (target[:1], draft[:1], tokens[:1])
    cases = [  # (scheme, target, draft, tokens, temperature, top_p, validate)
        ("standard", target, draft, tokens, 1.0, None, False),  # three rows
        ("block", *one, 1.0, None, False),
        ("nss", target, draft, tokens, 0.9, None, False),  # three rows
        ("traversal", *one, 1.2, None, False),
        ("standard", target, draft, tokens, per_row, None, False),
        ("standard", target[:1].bfloat16(), draft[:1].bfloat16(), tokens[:1], 1.0, None, False),
        ("standard", *one, 1.0, None, True),
        ("standard", *one, 0.0, None, False),  # greedy rows
        # top-p per sequence (a tensor or a sequence) or on a block engine
        ("standard", *one, 1.0, torch.tensor([[0.9]]), False),
        ("standard", target, draft, tokens, 1.0, torch.tensor([[0.9], [0.5], [1.0]]), False),
        ("standard", *one, 1.0, [[0.8]], False),
        ("block", *one, 1.0, 0.9, False),
    ]
    for name, t, d, x, temp, top_p, validate in cases:
        noise = ssg.chain.chain_noise(x.shape[0], x.shape[1], torch.Generator().manual_seed(5))
        got = ssg.verify_chain_logits(
            name, x, t, d, noise, temperature=temp, top_p=top_p, validate=validate
        )
        expected = ssg.verify_chain(
            name,
            x,
            ssg.process(t, temperature=temp, top_p=top_p, validate=validate),
            ssg.process(d, temperature=temp, top_p=top_p, validate=validate),
            noise,
            validate=validate,
        )
        assert torch.equal(got.tokens, expected.tokens), (name, top_p)
    # top-k per sequence, or at and above ROW_LOCAL_TOP_K (a row's sums split over threads)
    wide, wide_draft, wide_tokens = round_inputs(7, 1, 2, 40_000, torch.float32, 1.0)
    for x, t, d, top_k in [
        (tokens[:1], target[:1], draft[:1], torch.tensor([[5]])),
        (tokens[:1], target[:1], draft[:1], [[5]]),
        (wide_tokens, wide, wide_draft, L.ROW_LOCAL_TOP_K),
        (wide_tokens, wide, wide_draft, 20_000),
    ]:
        noise = ssg.chain.chain_noise(x.shape[0], x.shape[1], torch.Generator().manual_seed(5))
        got = ssg.verify_chain_logits("standard", x, t, d, noise, top_k=top_k, validate=False)
        expected = ssg.verify_chain(
            "standard",
            x,
            ssg.process(t, top_k=top_k, validate=False),
            ssg.process(d, top_k=top_k, validate=False),
            noise,
            validate=False,
        )
        assert torch.equal(got.tokens, expected.tokens), top_k


def test_bad_input_is_refused_naming_the_argument() -> None:
    """Bad input reaches ``process`` / ``verify_chain``, which name the argument."""
    target, draft, tokens = round_inputs(4, 1, 3, 50, torch.float32, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        ssg.verify_chain_logits("standard", tokens, target, draft, temperature=-1.0, validate=False)
    with pytest.raises(InvalidDistribution, match="num_draft_tokens"):
        ssg.verify_chain_logits(
            "standard", tokens, target, draft, validate=False, num_draft_tokens=[1.5]
        )
    nan = target.clone()
    nan[0, 1, 3] = float("nan")
    with pytest.raises(InvalidDistribution, match="NaN"):
        ssg.verify_chain_logits("standard", tokens, nan, draft)
    with pytest.raises(TypeError, match="noise"):
        ssg.verify_chain_logits("standard", tokens, target, draft, noise=0.5, validate=False)
    for top_p in (1.5, 0.0, True, "0.9", float("nan")):  # the whole-table route refuses them
        with pytest.raises(ValueError, match="top_p"):
            ssg.verify_chain_logits("standard", tokens, target, draft, top_p=top_p, validate=False)
    for top_k in (0, -3, True, 2.5, "5"):
        with pytest.raises(ValueError, match="top_k"):
            ssg.verify_chain_logits("standard", tokens, target, draft, top_k=top_k, validate=False)


def test_checked_errors_name_the_logits_arguments() -> None:
    """With ``validate=True`` an error names this function's own arguments (``target_logits``,
    ``draft_logits``), not ``process``'s ``logits`` (which of the two?) or ``verify_chain``'s
    ``target_probs`` / ``draft_probs``; a drafted token outside the processed draft's support
    is blamed on a top-k / top-p cut, not on underflow (whose advice, ``draft_probs=None``, has
    no equivalent here)."""
    target, draft, tokens = torch.zeros(1, 3, 4), torch.zeros(1, 2, 4), torch.tensor([[1, 2]])
    nan = draft.clone()
    nan[0, 1, 0] = float("nan")
    cases = [
        ((tokens, target, nan), {}, r"^draft_logits: NaN or \+inf"),
        ((tokens, nan[:, 1:].expand(1, 3, 4), draft), {}, r"^target_logits: NaN or \+inf"),
        ((tokens, target[:, :2], draft), {}, r"^target_logits: expected shape \(1, 3,"),
        ((tokens, target, torch.zeros(1, 2, 5)), {}, r"^draft_logits: vocabulary mismatch"),
        ((tokens, target, None), {}, r"^draft_logits: expected an array"),
        (
            (tokens, target, draft),
            {"top_k": 1},
            r"^draft_logits\[0, 0\]: the drafted token 1 has zero draft probability, so it "
            r"cannot have been sampled from the processed draft \(outside its top-k / top-p",
        ),
    ]
    for args, options, message in cases:
        with pytest.raises(InvalidDistribution, match=message):
            ssg.verify_chain_logits("standard", *args, **options)


def test_fast_path_inputs_of_other_kinds_match_the_whole_tables() -> None:
    """Numpy and integer temperatures, logits that require grad (read detached, as ``process``
    and ``verify_chain`` read them), float32 noise, int32 tokens and strided logits take the
    walk on read at one row, with the whole tables' verdicts; noise of the wrong shape takes
    the whole-table route, which refuses it as ``verify_chain`` does."""
    import numpy as np

    target, draft, tokens = round_inputs(6, 3, 4, 300, torch.float32, 1.0)
    noise = ssg.chain.chain_noise(3, 4, torch.Generator().manual_seed(1))
    cases = [
        (target, draft, tokens, noise, np.float32(0.7)),
        (target, draft, tokens, noise, 2),
        (target.clone().requires_grad_(), draft.clone().requires_grad_(), tokens, noise, 0.7),
        (target, draft, tokens, ssg.Noise(noise.accept.float(), noise.sample.float()), 1.0),
        (target, draft, tokens.int(), noise, 1.0),
        (target.transpose(0, 1).contiguous().transpose(0, 1), draft, tokens, noise, 1.3),
    ]
    for t, d, x, uniforms, temp in cases:
        for rows in (slice(0, 1), slice(0, 3)):  # the walk on read, then the whole tables
            part = ssg.Noise(uniforms.accept[rows], uniforms.sample[rows])
            got = ssg.verify_chain_logits(
                "standard", x[rows], t[rows], d[rows], part, temperature=temp, validate=False
            )
            expected = ssg.verify_chain(
                "standard",
                x[rows],
                ssg.process(t[rows], temperature=float(temp), validate=False),
                ssg.process(d[rows], temperature=float(temp), validate=False),
                part,
                validate=False,
            )
            assert torch.equal(got.tokens, expected.tokens), (temp, rows)
    short = ssg.Noise(noise.accept[:2, :3], noise.sample[:2, :3])  # [2, 3], not [1, 5]
    with pytest.raises(Exception) as refused:
        ssg.verify_chain_logits("greedy", tokens[:1], target[:1], draft[:1], short, validate=False)
    with pytest.raises(type(refused.value)):
        ssg.verify_chain(
            "greedy",
            tokens[:1],
            ssg.process(target[:1], validate=False),
            ssg.process(draft[:1], validate=False),
            short,
            validate=False,
        )
