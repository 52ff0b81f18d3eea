"""The Hugging Face decoder (``specsampling.gpu.hf.decoder``) on tiny random models.

Proofs, each on random-weight Llama / Qwen2 models built from small configs (no download):

* **tree-logits parity**: every target and draft logit row a round used equals a plain no-cache
  forward of that node's full prefix, over several rounds (after cache rollbacks), chains and
  trees, B = 1 and B = 3 with left-padded prompts of different lengths;
* **greedy equality**: at temperature 0 the tokens equal ``model.generate(do_sample=False)`` for
  every scheme that supports the shape;
* **sampling losslessness**: the law of the first two emitted tokens over thousands of batched
  rows matches the target's exact two-token law (chi-square on counts), with a negative control
  (an always-accept verifier) that must fail;
* EOS / ``max_new_tokens`` exactness, bad inputs, and two peer bugs: processors honoured on every
  path (sgl-project/sglang#10617) and the bonus token's KV (vllm-project/vllm#9730: a self-draft
  accepts everything for every γ).

False-positive budget: ``FALSE_POSITIVE_BUDGET = 1e-3`` for the file, split evenly (Bonferroni)
over the ``NUM_CHI_SQUARE_TESTS`` chi-square tests that must accept; the negative control must
reject at the same ``ALPHA`` (a power check, spending none of the budget).
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specsampling as ss  # noqa: E402
import specsampling.gpu as ssg  # noqa: E402
from proofs_tests.chisquare import chi_square_pvalue  # noqa: E402
from proofs_tests.hf_models import (  # noqa: E402
    AlwaysAccept,
    left_pad,
    no_grad,  # noqa: F401 (autouse fixture)
    one_thread,  # noqa: F401 (autouse fixture)
    perturbed,
    plain_logits,
    tiny_causal_lm,
    trace_prefixes,
)
from specsampling.errors import InvalidDistribution, UnsupportedShape  # noqa: E402
from specsampling.gpu.hf import (  # noqa: E402
    GENERATE_DIR,
    DecodeState,
    LayerSkipDraft,
    NGramDraft,
    SpeculativeDecoder,
)
from specsampling.gpu.hf import generate as hf_generate  # noqa: E402
from specsampling.gpu.schemes import TreeLowering  # noqa: E402

Shape = ss.Shape

CHAIN_AND_TREES = [
    Shape.chain(3),
    Shape.paths(2, 3),
    Shape.delayed(2, trunk=1, branch=2),
    Shape.branching((2, 2)),
    Shape.branching((2, 1), replacement=True),
    Shape.star(3),
    Shape.top((2, 1)),
    Shape.greedy((2, 1)),
    Shape.hub(1),
]
TREE_SCHEMES = [name for name, low in ssg.SCHEMES.items() if isinstance(low, TreeLowering)]


def llama(seed, vocab=64, attn="eager", dtype=torch.float32, layers=2):
    return tiny_causal_lm("llama", seed, vocab=vocab, attn=attn, dtype=dtype, layers=layers)


def sdpa_llama(seed, **kwargs):
    return llama(seed, attn="sdpa", **kwargs)


def qwen(seed, vocab=64, attn="sdpa", dtype=torch.float32, **extra):
    return tiny_causal_lm("qwen", seed, vocab=vocab, attn=attn, dtype=dtype, **extra)


@pytest.fixture(scope="module")
def pair():
    target = llama(0)
    return target, perturbed(target, 0.05, 1)


def last_logits(model, tokens):
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]


PROMPTS = [[3, 5, 7, 9, 11], [4, 2], [8, 1, 6, 6]]


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize(
    ("make", "dtype", "atol"),
    [(llama, torch.float32, 3e-5), (qwen, torch.float32, 3e-5), (sdpa_llama, torch.float64, 1e-10)],
    ids=["llama-eager-f32", "qwen-sdpa-f32", "llama-sdpa-f64"],
)
@pytest.mark.parametrize("batch", [1, 3])
def test_tree_logits_parity(make, dtype, atol, batch, monkeypatch):
    if batch == 3:  # compact the caches every round: holes moved away, same logits
        monkeypatch.setattr(DecodeState, "compact_slack", -(10**9))
    target = make(0, dtype=dtype)
    draft = perturbed(target, 0.3, 2)
    checked = 0
    for shape, scheme in [
        (Shape.chain(3), "standard"),
        (Shape.paths(2, 3), "specinfer"),
        (Shape.branching((2, 2)), "rsd"),
        (Shape.delayed(2, trunk=1, branch=1), "traversal"),
    ]:
        dec = SpeculativeDecoder(target, draft, scheme, shape)
        dec.traces = []
        ids, mask = left_pad(PROMPTS[:batch])
        dec.generate(ids, attention_mask=mask, max_new_tokens=9, seed=batch)
        assert len(dec.traces) >= 3
        for trace in dec.traces:
            where, prefixes = trace_prefixes(trace)
            for model, used in ((target, trace.target_logits), (draft, trace.draft_logits)):
                if used is None:  # the last round, one token left: nothing drafted
                    assert model is draft and trace.tree.max_depth == 0
                    continue
                rows = torch.stack([used[b, n] for b, n in where])  # [R, V]
                expanded = ~torch.isnan(rows).any(-1)
                expected = plain_logits(model, prefixes)
                torch.testing.assert_close(rows[expanded], expected[expanded], atol=atol, rtol=0)
                checked += int(expanded.sum())
    assert checked > 100


# ----------------------------------------------------------------------------- greedy
def greedy_reference(model, prompt, length):
    ids = torch.tensor([prompt])
    out = model.generate(ids, do_sample=False, max_new_tokens=length, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("shape", CHAIN_AND_TREES, ids=repr)
def test_greedy_equals_generate(pair, shape):
    target, draft = pair
    expected = greedy_reference(target, PROMPTS[0], 10)
    ran = 0
    for name in TREE_SCHEMES:
        if not ss.SCHEMES[name].supports(shape):
            continue
        dec = SpeculativeDecoder(target, draft, name, shape)
        out = dec.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=10, temperature=0)
        assert out.sequences[0, 5:].tolist() == expected, name
        ran += 1
    assert ran >= 1


def test_greedy_batch_ragged_and_other_drafters(pair):
    target, draft = pair
    expected = [greedy_reference(target, p, 8) for p in PROMPTS]
    ids, mask = left_pad(PROMPTS)
    width = ids.shape[1]
    for drafter, scheme, shape in [
        (draft, "specinfer", Shape.paths(2, 3)),
        (draft, "standard", Shape.chain(4)),
        (NGramDraft(n=2), "standard", Shape.chain(3)),
        (NGramDraft(n=2), "nss", Shape.chain(2)),
        (LayerSkipDraft(target, [0]), "traversal", Shape.branching((2, 1))),
        (None, "standard", Shape.chain(1)),
    ]:
        dec = SpeculativeDecoder(target, drafter, scheme, shape)
        out = dec.generate(ids, attention_mask=mask, max_new_tokens=8, temperature=0)
        assert out.sequences[:, width:].tolist() == expected, (drafter, scheme)
        assert out.num_generated == (8, 8, 8)


def test_generate_with_gradients_enabled(pair):
    """Regression: models fresh from ``from_pretrained`` have parameters that require grad, and
    callers rarely wrap decoding in ``no_grad``; the decoder must (traversal's in-place kernels
    refuse autograd inputs, and a graph over every round would hold all activations)."""
    target, draft = pair
    assert any(p.requires_grad for p in target.parameters())
    with torch.enable_grad():
        dec = SpeculativeDecoder(target, draft, "traversal", Shape.paths(2, 2))
        out = dec.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=6, seed=0)
    assert out.num_generated == (6,) and not out.sequences.requires_grad


class _Recorder:
    """A transformers-style streamer that keeps what it is given."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


