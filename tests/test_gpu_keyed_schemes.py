"""The lowered keyed couplings (``gumbel``, ``poisson``, ``gls``, ``gls_strong``) and
``specsampling.gpu.generate`` against the numpy reference, token for token.

* Streams: for every keyed scheme x supported shapes x pairs x keys (with and without a
  watermark window), ``ssg.generate`` equals ``ss.generate(..., key=...)``, and the number of
  rounds equals the reference's.
* Rounds: one :func:`keyed_round` over a batch of rows with different prefixes and keys gives
  every row the reference ``sample_keyed`` tree and verdict (rows never see their neighbours).
* Batches: row ``b`` of ``generate(key=k, batch_size=B)`` is the stream with key ``k + b``;
  permuting a key list permutes the rows.
* Strong invariance on the lowering: ``gumbel``, ``poisson`` and ``gls_strong`` emit the
  target-only seeded decode (:func:`specsampling.keyed.laws.decode`) whatever the drafter.
* Mutants (keyed hash with arithmetic shifts, GLS racing all rows, a ``without`` step that
  forgets the siblings, GLS drafting every path from row 0) are caught.
* Bad input raises clear errors.

Every comparison runs on ``cpu``, and again on ``cuda`` (marked ``cuda``) where a GPU is present.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
import torch

import specsampling as ss
import specsampling.gpu as ssg
from specsampling.gpu import keyed as gk
from specsampling.gpu.generate import generate, keyed_round, row_keys
from specsampling.gpu.schemes import gls, gumbel
from specsampling.gpu.schemes.base import Descent
from specsampling.gpu.schemes.coupled import KeyedLowering, iid_proposal, keyed_select_root
from specsampling.keyed import KeyedNoise
from specsampling.keyed.laws import decode, keyed_select

# The cuda copies run only where a GPU is present (on CPU they would repeat the cpu runs).
DEVICES = ["cpu"] + [pytest.param("cuda", marks=pytest.mark.cuda, id="cuda")] * bool(
    torch.cuda.is_available()
)
KEYED = ("gumbel", "poisson", "gls", "gls_strong")
SHAPES = {
    "gumbel": (
        ss.Shape.chain(1),
        ss.Shape.chain(3),
        ss.Shape.branching((1, 1)),
        ss.Shape.greedy((1, 1)),
        ss.Shape.delayed(1, trunk=1, branch=2),
    ),
    "poisson": (
        ss.Shape.chain(2),
        ss.Shape.star(3, replacement=False),
        ss.Shape.branching((2, 2)),
        ss.Shape.branching((3, 1)),
    ),
    "gls": (
        ss.Shape.chain(2),
        ss.Shape.star(3),
        ss.Shape.paths(3, 2),
        ss.Shape.paths(2, 3),
        ss.Shape.delayed(2, trunk=0, branch=2),
        ss.Shape.branching((1, 1)),
    ),
}
SHAPES["gls_strong"] = SHAPES["gls"]
REFUSED = {
    "gumbel": (ss.Shape.star(2), ss.Shape.star(2, replacement=False), ss.Shape.top((2,))),
    "poisson": (ss.Shape.star(2), ss.Shape.paths(2, 2), ss.Shape.hub(1)),
    "gls": (ss.Shape.star(2, replacement=False), ss.Shape.delayed(2, trunk=1, branch=1)),
    "gls_strong": (ss.Shape.greedy((2,)), ss.Shape.top((1, 1))),
}
PAIRS = (
    ss.pairs.Random(5, seed=1),
    ss.pairs.Random(9, seed=4),
    # Disjoint-ish supports and zeros: races with p = 0 / q = 0, exhausted ``without`` steps.
    ss.pairs.Stationary([0.5, 0.3, 0.2, 0.0], [0.0, 0.5, 0.5, 0.0]),
    ss.pairs.Stationary([0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]),
)
KEYS = (0, 7, 2**63, 2**64 - 1)
LENGTH = 10


def reference_stream(name: str, pair: Any, shape: ss.Shape, key: int, **kw: Any) -> ss.Generation:
    rng = np.random.default_rng(0)  # never read by a keyed round
    return ss.generate(name, pair, shape, LENGTH, rng, key=key, **kw)


def stream_mismatches(
    lowering: Any, name: str, device: str = "cpu", keys=KEYS, shapes=None, first: bool = False
) -> int:
    """Streams (rows of ``generate``) whose tokens or round counts differ from the reference;
    ``first``: stop at the first configuration with a mismatch."""
    bad = 0
    for shape in SHAPES[name] if shapes is None else shapes:
        for pair in PAIRS:
            for window, prefix in ((None, ()), (2, (1, 0))):
                out = generate(
                    lowering, pair, shape, LENGTH, key=list(keys), prefix=prefix,
                    window=window, device=device,
                )  # fmt: skip
                assert tuple(out.tokens.shape) == (len(keys), LENGTH)
                for row, key in enumerate(keys):
                    want = reference_stream(name, pair, shape, key, prefix=prefix, window=window)
                    same = out.tokens[row].tolist() == list(want)
                    bad += not (same and int(out.num_rounds[row]) == len(want.rounds))
                if first and bad:
                    return bad
    return bad


# --- streams --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KEYED)
def test_streams_equal_the_reference(name: str, device: str) -> None:
    assert stream_mismatches(name, name, device) == 0


@pytest.mark.parametrize("name", KEYED)
def test_registered_and_refusing_what_the_reference_refuses(name: str) -> None:
    lowering = ssg.SCHEMES[name]
    assert isinstance(lowering, KeyedLowering) and lowering.name == name
    assert ssg.get_lowering(ss.SCHEMES[name]) is lowering
    for shape in SHAPES[name]:
        assert ss.SCHEMES[name].supports(shape)
    for shape in REFUSED[name]:
        assert not ss.SCHEMES[name].supports(shape)
        with pytest.raises(ss.UnsupportedShape, match=name):
            generate(name, PAIRS[0], shape, 3, key=1)


# --- rounds: trees and verdicts of a mixed batch ----------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KEYED)
def test_rounds_of_a_mixed_batch_equal_the_reference(name: str, device: str) -> None:
    rng = np.random.default_rng(3)
    lowering = ssg.SCHEMES[name]
    reference = ss.SCHEMES[name]
    for shape in SHAPES[name]:
        plan = lowering.plan(shape)
        for pair in PAIRS:
            for window in (None, 1):
                size = 6
                prefixes = [
                    (0, *rng.integers(0, pair.vocab_size, size=n).tolist()) for n in range(size)
                ]
                prefixes[3] = prefixes[2]  # a twin context with another key
                keys = [int(k) for k in rng.integers(0, 2**63, size=size)]
                noise = KeyedNoise(keys[0], window, start=1)
                drafted, out = keyed_round(
                    lowering, plan, pair, prefixes, gk.as_words(keys, device), noise
                )
                trees = drafted.tree_batch(shape).to_trees()
                for row, (prefix, key) in enumerate(zip(prefixes, keys, strict=True)):
                    tree, verdict = reference.sample_keyed(
                        pair, shape, KeyedNoise(key, window, start=1), prefix
                    )
                    assert trees[row] == tree, (name, shape, row)
                    assert (int(out.node[row]), int(out.token[row])) == tuple(verdict)
                    emitted = out.tokens[row, : int(out.num_emitted[row])].tolist()
                    assert emitted == [*tree.prefix(verdict.node), verdict.token]
                    assert set(out.tokens[row, int(out.num_emitted[row]) :].tolist()) <= {-1}


@pytest.mark.parametrize("device", DEVICES)
def test_select_equals_keyed_select(device: str) -> None:
    rng = np.random.default_rng(8)
    lowering = ssg.SCHEMES["gls"]
    for vocab in (2, 5, 64):
        p = rng.dirichlet(np.full(vocab, 0.5), size=40)
        p[rng.random(p.shape) < 0.3] = 0.0
        p[:, 0] += p.sum(axis=1) == 0
        p /= p.sum(axis=1, keepdims=True)
        exps = gk.exponentials(5, gk.position_context(torch.arange(40))[:, None, None],
                               torch.arange(3)[None, :, None], torch.arange(vocab))  # fmt: skip
        raced = torch.from_numpy(rng.random((40, 3)) < 0.6)
        raced[:, 0] = True
        got = lowering.select(torch.from_numpy(p).to(device), exps.to(device), raced.to(device))
        for row in range(40):
            rows = exps[row][raced[row]].numpy()
            assert int(got[row]) == keyed_select(p[row], rows)


# --- batches --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KEYED)
def test_rows_are_independent_of_their_neighbours(name: str) -> None:
    pair, shape = PAIRS[1], SHAPES[name][-2]
    batch = generate(name, pair, shape, LENGTH, key=2**64 - 2, batch_size=4, window=3)
    assert batch.keys == (2**64 - 2, 2**64 - 1, 0, 1)  # key + b, mod 2**64
    for row, key in enumerate(batch.keys):
        alone = generate(name, pair, shape, LENGTH, key=key, window=3)
        assert alone.tokens.tolist() == [batch.tokens[row].tolist()]
        assert list(reference_stream(name, pair, shape, key, window=3)) == alone.tolist()[0]
    order = [2, 0, 3, 1]
    permuted = generate(name, pair, shape, LENGTH, key=[batch.keys[i] for i in order], window=3)
    assert torch.equal(permuted.tokens, batch.tokens[order])
    assert torch.equal(permuted.num_rounds, batch.num_rounds[order])


# --- strong drafter invariance ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["gumbel", "poisson", "gls_strong"])
def test_strong_couplings_emit_the_target_only_decode(name: str) -> None:
    base = ss.pairs.Random(7, seed=5)
    drafters = [base, ss.pairs.Swapped(base, ss.pairs.Random(7, seed=11)),
                ss.pairs.Swapped(base, ss.pairs.Random(7, seed=12))]  # fmt: skip
    for shape in SHAPES[name][1:3]:
        rows = ss.SCHEMES[name].rows(shape)
        for key in (3, 2**64 - 9):
            want = [list(decode(base, LENGTH, key, rows=rows, prefix=(2,)))]
            for pair in drafters:
                got = generate(name, pair, shape, LENGTH, key=key, prefix=(2,)).tolist()
                assert got == want, (name, shape, key)


def root_decode(name: str, pair: Any, shape: ss.Shape, noises: list, device: str) -> list:
    """``LENGTH`` tokens per row from :func:`keyed_select_root` alone, row ``b`` after its
    prompt ``noises[b].start * (1,)`` with its own key and window."""
    lowering = ssg.SCHEMES[name]
    plan = lowering.plan(shape)
    keys = gk.as_words([noise.key for noise in noises], device)
    sequences = [[1] * noise.start for noise in noises]
    for _ in range(LENGTH):
        contexts = gk.as_words([n.context(q) for n, q in zip(noises, sequences, strict=True)])
        target = torch.from_numpy(np.stack([pair.target(tuple(q)) for q in sequences]))
        out = keyed_select_root(lowering, plan, keys, contexts.to(device), target.to(device))
        assert out.node.tolist() == [0] * len(noises) == (out.num_emitted - 1).tolist()
        assert out.tokens.tolist() == [[token] for token in out.token.tolist()]
        for sequence, token in zip(sequences, out.token.tolist(), strict=True):
            sequence.append(token)
    return [tuple(q[noise.start :]) for noise, q in zip(noises, sequences, strict=True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KEYED)
def test_keyed_select_root_is_target_only_decoding(name: str, device: str) -> None:
    """Position after position, the stateless root selection of every row (its own key,
    prompt and watermark window) is the reference's keyed target-only decode."""
    for shape in SHAPES[name][:3]:
        rows = ss.SCHEMES[name].rows(shape)
        assert ssg.SCHEMES[name].plan(shape).num_rows == rows
        for pair in PAIRS:
            for window in (None, 2):
                starts = zip(KEYS, (0, 1, 3, 2), strict=True)  # prompt lengths
                noises = [KeyedNoise(key, window, start) for key, start in starts]
                got = root_decode(name, pair, shape, noises, device)
                for noise, tokens in zip(noises, got, strict=True):
                    prefix = (1,) * noise.start
                    assert tokens == decode(pair, LENGTH, noise, rows=rows, prefix=prefix)


