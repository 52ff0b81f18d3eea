"""Sampled rounds and streams (the Monte-Carlo counterpart of :mod:`specsampling.exact`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ._types import Prefix
from .pairs import ModelPair
from .schemes import Verdict, get_scheme
from .shapes import Shape
from .tree import DraftTree
from .validation import check_positive_int


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
    scheme: Any, pair: ModelPair, shape: Shape, rng: np.random.Generator, prefix: Prefix = ()
) -> Round:
    """Draft a tree after ``prefix``, draw fresh noise and verify: one sampled round.

    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Random(vocab_size=5, seed=0)
    >>> r = ss.speculate("specinfer", pair, ss.Shape.paths(2, 3), np.random.default_rng(0))
    >>> 1 <= len(r.tokens) <= 4
    True
    """
    resolved = get_scheme(scheme)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    tree, verdict = resolved.sample(pair, shape, rng, tuple(prefix))
    return Round(tree, verdict, (*tree.prefix(verdict.node), verdict.token))


def generate(
    scheme: Any,
    pair: ModelPair,
    shape: Shape,
    length: int,
    rng: np.random.Generator,
    prefix: Prefix = (),
) -> Generation:
    """Repeat rounds until ``length`` tokens are emitted; the stream is truncated to ``length``.

    Returns the tuple of emitted token ids (a :class:`Generation`, which also keeps the rounds).

    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Random(vocab_size=5, seed=0)
    >>> stream = ss.generate("nss", pair, ss.Shape.top((2, 2)), 10, np.random.default_rng(1))
    >>> len(stream), isinstance(stream, tuple), 1 <= stream.block_efficiency <= 3
    (10, True, True)
    """
    length = check_positive_int(length, "length")
    tokens: tuple[int, ...] = ()
    rounds: list[Round] = []
    while len(tokens) < length:
        step = speculate(scheme, pair, shape, rng, tuple(prefix) + tokens)
        rounds.append(step)
        tokens += step.tokens
    return Generation(tokens[:length], tuple(rounds))
