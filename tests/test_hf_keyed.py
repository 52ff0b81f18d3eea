"""Keyed decoding of Hugging Face models: ``SpeculativeDecoder(...).generate(key=...)``.

``key=`` selects keyed noise. Proved on tiny random Llama / Qwen2 models (no download), float32
throughout (no near-tie flip was met; none is tolerated):

* **keyed equality**: with ``gumbel``, ``gls_strong`` (and ``poisson``) the decoder's tokens equal
  keyed target-only decoding (``SpeculativeDecoder(target, None, scheme, shape)``, same key) token
  for token for 48 tokens, for an unrelated random draft, a perturbed copy of the target, a
  layer-skip draft and an n-gram draft, on chains and the trees each scheme supports; B = 3 with
  ragged prompts equals each row's own B = 1 run with key ``K + b`` (wrapping mod 2**64), with
  top-p and temperature processing (at T = 0.3 the n-gram drafts get accepted);
* **the reference**: every keyed scheme (``gls`` included, whose tokens depend on the draft)
  equals ``ss.generate`` and ``ssg.generate`` on the same models wrapped as a ModelPair of
  no-cache forwards, with and without a watermark window and with processing;
* **negative controls**: ``gls`` (not drafter-invariant) differs from target-only decoding, and a
  mutant whose drafted nodes read the noise of the position above fails the equality;
* the **watermark** detects a keyed decode with its key and not with another;
* refusals (a keyed scheme without a key, a key with a tree verifier, bad keys and windows),
  greedy keyed decoding, ``custom_generate`` with a key, and draft-logit parity on keyed trees.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specsampling as ss  # noqa: E402
import specsampling.gpu as ssg  # noqa: E402
from proofs_tests.hf_models import (  # noqa: E402
    left_pad,
    no_grad,  # noqa: F401 (autouse fixture)
    one_thread,  # noqa: F401 (autouse fixture)
    perturbed,
    tiny_causal_lm,
    trace_prefixes,
)
from specsampling.errors import UnsupportedShape  # noqa: E402
from specsampling.gpu.hf import (  # noqa: E402
    DecodeState,
    KeyedVerification,
    LayerSkipDraft,
    NGramDraft,
    SpeculativeDecoder,
)
from specsampling.gpu.hf import generate as hf_generate  # noqa: E402
from specsampling.keyed.watermark import detect  # noqa: E402

Shape = ss.Shape
VOCAB = 64
PROMPTS = [[3, 5, 7, 9, 11], [4, 2], [8, 1, 6, 6]]
LENGTH = 48
TOP = 2**64 - 1  # row keys wrap: TOP, 0, 1


def llama(seed, sharpness=10.0, attn="eager"):
    """A random Llama whose head is scaled by ``sharpness``: peaked distributions (max p ~0.1)
    so drafts are rejected often enough (unscaled random heads are near uniform)."""
    return tiny_causal_lm("llama", seed, vocab=VOCAB, attn=attn, sharpness=sharpness)


def qwen(seed, sharpness=10.0):
    return tiny_causal_lm("qwen", seed, vocab=VOCAB, attn="sdpa", sharpness=sharpness)


@pytest.fixture(scope="module")
def models():
    target = llama(0)
    return {
        "target": target,
        "random": llama(3),  # an unrelated model: low acceptance
        "perturbed": perturbed(target, 0.1, 1),  # mostly agrees
    }


def drafter(models, name):
    if name == "layerskip":
        return LayerSkipDraft(models["target"], [0])
    if name == "ngram":
        return NGramDraft(n=2)
    return models[name]


def decode(target, draft, scheme, shape, prompts, key, length=LENGTH, **kwargs):
    """The generated tokens of every row (the prompt and padding cut off)."""
    ids, mask = left_pad(prompts)
    out = SpeculativeDecoder(target, draft, scheme, shape).generate(
        ids, length, attention_mask=mask, key=key, **kwargs
    )
    return out.sequences[:, ids.shape[1] :].tolist(), out


# ----------------------------------------------------------------------------- proof 3
STRONG_CASES = [
    ("gumbel", Shape.chain(4)),
    ("gls_strong", Shape.chain(3)),
    ("gls_strong", Shape.star(3)),
    ("gls_strong", Shape.paths(2, 3)),
    ("poisson", Shape.star(2, replacement=False)),
]
DRAFTERS = ["random", "perturbed", "layerskip", "ngram"]


@pytest.mark.parametrize(("scheme", "shape"), STRONG_CASES, ids=str)
def test_keyed_equals_target_only(models, scheme, shape):
    """Strong drafter invariance on real decoding: whatever the draft, the tokens are keyed
    target-only decoding (float32; a near-tie flip would fail here, and none occurs)."""
    target = models["target"]
    expected, plain = decode(target, None, scheme, shape, PROMPTS[:1], key=11)
    assert plain.stats.target_forwards == LENGTH  # one per token, the first with the prompt
    accepted = 0
    for name in DRAFTERS:
        if name == "ngram" and not shape.is_chain:
            continue
        tokens, out = decode(target, drafter(models, name), scheme, shape, PROMPTS[:1], key=11)
        assert tokens == expected, (scheme, shape, name)
        accepted += sum(e - 1 for e in out.stats.emitted[0])
    assert accepted >= 10  # drafts were accepted: the walk descended, not only the root


@pytest.mark.parametrize(
    ("scheme", "shape", "name", "settings"),
    [
        ("gumbel", Shape.chain(4), "perturbed", {}),
        ("gls_strong", Shape.paths(2, 3), "layerskip", {"top_p": 0.95}),
        # Temperature 0.3: the text repeats, so prompt lookup proposes and gets accepted.
        ("gumbel", Shape.chain(3), "ngram", {"temperature": 0.3}),
    ],
)
def test_keyed_batch_rows_do_not_depend_on_the_batch(
    models, scheme, shape, name, settings, monkeypatch
):
    """B = 3, ragged left-padded prompts, keys TOP, 0, 1 (wrapping), caches compacted every
    round: row b equals its own B = 1 run with its key, and keyed target-only decoding."""
    monkeypatch.setattr(DecodeState, "compact_slack", -(10**9))
    target = models["target"]
    draft = drafter(models, name)
    batch, out = decode(target, draft, scheme, shape, PROMPTS, key=TOP, **settings)
    alone, _ = decode(target, None, scheme, shape, PROMPTS, key=[TOP, 0, 1], **settings)
    assert batch == alone
    assert out.num_generated == (LENGTH,) * 3
    assert sum(e - 1 for row in out.stats.emitted for e in row) >= 10  # drafts accepted
    for b, prompt in enumerate(PROMPTS):
        single, _ = decode(target, draft, scheme, shape, [prompt], (TOP + b) % 2**64, **settings)
        assert single[0] == batch[b], b


def test_keyed_equals_target_only_qwen_sdpa_window():
    """The same on an sdpa Qwen2 with a layer-skip draft and the watermark window."""
    target = qwen(4)
    for scheme, shape in [("gumbel", Shape.chain(3)), ("gls_strong", Shape.paths(2, 2))]:
        expected, _ = decode(target, None, scheme, shape, PROMPTS[1:], key=5, window=2)
        got, _ = decode(
            target, LayerSkipDraft(target, [1]), scheme, shape, PROMPTS[1:], 5, window=2
        )
        assert got == expected, scheme


# ----------------------------------------------------------------------------- the reference
class NoCachePair:
    """The models as a :class:`~specsampling.pairs.ModelPair`: one plain no-cache forward per
    prefix, processed by ``ssg.process`` as the decoder does (float32 logits)."""

    def __init__(self, target, draft, **settings):
        self.models = {"target": target, "draft": draft}
        self.settings = settings
        self.vocab_size = VOCAB

    def probs(self, name, prefix):
        logits = self.models[name](input_ids=torch.tensor([list(prefix)])).logits[0, -1]
        return ssg.process(logits, **self.settings).double().numpy()

    def target(self, prefix):
        return self.probs("target", prefix)

    def draft(self, prefix):
        return self.probs("draft", prefix)


@pytest.mark.parametrize(
    ("scheme", "shape", "window", "settings"),
    [
        ("gumbel", Shape.chain(3), None, {}),
        ("gls", Shape.paths(2, 3), None, {}),
        ("gls", Shape.star(3), 2, {}),
        ("gls_strong", Shape.paths(2, 2), 2, {"temperature": 0.7, "top_k": 20}),
        ("poisson", Shape.star(2, replacement=False), None, {"top_p": 0.9}),
    ],
    ids=str,
)
def test_keyed_equals_reference_generate(models, scheme, shape, window, settings):
    """The decoder (cached tree forwards) emits ``ss.generate`` and ``ssg.generate`` on the
    same models as a no-cache ModelPair, token for token: drafting, contexts, walk and
    processing all as the reference (``gls`` makes the drafted trees matter)."""
    target, draft = models["target"], models["perturbed"]
    prompt = PROMPTS[0]
    pair = NoCachePair(target, draft, **settings)
    length = 20
    reference = ss.generate(
        scheme, pair, shape, length, np.random.default_rng(0), key=9, prefix=prompt, window=window
    )
    lowered = ssg.generate(scheme, pair, shape, length, key=9, prefix=prompt, window=window)
    tokens, _ = decode(target, draft, scheme, shape, [prompt], 9, length, window=window, **settings)
    assert tokens[0] == list(reference) == lowered.tokens[0].tolist()


# ----------------------------------------------------------------------------- controls
def test_negative_controls(models, monkeypatch):
    """The equality can fail: ``gls`` (the active-set verifier, not drafter-invariant) differs
    from target-only decoding, another key gives other tokens, and a mutant whose drafted
    nodes read the noise of the position above them breaks the strong equality."""
    target, draft = models["target"], models["perturbed"]
    shape = Shape.paths(2, 3)
    expected, _ = decode(target, None, "gls_strong", shape, PROMPTS[:1], key=11)
    assert decode(target, draft, "gls", shape, PROMPTS[:1], key=11)[0] != expected
    assert decode(target, None, "gls_strong", shape, PROMPTS[:1], key=12)[0] != expected
    original = KeyedVerification.contexts_after

    def shifted(self, state, paths, depth):
        return original(self, state, paths, depth - 1)

    monkeypatch.setattr(KeyedVerification, "contexts_after", shifted)
    assert decode(target, draft, "gls_strong", shape, PROMPTS[:1], key=11)[0] != expected


# ----------------------------------------------------------------------------- watermark
@pytest.mark.parametrize(
    ("scheme", "shape", "window", "rows"),
    [
        ("gumbel", Shape.chain(3), None, 1),
        ("gumbel", Shape.chain(3), 2, 1),
        ("gls_strong", Shape.paths(2, 2), 3, 2),
    ],
)
def test_watermark_detects_keyed_decode(models, scheme, shape, window, rows):
    """``specsampling.keyed.watermark.detect`` on the prompt + generated tokens: tiny p-values
    with each row's key, none with a wrong key (fixed keys: deterministic)."""
    target = models["target"]
    tokens, _ = decode(target, models["random"], scheme, shape, PROMPTS[:2], 21, window=window)
    for b, prompt in enumerate(PROMPTS[:2]):
        text = prompt + tokens[b]
        kwargs = {"vocab_size": VOCAB, "window": window, "start": len(prompt), "rows": rows}
        right = detect(text, 21 + b, **kwargs)
        wrong = detect(text, 1234 + b, **kwargs)
        assert right.num_scored >= 30
        assert right.p_value < 1e-6, (b, right)
        assert wrong.p_value > 1e-3, (b, wrong)


