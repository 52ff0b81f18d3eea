"""Model pairs: a target and a draft next-token distribution for every prefix.

Every pair exposes ``vocab_size``, ``target(prefix)`` and ``draft(prefix)``; the returned arrays
are the *processed* distributions actually sampled from (float64, or exact ``Fraction``).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._types import Prefix, Probs
from .validation import check_distribution, check_pair, check_positive_int


@runtime_checkable
class ModelPair(Protocol):
    """What the exact engine and the samplers need from a model pair."""

    @property
    def vocab_size(self) -> int: ...

    def target(self, prefix: Prefix) -> Probs: ...

    def draft(self, prefix: Prefix) -> Probs: ...


class Stationary:
    """The same target and draft distribution after every prefix.

    >>> from fractions import Fraction as F
    >>> pair = Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> pair.vocab_size, pair.target((1, 0))[1]
    (2, Fraction(2, 3))
    """

    def __init__(self, target: Any, draft: Any) -> None:
        self._target, self._draft = check_pair(target, draft)

    @property
    def vocab_size(self) -> int:
        return int(self._target.shape[0])

    def target(self, prefix: Prefix) -> Probs:
        return self._target

    def draft(self, prefix: Prefix) -> Probs:
        return self._draft

    def __repr__(self) -> str:
        return f"Stationary(target={_show(self._target)}, draft={_show(self._draft)})"


class Table:
    """Distributions listed per prefix: ``{prefix: (target, draft)}``.

    A prefix missing from the table raises ``KeyError`` naming it.

    >>> pair = Table({(): ([1.0, 0.0], [0.5, 0.5]), (0,): ([0.5, 0.5], [0.5, 0.5])})
    >>> pair.draft((0,))
    array([0.5, 0.5])
    """

    def __init__(self, mapping: Mapping[Prefix, tuple[Any, Any]]) -> None:
        if not mapping:
            raise ValueError("mapping: needs at least one prefix")
        self._rows: dict[Prefix, tuple[Probs, Probs]] = {}
        size: int | None = None
        for prefix, (target, draft) in mapping.items():
            key = tuple(int(t) for t in prefix)
            t = check_distribution(target, f"mapping[{key}].target", size)
            size = int(t.shape[0])
            d = check_distribution(draft, f"mapping[{key}].draft", size)
            self._rows[key] = (t, d)
        assert size is not None
        self._vocab_size = size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def _row(self, prefix: Prefix) -> tuple[Probs, Probs]:
        try:
            return self._rows[tuple(prefix)]
        except KeyError:
            raise KeyError(f"Table has no distributions for prefix {tuple(prefix)}") from None

    def target(self, prefix: Prefix) -> Probs:
        return self._row(prefix)[0]

    def draft(self, prefix: Prefix) -> Probs:
        return self._row(prefix)[1]


class Random:
    """Seeded random distributions per prefix, deterministic in ``(seed, prefix)``.

    Rows are Dirichlet draws (``exact=True``: small-denominator rationals) with deliberate edge
    cases: about a third of the rows have zeros, a tenth have ``draft == target`` and a tenth are
    near one-hot.

    >>> pair = Random(vocab_size=4, seed=0)
    >>> bool(np.all(pair.target((1, 2)) == Random(4, seed=0).target((1, 2))))
    True
    >>> Random(3, seed=1, exact=True).draft(()).dtype
    dtype('O')
    """

    def __init__(self, vocab_size: int, seed: int = 0, *, exact: bool = False) -> None:
        self._vocab_size = check_positive_int(vocab_size, "vocab_size", minimum=2)
        self._seed = check_positive_int(seed, "seed", minimum=0)
        self._exact = bool(exact)
        self._cache: dict[Prefix, tuple[Probs, Probs]] = {}

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def __repr__(self) -> str:
        return f"Random(vocab_size={self._vocab_size}, seed={self._seed}, exact={self._exact})"

    def target(self, prefix: Prefix) -> Probs:
        return self._row(prefix)[0]

    def draft(self, prefix: Prefix) -> Probs:
        return self._row(prefix)[1]

    def _row(self, prefix: Prefix) -> tuple[Probs, Probs]:
        key = tuple(int(t) for t in prefix)
        if key not in self._cache:
            rng = np.random.default_rng([self._seed, len(key), *key])
            target = self._weights(rng)
            draft = target.copy() if rng.random() < 0.1 else self._weights(rng)
            self._cache[key] = (self._normalise(target), self._normalise(draft))
        return self._cache[key]

    def _weights(self, rng: np.random.Generator) -> Probs:
        size = self._vocab_size
        if self._exact:
            weights: Probs = rng.integers(1, 8, size).astype(np.float64)
        else:
            weights = rng.dirichlet(np.ones(size))
        if rng.random() < 1 / 3:
            zeros = rng.random(size) < 0.4
            zeros[rng.integers(size)] = False
            weights[zeros] = 0.0
        if rng.random() < 0.1:
            peak = rng.integers(size)
            weights = np.where(np.arange(size) == peak, 1.0, 1e-3 if self._exact else 1e-9)
        return weights

    def _normalise(self, weights: Probs) -> Probs:
        if self._exact:
            ints = [Fraction(w).limit_denominator(1000) for w in weights]
            mass = sum(ints, Fraction(0))
            return np.array([w / mass for w in ints], dtype=object)
        out: Probs = weights / weights.sum()
        return out


class Swapped:
    """The target of one pair with the draft of another: swap the drafter, keep the target.

    ``draft_from=None`` makes the draft equal to the target (a perfect drafter). Used to show
    drafter invariance: with a fixed key the strong keyed couplings emit the same tokens for
    every ``draft_from``.

    >>> base = Random(4, seed=0)
    >>> pair = Swapped(base, Random(4, seed=1))
    >>> bool(np.all(pair.target(()) == base.target(()))), pair.vocab_size
    (True, 4)
    >>> bool(np.all(Swapped(base).draft((2,)) == base.target((2,))))
    True
    """

    def __init__(self, target_from: ModelPair, draft_from: ModelPair | None = None) -> None:
        for name, pair in (("target_from", target_from), ("draft_from", draft_from)):
            if pair is not None and not isinstance(pair, ModelPair):
                raise TypeError(f"{name}: expected a model pair, got {type(pair).__name__}")
        if draft_from is not None and draft_from.vocab_size != target_from.vocab_size:
            raise ValueError(
                f"draft_from: vocabulary {draft_from.vocab_size} != {target_from.vocab_size}"
            )
        self._target_from, self._draft_from = target_from, draft_from

    @property
    def vocab_size(self) -> int:
        return self._target_from.vocab_size

    def target(self, prefix: Prefix) -> Probs:
        return self._target_from.target(prefix)

    def draft(self, prefix: Prefix) -> Probs:
        if self._draft_from is None:
            return self._target_from.target(prefix)
        return self._draft_from.draft(prefix)

    def __repr__(self) -> str:
        return f"Swapped({self._target_from!r}, {self._draft_from!r})"


def _show(probs: Probs) -> str:
    """Readable values: ``1/3`` for exact entries, ``0.7`` for floats."""
    return "[" + ", ".join(str(x) if probs.dtype == object else f"{x:.6g}" for x in probs) + "]"
