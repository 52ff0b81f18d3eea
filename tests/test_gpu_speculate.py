"""``ssg.speculate``: batched sampled rounds on a model pair follow the target's law.

Every registered tree lowering is run for a few rounds on many independent rows (fixed seeds),
on a chain and on a tree of its own draw law, and the **counts** of each row's first two emitted
tokens are compared with the target's own law of two tokens (``ss.exact.target_joint``) by
Pearson's chi-square, least likely outcomes merged into bins expecting >= ``MIN_EXPECTED``
(the style of ``tests/test_sampling_stats.py``). A sampled outcome outside the law's support fails
at once.

False-positive budget: ``FALSE_POSITIVE_BUDGET = 1e-3`` for this file, split evenly (Bonferroni)
over the ``len(CASES) + 1`` tests that must accept (every case on the CPU, and one on the
device: CUDA when present). The negative control (drafting from the
verifier's noise, the shared-stream bug) uses the same ``ALPHA`` and must reject; it spends none
of the budget.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

import specsampling as ss
from proofs_tests.chisquare import chi_square_pvalue
from specsampling import Shape
from specsampling import gpu as ssg
from specsampling.errors import UnsupportedShape
from specsampling.gpu.speculate import RoundNoise, Speculator
from specsampling.pairs import Random, Stationary
from specsampling.schemes import KeyedCoupling

SEED = 20240612
NUM_ROWS = 4000
NUM_EMITTED = 2  # tokens per row tested (two rounds emit at least two)
PREFIX = (1,)

RANDOM_PAIR = Random(3, seed=2)  # context dependent; some rows have zeros
# Acceptance depends on the uniform (q > p on token 0): sensitive to noise reuse.
REUSE_PAIR = Stationary([0.2, 0.4, 0.4], [0.5, 0.25, 0.25])

CHAIN = Shape.chain(2)
TREES = (
    Shape.paths(2, 2),
    Shape.branching((2, 1)),
    Shape.greedy((2, 1)),
    Shape.hub(2),
    Shape.top((2, 1)),
    Shape.star(2),
)
TREE_SCHEMES = sorted(
    name for name, lowering in ssg.SCHEMES.items() if isinstance(lowering, ssg.schemes.TreeLowering)
)


def _tree_shape(name: str) -> Shape | None:
    """A tree of the scheme's own two-candidate law if supported, else its first supported."""
    scheme = ss.SCHEMES[name]
    supported = [shape for shape in TREES if scheme.supports(shape)]
    own = scheme.single_shape(2).law
    return next((s for s in supported if s.law == own), supported[0] if supported else None)


# Registering a lowering puts it under test: a chain and a tree per scheme it supports.
CASES: list[tuple[str, Shape]] = []
for _name in TREE_SCHEMES:
    if ss.SCHEMES[_name].supports(CHAIN):
        CASES.append((_name, CHAIN))
    _tree = _tree_shape(_name)
    if _tree is not None:
        CASES.append((_name, _tree))
if "nss" in TREE_SCHEMES:
    CASES.append(("nss", Shape.top((2, 1))))  # the deterministic law

FALSE_POSITIVE_BUDGET = 1e-3
NUM_ACCEPTING = len(CASES) + 1  # the cases, and the run on the device
ALPHA = FALSE_POSITIVE_BUDGET / NUM_ACCEPTING  # per test, Bonferroni


def first_tokens_pvalue(out: ssg.Speculation, pair: Any) -> float:
    law = ss.exact.target_joint(pair, NUM_EMITTED, PREFIX)
    return chi_square_pvalue(Counter(row[:NUM_EMITTED] for row in out.tokens), law)


def check_rounds(out: ssg.Speculation, shape: Shape, num_rows: int) -> None:
    """Two rounds per row, each emitting 1 to ``depth + 1`` in-vocabulary tokens."""
    assert out.num_rounds == 2 and len(out.tokens) == num_rows
    for row, counts in zip(out.tokens, out.emitted, strict=True):
        assert len(counts) == 2 and all(1 <= c <= shape.depth + 1 for c in counts)
        assert len(row) == sum(counts) and all(0 <= t < RANDOM_PAIR.vocab_size for t in row)


def test_budget_is_declared() -> None:
    assert len(CASES) >= 8  # standard, nss, specinfer, rsd: chains and trees; grows with them
    assert {name for name, _ in CASES} == set(TREE_SCHEMES)
    assert ALPHA * NUM_ACCEPTING == pytest.approx(FALSE_POSITIVE_BUDGET)


