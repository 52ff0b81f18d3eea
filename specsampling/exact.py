r"""The exact engine: laws of rounds and streams by enumeration, float64 or exact.

A round drafts a tree with the shape's law and verifies it. Its law is

.. math:: R(o) = \sum_{T} P(T) \sum_{(n, y):\ \mathrm{prefix}(n) \oplus y = o} V_T(n, y),

summed over every draftable tree :math:`T` and the scheme's exact verdict law :math:`V_T`. A
scheme is lossless (``docs/notation.md``, "The lossless criterion") iff, for
:math:`m = \text{depth} + 1`, the round law with outputs shorter than :math:`m` extended by target
samples equals the target joint :math:`\prod_i p(y_i \mid y_{<i})`; applied at every prefix this
gives the law of the whole stream, which :func:`stream_law` computes by repeating rounds.

Everything here enumerates and is meant for small vocabularies and shapes; with ``Fraction``
pairs the results are exact. Each entry point estimates its work first (:func:`check_work`):
beyond ``max_trees`` draftable trees it refuses at once, naming the cost and the Monte-Carlo
alternative (:func:`specsampling.simulators.estimate_emitted`), and runs that take long report
their progress on standard error.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ._types import Law, Prefix, Probs
from .ops import clip_probability
from .pairs import ModelPair, Stationary, check_model_pair
from .schemes import KeyedCoupling, Scheme, SchemeLike, TreeVerifier, get_scheme, tables
from .shapes import Shape, check_shape
from .validation import check_positive_int, check_prefix

#: Largest number of draftable trees the single-position helpers will enumerate.
MAX_ENUMERATION = 200_000
#: Default largest number of draftable trees (keyed couplings: target paths) one round law may
#: enumerate; every entry point takes ``max_trees=`` to change it.
MAX_TREES = 2_000_000
#: Largest number of probability-table entries (trees x nodes x vocabulary) one round law may
#: read: a round over a large vocabulary is refused even when it has few trees.
MAX_TABLE_ENTRIES = 10**9
#: Rounds estimated above this many trees print their progress on standard error.
PROGRESS_ABOVE = 20_000
#: A guess of the next tokens from the context alone (prompt lookup's role): ``graft(prefix)``
#: gives token ids that :meth:`~specsampling.DraftTree.graft` grafts into every drafted tree.
Graft = Callable[[Prefix], Sequence[int]]
_MONTE_CARLO = (
    "estimate it by Monte Carlo instead: specsampling.simulators.estimate_emitted(scheme, pair, "
    "shape, num_rounds, rng)"
)


def check_work(
    scheme: SchemeLike, pair: ModelPair, shape: Shape, max_trees: int = MAX_TREES
) -> int:
    """Upper bound on the trees one round law enumerates; refuse beyond ``max_trees`` trees or
    ``MAX_TABLE_ENTRIES`` probability-table entries read.

    Tree verifiers enumerate :meth:`Shape.count_trees` trees over the vocabulary, each with a
    table row per node; keyed couplings walk the target's paths, ``vocab_size ** depth`` of them.

    >>> import specsampling as ss
    >>> check_work("specinfer", ss.pairs.Random(3, seed=0), ss.Shape.paths(2, 2))
    81
    >>> check_work("rsd", ss.pairs.Random(150_000, seed=0), ss.Shape.star(8, replacement=False))
    Traceback (most recent call last):
    ...
    ValueError: round law of 'rsd' on star(8, replacement=False) over 150000 tokens would \
