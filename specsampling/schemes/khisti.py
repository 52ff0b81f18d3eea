r"""Khisti et al.'s canonical decomposition: importance-sampling selection, then one-draft SS.

Algorithm. At node :math:`v` with :math:`n \ge 2` i.i.d. candidates
:math:`\bar x = (x_1..x_n) \sim q` (a multiset, in drafting order) and truncation :math:`s`:

1. *Pair plans.* With :math:`r_1 = q`, for :math:`i = 2..n` solve the :math:`s`-truncated pairwise
   LP :math:`(w_i, r_i) = \mathrm{pair\_plan}(p, r_{i-1}, q, s)` (:func:`pair_plan`): rank the
   tokens by descending :math:`\kappa = p - r_{i-1} q` (ties by ascending id), let
   :math:`\Omega_1` be the top :math:`s`; a drafted pair is won by the higher-priority token,
   except that two distinct :math:`\Omega_1` tokens play a lottery with weight
   :math:`w_i[a, b]`; :math:`w_i` maximises :math:`\sum_{\Omega_1} \min(p, r_{w})`, and
   :math:`r_i` is the exact winner law **recomputed from the returned** :math:`w_i`.
2. *Selection.* A tournament: the winner of round :math:`i - 1` (law :math:`r_{i-1}`,
   independent of :math:`x_i`) plays :math:`x_i` by the pair rule of round :math:`i`; the final
   winner :math:`Y` has law exactly :math:`r_n`.
3. *Stage 2.* Keep :math:`Y` with probability :math:`\min(1, p(Y)/r_n(Y))`, otherwise emit
   :math:`y' \sim \mathrm{norm}((p - r_n)_+)` (the target when that residual has no mass).

Noise: the exact conditional law :math:`\pi(c \mid \bar x) = \sum_{x_j = c}
\mathrm{sel}(j \mid \bar x)\,\min(1, p(c)/r_n(c))` is drawn with **one** categorical over
(the distinct children in first-drafted order, then "reject") with ``noise.accept[first
child]``; a reject draws the residual with ``noise.sample[node]``. A node with one candidate
runs :func:`~specsampling.ops.standard_step` (:math:`r_1 = q`), so chains equal ``standard``.

Theorem. Lossless on i.i.d. drafts. Proof idea (the canonical decomposition): for **any**
selection rule whose selected token has law :math:`r`, keeping it with probability
:math:`\min(1, p/r)` and otherwise sampling :math:`\mathrm{norm}((p - r)_+)` outputs
:math:`\min(p, r) + (p - r)_+ = p`; :math:`r_n` is that law exactly, by induction over the
rounds. On trees, induct over depth (conditionally on the node, its candidates are i.i.d.).

Acceptance. :math:`\alpha = \sum_y \min(p(y), r_n(y)) + P(\text{hit})` (residual samples equal to
a draft); the first term, :func:`khisti_selection_acceptance`, is a lower bound. It equals the
optimum :math:`\alpha^*` for :math:`n = 2` and :math:`s \ge |\mathrm{supp}\, q|`; for
:math:`n \ge 3` the tournament is suboptimal. :meth:`Khisti.closed_acceptance` is ``None``:
the exact value comes from enumeration.

Not rational: the LP weights are floats (HiGHS dual simplex, ``method="highs-ds"``, pinned so
that LP-vertex-dependent values are reproducible); ``Fraction`` rows are converted to float64.

Reference: Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft Speculative
Sampling: Canonical Decomposition and Theoretical Limits", ICLR 2025, arXiv 2410.18234.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from .._types import Probs
from ..noise import Noise
from ..ops import (
    accept_probability,
    categorical,
    clip_probability,
    memo_by_distribution,
    residual,
    standard_step,
    standard_step_law,
)
from ..tree import DraftTree, DrawLaw
from ..validation import check_distribution, check_pair, check_positive_int
from .base import NodeScheme, Step

#: The truncation size :math:`s` used unless stated (the third-party code caps it at 15).
DEFAULT_TRUNCATION = 5
#: Largest accepted :math:`|\sum r - 1|` of a winner law (never renormalised).
MASS_TOLERANCE = 1e-12
#: Most negative accepted entry of a winner law (rounding in the recomputation).
NEGATIVE_TOLERANCE = 1e-15
#: The LP weight used everywhere when HiGHS does not report an optimum (``r`` recomputed from it).
FALLBACK_WEIGHT = 0.5

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


class PairPlan(NamedTuple):
    """The pair rule for two independent drafts :math:`X_1 \\sim q_1`, :math:`X_2 \\sim q_2`.

    ``rank[y]`` is token y's priority (0 first); ``top`` holds :math:`\\Omega_1` in rank order;
    ``weights[i, j]`` is :math:`w` for the ordered pair ``(top[i], top[j])``, the probability that
    the higher-priority token of the two wins (diagonal unused, 0); ``winner_law`` is the exact
    law of the winner under this rule; ``solved`` is ``False`` when the LP failed and the
    fallback :data:`FALLBACK_WEIGHT` was used.
    """

    rank: IntArray
    top: IntArray
    weights: FloatArray
    winner_law: FloatArray
    solved: bool

    def first_wins(self, first: int, second: int) -> float:
        """:math:`P(X_1 \\text{ wins})` for the drafted pair ``(first, second)``.

        >>> plan = pair_plan([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5], truncation=1)
        >>> plan.first_wins(1, 1), plan.first_wins(0, 2), plan.first_wins(2, 0)
        (1.0, 1.0, 0.0)
        """
        if first == second:
            return 1.0
        rank_first, rank_second = int(self.rank[first]), int(self.rank[second])
        size = len(self.top)
        if rank_first < size and rank_second < size:
            weight = float(self.weights[rank_first, rank_second])
            return weight if rank_first < rank_second else 1.0 - weight
        return 1.0 if rank_first < rank_second else 0.0


def pair_plan(
    target: Any, first_draft: Any, second_draft: Any, truncation: int = DEFAULT_TRUNCATION
) -> PairPlan:
    r"""The :math:`s`-truncated pairwise LP of Khisti et al. (Appendix I) and its exact winner law.

    Tokens are ranked by descending :math:`\kappa(y) = p(y) - q_1(y) q_2(y)`, ties by ascending
    token id; :math:`\Omega_1` is the top ``truncation`` tokens. A drafted pair
    :math:`(x_1, x_2)` is won by :math:`x_1` if :math:`x_1 = x_2`; by the higher-priority token
    with probability :math:`w[x_1, x_2]` when both are distinct tokens of :math:`\Omega_1`; by the
    higher-priority token otherwise. With :math:`t_i(y) = \sum_{\mathrm{rank}(z) >
    \mathrm{rank}(y)} q_i(z)` the winner law is, for :math:`y \in \Omega_2`,

    .. math:: r(y) = q_1(y) q_2(y) + q_1(y)\,t_2(y) + t_1(y)\,q_2(y),

    and for :math:`y \in \Omega_1` the same three terms over :math:`\Omega_2` partners plus
    :math:`q_1(a) q_2(b) w[a, b]` (to the higher-priority of :math:`a, b`) and
    :math:`q_1(a) q_2(b)(1 - w[a, b])` (to the other) for every ordered pair of distinct
    :math:`a, b \in \Omega_1`. The LP

    .. math:: \max_{w \in [0, 1],\, z} \sum_{y \in \Omega_1} z_y \quad\text{s.t.}\quad
              z_y \le p(y),\ z_y \le r_w(y)

    is solved by HiGHS dual simplex (``method="highs-ds"``). The returned law is recomputed
    from the returned :math:`w` (on LP failure from :math:`w = 1/2`), never taken from the
    solver, and checked: :math:`|\sum r - 1| \le 10^{-12}`, :math:`r \ge -10^{-15}`.

    Parameters
    ----------
    target, first_draft, second_draft : array_like, shape (vocab_size,)
        :math:`p`, :math:`q_1` and :math:`q_2` (float64, or ``Fraction`` entries, converted).
    truncation : int, default 5
        :math:`s \ge 1`, the size of :math:`\Omega_1` (at most the vocabulary is used).

    Returns
    -------
    PairPlan
        The rule (``rank``, ``top``, ``weights``) and its ``winner_law``, shape (vocab_size,).

    Examples
    --------
    >>> plan = pair_plan([1/2, 1/3, 1/6], [1/3] * 3, [1/3] * 3, truncation=3)
    >>> plan.top.tolist(), [round(float(x), 6) for x in plan.winner_law]
    ([0, 1, 2], [0.5, 0.333333, 0.166667])
    """
    size = check_positive_int(truncation, "truncation")
    target_probs = _float(check_distribution(target, "target"))
    vocab_size = target_probs.shape[0]
    first = _float(check_distribution(first_draft, "first_draft", vocab_size))
    second = _float(check_distribution(second_draft, "second_draft", vocab_size))
    return _pair_plan(target_probs, first, second, size)


def khisti_selection_acceptance(
    target: Any, draft: Any, num_drafts: int, truncation: int = DEFAULT_TRUNCATION
) -> float:
    r"""The lower bound :math:`\sum_y \min(p(y), r_n(y))` on Khisti's acceptance.

    :math:`r_n` is the exact law of the tournament winner among ``num_drafts`` i.i.d. drafts
    (:math:`r_1 = q`). The acceptance :math:`P(Y \in \text{drafts})` adds residual samples that
    equal a draft ("hits"): get it from ``ss.acceptance(Khisti(truncation), ...)``. For
    :math:`n = 2` and ``truncation`` at least the draft's support size the bound is the
    optimum :math:`\alpha^*`.

    Parameters
    ----------
    target, draft : array_like, shape (vocab_size,)
        :math:`p` and :math:`q`.
    num_drafts : int
        :math:`n \ge 1` i.i.d. drafts.
    truncation : int, default 5
        :math:`s`, the LP truncation.

    Examples
    --------
    >>> round(khisti_selection_acceptance([1/2, 1/3, 1/6], [1/3] * 3, 2, truncation=3), 6)
    1.0
    >>> round(khisti_selection_acceptance([1/2, 1/3, 1/6], [1/3] * 3, 2, truncation=2), 6)
    0.944444
    """
    target_probs, draft_probs = check_pair(target, draft)
    num = check_positive_int(num_drafts, "num_drafts")
    size = check_positive_int(truncation, "truncation")
    target_probs, draft_probs = _float(target_probs), _float(draft_probs)
    law = winner_law(_node_rounds(target_probs, draft_probs, num, size), draft_probs)
    return float(clip_probability(float(np.minimum(target_probs, law).sum())))


def winner_law(rounds: tuple[PairPlan, ...], draft: Probs) -> FloatArray:
    """:math:`r_n`: the last round's winner law, or the draft for a single draft."""
    law: FloatArray = rounds[-1].winner_law if rounds else draft
    return law


