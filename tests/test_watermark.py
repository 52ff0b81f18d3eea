"""Watermark detection: exact Gamma null (KS) and power on coupled text.

Statistical budget: 3 KS checks at alpha = 1e-4 with fixed seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specsampling import keyed
from specsampling.couplings import couple
from specsampling.pairs import Random
from specsampling.watermark import detect, scored_positions

ALPHA = 1e-4
V = 30


def _plain(seed: int, length: int) -> list[int]:
    """Unwatermarked text: ordinary sampling from a Random pair's target."""
    pair, rng = Random(V, seed=seed), np.random.default_rng(seed)
    seq: list[int] = []
    for _ in range(length):
        seq.append(int(rng.choice(V, p=pair.target(tuple(seq)))))
    return seq


def test_null_p_values_are_uniform_on_plain_text() -> None:
    pvals = [detect(_plain(s, 40), 77, window=2, vocab_size=V).p_value for s in range(300)]
    assert stats.kstest(pvals, "uniform").pvalue > ALPHA


def test_null_p_values_are_uniform_under_another_key() -> None:
    pvals = []
    for s in range(300):
        text = couple(Random(V, seed=s), 30, key=1000 + s, window=2).tokens
        pvals.append(detect(text, 77, window=2, vocab_size=V).p_value)
    assert stats.kstest(pvals, "uniform").pvalue > ALPHA


def test_power_on_coupled_text() -> None:
    for s in range(5):
        text = couple(Random(V, seed=s), 200, key=77, list_size=2, window=2).tokens
        result = detect(text, 77, window=2, vocab_size=V)
        assert result.p_value < 1e-6 and result.num_scored > 100


def test_repeated_contexts_are_skipped_and_keep_the_null_exact() -> None:
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


def test_detection_positions_match_the_embedding() -> None:
    text = couple(Random(V, seed=1), 50, key=9, prefix=(4, 4), window=1).tokens
    full = [4, 4, *text]
    positions, _ = scored_positions(full, 1, start=2)
    assert np.all(positions >= 2) and len(positions) <= 50
    assert detect(full, 9, window=1, vocab_size=V, start=2).num_scored == len(positions)


def test_detect_validates_and_handles_empty_text() -> None:
    assert detect([], 1, window=3, vocab_size=V).p_value == 1.0
    with pytest.raises(ValueError):
        detect([V], 1, window=3, vocab_size=V)
