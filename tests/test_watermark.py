"""Watermark: unbiased over keys, exact Gamma null, power, acceptance unchanged.

Guide: ``docs/watermark.md``.

Statistical budget, all at ``ALPHA = 1e-4`` with fixed seeds: 8 chi-square checks of the output
law over keys, 5 KS checks of null p-values, 8 "another key gives no signal" p-values, 4
chi-square checks of the accepted counts, and 4 z-tests at ``|z| < 4.5`` (two-sided ``6.8e-6``
each): below ``2.6e-3`` per run for a correct implementation (Bonferroni).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats

import specsampling as ss
from proofs_tests.oracles import pooled_chi2
from specsampling import keyed
from specsampling.keyed import KeyedNoise
from specsampling.keyed.watermark import detect, scored_positions
from specsampling.pairs import Random, Stationary

ALPHA = 1e-4
Z_MAX = 4.5
V = 30
#: (scheme, shape, rows of noise per position); window 2 throughout.
KEYED = [
    ("gumbel", ss.Shape.chain(3), 1),
    ("poisson", ss.Shape.branching((2, 2)), 1),
    ("gls_strong", ss.Shape.paths(3, 2), 3),
    ("gls", ss.Shape.paths(3, 2), 3),
]


#: A skewed unigram law: plain text repeats tokens and contexts, as real text does.
UNIGRAM = 1.0 / np.arange(1, V + 1) / np.sum(1.0 / np.arange(1, V + 1))


def _plain(seed: int, length: int) -> list[int]:
    """Unwatermarked text, independent of every key."""
    return np.random.default_rng(seed).choice(V, size=length, p=UNIGRAM).tolist()


# --- the null --------------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "rows"), [(None, 1), (2, 1), (2, 3)])
def test_null_p_values_are_uniform_on_plain_text(window, rows: int) -> None:  # 1 KS each
    # One key per text: under a shared key, position-keyed noise is shared across texts and
    # their p-values are dependent, which a KS test does not allow.
    pvals = [
        detect(_plain(s, 40), 5000 + s, window=window, rows=rows, vocab_size=V).p_value
        for s in range(300)
    ]
    assert stats.kstest(pvals, "uniform").pvalue > ALPHA


def test_null_p_values_are_uniform_under_another_key() -> None:  # 1 KS
    pvals, pair = [], Random(V, seed=0)
    for s in range(80):
        name, shape, rows = KEYED[s % len(KEYED)]
        rng = np.random.default_rng(s)
        text = ss.generate(name, pair, shape, 16, rng, key=1000 + s, window=2)
        pvals.append(detect(text, 5000 + s, window=2, rows=rows, vocab_size=V).p_value)
    assert stats.kstest(pvals, "uniform").pvalue > ALPHA


def test_repeated_contexts_are_skipped_and_keep_the_null_exact() -> None:  # 1 KS
    result = detect([1, 2] * 20, 5, window=2, vocab_size=V)
    assert result.num_scored == 4  # contexts (), (1,), (1, 2), (2, 1); the rest repeat
    rng = np.random.default_rng(3)
    pvals, naive = [], []
    for _ in range(300):
        text = list(rng.integers(V, size=6)) * 8  # very repetitive unwatermarked text
        pvals.append(detect(text, 5, window=2, vocab_size=V).p_value)
        # mutant: score every position, repeats included
        ctx = keyed.context_hashes(text, 2)[:-1]
        u = keyed.uniforms(5, ctx, 0, np.array(text))
        naive.append(stats.gamma.sf(float(np.sum(-np.log(u))), len(text)))
    assert stats.kstest(pvals, "uniform").pvalue > ALPHA
    assert np.mean(np.array(naive) < 0.01) > 0.05  # repeats inflate false positives


# --- unbiased: the output law over keys ------------------------------------------------------

OUTPUT_CASES = [
    ("gumbel", ss.Shape.chain(2)),
    ("poisson", ss.Shape.branching((2, 2))),
    ("gls", ss.Shape.paths(2, 2)),
    ("gls_strong", ss.Shape.paths(2, 2)),
]


@pytest.mark.parametrize(("name", "shape"), OUTPUT_CASES)
def test_output_over_keys_is_the_target_law(name: str, shape: ss.Shape) -> None:  # 2 checks each
    pair, prefix, n = Random(3, seed=8), (1,), 1200  # position-keyed (window None)
    joint = ss.exact.target_joint(pair, 2, prefix)
    cells = sorted(joint)
    rng = np.random.default_rng(0)
    draws = [ss.generate(name, pair, shape, 2, rng, key=k, prefix=prefix) for k in range(n)]
    counts = np.array([sum(d == c for d in draws) for c in cells])
    probs = np.array([float(joint[c]) for c in cells])
    first = np.array([counts[[c[0] == t for c in cells]].sum() for t in range(3)])
    marginal = np.array([probs[[c[0] == t for c in cells]].sum() for t in range(3)])
    assert pooled_chi2(first, marginal) > ALPHA and pooled_chi2(counts, probs) > ALPHA


# --- power --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "shape", "rows"), KEYED, ids=[k[0] for k in KEYED])
def test_power_on_keyed_text(name: str, shape: ss.Shape, rows: int) -> None:  # 2 checks each
    for s in range(2):
        rng = np.random.default_rng(s)
        text = ss.generate(name, Random(V, seed=s), shape, 100, rng, key=77, window=2)
        result = detect(text, 77, window=2, rows=rows, vocab_size=V)
        assert result.p_value < 1e-10 and result.num_scored > 60
        assert detect(text, 78, window=2, rows=rows, vocab_size=V).p_value > ALPHA  # other key


# --- contexts: embedding and detection read the same noise -----------------------------------


def test_keyed_noise_contexts_and_validation() -> None:
    plain = KeyedNoise(3)
    assert plain.context((9, 9, 9)) == keyed.position_context(3) == plain.context((1, 2, 3))
    marked = KeyedNoise(3, window=1, start=1)
    assert marked.context((0, 5)) == marked.context((7, 5)) == keyed.context_hash([5], 1)
    # (5,) named position 2 already: position 4 falls back to its absolute position.
    assert marked.context((0, 5, 1, 5)) == keyed.position_context(4)
    # The prompt's contexts do not count as seen (start = 1).
    assert KeyedNoise(3, window=1, start=2).context((5, 5)) == keyed.context_hash([5], 1)
    exps = marked.exponentials((0, 5), rows=3, vocab_size=4)
    expected = keyed.exponentials(3, marked.context((0, 5)), np.arange(3)[:, None], np.arange(4))
    assert exps.shape == (3, 4) and np.array_equal(exps, expected)
    for kwargs in ({"window": 0}, {"window": 1.0}, {"window": True}, {"start": -1}):
        with pytest.raises(ValueError):
            KeyedNoise(1, **kwargs)
    for key in (-1, 2**64, "seven"):
        with pytest.raises(ValueError):
            KeyedNoise(key)


def test_detection_positions_match_the_embedding() -> None:
    prompt = (4, 4)
    rng = np.random.default_rng(0)
    pair, shape = Random(V, seed=1), ss.Shape.chain(2)
    text = ss.generate("gumbel", pair, shape, 50, rng, key=9, prefix=prompt, window=1)
    full = [*prompt, *text]
    positions, contexts = scored_positions(full, 1, start=2)
    assert np.all(positions >= 2) and 0 < len(positions) <= 50
    assert len(set(contexts.tolist())) == len(positions)  # a repeated context is never scored
    noise = KeyedNoise(9, window=1, start=2)
    for t, word in zip(positions.tolist(), contexts.tolist(), strict=True):
        assert noise.context(full[:t]) == word  # detection reads the embedding's noise
    result = detect(full, 9, window=1, vocab_size=V, start=2)
    assert result.num_scored == len(positions) and result.p_value < 1e-3


def test_detect_validates_and_handles_empty_text() -> None:
    assert detect([], 1, window=3, vocab_size=V).p_value == 1.0
    assert detect([1, 2], 1, vocab_size=V, start=2).num_scored == 0
    for kwargs in ({"window": 0}, {"rows": 0}, {"start": -1}):
        with pytest.raises(ValueError):
            detect([1, 2], 1, vocab_size=V, **kwargs)
    with pytest.raises(ValueError):
        detect([V], 1, window=3, vocab_size=V)


# --- the PRF leaves speculative acceptance unchanged -------------------------------------------

STATIONARY = Stationary([0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.1, 0.4])


def _keyed_round_lengths(name: str, shape: ss.Shape, keys: int, rounds: int) -> list[int]:
    """Tokens emitted by the first ``rounds`` rounds of watermarked decoding, per key."""
    lengths, rng = [], np.random.default_rng(0)  # rng unused: the noise is keyed
    for key in range(keys):
        noise, tokens = KeyedNoise(key, window=2, start=1), (0,)
        for _ in range(rounds):
            step = ss.speculate(name, STATIONARY, shape, rng, tokens, noise=noise)
            lengths.append(len(step.tokens))
            tokens += step.tokens
    return lengths


@pytest.mark.parametrize(("name", "shape", "rows"), KEYED, ids=[k[0] for k in KEYED])
def test_acceptance_with_the_prf_is_acceptance_with_true_randomness(name, shape, rows) -> None:
    law = ss.round_law(name, STATIONARY, shape)  # exact: true randomness
    probs = [sum(p for out, p in law.items() if len(out) == m) for m in range(1, shape.depth + 2)]
    mean = ss.expected_emitted(name, STATIONARY, shape)
    var = sum(prob * len(out) ** 2 for out, prob in law.items()) - mean**2
    lengths = _keyed_round_lengths(name, shape, 100, 6)
    z = (np.mean(lengths) - mean) / np.sqrt(var / len(lengths))
    assert abs(z) < Z_MAX, (name, np.mean(lengths), mean)
    counts = Counter(lengths)
    assert pooled_chi2([counts[m] for m in range(1, shape.depth + 2)], probs) > ALPHA