# ----------------------------------------------------------------------------- the rest
def test_keyed_refusals(models):
    target, draft = models["target"], models["perturbed"]
    prompt = torch.tensor([PROMPTS[0]])
    with pytest.raises(ValueError, match="key: scheme 'gumbel' is a keyed coupling"):
        SpeculativeDecoder(target, draft, "gumbel", Shape.chain(2)).generate(prompt)
    with pytest.raises(ValueError, match="key: scheme 'gls_strong' is a keyed coupling"):
        SpeculativeDecoder(target, None, "gls_strong", Shape.chain(2)).generate(prompt)
    standard = SpeculativeDecoder(target, draft, "standard", Shape.chain(2))
    with pytest.raises(ValueError, match="key: scheme 'standard' verifies from fresh uniforms"):
        standard.generate(prompt, key=3)
    with pytest.raises(ValueError, match="takes no key"):
        standard.generate(prompt, window=2)
    keyed = SpeculativeDecoder(target, draft, "gumbel", Shape.chain(2))
    with pytest.raises(ValueError, match=r"key: expected one key per row \(1\), got 2"):
        keyed.generate(prompt, key=[1, 2])
    with pytest.raises(ValueError, match="key"):
        keyed.generate(prompt, key=-1)
    with pytest.raises(ValueError, match="key"):
        keyed.generate(prompt, key=2**64)
    with pytest.raises(ValueError, match="window"):
        keyed.generate(prompt, key=1, window=0)
    with pytest.raises(UnsupportedShape, match="gumbel"):
        SpeculativeDecoder(target, draft, "gumbel", Shape.paths(2, 2))
    with pytest.raises(UnsupportedShape, match="gumbel"):
        SpeculativeDecoder(target, None, "gumbel", Shape.star(2))
    with pytest.raises(UnsupportedShape, match="NGramDraft proposes chains"):
        SpeculativeDecoder(target, NGramDraft(), "gls_strong", Shape.star(2))


