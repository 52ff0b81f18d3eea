"""Drafter invariance of the keyed couplings: the structural checks of ``specsampling certify``.

Two strengths (Rowan, Phan, Khisti, arXiv 2506.05632, Definition 1; ``docs/schemes/gls.md``):

* **strong** (``gumbel``, ``poisson``, ``gls_strong``): with a fixed key the emitted stream is
  seeded target-only decoding (:func:`~specsampling.keyed.laws.decode`), bit for bit, for every
  drafter, the perfect one and a wrong one included, with position-keyed and context-keyed
  (watermark) noise alike;
* **conditional** (``gls``): the output may depend on the draft *tokens*, never on the draft
  *probabilities*: two drafters whose keyed race winners coincide give identical verdicts.

Both are checked by running the scheme, not by trusting its flag, and return a list of
violations (empty when the property holds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._types import Prefix
from .keyed import KeyedNoise
from .keyed.laws import decode
from .pairs import ModelPair, Perturbed, Random, Swapped
from .sampling import generate
from .schemes import KeyedCoupling
from .shapes import Shape


def drafters(base: ModelPair, seed: int = 99) -> dict[str, ModelPair]:
    """The drafters a strong coupling must be invariant to: none (draft = target), the pair's
    own draft and an unrelated random draft."""
    return {
        "perfect": Swapped(base),
        "own": base,
        "unrelated": Swapped(base, Random(base.vocab_size, seed=seed)),
    }


def strong_violations(
    scheme: KeyedCoupling,
    base: ModelPair,
    shape: Shape,
    *,
    keys: Sequence[int] = (1, 2, 3),
    length: int = 12,
    window: int | None = None,
    prefix: Prefix = (1,),
) -> list[str]:
    """Streams of ``scheme`` that differ from seeded target-only decoding, per drafter and key.

    >>> import specsampling as ss
    >>> pair = ss.pairs.Random(5, seed=0)
    >>> strong_violations(ss.SCHEMES["poisson"], pair, ss.Shape.star(2, replacement=False))
    []
    """
    problems = []
    rows = scheme.rows(shape)
    for key in keys:
        noise = KeyedNoise(key, window, start=len(prefix))
        expected = decode(base, length, noise, rows=rows, prefix=prefix)
        for label, pair in drafters(base).items():
            stream = generate(
                scheme, pair, shape, length, np.random.default_rng(key), key, prefix, window=window
            )
            if stream.tokens != expected:
                problems.append(
                    f"{shape!r}, key {key}, window {window}, {label} drafter: "
                    f"{stream.tokens} != target-only {expected}"
                )
    return problems


def conditional_violations(
    scheme: KeyedCoupling,
    base: ModelPair,
    shape: Shape,
    *,
    keys: Sequence[int] = tuple(range(1, 41)),
    window: int | None = None,
    prefix: Prefix = (1,),
) -> tuple[list[str], int]:
    """Rounds where the same drafted tree gave different verdicts under a perturbed drafter.

    Returns ``(problems, compared)``; ``compared`` counts the keys whose two drafted trees
    coincide (the check is vacuous when it is 0).

    >>> import specsampling as ss
    >>> problems, compared = conditional_violations(
    ...     ss.SCHEMES["gls"], ss.pairs.Random(5, seed=0), ss.Shape.paths(2, 2))
    >>> problems, compared > 0
    ([], True)
    """
    problems, compared = [], 0
    other = Perturbed(base)
    for key in keys:
        noise = KeyedNoise(key, window, start=len(prefix))
        tree, verdict = scheme.sample_keyed(base, shape, noise, prefix)
        other_tree, other_verdict = scheme.sample_keyed(other, shape, noise, prefix)
        if (tree.parents, tree.tokens) != (other_tree.parents, other_tree.tokens):
            continue
        compared += 1
        if verdict != other_verdict:
            problems.append(
                f"{shape!r}, key {key}, window {window}: same draft tokens {tree.tokens}, "
                f"verdicts {verdict} != {other_verdict}"
            )
    return problems, compared


__all__ = ["conditional_violations", "drafters", "strong_violations"]