def test_keyed_select_root_refuses_bad_input() -> None:
    lowering = ssg.SCHEMES["gumbel"]
    plan = lowering.plan(ss.Shape.chain(2))
    words, probs = gk.as_words([1, 2]), torch.full((2, 4), 0.25, dtype=torch.float64)
    with pytest.raises(TypeError, match="lowering"):
        keyed_select_root(ssg.SCHEMES["nss"], plan, words, words, probs)
    with pytest.raises(ValueError, match="target_probs"):
        keyed_select_root(lowering, plan, words, words, probs[0])
    with pytest.raises(ValueError, match=r"keys: expected shape \(2,\)"):
        keyed_select_root(lowering, plan, words[:1], words, probs)
    with pytest.raises(ValueError, match=r"contexts: expected shape \(2,\)"):
        keyed_select_root(lowering, plan, words, words[None], probs)


def test_gls_depends_on_the_drafter_tokens() -> None:
    """``gls`` is only conditionally invariant: the lowering, like the reference, changes."""
    base = ss.pairs.Random(7, seed=5)
    other = ss.pairs.Swapped(base, ss.pairs.Random(7, seed=11))
    shape = ss.Shape.paths(3, 2)
    streams = {
        tuple(generate("gls", pair, shape, 20, key=k).tolist()[0]) for pair in (base, other)
        for k in (1, 2, 3)
    }  # fmt: skip
    strong = {
        tuple(generate("gls_strong", pair, shape, 20, key=k).tolist()[0])
        for pair in (base, other) for k in (1, 2, 3)
    }  # fmt: skip
    assert len(strong) == 3 and len(streams) > 3


