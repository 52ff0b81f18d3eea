r"""The base of the keyed list couplings (``gumbel``, ``poisson``, ``gls``, ``gls_strong``).

A keyed coupling does not verify a tree with per-node uniforms: drafter and verifier read the
*same* keyed exponentials (:class:`~specsampling.keyed.KeyedNoise`), the drafter's tokens are
race winners ``argmin E / q`` and the emitted token at every position is the target's own race
winner ``argmin E / p``. The output is therefore exact by construction (the race winner is an
exact draw), and drafting only decides how many positions one target pass covers.

For the exact engine, a keyed scheme gives the law of a round directly: walking down the
target's path, each position contributes ``P(Y = j, the drafts continue)`` and
``P(Y = j, the round stops here)``. :meth:`KeyedScheme.outcomes` reports each accepted path as a
chain tree with its probability and the law of the token emitted after it, so
:func:`~specsampling.exact.round_law`, :func:`~specsampling.lossless_error`,
:func:`~specsampling.expected_emitted` and :func:`~specsampling.acceptance` work unchanged.

Sampling draws the keyed noise from a key: :meth:`KeyedScheme.sample_keyed` with a given
:class:`~specsampling.keyed.KeyedNoise` (``ss.generate(..., key=...)``), or a fresh random key
per round from ``rng`` (:meth:`KeyedScheme.sample`, which is exact as well).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .._types import Prefix, Probs
from ..keyed import KeyedNoise
from ..keyed.laws import race_winner
from ..ops import support
from ..pairs import ModelPair
from ..shapes import Shape
from ..tree import DraftTree
from .base import SchemeDefaults, Verdict, VerdictLaw

#: ``(token, probability, next state or None)``: ``None`` ends the round with ``token``.
Transition = tuple[int, Any, Any]


class KeyedScheme(SchemeDefaults):
    """The :class:`~specsampling.schemes.KeyedCoupling` base: a list coupling on keyed noise;
    subclasses give the drafting and per-position laws."""

    rational = False
    #: ``True``: the output is seeded target-only decoding for any drafter; ``False``
    #: (conditional): it depends on the draft tokens, never on the draft probabilities.
    strong_invariance = True

    @abstractmethod
    def rows(self, shape: Shape) -> int:
        """Rows of keyed exponentials per position (``K`` for GLS, else one)."""

    @abstractmethod
    def transitions(
        self, target: Probs, draft: Probs, shape: Shape, depth: int, state: Any
    ) -> Iterable[Transition]:
        """Exact law of one position of the target's path at ``depth`` (< ``shape.depth``)."""

    @abstractmethod
    def initial_state(self, shape: Shape) -> Any:
        """The walk's state at the root (GLS: the number of active rows)."""

    @abstractmethod
    def sample_keyed(
        self, pair: ModelPair, shape: Shape, noise: KeyedNoise, prefix: Prefix = ()
    ) -> tuple[DraftTree, Verdict]:
        """One round with the given keyed noise: draft from it, then walk the target's path."""

    def outcomes(
        self, pair: ModelPair, shape: Shape, prefix: Prefix
    ) -> Iterator[tuple[DraftTree, Any, VerdictLaw]]:
        """The round law as ``(chain of accepted tokens, its probability, law of the next token)``.

        The chain is the target's accepted path (the drafted tree around it is marginalised
        out), so the weights sum to one and ``round_law`` sums ``weight * law`` as usual.
        """
        self.check(shape)
        laws: dict[Prefix, VerdictLaw] = {}
        pending: list[tuple[Prefix, Any, Any]] = [((), self.initial_state(shape), 1)]
        while pending:
            path, state, weight = pending.pop()
            context = tuple(prefix) + path
            target = pair.target(context)
            if len(path) == shape.depth:
                steps: Iterable[Transition] = ((int(t), target[t], None) for t in support(target))
            else:
                steps = self.transitions(target, pair.draft(context), shape, len(path), state)
            for token, prob, after in steps:
                mass = weight * prob
                if not mass > 0:  # an impossible step, or a path whose float64 mass underflows
                    continue  # (0 / 0 below otherwise: NaN in the round law)
                if after is None:
                    law = laws.setdefault(path, {})
                    verdict = Verdict(len(path), token)
                    law[verdict] = law.get(verdict, 0) + mass
                else:
                    pending.append(((*path, token), after, mass))
        for path, law in laws.items():
            mass = sum(law.values())
            yield DraftTree.chain(path), mass, {v: prob / mass for v, prob in law.items()}

    def sample(
        self, pair: ModelPair, shape: Shape, rng: np.random.Generator, prefix: Prefix
    ) -> tuple[DraftTree, Verdict]:
        """One round with a fresh random key drawn from ``rng`` (exact: fresh noise)."""
        self.check(shape)
        key = int(rng.integers(2**63))
        return self.sample_keyed(pair, shape, KeyedNoise(key, start=len(prefix)), prefix)


def race_pick(noise: KeyedNoise, prefix: Prefix, vocab_size: int, rows_of_step: Any) -> Any:
    """A :meth:`Shape.draft_with` chooser: the race winner ``argmin E[row] / proposal``
    (:func:`~specsampling.keyed.laws.race_winner`, the race the tested selections use)."""

    def pick(proposal: Probs, path: Prefix, step: int) -> int:
        # Rows 0..row through the one method a keyed field (or a test double) provides.
        row = rows_of_step(step)
        exps = noise.exponentials(tuple(prefix) + path, row + 1, vocab_size)[row]
        return int(race_winner(np.asarray(proposal, dtype=np.float64), exps))

    return pick


__all__ = ["KeyedScheme", "Transition", "race_pick"]