def test_streamer_gets_the_prompt_then_every_round_then_end(pair):
    target, draft = pair
    prompt = torch.tensor([[5, 6, 7]])
    streamer = _Recorder()
    dec = SpeculativeDecoder(target, draft, "traversal", Shape.paths(2, 2))
    out = dec.generate(prompt, max_new_tokens=9, seed=3, streamer=streamer)
    assert streamer.puts[0] == [5, 6, 7] and streamer.ended == 1
    streamed = [t for chunk in streamer.puts[1:] for t in chunk]
    assert streamed == out.sequences[0, 3:].tolist() and len(streamed) == 9
    assert [len(c) for c in streamer.puts[1:]] == list(out.stats.emitted[0])  # one put a round
    with pytest.raises(ValueError, match="streamer"):
        dec.generate(torch.tensor([[1, 2], [3, 4]]), max_new_tokens=2, streamer=_Recorder())


def test_greedy_sdpa_float64_and_vocab_padded_draft():
    target = qwen(0, dtype=torch.float64)
    draft = qwen(3, vocab=80, dtype=torch.float64)  # vocabulary padded by 16 ids
    draft.lm_head.register_forward_hook(
        lambda m, i, out: out.index_fill(-1, torch.arange(64, 80), float("-inf"))
    )
    expected = greedy_reference(target, PROMPTS[2], 9)
    dec = SpeculativeDecoder(target, draft, "spectr", Shape.star(2))
    assert (
        dec.generate(torch.tensor([PROMPTS[2]]), 9, temperature=0).sequences[0, 4:].tolist()
        == expected
    )
    unmasked = qwen(3, vocab=80, dtype=torch.float64)
    with pytest.raises(InvalidDistribution, match="draft: its vocabulary is padded"):
        SpeculativeDecoder(target, unmasked, "spectr", Shape.star(2)).generate(
            torch.tensor([PROMPTS[2]]), 3
        )


