"""Sampled rounds and streams (the Monte-Carlo counterpart of :mod:`specsampling.exact`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._types import Prefix
from .keyed import KeyedNoise
from .pairs import ModelPair, check_model_pair
from .schemes import SCHEMES, KeyedCoupling, SchemeLike, Verdict, get_scheme
from .shapes import Shape, check_shape
from .tree import DraftTree
from .validation import check_positive_int, check_prefix


class Round(NamedTuple):
    """One sampled round: the drafted tree, the verdict and the emitted tokens."""

    tree: DraftTree
    verdict: Verdict
    tokens: tuple[int, ...]


class Generation(tuple[int, ...]):
    """The emitted stream: a tuple of token ids, with the rounds that produced it.

    It compares and hashes as the plain tuple of tokens; ``rounds`` holds every sampled round
    (the last one possibly truncated in the stream).
    """

    rounds: tuple[Round, ...]

    def __new__(cls, tokens: tuple[int, ...], rounds: tuple[Round, ...] = ()) -> Generation:
        stream = super().__new__(cls, tokens)
        stream.rounds = tuple(rounds)
        return stream

    @property
    def tokens(self) -> tuple[int, ...]:
        """The emitted token ids as a plain tuple."""
        return tuple(self)

    @property
    def block_efficiency(self) -> float:
        """Mean tokens emitted per round (``nan`` when no round ran)."""
        emitted = [len(r.tokens) for r in self.rounds]
        return float(np.mean(emitted)) if emitted else float("nan")


def speculate(
    scheme: SchemeLike,
    pair: ModelPair,
    shape: Shape,
    rng: np.random.Generator,
    prefix: Prefix = (),
    *,
    noise: KeyedNoise | None = None,
) -> Round:
    """Draft a tree after ``prefix``, draw fresh noise and verify: one sampled round.

    Keyed couplings (``gumbel``, ``poisson``, ``gls``, ``gls_strong``) read ``noise`` when it is
    given (a :class:`~specsampling.keyed.KeyedNoise`); otherwise they draw a fresh key from
    ``rng``. Other schemes refuse ``noise``.

    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Random(vocab_size=5, seed=0)
    >>> r = ss.speculate("specinfer", pair, ss.Shape.paths(2, 3), np.random.default_rng(0))
    >>> 1 <= len(r.tokens) <= 4
    True
    """
    resolved = get_scheme(scheme)
    check_model_pair(pair)
    check_shape(shape)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    prefix = check_prefix(prefix, pair.vocab_size)
    if noise is None:
        tree, verdict = resolved.sample(pair, shape, rng, prefix)
    elif isinstance(resolved, KeyedCoupling):
        tree, verdict = resolved.sample_keyed(pair, shape, noise, prefix)
    else:
        raise ValueError(
            f"key: scheme {resolved.name!r} does not use keyed noise; only the keyed couplings "
            f"{sorted(n for n, s in SCHEMES.items() if isinstance(s, KeyedCoupling))} take a key"
        )
    return Round(tree, verdict, (*tree.prefix(verdict.node), verdict.token))


def generate(
    scheme: SchemeLike,
    pair: ModelPair,
    shape: Shape,
    length: int,
    rng: np.random.Generator,
    key: int | None = None,
    prefix: Prefix = (),
    *,
    window: int | None = None,
) -> Generation:
    """Repeat rounds until ``length`` tokens are emitted; the stream is truncated to ``length``.

    Returns the tuple of emitted token ids (a :class:`Generation`, which also keeps the rounds).

    ``key`` (keyed couplings only) seeds the keyed noise and is the watermark key: noise is
    keyed by absolute position, or with ``window=h`` by the hash of the previous ``h`` tokens
    (:class:`~specsampling.keyed.KeyedNoise`, prompt length ``len(prefix)``). For a fixed key
    the strong couplings (``gumbel``, ``poisson``, ``gls_strong``) emit the same tokens
    whatever the draft model: :func:`specsampling.keyed.laws.decode` of the target alone.

    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Random(vocab_size=5, seed=0)
    >>> stream = ss.generate("nss", pair, ss.Shape.top((2, 2)), 10, np.random.default_rng(1))
    >>> len(stream), isinstance(stream, tuple), 1 <= stream.block_efficiency <= 3
    (10, True, True)
    >>> other = ss.pairs.Swapped(pair, ss.pairs.Random(5, seed=9))  # another drafter
    >>> star = ss.Shape.star(2, replacement=False)
    >>> a = ss.generate("poisson", pair, star, 10, np.random.default_rng(2), key=7)
    >>> b = ss.generate("poisson", other, ss.Shape.chain(3), 10, np.random.default_rng(3), key=7)
    >>> a == b
    True
    """
    length = check_positive_int(length, "length")
    check_model_pair(pair)
    prefix = check_prefix(prefix, pair.vocab_size)
    noise = None
    if key is not None:
        noise = KeyedNoise(key, window, start=len(tuple(prefix)))
    elif window is not None:
        raise ValueError("window: the watermark window needs a key")
    tokens: tuple[int, ...] = ()
    rounds: list[Round] = []
    while len(tokens) < length:
        step = speculate(scheme, pair, shape, rng, tuple(prefix) + tokens, noise=noise)
        rounds.append(step)
        tokens += step.tokens
    return Generation(tokens[:length], tuple(rounds))