# --- mutants --------------------------------------------------------------------------------


def _mix_arithmetic(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 30)
    x = x * gk._M1
    x = x ^ (x >> 27)
    x = x * gk._M2
    return x ^ (x >> 31)


class ArithmeticShift(gumbel.Poisson):
    """The keyed hash with sign-extending (arithmetic) shifts instead of logical ones."""

    def node_exponentials(self, keys, contexts, num_rows, vocab_size):
        def absorb(state, word, salt):
            return _mix_arithmetic(state ^ _mix_arithmetic(word + salt))

        device = contexts.device
        rows = torch.arange(num_rows, device=device)[None, :, None]
        tokens = torch.arange(vocab_size, device=device)[None, None, :]
        state = _mix_arithmetic(keys[:, None, None] ^ gk._SALTS[0])
        state = absorb(state, contexts[:, None, None], gk._SALTS[1])
        state = absorb(state, rows, gk._SALTS[2])
        bits = absorb(state, tokens, gk._SALTS[3])
        return -gk.log1p(-gk.to_unit(bits))


class RacesAllRows(gls.GLSActive):
    """``gls`` whose target races every row (the strong variant under the wrong name)."""

    strong = True


class ForgetsSiblings(gumbel.Poisson):
    """A ``without`` step that races the full draft (earlier children not removed)."""

    def draft_step(self, drafted, plan, step, keys, draft_probs):
        plan = plan._replace(without=(False,) * len(plan.without))
        return super().draft_step(drafted, plan, step, keys, draft_probs)