def test_custom_generate_greedy_and_refusals(pair):
    target, draft = pair
    ids, mask = left_pad(PROMPTS)
    expected = [greedy_reference(target, p, 7) for p in PROMPTS]
    for drafter, scheme, shape in [
        (draft, "traversal", Shape.paths(2, 2)),
        (draft, "standard", Shape.chain(3)),
        (NGramDraft(n=2), "nss", Shape.chain(2)),
    ]:
        out = target.generate(
            input_ids=ids,
            attention_mask=mask,
            custom_generate=hf_generate,
            draft_model=drafter,
            scheme=scheme,
            shape=shape,
            do_sample=False,
            max_new_tokens=7,
            pad_token_id=0,
        )
        assert out[:, ids.shape[1] :].tolist() == expected, scheme
    sampled = target.generate(
        input_ids=ids[:1, -5:],
        custom_generate=hf_generate,
        draft_model=draft,
        do_sample=True,
        top_k=4,
        max_new_tokens=6,
        seed=0,
    )
    context = PROMPTS[0][:]
    for token in sampled[0, 5:].tolist():
        assert processed_support(target, context, {"top_k": 4})[token]
        context.append(token)
    # what it cannot honour is refused, not dropped: other processors, beams, a dict of scores
    for refused, name in [
        ({"repetition_penalty": 1.5}, "RepetitionPenaltyLogitsProcessor"),
        ({"num_beams": 3, "do_sample": False}, "num_beams"),
        ({"return_dict_in_generate": True, "output_scores": True}, "return_dict_in_generate"),
    ]:
        with pytest.raises(ValueError, match=name):
            target.generate(
                input_ids=ids[:1, -5:],
                custom_generate=hf_generate,
                draft_model=draft,
                max_new_tokens=3,
                pad_token_id=0,
                **refused,
            )


