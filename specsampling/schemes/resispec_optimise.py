r"""ResiSpec's default policy: per node, the best member of the policy family by closed form.

:func:`optimise` searches greedy (SpecInfer), SpecTr's constant ratio and a grid of
confidence-damping rules, scoring each with the i.i.d. closed form
(:func:`~specsampling.schemes.resispec_policy.evaluate_rules`); large float vocabularies are
searched on a compressed vocabulary and the finalists evaluated exactly. :class:`Optimised` is
the policy that applies it at every node, memoised by the node's distributions.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .._types import Probs
from ..ops import memo_by_distribution
from ..validation import check_pair, check_positive_int
from .resispec_policy import (
    ConfidenceDamping,
    ConstantRatio,
    Greedy,
    Policy,
    Stage,
    evaluate_rules,
    node_rho,
    rule_acceptance,
)

#: The optimiser's damping grid: :math:`s \in \{0, 1/40, \dots, 39/40\}` (:math:`s = 1` is greedy).
GRID_STEPS = 40
#: At most this many thresholds :math:`\tau` (else top-m sets with m on a geometric grid).
MAX_THRESHOLDS = 32
#: Float vocabularies above this are searched on a compressed vocabulary (see :func:`optimise`).
COMPRESS_ABOVE = 4096
#: Ratio bins per octave of :math:`p/q` in the compressed search.
BINS_PER_OCTAVE = 8
#: Damping rules re-evaluated exactly after a compressed search.
FINALISTS = 4


@dataclass(frozen=True)
class Optimised(Policy):
    """Per node, the member of :func:`optimise`'s family with the largest closed-form acceptance.

    The objective is the i.i.d. closed form; without replacement it is a surrogate (exactness is
    unaffected, acceptance is not guaranteed to beat RSD).
    """

    steps: int = GRID_STEPS
    max_thresholds: int = MAX_THRESHOLDS
    oblivious: ClassVar[bool] = True

    def at_node(self, target: Probs, draft: Probs, num_candidates: int) -> Policy:
        return _cached_optimise(target, draft, num_candidates, self.steps, self.max_thresholds)

    def sub_target(self, stage: Stage) -> Probs:
        return self.at_node(stage.target, stage.draft, stage.count).sub_target(stage)


class Choice(NamedTuple):
    """The optimiser's pick: a resolved policy and its closed-form acceptance."""

    policy: Policy
    acceptance: Any


