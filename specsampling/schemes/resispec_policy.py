r"""ResiSpec's shaping policies: the sub-target contract, the policy family and the closed form.

A policy chooses the sub-target :math:`0 \le a_k \le t_k` of every stage from a :class:`Stage`,
which holds nothing about the candidate being tested or later ones; :func:`check_sub_target`
enforces the bound. For oblivious policies (sub-targets that ignore earlier candidates) the
acceptance with i.i.d. candidates has a closed form, :func:`evaluate_rules`, vectorised over the
vocabulary and over a batch of rules. The scheme is :mod:`specsampling.schemes.resispec`; the
optimiser over this family is :mod:`specsampling.schemes.resispec_optimise`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from .._types import Prefix, Probs, Scalar
from ..ops import memo_by_distribution
from ..validation import check_positive_int
from .greedy import top_tokens
from .spectr import optimal_rho

#: Relative tolerance of the float check :math:`a_k \le t_k` (few-ulp overshoots are clamped).
RTOL = 1e-12


@dataclass(frozen=True, eq=False)
class Stage:
    """What a policy may read at candidate ``index``: never the candidate itself or later ones.

    Attributes
    ----------
    target, draft : ndarray, shape (vocab_size,)
        :math:`p` and :math:`q` at the node (read-only).
    current : ndarray, shape (vocab_size,)
        The shaped target :math:`t_k` (read-only); :math:`t_1 = p`.
    proposal : ndarray, shape (vocab_size,)
        :math:`q_k`, the law candidate ``index`` was drawn from (read-only).
    index, count : int
        :math:`k` (from 1) and the number of candidates :math:`K` at the node.
    earlier : tuple of int
        Tokens :math:`x_1..x_{k-1}`; empty in the closed form (oblivious policies only).
    """

    target: Probs
    draft: Probs
    current: Probs
    proposal: Probs
    index: int
    count: int
    earlier: Prefix


class Policy(ABC):
    """A shaping rule: the sub-target :math:`a_k` of every stage.

    :meth:`at_node` resolves per-node parameters once (from :math:`p, q, K` only); the verifier
    then calls :meth:`sub_target` of the result at every stage.
    """

    #: ``True`` when :meth:`sub_target` never reads ``stage.earlier``; only such policies have
    #: the closed form (their sub-targets are deterministic under i.i.d. drafting).
    oblivious: ClassVar[bool] = False

    def at_node(self, target: Probs, draft: Probs, num_candidates: int) -> Policy:
        """The rule used at a node with these distributions and candidate count."""
        return self

    @abstractmethod
    def sub_target(self, stage: Stage) -> Probs:
        """:math:`a_k`, shape ``(vocab_size,)``, with :math:`0 \\le a_k \\le t_k`."""


@dataclass(frozen=True)
class Greedy(Policy):
    """:math:`a_k = t_k`: SpecInfer with i.i.d. drafts, RSD without replacement."""

    oblivious: ClassVar[bool] = True

    def sub_target(self, stage: Stage) -> Probs:
        return stage.current


@dataclass(frozen=True)
class ConstantRatio(Policy):
    r""":math:`a_k = \min(t_k, q_k, p/\rho)`; ``rho=None`` takes SpecTr's :math:`\rho^*(p, q, K)`.

    With i.i.d. drafts and :math:`\rho^*` the cap :math:`t_k` is inactive (exactly, for
    ``Fraction`` inputs) and the rule is SpecTr K-SEQ; without replacement the cap keeps it valid.
    """

    rho: Scalar | None = None
    oblivious: ClassVar[bool] = True

    def __post_init__(self) -> None:
        rho = self.rho
        if rho is not None and (
            isinstance(rho, (bool, np.bool_))
            or not isinstance(rho, (int, float, Fraction, np.integer, np.floating))
            or not 0 < rho < float("inf")
        ):
            raise ValueError(f"rho: expected None or a finite number > 0, got {rho!r}")

    def at_node(self, target: Probs, draft: Probs, num_candidates: int) -> Policy:
        if self.rho is not None:
            return self
        return ConstantRatio(node_rho(target, draft, num_candidates))

    def sub_target(self, stage: Stage) -> Probs:
        rho = self.rho
        if rho is None:
            rho = node_rho(stage.target, stage.draft, stage.count)
        capped: Probs = np.minimum(np.minimum(stage.target / rho, stage.proposal), stage.current)
        return capped


@dataclass(frozen=True)
class ConfidenceDamping(Policy):
    r"""Damp the draft's high-confidence set :math:`H` on every candidate but the last.

    :math:`a_k = s_k t_k` on :math:`H` and :math:`t_k` elsewhere for :math:`k < K`,
    :math:`a_K = t_K`, with :math:`H = \{x : q(x) \ge \tau\}` (``threshold``; the default 0 damps
    every token) or the ``top`` most probable draft tokens. ``scale`` is one :math:`s` or one per
    candidate (the last entry repeats).
    """

    scale: Scalar | tuple[Scalar, ...] = Fraction(1, 2)
    threshold: Scalar = 0
    top: int | None = None
    oblivious: ClassVar[bool] = True

    def __post_init__(self) -> None:
        scales = self.scale if isinstance(self.scale, tuple) else (self.scale,)
        if not scales or not all(0 <= s <= 1 for s in scales):
            raise ValueError(f"scale: every damping factor must lie in [0, 1], got {self.scale}")
        if self.top is not None:
            check_positive_int(self.top, "top")

    def mask(self, draft: Probs) -> Any:
        """Boolean mask of :math:`H`."""
        if self.top is not None:
            return top_tokens(draft, self.top)
        return np.asarray(draft >= self.threshold, dtype=bool)

    def sub_target(self, stage: Stage) -> Probs:
        if stage.index >= stage.count:
            return stage.current
        scales = self.scale if isinstance(self.scale, tuple) else (self.scale,)
        scale = scales[min(stage.index, len(scales)) - 1]
        damped: Probs = np.where(self.mask(stage.draft), scale * stage.current, stage.current)
        return damped


def check_sub_target(values: Any, stage: Stage, policy: Any) -> Probs:
    """Enforce :math:`0 \\le a_k \\le t_k` pointwise; return :math:`a_k` (floats: clamped).

    ``Fraction`` stages compare exactly. Floats allow a relative excess of ``RTOL`` (rounding,
    clamped to the bound); anything more raises :class:`ValueError` naming the policy and stage.

    >>> import numpy as np
    >>> stage = Stage(*[np.array([0.5, 0.5])] * 4, index=1, count=2, earlier=())
    >>> check_sub_target(np.array([0.5, 0.5 * (1 + 1e-15)]), stage, "demo")
    array([0.5, 0.5])
    >>> check_sub_target(np.array([0.6, 0.4]), stage, "demo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: resispec: policy 'demo' broke ... candidate 1 of 2: a_k > t_k at token 0 (0.6 > 0.5)
    """
    current = stage.current
    sub = np.asarray(values)
    where = f"resispec: policy {policy!r} broke the sub-target contract at candidate "
    where += f"{stage.index} of {stage.count}"
    if sub.shape != current.shape:
        raise ValueError(f"{where}: expected shape {current.shape}, got {sub.shape}")
    exact = current.dtype == object
    if exact and sub.dtype != object:
        raise ValueError(f"{where}: Fraction inputs need an exact (object) sub-target")
    if exact:
        low, high = sub < 0, sub > current
    else:
        sub = sub.astype(np.float64)
        slack = RTOL * np.maximum(np.abs(sub), current)
        low, high = ~(sub >= -slack), sub - current > slack
    for bad, relation in ((high, ">"), (low, "<")):
        token = np.flatnonzero(np.asarray(bad, dtype=bool))
        if token.size:
            x = int(token[0])
            bound = current[x] if relation == ">" else 0
            raise ValueError(
                f"{where}: a_k {relation} {'t_k' if relation == '>' else '0'} at "
                f"token {x} ({sub[x]} {relation} {bound})"
            )
    if exact:
        return sub
    clamped: Probs = np.minimum(np.maximum(sub, 0.0), current)
    return clamped


# --------------------------------------------------------------------------- closed form
#: Sub-targets of a batch of rules: ``(stage index, current (rows, V)) -> (rows, V)``.
Shaper = Callable[[int, Probs], Probs]


def evaluate_rules(target: Probs, draft: Probs, k: int, shaper: Shaper) -> Probs:
    """The closed form for a batch of oblivious rules (one per row), i.i.d. candidates.

    Each stage's arrays are worked on in place where they are this function's own (``kept``,
    ``rest``): the same operations on the same values as forming new ones (``missing`` is
    multiplied in the other order, exact for floats and Fractions alike), without allocating
    four ``(rows, V)`` temporaries a stage (the optimiser's search spends most of its time
    here)."""
    current: Probs = target[None, :]
    rejected: Any = 1
    missing: Any = 1
    for index in range(1, k + 1):
        kept = np.minimum(shaper(index, current), draft)  # a new array: ours from here
        rest = current - kept  # a new array: ours
        mass = rest.sum(axis=-1)
        sure = ~np.asarray(mass > 0, dtype=bool)
        safe = np.where(sure, 1, mass)[:, None]
        factor = np.subtract(draft, kept, out=kept)  # draft - kept, in kept's place
        factor /= safe
        np.subtract(1, factor, out=factor)  # 1 - (draft - kept) / safe
        missing = factor if index == 1 else np.multiply(factor, missing, out=factor)
        rejected = rejected * np.where(sure, 0 * mass, mass)
        rest /= safe
        current = rest
    hits = (current * (1 - missing)).sum(axis=-1)
    values: Probs = 1 - rejected + rejected * hits
    return values


def rule_acceptance(rule: Policy, target: Probs, draft: Probs, k: int) -> Any:
    """The closed-form acceptance of one oblivious rule with ``k`` i.i.d. candidates."""

    def shaper(index: int, current: Probs) -> Probs:
        stage = Stage(target, draft, current[0], draft, index, k, ())
        return check_sub_target(rule.sub_target(stage), stage, rule)[None, :]

    return evaluate_rules(target, draft, k, shaper)[0]


#: SpecTr's :math:`\rho^*` per node, memoised by the node's distributions.
node_rho = memo_by_distribution(optimal_rho)

__all__ = [
    "RTOL",
    "ConfidenceDamping",
    "ConstantRatio",
    "Greedy",
    "Policy",
    "Shaper",
    "Stage",
    "check_sub_target",
    "evaluate_rules",
    "node_rho",
    "rule_acceptance",
]