class Khisti(NodeScheme):
    """Khisti et al.'s importance-sampling selection with the truncated pair LP; i.i.d. drafts.

    >>> import specsampling as ss
    >>> from specsampling.schemes.khisti import SCHEME
    >>> round(float(ss.acceptance(SCHEME, [1/2, 1/3, 1/6], [1/3] * 3, 2)), 6)
    1.0
    >>> round(float(ss.acceptance(Khisti(truncation=2), [1/2, 1/3, 1/6], [1/3] * 3, 2)), 6)
    0.966667
    """

    name = "khisti"
    rational = False
    reference = (
        "Khisti et al. 2025, Multi-Draft Speculative Sampling: Canonical Decomposition and "
        "Theoretical Limits (ICLR 2025, arXiv 2410.18234)"
    )

    laws = frozenset({DrawLaw.IID})

    def __init__(self, truncation: int = DEFAULT_TRUNCATION) -> None:
        self.truncation = check_positive_int(truncation, "truncation")

    def __repr__(self) -> str:
        return f"<scheme {self.name!r} truncation={self.truncation}>"

    def rounds(self, target: Probs, draft: Probs, num_drafts: int) -> tuple[PairPlan, ...]:
        """The pair plans of rounds 2..n at a node (memoised; the hook mutants override)."""
        return _node_rounds(target, draft, num_drafts, self.truncation)

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        candidates = tree.candidates[node]
        if len(candidates) == 1:
            (child,) = candidates
            drawn = standard_step(
                target_probs[node],
                draft_probs[node],
                tree.tokens[child],
                noise.accept[child],
                noise.sample[node],
            )
            return (child, None) if drawn is None else (None, drawn)
        children, weights, law, target = self._decision(tree, node, target_probs, draft_probs)
        index = categorical(weights, noise.accept[children[0]])
        if index < len(children):
            return children[index], None
        return None, categorical(residual(target, law), noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        candidates = tree.candidates[node]
        if len(candidates) == 1:
            (child,) = candidates
            token = tree.tokens[child]
            accept, stop = standard_step_law(target_probs[node], draft_probs[node], token)
            return [(child, accept)], stop
        children, weights, law, target = self._decision(tree, node, target_probs, draft_probs)
        descend = [
            (child, float(weight)) for child, weight in zip(children, weights[:-1], strict=True)
        ]
        return descend, float(weights[-1]) * residual(target, law)

    def decision(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[Any], Any, Probs]:
        """``(pi per distinct child, pi_reject, residual)`` of a node with >= 2 candidates: the
        one categorical and its reject law (the torch lowering's host plan reads this)."""
        _, weights, law, target = self._decision(tree, node, target_probs, draft_probs)
        return [float(w) for w in weights[:-1]], float(weights[-1]), residual(target, law)

    def _decision(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[tuple[int, ...], FloatArray, FloatArray, FloatArray]:
        """``(children, [pi(child)..., pi_reject], r_n, target)`` at a node with n >= 2."""
        target = _normalised(target_probs[node])
        draft = _normalised(draft_probs[node])
        tokens = [tree.tokens[child] for child in tree.candidates[node]]
        rounds = self.rounds(target, draft, len(tokens))
        law = winner_law(rounds, draft)
        selected = selection(rounds, tokens)
        children = tree.children(node)
        weights = np.zeros(len(children) + 1)
        for index, child in enumerate(children):
            token = tree.tokens[child]
            chosen = selected.get(token, 0.0)
            weights[index] = chosen * float(accept_probability(target[token], law[token]))
        weights[-1] = clip_probability(1.0 - float(weights[:-1].sum()))
        return children, weights, law, target


def selection(rounds: tuple[PairPlan, ...], tokens: list[int]) -> dict[int, float]:
    """:math:`\\mathrm{sel}(\\cdot \\mid \\bar x)`: the tournament winner's law given the drafts.

    ``tokens`` are the drafts in drafting order; round ``i`` (``rounds[i - 2]``) plays the
    current winner (first in the pair) against ``tokens[i - 1]``.

    >>> plan = pair_plan([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5], truncation=1)
    >>> selection((plan,), [2, 0])
    {2: 0.0, 0: 1.0}
    """
    selected: dict[int, float] = {tokens[0]: 1.0}
    for plan, challenger in zip(rounds, tokens[1:], strict=True):
        after: dict[int, float] = {}
        for holder, mass in selected.items():
            keep = plan.first_wins(holder, challenger)
            after[holder] = after.get(holder, 0.0) + mass * keep
            after[challenger] = after.get(challenger, 0.0) + mass * (1.0 - keep)
        selected = after
    return selected


def _build_rounds(
    target: FloatArray, draft: FloatArray, num_drafts: int, truncation: int
) -> tuple[PairPlan, ...]:
    """Rounds 2..n: ``pair_plan(p, r_{i-1}, q, s)`` with :math:`r_1 = q` (pitfall 1.8.3)."""
    rounds: list[PairPlan] = []
    law = draft
    for _ in range(num_drafts - 1):
        plan = _pair_plan(target, law, draft, truncation)
        rounds.append(plan)
        law = plan.winner_law
    return tuple(rounds)


#: :func:`_build_rounds`, memoised: exact enumeration revisits the same node distributions.
_node_rounds = memo_by_distribution(_build_rounds)


def _pair_plan(
    target: FloatArray, first: FloatArray, second: FloatArray, truncation: int
) -> PairPlan:
    vocab_size = target.shape[0]
    score = target - first * second
    # Descending kappa; a stable sort keeps equal scores in ascending token id (pitfall 1.8.4).
    order: IntArray = np.argsort(-score, kind="stable")
    rank: IntArray = np.empty(vocab_size, dtype=np.intp)
    rank[order] = np.arange(vocab_size)
    top = order[: min(truncation, vocab_size)]
    weights = _solve_weights(target, first, second, order, len(top))
    solved = weights is not None
    if weights is None:
        weights = np.full((len(top), len(top)), FALLBACK_WEIGHT)
        np.fill_diagonal(weights, 0.0)
    law = _winner_law(first, second, order, weights)
    _check_law(law)
    for array in (rank, top, weights, law):
        array.setflags(write=False)
    return PairPlan(rank, top, weights, law, solved)


def _winner_law(
    first: FloatArray, second: FloatArray, order: IntArray, weights: FloatArray
) -> FloatArray:
    """Exact winner law of the pair rule with LP weights ``weights`` (the pair plan of
    ``docs/schemes/khisti.md``)."""
    size = weights.shape[0]
    first_sorted, second_sorted = first[order], second[order]
    law_sorted = first_sorted * second_sorted
    law_sorted += first_sorted * _tail(second_sorted) + _tail(first_sorted) * second_sorted
    if size > 1:
        # Omega_1 tokens: their tails above count Omega_2 partners only (ranks >= size), since
        # every Omega_1 token ranks before every Omega_2 token; add the lottery of every ordered
        # pair (top[i], top[j]), i != j, whose higher-priority token is top[min(i, j)].
        law_sorted[:size] = first_sorted[:size] * second_sorted[:size]
        law_sorted[:size] += first_sorted[:size] * float(second_sorted[size:].sum())
        law_sorted[:size] += float(first_sorted[size:].sum()) * second_sorted[:size]
        mass = np.outer(first_sorted[:size], second_sorted[:size])
        wins, losses = mass * weights, mass * (1.0 - weights)
        upper = np.triu(np.ones((size, size), dtype=bool), 1)
        lower = upper.T
        law_sorted[:size] += np.where(upper, wins, 0.0).sum(axis=1)
        law_sorted[:size] += np.where(upper, losses, 0.0).sum(axis=0)
        law_sorted[:size] += np.where(lower, wins, 0.0).sum(axis=0)
        law_sorted[:size] += np.where(lower, losses, 0.0).sum(axis=1)
    law: FloatArray = np.empty_like(law_sorted)
    law[order] = law_sorted
    return law


def _tail(values: FloatArray) -> FloatArray:
    """``out[i] = sum(values[i + 1:])``, computed as a suffix sum (no subtraction)."""
    out: FloatArray = np.zeros_like(values)
    out[:-1] = np.cumsum(values[::-1])[::-1][1:]
    return out


def _solve_weights(
    target: FloatArray, first: FloatArray, second: FloatArray, order: IntArray, size: int
) -> FloatArray | None:
    """The LP weights ``(size, size)`` (diagonal 0), or ``None`` when HiGHS reports no optimum.

    Variables: one ``w`` per ordered pair of distinct Omega_1 ranks (row-major), then one ``z``
    per Omega_1 token. Row ``k``: ``z_k - r_w(top[k]) <= 0`` written with the ``w`` terms on the
    left and the ``w``-free part of ``r`` on the right; ``z_k <= p(top[k])`` is a bound.
    """
    if size < 2:
        return np.zeros((size, size))
    top = order[:size]
    first_top, second_top = first[top], second[top]
    pairs = [(i, j) for i in range(size) for j in range(size) if i != j]
    num_pairs = len(pairs)
    matrix = np.zeros((size, num_pairs + size))
    constant = first_top * second_top
    constant += (
        first_top * float(second[order[size:]].sum())
        + float(first[order[size:]].sum()) * second_top
    )
    for column, (i, j) in enumerate(pairs):
        mass = first_top[i] * second_top[j]
        high, low = min(i, j), max(i, j)
        matrix[high, column] -= mass
        matrix[low, column] += mass
        constant[low] += mass
    matrix[:, num_pairs:] = np.eye(size)
    objective = np.concatenate([np.zeros(num_pairs), -np.ones(size)])
    bounds = [(0.0, 1.0)] * num_pairs + [(0.0, float(p)) for p in target[top]]
    from scipy.optimize import linprog  # imported here: half a second to import

    result = linprog(objective, A_ub=matrix, b_ub=constant, bounds=bounds, method="highs-ds")
    if result.status != 0 or result.x is None:
        return None
    weights = np.zeros((size, size))
    for column, (i, j) in enumerate(pairs):
        weights[i, j] = min(max(float(result.x[column]), 0.0), 1.0)
    return weights


def _check_law(law: FloatArray) -> None:
    """Pitfall 1.8.2: a wrong winner law is an error, never renormalised away."""
    mass = float(law.sum())
    if not abs(mass - 1.0) <= MASS_TOLERANCE:
        raise ValueError(
            f"khisti pair_plan: the winner law has mass {mass!r}, not 1 within "
            f"{MASS_TOLERANCE} (the drafts' laws must each sum to 1)"
        )
    smallest = float(law.min())
    if smallest < -NEGATIVE_TOLERANCE:
        raise ValueError(
            f"khisti pair_plan: the winner law has a negative entry {smallest!r} "
            f"at token {int(law.argmin())}"
        )


def _float(probs: Probs) -> FloatArray:
    out: FloatArray = np.asarray(probs, dtype=np.float64)
    return out


def _normalised(row: Probs) -> FloatArray:
    """A node's row as float64 of mass one (validated rows are within 1e-6 of it)."""
    values = _float(row)
    out: FloatArray = values / values.sum()
    return out


SCHEME = Khisti()