def test_keyed_greedy_and_custom_generate(models):
    """Temperature 0 (one-hot targets): keyed decoding is greedy decoding; ``custom_generate``
    passes ``key`` / ``window`` through and equals the decoder."""
    target, draft = models["target"], models["perturbed"]
    prompt = PROMPTS[0]
    greedy = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)
    tokens, _ = decode(
        target, draft, "gls_strong", Shape.paths(2, 2), [prompt], 3, 12, temperature=0
    )
    assert tokens[0] == greedy[0, len(prompt) :].tolist()
    ids, mask = left_pad(PROMPTS)
    out = target.generate(
        input_ids=ids,
        attention_mask=mask,
        custom_generate=hf_generate,
        draft_model=draft,
        scheme="gumbel",
        shape=Shape.chain(3),
        key=TOP,
        window=2,
        do_sample=True,
        top_k=0,
        max_new_tokens=10,
        pad_token_id=0,
    )
    expected, _ = decode(target, None, "gumbel", Shape.chain(3), PROMPTS, TOP, 10, window=2)
    assert out[:, ids.shape[1] :].tolist() == expected


def test_keyed_eos_and_budget(models):
    """Keyed rows stop at EOS and at ``max_new_tokens`` exactly, as keyed target-only does."""
    target, draft = models["target"], models["perturbed"]
    shape = Shape.chain(4)
    expected, _ = decode(target, None, "gumbel", shape, PROMPTS, TOP, 20)
    for budget in (1, 7):
        tokens, out = decode(target, draft, "gumbel", shape, PROMPTS, TOP, budget)
        assert tokens == [e[:budget] for e in expected]
        assert out.num_generated == (budget,) * 3
    eos = expected[0][6]
    tokens, out = decode(target, draft, "gumbel", shape, PROMPTS, TOP, 20, eos_token_id=eos)
    for row, want in enumerate(expected):
        stop = want.index(eos) + 1 if eos in want else 20
        assert out.num_generated[row] == stop
        assert tokens[row][:stop] == want[:stop]
        assert tokens[row][stop:] == [eos] * (len(tokens[row]) - stop)  # padded with the EOS