class OneRow(gls.GLSStrong):
    """GLS drafting every path from row 0."""

    def step_row(self, step: int, depth: int) -> int:
        return 0


@pytest.mark.parametrize(
    ("mutant", "name", "shape"),
    [
        (ArithmeticShift(), "poisson", ss.Shape.chain(2)),
        (RacesAllRows(), "gls", ss.Shape.paths(3, 2)),
        (ForgetsSiblings(), "poisson", ss.Shape.star(3, replacement=False)),
        (OneRow(), "gls_strong", ss.Shape.paths(3, 2)),
    ],
)
def test_mutants_are_caught(mutant: Any, name: str, shape: ss.Shape) -> None:
    assert mutant.name == name
    assert stream_mismatches(mutant, name, keys=(0, 7), shapes=(shape,), first=True) > 0
    # ... while the real lowering passes the same comparison.
    assert stream_mismatches(name, name, keys=(0, 7), shapes=(shape,)) == 0


def test_arithmetic_shift_mutant_differs_from_the_field() -> None:
    keys, contexts = gk.as_words([1, 2**63 + 5]), gk.as_words([3, 2**64 - 1])
    real = gumbel.POISSON.node_exponentials(keys, contexts, 2, 16)
    want = ss.keyed.exponentials(2**63 + 5, 2**64 - 1, np.arange(2)[:, None], np.arange(16))
    assert np.array_equal(real[1].numpy(), want)
    mutant = ArithmeticShift().node_exponentials(keys, contexts, 2, 16)
    assert (mutant != real).float().mean() > 0.9