def test_custom_generate_streams_and_refuses_assisted_options(pair, tmp_path, monkeypatch):
    """A ``streamer`` given to ``model.generate`` (transformers puts the prompt, then drops it
    from a callable's arguments: a consumer waited forever) gets every token once, then
    ``end()``, in both forms; transformers' assisted-generation settings, which this decoder does
    not read, are refused naming the equivalent (they were ignored); so is ``synced_gpus``."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path))
    target, draft = pair
    prompt = torch.tensor([[5, 6, 7]])
    common = {"draft_model": draft, "do_sample": False, "max_new_tokens": 7, "pad_token_id": 0}
    expected = greedy_reference(target, [5, 6, 7], 7)
    for form in ({"custom_generate": hf_generate}, {"custom_generate": GENERATE_DIR}):
        streamer = _Recorder()
        remote = {"trust_remote_code": True} if form["custom_generate"] == GENERATE_DIR else {}
        out = target.generate(prompt, streamer=streamer, **form, **remote, **common)
        assert out[0, 3:].tolist() == expected
        assert streamer.puts[0] == [[5, 6, 7]] and streamer.ended == 1, streamer.puts
        assert [t for chunk in streamer.puts[1:] for t in chunk] == expected
    for option, equivalent in [
        ({"num_assistant_tokens": 1}, "Shape.chain"),
        ({"num_assistant_tokens_schedule": "heuristic"}, "HeuristicLength"),
        ({"assistant_confidence_threshold": 0.9}, "ModelDraft"),
        ({"prompt_lookup_num_tokens": 3}, "NGramDraft"),
        ({"max_matching_ngram_size": 2}, "NGramDraft"),
        ({"synced_gpus": True}, "not supported"),
    ]:
        name = next(iter(option))
        with pytest.raises(ValueError, match=rf"^{name}: .*{equivalent}"):
            target.generate(prompt, custom_generate=hf_generate, **common, **option)
    defaults = {"num_assistant_tokens": 20, "assistant_confidence_threshold": 0.4}
    out = target.generate(prompt, custom_generate=hf_generate, **common, **defaults)
    assert out[0, 3:].tolist() == expected  # transformers' own defaults are not refused


def test_custom_generate_assistant_model(pair, tmp_path, monkeypatch):
    """HF's own ``assistant_model=``: taken as the draft by the directory form, refused by the
    callable form (transformers drops it before calling a callable, so it would be ignored)."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path))  # transformers copies the entry here
    target, draft = pair
    ids, mask = left_pad(PROMPTS)
    expected = [greedy_reference(target, p, 6) for p in PROMPTS]
    calls = []
    original = SpeculativeDecoder.__init__

    def spy(self, target_model, drafter, *args, **kwargs):
        calls.append(drafter)
        original(self, target_model, drafter, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "__init__", spy)
    common = {"do_sample": False, "max_new_tokens": 6, "pad_token_id": 0, "attention_mask": mask}
    out = target.generate(
        ids,
        custom_generate=GENERATE_DIR,
        trust_remote_code=True,
        assistant_model=draft,
        shape=Shape.chain(3),
        **common,
    )
    assert out[:, ids.shape[1] :].tolist() == expected
    assert calls == [draft]  # the assistant is the draft, not dropped
    with pytest.raises(ValueError, match="assistant_model: give the draft once"):
        target.generate(
            ids,
            custom_generate=GENERATE_DIR,
            trust_remote_code=True,
            assistant_model=draft,
            draft_model=draft,
            **common,
        )
    with pytest.raises(ValueError, match="prefix_allowed_tokens_fn"):
        target.generate(
            ids,
            custom_generate=GENERATE_DIR,
            trust_remote_code=True,
            prefix_allowed_tokens_fn=lambda batch, tokens: [0],
            **common,
        )
    with pytest.raises(ValueError, match="assistant_model: transformers does not pass it"):
        target.generate(ids, custom_generate=hf_generate, assistant_model=draft, **common)
    assert calls == [draft]  # refused before any decoder was built