enumerate about 2.6e+41 draft trees, more than max_trees=2000000; estimate it by Monte Carlo \
instead: specsampling.simulators.estimate_emitted(scheme, pair, shape, num_rounds, rng)
    """
    resolved = get_scheme(scheme)
    check_model_pair(pair)
    check_shape(shape)
    limit = check_positive_int(max_trees, "max_trees")
    resolved.check(shape)
    vocab = pair.vocab_size
    if isinstance(resolved, KeyedCoupling):
        count, what, rows = vocab**shape.depth, "target paths", shape.depth + 1
    else:
        count, what, rows = shape.count_trees(vocab), "draft trees", len(shape.steps) + 1
    where = f"round law of {resolved.name!r} on {shape!r} over {vocab} tokens"
    if count > limit:
        raise ValueError(
            f"{where} would enumerate about {_about(count)} {what}, more than "
            f"max_trees={limit}; {_MONTE_CARLO}"
        )
    entries = count * rows * vocab
    if entries > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"{where} would read about {_about(entries)} probability-table entries "
            f"({count} {what}), more than MAX_TABLE_ENTRIES={MAX_TABLE_ENTRIES:.0e}; "
            f"{_MONTE_CARLO}"
        )
    return int(count)


def round_law(
    scheme: SchemeLike,
    pair: ModelPair,
    shape: Shape,
    prefix: Prefix = (),
    *,
    max_trees: int = MAX_TREES,
    graft: Graft | None = None,
) -> Law:
    """Exact law of the tokens one round emits after ``prefix``.

    Returns ``{emitted tuple: probability}``; each tuple holds the accepted drafts and the next
    token, so its length is ``num_accepted + 1``. Refuses rounds of more than ``max_trees``
    draftable trees (:func:`check_work`). ``graft``: a guess from the context alone
    (:data:`Graft`), grafted into every drafted tree before it is verified (trees of law
    ``grafted`` beside i.i.d. shapes and chains, ``unknown`` beside others): the round of a
    drafter that mixes prompt lookup into its sampled tree; tree verifiers only.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> pair = ss.pairs.Stationary([F(1, 2), F(1, 2)], [F(1, 4), F(3, 4)])
    >>> law = ss.round_law("standard", pair, ss.Shape.chain(1))
    >>> law[(0,)], law[(1, 0)], sum(law.values())
    (Fraction(1, 4), Fraction(1, 4), Fraction(1, 1))
    """
    resolved = get_scheme(scheme)
    count = check_work(resolved, pair, shape, max_trees)
    prefix = check_prefix(prefix, pair.vocab_size)
    law: Law = {}
    vocab_size = pair.vocab_size
    progress = _Progress(f"round law of {resolved.name!r} on {shape!r}", count)
    outcomes = (
        resolved.outcomes(pair, shape, tuple(prefix))
        if graft is None
        else _grafted_outcomes(resolved, pair, shape, tuple(prefix), graft)
    )
    for tree, weight, verdicts in outcomes:
        progress.tick()
        for verdict, prob in verdicts.items():
            if not 0 <= verdict.token < vocab_size:
                raise AssertionError(f"{resolved.name}: emitted token {verdict.token} out of range")
            emitted = (*tree.prefix(verdict.node), verdict.token)
            law[emitted] = law.get(emitted, 0) + weight * prob
    progress.done()
    return law


def _grafted_outcomes(
    scheme: Scheme, pair: ModelPair, shape: Shape, prefix: Prefix, graft: Graft
) -> Iterator[tuple[Any, Any, Any]]:
    """``scheme.outcomes`` with ``graft(prefix)`` grafted into every drafted tree."""
    if not isinstance(scheme, TreeVerifier):
        raise ValueError(
            f"graft: {scheme.name!r} drafts by its own keyed race; a guess can be grafted only "
            "into the trees of a tree verifier"
        )
    if not callable(graft):
        raise TypeError(f"graft: expected a function of the prefix, got {graft!r}")
    guess = check_prefix(graft(prefix), pair.vocab_size, "graft(prefix)")
    for tree, weight in shape.enumerate(pair, prefix):
        grown = tree.graft(guess)
        yield grown, weight, scheme.verdict_law(grown, *tables(pair, grown, prefix))


def target_joint(pair: ModelPair, length: int, prefix: Prefix = ()) -> Law:
    """The target's law of the next ``length`` tokens (positive-probability sequences only)."""
    length = check_positive_int(length, "length", minimum=0)
    law: Law = {(): 1}
    for _ in range(length):
        grown: Law = {}
        for seq, prob in law.items():
            target = pair.target(tuple(prefix) + seq)
            for token in np.flatnonzero(np.asarray(target > 0, dtype=bool)):
                grown[(*seq, int(token))] = prob * target[token]
        law = grown
    return law


def extended_law(
    scheme: SchemeLike,
    pair: ModelPair,
    shape: Shape,
    length: int,
    prefix: Prefix = (),
    *,
    max_trees: int = MAX_TREES,
    graft: Graft | None = None,
) -> Law:
    """Law of the next ``length`` tokens: one round of ``scheme`` (``graft``: as
    :func:`round_law`), then target samples."""
    law: Law = {}
    rounds = round_law(scheme, pair, shape, prefix, max_trees=max_trees, graft=graft)
    for emitted, prob in rounds.items():
        if len(emitted) >= length:
            _add(law, emitted[:length], prob)
            continue
        rest = target_joint(pair, length - len(emitted), tuple(prefix) + emitted)
        for tail, tail_prob in rest.items():
            _add(law, emitted + tail, prob * tail_prob)
    return law