# --- the hot path ---------------------------------------------------------------------------


def test_hot_path_never_synchronises() -> None:
    sources = [
        inspect.getsource(getattr(type(ssg.SCHEMES[name]), method))
        for name in KEYED
        for method in ssg.SCHEMES[name].hot_path
    ]
    sources += [inspect.getsource(f) for f in (iid_proposal, Descent.start, Descent.advance)]
    sources.append(inspect.getsource(Descent.verified))
    for source in sources:
        for forbidden in (".item(", ".tolist(", "bool(", "int(", "float(", ".nonzero(", "if "):
            assert forbidden not in source.split('"""')[-1], forbidden


# --- bad input ------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors() -> None:
    pair, chain = PAIRS[0], ss.Shape.chain(2)
    with pytest.raises(KeyError, match="nope"):
        generate("nope", pair, chain, 3, key=1)
    with pytest.raises(ValueError, match="scheme: 'nss' does not use keyed noise"):
        generate("nss", pair, chain, 3, key=1)
    for length in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="length"):
            generate("gumbel", pair, chain, length, key=1)
    for key in (-1, 2**64, 1.5, True, "3"):
        with pytest.raises(ValueError, match="key"):
            generate("gumbel", pair, chain, 3, key=key)
    with pytest.raises(ValueError, match=r"key\[1\]"):
        generate("gumbel", pair, chain, 3, key=[1, -2])
    with pytest.raises(ValueError, match="key"):
        generate("gumbel", pair, chain, 3, key=[])
    with pytest.raises(ValueError, match="batch_size"):
        generate("gumbel", pair, chain, 3, key=[1, 2], batch_size=3)
    with pytest.raises(ValueError, match="batch_size"):
        generate("gumbel", pair, chain, 3, key=1, batch_size=0)
    with pytest.raises(ValueError, match="window"):
        generate("gumbel", pair, chain, 3, key=1, window=0)
    with pytest.raises(TypeError, match="shape"):
        generate("gumbel", pair, "chain(2)", 3, key=1)
    with pytest.raises(TypeError, match="pair"):
        generate("gumbel", (1, 2), chain, 3, key=1)
    bad = ss.pairs.Stationary([0.5, 0.5], [0.5, 0.5])
    bad.target = lambda prefix: np.array([0.7, 0.7])  # type: ignore[method-assign]
    with pytest.raises(ss.InvalidDistribution, match="target"):
        generate("gumbel", bad, chain, 3, key=1)
    with pytest.raises(ss.UnsupportedShape, match="keyed coupling"):
        ssg.verify("gumbel", ssg.TreeBatch.from_trees([ss.DraftTree.chain([1])]), None, None)
    assert row_keys(5, 2) == (5, 6) and row_keys(np.array([3, 4], dtype=np.uint64)) == (3, 4)