# ----------------------------------------------------------------------------- sampling
FALSE_POSITIVE_BUDGET = 1e-3
NUM_ROWS = 3000
SMALL_VOCAB = 10
PROMPT = [1, 2, 3, 1, 2]
SAMPLING_CASES = [
    ("standard", Shape.chain(2), "model", {}),
    ("specinfer", Shape.paths(2, 2), "model", {}),
    ("rsd", Shape.branching((2, 1)), "model", {}),
    ("traversal", Shape.delayed(2, trunk=1, branch=1), "model", {}),
    ("spectr", Shape.star(3), "model", {}),
    ("resispec", Shape.paths(2, 2), "model", {}),
    ("block", Shape.chain(3), "model", {}),
    ("specinfer", Shape.paths(2, 2), "model", {"temperature": 0.8, "top_k": 6, "top_p": 0.9}),
    ("greedy", Shape.greedy((2, 1)), "model", {}),
    ("spechub", Shape.hub(1), "model", {}),
    ("nss", Shape.top((2, 1)), "model", {}),
    ("ot_optimal", Shape.star(2), "model", {}),
    ("standard", Shape.chain(3), "ngram", {}),
    ("specinfer", Shape.paths(2, 2), "layerskip", {}),
]
NUM_CHI_SQUARE_TESTS = len(SAMPLING_CASES)
ALPHA = FALSE_POSITIVE_BUDGET / NUM_CHI_SQUARE_TESTS


@pytest.fixture(scope="module")
def small_pair():
    target = llama(5, vocab=SMALL_VOCAB)
    return target, llama(6, vocab=SMALL_VOCAB)


def two_token_law(target, settings):
    """The exact law of the first two tokens after ``PROMPT`` from no-cache forwards."""
    first = ssg.process(last_logits(target, PROMPT).double(), **settings)
    law = {}
    for x in range(SMALL_VOCAB):
        if first[x] > 0:
            second = ssg.process(last_logits(target, [*PROMPT, x]).double(), **settings)
            for y in range(SMALL_VOCAB):
                law[(x, y)] = float(first[x] * second[y])
    return law


def two_token_counts(dec, settings, seed, budget=2):
    """The first two tokens of ``NUM_ROWS`` rows generating ``budget`` tokens each."""
    ids = torch.tensor([PROMPT] * NUM_ROWS)
    out = dec.generate(ids, max_new_tokens=budget, seed=seed, **settings)
    tail = out.sequences[:, len(PROMPT) : len(PROMPT) + 2].tolist()
    return Counter(tuple(row) for row in tail), out


@pytest.mark.parametrize(("scheme", "shape", "drafter", "settings"), SAMPLING_CASES)
def test_sampling_two_token_law(small_pair, scheme, shape, drafter, settings):
    target, draft = small_pair
    draft = {"model": draft, "ngram": NGramDraft(n=2), "layerskip": LayerSkipDraft(target, [1])}[
        drafter
    ]
    dec = SpeculativeDecoder(target, draft, scheme, shape)
    counts, out = two_token_counts(dec, settings, seed=11)
    assert chi_square_pvalue(counts, two_token_law(target, settings)) > ALPHA
    assert max(max(e) for e in out.stats.emitted) >= 2  # some rows did emit 2 in one round


def test_negative_control_always_accept_fails(small_pair):
    """A budget of 3: a chain is cut to the tokens a row may still emit, and the mutant's two
    drafted tokens must both be kept."""
    target, draft = small_pair
    dec = AlwaysAccept(target, draft, "standard", Shape.chain(2))
    counts, _ = two_token_counts(dec, {}, seed=11, budget=3)
    assert chi_square_pvalue(counts, two_token_law(target, {})) < ALPHA