@pytest.mark.parametrize("index", range(len(CASES)), ids=lambda i: f"{CASES[i][0]}-{CASES[i][1]}")
def test_first_tokens_follow_the_target(index: int) -> None:
    name, shape = CASES[index]
    generator = torch.Generator().manual_seed(SEED + index)
    out = ssg.speculate(name, RANDOM_PAIR, shape, 2, generator, PREFIX, batch_size=NUM_ROWS)
    check_rounds(out, shape, NUM_ROWS)
    assert first_tokens_pvalue(out, RANDOM_PAIR) > ALPHA


# --------------------------------------------------------------------------- negative control
class DraftsFromVerifierNoise(Speculator):
    """The shared-stream bug: node ``s + 1``'s accept uniform is step ``s``'s drafting uniform."""

    def noise(self, batch_size: int, generator: Any, device: Any) -> RoundNoise:
        fresh = super().noise(batch_size, generator, device)
        accept = fresh.verify.accept.clone()  # [B, 1 + S]
        accept[:, 1:] = fresh.drafting
        return RoundNoise(fresh.drafting, ssg.Noise(accept, fresh.verify.sample))


@pytest.mark.parametrize("name", [n for n in ("standard", "specinfer") if n in TREE_SCHEMES])
def test_shared_noise_mutant_is_rejected(name: str) -> None:
    shape = CHAIN if name == "standard" else Shape.paths(2, 2)
    generator = torch.Generator().manual_seed(SEED)
    out = DraftsFromVerifierNoise(name, REUSE_PAIR, shape).run(2, generator, PREFIX, NUM_ROWS)
    assert first_tokens_pvalue(out, REUSE_PAIR) < ALPHA
    # The unmutated speculator on the same pair and seed accepts.
    generator = torch.Generator().manual_seed(SEED)
    out = Speculator(name, REUSE_PAIR, shape).run(2, generator, PREFIX, NUM_ROWS)
    assert first_tokens_pvalue(out, REUSE_PAIR) > ALPHA


# --------------------------------------------------------------------------- contract
def test_fresh_noise_is_independent_and_seeded() -> None:
    speculator = Speculator("nss", RANDOM_PAIR, Shape.paths(2, 2))
    noise = speculator.noise(3, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert noise.drafting.shape == (3, 4) and noise.verify.accept.shape == (3, 5)
    assert noise.drafting.dtype == noise.verify.sample.dtype == torch.float64
    values = torch.cat([noise.drafting, noise.verify.accept, noise.verify.sample], 1).flatten()
    assert len(set(values.tolist())) == values.numel()  # three separate draws
    run = [
        ssg.speculate("nss", RANDOM_PAIR, Shape.paths(2, 2), 3, torch.Generator().manual_seed(4))
        for _ in range(2)
    ]
    assert run[0] == run[1]


def test_keyed_and_unsupported_schemes_are_refused() -> None:
    keyed = sorted(n for n, s in ss.SCHEMES.items() if isinstance(s, KeyedCoupling))
    assert keyed, "the reference registers keyed couplings"
    for name in keyed:
        with pytest.raises(UnsupportedShape, match="keyed coupling"):
            ssg.speculate(name, RANDOM_PAIR, CHAIN, 1)
    with pytest.raises(UnsupportedShape, match="not exact"):
        ssg.speculate("standard", RANDOM_PAIR, Shape.star(2), 1)
    with pytest.raises(ValueError, match="num_rounds"):
        ssg.speculate("standard", RANDOM_PAIR, CHAIN, 0)
    with pytest.raises(TypeError, match="generator"):
        ssg.speculate("standard", RANDOM_PAIR, CHAIN, 1, generator=np.random.default_rng(0))
    with pytest.raises(TypeError, match="shape"):
        ssg.speculate("standard", RANDOM_PAIR, "chain(2)", 1)


def test_rounds_continue_after_the_emitted_tokens() -> None:
    """A pair whose target is one-hot on ``len(prefix) % 3`` emits 0, 1, 2, 0, ... whatever
    the draft: every round must draft and verify after all the tokens emitted so far."""

    class Counting:
        vocab_size = 3

        def target(self, prefix: Any) -> Any:
            return np.eye(3)[len(prefix) % 3]

        def draft(self, prefix: Any) -> Any:
            return np.array([0.5, 0.25, 0.25])

    out = ssg.speculate("specinfer", Counting(), Shape.paths(2, 2), 5, batch_size=4)
    for row in out.tokens:
        assert row == tuple(i % 3 for i in range(len(row))) and len(row) >= 5


@pytest.mark.cuda
def test_speculate_on_device() -> None:
    """On the device's own generator (CUDA when present), the first two tokens still follow
    the target's law (one share of the budget)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(SEED - 1)
    shape = Shape.paths(2, 2)
    out = ssg.speculate("specinfer", RANDOM_PAIR, shape, 2, generator, PREFIX, NUM_ROWS)
    check_rounds(out, shape, NUM_ROWS)
    assert first_tokens_pvalue(out, RANDOM_PAIR) > ALPHA