class _AsGiven:
    """A model pair whose draft (and target) sums to one only to rounding: ``q`` as given
    differs in its last bits from ``q`` divided again by its float sum."""

    vocab_size = 4

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.probs

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.probs


def test_the_draft_is_raced_as_the_pair_gives_it_not_renormalised() -> None:
    """The reference races ``pair.draft(...)`` as returned; dividing it again by its float sum
    moves its last bits, which flips the race at a near-tie. Built at one: token 1's share of
    the first race set so that its score ties token 0's up to the last bit."""
    from specsampling.keyed import field

    exps = field.exponentials(0, field.position_context(0), 0, np.arange(4))
    probs = np.array([0.7881877502847706, 0.8 * exps[1] / (exps[0] + exps[1]), 0.1, 0.1])
    assert probs.sum() != 1.0 and not np.array_equal(probs / probs.sum(), probs)
    draft = [0.6896642814991744, 0.010335718500826024, 0.04764134450303995, 0.25235865549696]
    stationary = ss.pairs.Stationary([0.25] * 4, draft)
    cases = (
        ("gumbel", _AsGiven(probs), ss.Shape.chain(1), 4),
        ("gls", _AsGiven(probs), ss.Shape.paths(2, 2), 6),
        ("gls", stationary, ss.Shape.paths(3, 1), 4),
        ("gls", stationary, ss.Shape.paths(2, 2), 4),
    )
    for name, pair, shape, length in cases:
        out = generate(name, pair, shape, length, key=0)
        want = ss.generate(name, pair, shape, length, np.random.default_rng(0), key=0)
        assert out.tokens[0].tolist() == list(want), (name, shape)
        assert int(out.num_rounds[0]) == len(want.rounds), (name, shape)


def test_keys_of_every_form_the_reference_takes_and_clear_refusals() -> None:
    pair, chain = PAIRS[0], ss.Shape.chain(2)
    want = generate("gumbel", pair, chain, 3, key=5).tokens
    for key in (torch.tensor(5), np.array(5), np.uint64(5), np.array(5, dtype=np.uint64)):
        assert torch.equal(generate("gumbel", pair, chain, 3, key=key).tokens, want), key
    refused = (
        (b"ab", r"key: expected an integer in \[0, 2\*\*64\) or a sequence of them, got b'ab'"),
        (bytearray(b"a"), "key: expected an integer"),
        ("7", "key: expected an integer"),
        (np.array([[1, 2]]), r"key: expected one key per stream \(a 1-D sequence\), got shape"),
        (torch.tensor([[1, 2]]), r"key: expected one key per stream"),
    )
    for key, message in refused:
        with pytest.raises(ValueError, match=message):
            generate("gumbel", pair, chain, 3, key=key)
    with pytest.raises(ValueError, match=r"key\[0\]: expected an integer in \[0, 2\*\*64\), got"):
        generate("gumbel", pair, chain, 3, key=[[1, 2]])
    with pytest.raises(ValueError, match=r"^key\[1\]: expected integers, got 1\.5$"):
        generate("gumbel", pair, chain, 3, key=[1, 1.5])


def test_field_errors_name_the_argument() -> None:
    for args, name in (((-1, 0, 0, 0), "key"), ((0, -1, 0, 0), "context"),
                       ((0, 0, [True], 0), "row"), ((0, 0, 0, torch.tensor([0.5])), "tokens"),
                       ((torch.tensor([-3], dtype=torch.int32), 0, 0, 0), "key")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}: "):
            gk.hash_bits(*args)