# ----------------------------------------------------------------------------- EOS, budget
def test_max_new_tokens_and_eos_exact(pair):
    target, _ = pair
    expected = [greedy_reference(target, p, 12) for p in PROMPTS]
    ids, mask = left_pad(PROMPTS)
    dec = SpeculativeDecoder(target, target, "standard", Shape.chain(4))  # accepts everything
    for budget in (1, 3, 7, 10):
        out = dec.generate(ids, attention_mask=mask, max_new_tokens=budget, temperature=0)
        assert out.num_generated == (budget,) * 3
        assert out.sequences[:, ids.shape[1] :].tolist() == [e[:budget] for e in expected]
    eos = expected[0][5]
    cut = [e.index(eos) + 1 if eos in e else 12 for e in expected]
    out = dec.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=12,
        temperature=0,
        eos_token_id=eos,
        pad_token_id=np.int64(63),  # numpy ids as the other arguments
    )
    assert out.num_generated == tuple(cut)
    for row, stop in enumerate(cut):
        tail = out.sequences[row, ids.shape[1] :].tolist()
        assert tail[:stop] == expected[row][:stop]
        assert tail[stop:] == [63] * (len(tail) - stop)
    assert dec.generate(ids, attention_mask=mask, max_new_tokens=0).sequences.shape == ids.shape
    # no pad id and several EOS ids: finished rows pad with the first one given, as transformers
    # does (not the smallest)
    first = max(set(range(target.config.vocab_size)) - {t for e in expected for t in e})
    out = dec.generate(
        ids, attention_mask=mask, max_new_tokens=12, temperature=0, eos_token_id=[first, eos]
    )
    for row, stop in enumerate(cut):
        tail = out.sequences[row, ids.shape[1] :].tolist()
        assert tail[stop:] == [first] * (len(tail) - stop)


