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
from .validation import (
    MASS_TOLERANCE,
    check_distribution,
    check_pair,
    check_positive_int,
    check_token,
    is_exact,
)


@runtime_checkable
class ModelPair(Protocol):
    """What the exact engine and the samplers need from a model pair."""

    @property
    def vocab_size(self) -> int: ...

    def target(self, prefix: Prefix) -> Probs: ...

    def draft(self, prefix: Prefix) -> Probs: ...


def check_model_pair(pair: Any, name: str = "pair") -> ModelPair:
    """Return ``pair`` if it is a model pair (``vocab_size``, ``target``, ``draft``), else raise.

    Raises
    ------
    TypeError
        Naming ``name`` and what was passed, with the constructor to use instead: a
        ``(target, draft)`` tuple is :class:`Stationary`, a ``{prefix: (target, draft)}``
        mapping is :class:`Table`.
    ValueError
        If its ``vocab_size`` is not an integer >= 1.

    Examples
    --------
    >>> check_model_pair(([0.5, 0.5], [0.5, 0.5]))
    Traceback (most recent call last):
    ...
    TypeError: pair: expected a model pair (vocab_size, target(prefix), draft(prefix)), got tuple; for one target and draft distribution use specsampling.pairs.Stationary(target, draft)
    """  # noqa: E501
    if isinstance(pair, type) or not isinstance(pair, ModelPair):
        if isinstance(pair, type):
            got, hint = f"the class {pair.__name__}", "create an instance first"
        elif isinstance(pair, Mapping):
            got = type(pair).__name__
            hint = (
                "for distributions listed per prefix use "
                "specsampling.pairs.Table({prefix: (target, draft), ...})"
            )
        else:
            got = type(pair).__name__
            hint = (
                "for one target and draft distribution use "
                "specsampling.pairs.Stationary(target, draft)"
            )
        raise TypeError(
            f"{name}: expected a model pair (vocab_size, target(prefix), draft(prefix)), "
            f"got {got}; {hint}"
        )
    check_positive_int(pair.vocab_size, f"{name}.vocab_size")
    return pair


class Stationary:
    """The same target and draft distribution after every prefix.

    ``tolerance`` is the float mass tolerance (default ``1e-6``); raise it for probabilities
    computed in low precision (float32, fp16, bf16), which are then renormalised in float64.

    >>> from fractions import Fraction as F
    >>> pair = Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> pair.vocab_size, pair.target((1, 0))[1]
    (2, Fraction(2, 3))
    >>> float(Stationary([0.5, 0.5007], [0.5, 0.5], tolerance=1e-2).target(()).sum())
    1.0
    """

    def __init__(self, target: Any, draft: Any, *, tolerance: float = MASS_TOLERANCE) -> None:
        self._target, self._draft = check_pair(target, draft, tolerance=tolerance)

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

    Prefixes are tuples of token ids in ``[0, vocab_size)``; every row is validated (all exact
    or all float, one vocabulary; ``tolerance`` as in :class:`Stationary`). A prefix missing
    from the table raises ``KeyError`` naming it.

    >>> pair = Table({(): ([1.0, 0.0], [0.5, 0.5]), (0,): ([0.5, 0.5], [0.5, 0.5])})
    >>> pair.draft((0,))
    array([0.5, 0.5])
    """

    def __init__(
        self, mapping: Mapping[Prefix, tuple[Any, Any]], *, tolerance: float = MASS_TOLERANCE
    ) -> None:
        if not isinstance(mapping, Mapping):
            raise TypeError(
                "mapping: expected a dict {prefix: (target, draft)}, "
                f"got {type(mapping).__name__}"
            )
        if not mapping:
            raise ValueError("mapping: needs at least one prefix")
        self._rows: dict[Prefix, tuple[Probs, Probs]] = {}
        size: int | None = None
        exact: bool | None = None
        for prefix, rows in mapping.items():
            if not isinstance(prefix, (tuple, list)):
                raise TypeError(
                    f"mapping: keys are prefixes, tuples of token ids such as () or (0, 2), "
                    f"got {type(prefix).__name__} {prefix!r}"
                )
            if not isinstance(rows, (tuple, list)) or len(rows) != 2:
                raise ValueError(
                    f"mapping[{tuple(prefix)!r}]: expected a (target, draft) pair of "
                    f"distributions, got {type(rows).__name__}"
                    + (f" of length {len(rows)}" if isinstance(rows, (tuple, list)) else "")
                )
            target, draft = rows
            if np.ndim(target) == 0 and np.ndim(draft) == 0:
                raise ValueError(
                    f"mapping[{tuple(prefix)!r}]: expected a (target, draft) pair of "
                    f"distributions, got two numbers {rows!r}"
                )
            label = f"mapping[{tuple(prefix)!r}]"
            t = check_distribution(target, f"{label}.target", size, tolerance=tolerance)
            size = int(t.shape[0])
            d = check_distribution(draft, f"{label}.draft", size, tolerance=tolerance)
            key = tuple(check_token(token, f"{label}: prefix token", size) for token in prefix)
            if exact is None:
                exact = is_exact(t)
            if is_exact(t) != exact or is_exact(d) != exact:
                raise ValueError(
                    f"{label}: every row both exact (Fraction) or every row float, not mixed"
                )
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
        if not isinstance(exact, (bool, np.bool_)):
            raise TypeError(f"exact: expected True or False, got {exact!r}")
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
        check_model_pair(target_from, "target_from")
        if draft_from is not None:
            check_model_pair(draft_from, "draft_from")
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


class Perturbed:
    """``pair`` with its draft mixed with ``weight`` of the uniform law (same support
    structure up to ``weight``): race winners move only near ties. Certify's conditional
    drafter-invariance check uses it.

    >>> base = Random(4, seed=0)
    >>> moved = Perturbed(base, weight=0.5).draft(())
    >>> bool(abs(moved.sum() - 1) < 1e-12), bool(np.all(moved >= 0.125))
    (True, True)
    """

    def __init__(self, pair: ModelPair, weight: float = 1e-6) -> None:
        self._pair = check_model_pair(pair)
        if not 0 <= weight <= 1:
            raise ValueError(f"weight: expected a number in [0, 1], got {weight!r}")
        self._weight = weight

    @property
    def vocab_size(self) -> int:
        return self._pair.vocab_size

    def target(self, prefix: Prefix) -> Probs:
        return self._pair.target(prefix)

    def draft(self, prefix: Prefix) -> Probs:
        draft = np.asarray(self._pair.draft(prefix), dtype=np.float64)
        mixed: Probs = (1 - self._weight) * draft + self._weight / draft.shape[0]
        return mixed