def stream_law(
    scheme: SchemeLike,
    pair: ModelPair,
    shape: Shape,
    length: int,
    prefix: Prefix = (),
    *,
    max_trees: int = MAX_TREES,
) -> Law:
    """Exact law of the first ``length`` tokens emitted by repeated rounds of ``scheme``.

    Round laws are computed once per visited context, so the cost grows with
    ``vocab_size ** (length - 1)`` contexts; keep ``length`` small.

    >>> import specsampling as ss
    >>> pair = ss.pairs.Random(vocab_size=3, seed=4, exact=True)
    >>> law = ss.stream_law("specinfer", pair, ss.Shape.star(2), 2)
    >>> law == ss.exact.target_joint(pair, 2)
    True
    """
    length = check_positive_int(length, "length")
    rounds: dict[Prefix, Law] = {}

    def law_after(context: Prefix, remaining: int) -> Law:
        if remaining == 0:
            return {(): 1}
        if context not in rounds:
            rounds[context] = round_law(scheme, pair, shape, context, max_trees=max_trees)
        law: Law = {}
        for emitted, prob in rounds[context].items():
            if len(emitted) >= remaining:
                _add(law, emitted[:remaining], prob)
                continue
            for tail, tail_prob in law_after(context + emitted, remaining - len(emitted)).items():
                _add(law, emitted + tail, prob * tail_prob)
        return law

    return law_after(tuple(prefix), length)


def lossless_error(
    scheme: SchemeLike,
    pair: ModelPair,
    shape: Shape,
    length: int | None = None,
    prefix: Prefix = (),
    *,
    max_trees: int = MAX_TREES,
    graft: Graft | None = None,
) -> Any:
    """Max absolute deviation of the emitted law from the target joint (0 iff lossless).

    The emitted law is one round of ``scheme`` followed by target samples, over the next
    ``length`` tokens (default ``shape.depth + 1``, the longest round output; with ``graft``,
    a guess grafted into every tree as in :func:`round_law`, the longer of the shape and the
    guess, plus one): the lossless criterion of ``docs/notation.md``. Exactly ``0`` with
    ``Fraction`` pairs for an exact scheme; about ``1e-16`` in float64.

    >>> import specsampling as ss
    >>> pair = ss.pairs.Random(vocab_size=3, seed=1, exact=True)
    >>> ss.lossless_error("rsd", pair, ss.Shape.branching((2, 1)))
    Fraction(0, 1)
    >>> lookup = lambda prefix: [2, 0]  # a guess from the context alone
    >>> ss.lossless_error("specinfer", pair, ss.Shape.chain(1), graft=lookup)
    Fraction(0, 1)
    """
    resolved = get_scheme(scheme)
    check_model_pair(pair)
    check_shape(shape)
    guessed: tuple[Any, ...] = ()
    if graft is not None and callable(graft):  # one call: the round is at ``prefix`` alone
        guessed = tuple(graft(tuple(prefix)))
        graft = lambda context: guessed  # noqa: E731
    if length is not None:
        length = check_positive_int(length, "length")
    else:
        length = max(shape.depth, len(guessed)) + 1
    emitted = extended_law(resolved, pair, shape, length, prefix, max_trees=max_trees, graft=graft)
    target = target_joint(pair, length, prefix)
    deviations = [abs(emitted.get(seq, 0) - target.get(seq, 0)) for seq in {*emitted, *target}]
    if any(d != d for d in deviations):  # a NaN: max() would skip it where it is not first
        return math.nan
    return max(deviations)


def expected_emitted(
    scheme: SchemeLike,
    pair: ModelPair,
    shape: Shape,
    prefix: Prefix = (),
    *,
    max_trees: int = MAX_TREES,
) -> Any:
    """Exact block efficiency :math:`E[\\tau + 1]`: expected tokens emitted by one round.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> pair = ss.pairs.Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> ss.expected_emitted("specinfer", pair, ss.Shape.paths(2, 2))
    Fraction(7, 3)
    """
    law = round_law(scheme, pair, shape, prefix, max_trees=max_trees)
    return sum(prob * len(emitted) for emitted, prob in law.items())