# ----------------------------------------------------------------------------- bad input
def test_bad_inputs(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, draft, "standard", Shape.chain(2))
    prompt = torch.tensor([PROMPTS[0]])
    with pytest.raises(ValueError, match="input_ids"):
        dec.generate(torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        dec.generate(prompt, temperature=-1.0)
    for top_p in (0.0, 1.5):
        with pytest.raises(ValueError, match="top_p"):
            dec.generate(prompt, top_p=top_p)
    with pytest.raises(ValueError, match="attention_mask"):
        dec.generate(torch.tensor([[1, 2, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate(prompt, max_new_tokens=-1)
    vocab = target.config.vocab_size
    for bad_id, where in ((-1, "position 0"), (vocab, "position 2")):
        ids = torch.tensor([[bad_id, 5, 6]]) if bad_id < 0 else torch.tensor([[4, 5, bad_id]])
        with pytest.raises(ValueError, match=f"input_ids: token id {bad_id} at row 0, {where}"):
            dec.generate(ids)
    padded, padded_mask = left_pad([[4, 5, 6], [7]], pad=-1)  # padding may hold -1: never read
    assert dec.generate(padded, attention_mask=padded_mask, max_new_tokens=2, seed=0).num_generated
    for eos in (-5, vocab, [3, -5]):
        with pytest.raises(ValueError, match=r"eos_token_id: id -?[0-9]+ out of range"):
            dec.generate(prompt, eos_token_id=eos)
    with pytest.raises(ValueError, match="eos_token_id: expected token ids"):
        dec.generate(prompt, eos_token_id="</s>")
    with pytest.raises(ValueError, match="pad_token_id"):
        dec.generate(prompt, pad_token_id="0")
    for seed in ("abc", -1, 1.5):
        with pytest.raises(ValueError, match="seed"):
            dec.generate(prompt, seed=seed)
    with pytest.raises(ValueError, match="draft: dtype"):
        SpeculativeDecoder(target, copy.deepcopy(draft).double())
    with pytest.raises(ValueError, match="draft: vocabulary"):
        SpeculativeDecoder(target, llama(0, vocab=32))
    flash = copy.deepcopy(target)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="target: attention implementation"):
        SpeculativeDecoder(flash, draft)
    with pytest.raises(ValueError, match="draft: attention implementation"):
        SpeculativeDecoder(target, flash)
    sliding = qwen(0, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    with pytest.raises(ValueError, match="target: layer types"):
        SpeculativeDecoder(sliding, None)
    with pytest.raises(UnsupportedShape, match="standard"):
        SpeculativeDecoder(target, draft, "standard", Shape.paths(2, 2))
    with pytest.raises(ValueError, match="keyed coupling"):  # keyed: tests/test_hf_keyed.py
        SpeculativeDecoder(target, draft, "gumbel", Shape.chain(2)).generate(prompt)
    with pytest.raises(UnsupportedShape, match="NGramDraft proposes chains"):
        SpeculativeDecoder(target, NGramDraft(), "nss", Shape.star(2))
    with pytest.raises(ValueError, match="layers"):
        LayerSkipDraft(target, [5])


# ----------------------------------------------------------------------------- peer bugs
def processed_support(model, prefix, settings):
    return ssg.process(last_logits(model, prefix).double(), **settings) > 0


@pytest.mark.parametrize(
    "settings", [{"top_k": 3}, {"top_p": 0.5, "temperature": 0.7}], ids=["top_k", "top_p"]
)
def test_every_processor_on_every_path(pair, settings):
    """Every emitted token lies in the processed target support at its position, and every
    drafted token in the processed draft support below its parent: chain, tree, batch,
    n-gram and plain paths."""
    target, draft = pair
    ids, mask = left_pad(PROMPTS)
    for drafter, scheme, shape, batch in [
        (draft, "standard", Shape.chain(3), 1),
        (draft, "specinfer", Shape.paths(2, 2), 1),
        (draft, "rsd", Shape.branching((2, 2)), 3),
        (NGramDraft(n=1), "standard", Shape.chain(3), 3),
        (None, "standard", Shape.chain(1), 3),
    ]:
        dec = SpeculativeDecoder(target, drafter, scheme, shape)
        dec.traces = []
        out = dec.generate(
            ids[:batch], attention_mask=mask[:batch], max_new_tokens=8, seed=3, **settings
        )
        for row in range(batch):
            context = [t for t, m in zip(ids[row].tolist(), mask[row].tolist(), strict=True) if m]
            for token in out.sequences[row, ids.shape[1] :].tolist():
                assert processed_support(target, context, settings)[token], (scheme, row)
                context.append(token)
        for trace in dec.traces:
            if trace.draft_logits is None:
                continue
            tree = trace.tree
            for b in range(tree.batch_size):
                for n in range(1, int(tree.num_nodes[b])):
                    parent = int(tree.parents[b, n])
                    support = ssg.process(trace.draft_logits[b, parent].double(), **settings) > 0
                    assert support[int(tree.tokens[b, n])]


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_self_draft_accepts_every_position(gamma):
    """With the target as its own draft (float64) every drafted token is accepted in every
    round for every γ: a stale or missing bonus-token KV entry in either cache would make
    ``q != p`` after the first round and reject."""
    target = llama(7, dtype=torch.float64)
    ids, mask = left_pad(PROMPTS)
    for scheme, shape in [("standard", Shape.chain(gamma)), ("specinfer", Shape.paths(2, gamma))]:
        dec = SpeculativeDecoder(target, target, scheme, shape)
        out = dec.generate(ids, attention_mask=mask, max_new_tokens=4 * (gamma + 1), seed=gamma)
        for row in out.stats.emitted:
            assert row == (gamma + 1,) * 4, (scheme, row)
        assert out.stats.block_efficiency == gamma + 1
        assert out.stats.target_forwards == 4  # one per round, the first with the prompt


def test_the_draft_cache_does_not_outlive_the_call(pair, monkeypatch):
    """A decoder kept for later calls holds no KV cache between them, nor after an error in a
    round."""
    target, draft = pair
    dec = SpeculativeDecoder(target, draft, "standard", Shape.chain(3))
    out = dec.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=6, seed=0)
    assert dec.drafter.kv is None and out.stats.draft_forwards > 0
    seen = []

    def fails(state, proposal, target_probs):
        seen.append(dec.drafter.kv is not None)  # the cache exists during the round
        raise RuntimeError("verification failed")

    monkeypatch.setattr(dec.verification, "verify", fails)
    with pytest.raises(RuntimeError, match="verification failed"):
        dec.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=6, seed=0)
    assert seen == [True] and dec.drafter.kv is None