def optimise(
    target: Any,
    draft: Any,
    num_drafts: int,
    *,
    steps: int = GRID_STEPS,
    max_thresholds: int = MAX_THRESHOLDS,
) -> Choice:
    r"""Best member of the family for :math:`K` i.i.d. candidates, by closed-form acceptance.

    Candidates: greedy (SpecInfer), constant ratio at :math:`\rho^*` (SpecTr) and
    :class:`ConfidenceDamping` with one :math:`s \in \{0, 1/\text{steps}, \dots\}` and
    :math:`\tau` among the distinct values of :math:`q` (at most ``max_thresholds``: beyond, the
    :math:`m`-th largest :math:`q` for :math:`m` on a geometric grid). Ties keep the earlier
    member, so the result is never below SpecInfer or SpecTr. ``Fraction`` inputs stay exact
    (:math:`s` and :math:`\tau` rational). Float vocabularies above ``COMPRESS_ABOVE`` are searched
    on a compressed vocabulary (tokens merged by threshold class and :math:`\log_2(p/q)` bin, exact
    for equal ratios) and the best ``FINALISTS`` rules are then evaluated exactly.

    Examples
    --------
    >>> from fractions import Fraction as F
    >>> choice = optimise([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    >>> choice.policy
    ConfidenceDamping(scale=Fraction(13, 20), threshold=Fraction(1, 3), top=None)
    >>> choice.acceptance
    Fraction(679, 720)
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    steps = check_positive_int(steps, "steps")
    max_thresholds = check_positive_int(max_thresholds, "max_thresholds")
    return _optimise(target, draft, k, steps, max_thresholds)


# --------------------------------------------------------------------------- optimiser
def _optimise(target: Probs, draft: Probs, k: int, steps: int, max_thresholds: int) -> Choice:
    best = Choice(Greedy(), rule_acceptance(Greedy(), target, draft, k))
    if k == 1:
        return best
    ratio = ConstantRatio(node_rho(target, draft, k))
    best = max(best, Choice(ratio, rule_acceptance(ratio, target, draft, k)), key=_value)
    exact = target.dtype == object
    thresholds = _thresholds(draft, max_thresholds)
    if exact:
        scales: Probs = np.array([Fraction(i, steps) for i in range(steps)], dtype=object)
    else:
        scales = np.arange(steps) / steps
    classes = np.searchsorted(thresholds, draft, side="right")
    compressed = not exact and target.shape[0] > COMPRESS_ABOVE
    search = _compress(target, draft, classes) if compressed else (target, draft, classes)
    scored: list[tuple[Any, int, int]] = []
    for j in range(len(thresholds)):
        factors = np.where(search[2][None, :] > j, scales[:, None], 1 + 0 * scales[:, None])

        def damp(index: int, current: Probs, factors: Probs = factors) -> Probs:
            return current * factors if index < k else current

        values = evaluate_rules(search[0], search[1], k, damp)
        scored.extend((value, j, i) for i, value in enumerate(values))
    scored.sort(key=lambda item: item[0], reverse=True)
    for _, j, i in scored[: FINALISTS if compressed else 1]:
        scale = scales[i] if exact else float(scales[i])
        tau = thresholds[j] if exact else float(thresholds[j])
        rule = ConfidenceDamping(scale=scale, threshold=tau)
        best = max(best, Choice(rule, rule_acceptance(rule, target, draft, k)), key=_value)
    return best


def _value(choice: Choice) -> Any:
    return choice.acceptance


def _thresholds(draft: Probs, max_thresholds: int) -> Probs:
    """Ascending candidate thresholds :math:`\\tau`: distinct positive :math:`q`, capped."""
    positive = draft[np.asarray(draft > 0, dtype=bool)]
    values: Probs = np.unique(positive)
    if len(values) <= max_thresholds:
        return values
    descending = np.sort(positive)[::-1]
    sizes = np.unique(np.geomspace(1, len(descending), max_thresholds).round().astype(int))
    capped: Probs = np.unique(descending[sizes - 1])
    return capped


def _compress(target: Probs, draft: Probs, classes: Any) -> tuple[Probs, Probs, Any]:
    """Merge tokens of one threshold class and one :math:`\\log_2(p/q)` bin (float search)."""
    limit = 64 * BINS_PER_OCTAVE
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log2(target) - np.log2(draft)
    ratio = np.clip(np.nan_to_num(ratio), -65.0, 65.0)  # +-inf: no overflow in the product
    bins = np.clip(np.floor(ratio * BINS_PER_OCTAVE), -limit, limit)
    bins = np.where(target == 0, -limit - 1, np.where(draft == 0, limit + 1, bins))
    width = 2 * limit + 3
    keys, inverse = np.unique(classes * width + (bins + limit + 1).astype(int), return_inverse=True)
    merged_target = np.bincount(inverse, weights=target)
    merged_draft = np.bincount(inverse, weights=draft)
    return merged_target, merged_draft, keys // width


def _optimised_policy(
    target: Probs, draft: Probs, k: int, steps: int, max_thresholds: int
) -> Policy:
    return _optimise(target, draft, k, steps, max_thresholds).policy


#: Per-node optimisation, memoised by the node's distributions.
_cached_optimise = memo_by_distribution(_optimised_policy)


__all__ = [
    "BINS_PER_OCTAVE",
    "COMPRESS_ABOVE",
    "FINALISTS",
    "GRID_STEPS",
    "MAX_THRESHOLDS",
    "Choice",
    "Optimised",
    "optimise",
]