def acceptance(scheme: SchemeLike, target: Any, draft: Any, num_drafts: int) -> Any:
    r"""Single position: :math:`P(Y \in \{x_1..x_k\})` under the scheme's own draft law.

    Uses the scheme's closed form when it has one (vectorised, any vocabulary size), otherwise
    exact enumeration of the candidate tuples (small vocabularies only: beyond
    ``MAX_ENUMERATION`` tuples it refuses at once and names the Monte-Carlo alternative). A
    float result is a probability, clipped to ``[0, 1]`` against rounding.

    >>> import specsampling as ss
    >>> round(float(ss.acceptance("specinfer", [1/2, 1/3, 1/6], [1/3] * 3, 3)), 6)
    0.925926
    """
    resolved = get_scheme(scheme)
    pair = Stationary(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    closed = resolved.closed_acceptance(pair.target(()), pair.draft(()), k)
    if closed is None:
        closed = enumerated_acceptance(resolved, pair, _single_shape(resolved, pair, k))
    return clip_probability(closed)


def enumerated_acceptance(
    scheme: SchemeLike, pair: ModelPair, shape: Shape, prefix: Prefix = ()
) -> Any:
    r""":math:`P(Y \in \text{root candidates})` by enumerating every drafted tree of ``shape``.

    ``Y`` is the first emitted token; a correction token equal to a drafted candidate counts.
    This is what the closed forms are checked against; it costs one verdict law per tree.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> pair = ss.pairs.Stationary([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3)
    >>> enumerated_acceptance("specinfer", pair, ss.Shape.star(2))
    Fraction(8, 9)
    """
    resolved = get_scheme(scheme)
    total: Any = 0 * pair.target(tuple(prefix))[0]
    for tree, weight, verdicts in resolved.outcomes(pair, shape, tuple(prefix)):
        drafted = {tree.tokens[child] for child in tree.children(0)}
        total = total + weight * sum(
            (prob for verdict, prob in verdicts.items() if _first(tree, verdict) in drafted), 0
        )
    return total


def output_law(scheme: SchemeLike, target: Any, draft: Any, num_drafts: int) -> Probs:
    """Single position: exact law of the emitted token, an array over the vocabulary.

    >>> import specsampling as ss
    >>> ss.output_law("nss", [0.25, 0.75], [0.5, 0.5], 2)
    array([0.25, 0.75])
    """
    resolved = get_scheme(scheme)
    pair = Stationary(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    shape = _single_shape(resolved, pair, k)
    out: Probs = 0 * pair.target(()).copy()
    for emitted, prob in round_law(resolved, pair, shape).items():
        out[emitted[0]] = out[emitted[0]] + prob
    return out


def _single_shape(scheme: Scheme, pair: Stationary, num_drafts: int) -> Shape:
    shape = scheme.single_shape(num_drafts)
    scheme.check(shape)
    size = int(np.count_nonzero(np.asarray(pair.draft(()) > 0)))
    count = shape.count_trees(size)
    if count > MAX_ENUMERATION:
        raise ValueError(
            f"scheme {scheme.name!r} has no closed form for num_drafts={num_drafts}, and exact "
            f"enumeration would draft about {_about(count)} candidate tuples over the "
            f"{size} draft tokens of positive probability, more than {MAX_ENUMERATION}; "
            f"{_MONTE_CARLO} with pair=Stationary(target, draft), shape={shape!r}: acceptance "
            "is its mean minus 1"
        )
    return shape


def _about(count: int) -> str:
    """An integer count for a message, in scientific notation (no float overflow)."""
    if count.bit_length() < 1000:  # below float64's overflow: its own rounding
        return f"{float(count):.2g}"
    # math.log10 takes any int (str() refuses more than 4,300 digits)
    return f"1e+{math.floor(math.log10(count))}"


class _Progress:
    """Progress of a long enumeration on standard error, at most once a second."""

    def __init__(self, label: str, estimate: int) -> None:
        self.label, self.estimate, self.count = label, estimate, 0
        self.active = estimate > PROGRESS_ABOVE
        self.start = self.last = time.monotonic()

    def tick(self) -> None:
        self.count += 1
        if self.active and self.count % 1024 == 0 and time.monotonic() - self.last >= 1:
            self.last = time.monotonic()
            share = min(1.0, self.count / self.estimate)
            print(
                f"\r{self.label}: {self.count} of at most {self.estimate} trees ({share:.0%})",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def done(self) -> None:
        if self.active:
            elapsed = time.monotonic() - self.start
            print(f"\r{self.label}: {self.count} trees in {elapsed:.1f} s", file=sys.stderr)


def _first(tree: Any, verdict: Any) -> int:
    path = tree.prefix(verdict.node)
    return int(path[0]) if path else int(verdict.token)


def _add(law: Law, key: tuple[int, ...], prob: Any) -> None:
    law[key] = law.get(key, 0) + prob