def test_keyed_tree_logits_parity(models):
    """The draft and target logits of every keyed round equal no-cache forwards of each node's
    full prefix (B = 3, ragged): the keyed drafting forwards are the decoder's own."""
    target = models["target"]
    draft = models["perturbed"]
    dec = SpeculativeDecoder(target, draft, "gls", Shape.paths(2, 3))
    dec.traces = []
    ids, mask = left_pad(PROMPTS)
    dec.generate(ids, 9, attention_mask=mask, key=4)
    checked = 0
    for trace in dec.traces:
        where, prefixes = trace_prefixes(trace)
        for model, used in ((target, trace.target_logits), (draft, trace.draft_logits)):
            rows = torch.stack([used[b, n] for b, n in where])  # [R, V]
            expanded = ~torch.isnan(rows).any(-1)
            expected = torch.stack(
                [model(input_ids=torch.tensor([p])).logits[0, -1] for p in prefixes]
            )
            torch.testing.assert_close(rows[expanded], expected[expanded], atol=1e-4, rtol=0)
            checked += int(expanded.sum())
    assert checked > 40


# ----------------------------------------------------------------------------- real weights
@pytest.mark.slow
def test_keyed_equality_on_real_weights():
    """Proof 3 on SmolLM2-135M-Instruct (float32, T = 1, 64 tokens): ``gumbel`` with a
    layer-skip and an n-gram draft and ``gls_strong`` on ``paths(2, 3)`` with a layer-skip
    draft emit keyed target-only decoding token for token, and the watermark detects the
    ``gumbel`` text (measured: no float32 flip; p ~ 1e-13 with the key, ~0.9 without)."""
    from specsampling.gpu import hf

    model, tokenizer = hf.load_model("smollm2-135m", dtype=torch.float32)
    model.generation_config.eos_token_id = None
    prompt = torch.tensor([tokenizer("def fibonacci(n):")["input_ids"]])
    skip = LayerSkipDraft(model, layers=list(range(10)))
    for scheme, shape, drafts in [
        ("gumbel", Shape.chain(4), [skip, NGramDraft(n=3)]),
        ("gls_strong", Shape.paths(2, 3), [skip]),
    ]:
        expected = SpeculativeDecoder(model, None, scheme, shape).generate(prompt, 64, key=5)
        for draft in drafts:
            out = SpeculativeDecoder(model, draft, scheme, shape).generate(prompt, 64, key=5)
            assert torch.equal(out.sequences, expected.sequences), (scheme, draft)
        if scheme == "gumbel":
            text = expected.sequences[0].tolist()
            size = model.config.vocab_size
            start = prompt.shape[1]
            assert detect(text, 5, vocab_size=size, start=start).p_value < 1e-6
            assert detect(text, 6, vocab_size=size, start=start).p_value > 1e-3
