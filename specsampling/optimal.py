r"""The theoretical optimum of single-position multi-draft acceptance (Hu et al., arXiv 2502.18779).

Drafts :math:`\bar x = (x_1..x_k)` have law :math:`Q` (i.i.d. from :math:`q`, or sequentially
without replacement); the target token :math:`Y` has law :math:`p`. Over all couplings
:math:`\pi` of :math:`Q` and :math:`p` (every lossless verifier is one), the best acceptance is
the optimal-transport LP

.. math:: \alpha^* = \max_{\pi \ge 0} \sum_{\bar x} \sum_{y \in \bar x} \pi(\bar x, y)
          \quad\text{s.t.}\quad \sum_y \pi(\bar x, y) \le Q(\bar x),\
          \sum_{\bar x} \pi(\bar x, y) \le p(y),

(the max-flow form: equalities relaxed to :math:`\le`, same optimum, robust to rounding). Its dual
is a min-cut over token sets :math:`H`:

.. math:: \alpha^* = \min_{H \subseteq \mathcal V}
          \bigl[\, p(H) + \Pr_Q(\text{some draft} \notin H) \,\bigr]
          = \min_H \bigl[\, p(H) + 1 - W(H) \,\bigr],

with :math:`W(H) = q(H)^k` for i.i.d. drafts and :math:`W(H) = \Pr(\text{all } k \text{ draws}
\in H)` without replacement.

**Prefix property.** Some minimising :math:`H` is a prefix of the tokens sorted by ascending
:math:`p/q` (:math:`q = 0` last). It follows from the exchange inequality
:math:`[W(H) - W(H - x)]/q(x) \le [W(H + y) - W(H)]/q(y)` (:math:`x \in H`, :math:`y \notin H`),
which holds for i.i.d. drafts by convexity of :math:`t \mapsto t^k` and without replacement for
:math:`k = 2` by an explicit formula (``docs/optimal.md``); for :math:`k \ge 3` without
replacement it is verified numerically only. Hence the :math:`O(V \log V)` i.i.d. closed form
:math:`\alpha^* = \min_j [P_j + 1 - Q_j^k]` over cumulative sums, while without replacement
:func:`optimal_acceptance` minimises over **all** subsets when the draft has at most
:data:`MAX_SUBSET_SUPPORT` tokens and over the sorted prefixes beyond, with :math:`W` from the
exponential-race quadrature of :mod:`specsampling._optimal_race`.

Reference: Hu et al., "Towards Optimal Multi-draft Speculative Decoding", arXiv 2502.18779.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _optimal_race
from ._types import Probs
from .pairs import Stationary
from .shapes import Shape, check_shape
from .validation import check_pair, check_positive_int, is_exact

#: Draft supports up to this size are minimised over every subset (exact, Fraction-capable).
MAX_SUBSET_SUPPORT = 12
#: :func:`lp_acceptance` refuses LPs with more variables than this.
MAX_LP_VARIABLES = 50_000
#: Prefixes whose i.i.d. lower bound is within this of the best value found are evaluated
#: (above the exponential-race error, about 1e-13).
PRUNE_MARGIN = 1e-10
#: Prefixes evaluated per exponential-race pass of the branch and bound.
BATCH = 2048


def optimal_acceptance(target: Any, draft: Any, num_drafts: int, replacement: bool = True) -> Any:
    r"""The LP optimum :math:`\alpha^*` of :math:`P(Y \in \text{drafts})` at one position.

    Parameters
    ----------
    target, draft : array_like, shape (vocab_size,)
        :math:`p` and :math:`q`: float64, or ``Fraction`` entries for an exact result.
    num_drafts : int
        :math:`k \ge 1` drafts.
    replacement : bool
        ``True``: i.i.d. drafts from :math:`q`; ``False``: sequentially without replacement
        (fewer than :math:`k` if the support of :math:`q` is smaller).

    Returns
    -------
    Fraction or float
        The optimum, in ``[0, 1]``. With ``Fraction`` inputs it is an exact ``Fraction`` for
        i.i.d. drafts and, without replacement, when the draft has at most
        :data:`MAX_SUBSET_SUPPORT` tokens (or at most ``num_drafts``); otherwise a float.

    Notes
    -----
    i.i.d.: sort tokens by ascending :math:`p/q` (:math:`q = 0` last, ties in any order), then

    .. math:: \alpha^* = \min_{j = 0..V} \bigl[P_j + 1 - Q_j^k\bigr],

    :math:`O(V \log V)`, exact to rounding (the complement :math:`1 - Q_j^k` is computed from
    suffix sums); about 15 ms at vocabulary 150,000.

    Without replacement: exact minimisation over all subsets of the draft's support up to
    :data:`MAX_SUBSET_SUPPORT` tokens, :math:`O(2^V V)`. Beyond, the minimum over the sorted
    prefixes (the prefix property, numerically verified for :math:`k \ge 3`) with :math:`W`
    from the exponential-race quadrature, absolute error below ``1e-12`` (worst measured
    against exact enumeration about ``6e-14``, subnormal masses included); a branch and bound
    integrates only prefixes that can still be the minimum (80-230 ms for k = 2..8 at
    vocabulary 150,000).

    Examples
    --------
    >>> from fractions import Fraction as F
    >>> optimal_acceptance([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(1, 1)
    >>> optimal_acceptance([F(1, 2), F(1, 2)], [F(3, 4), F(1, 4)], 2)
    Fraction(15, 16)
    >>> optimal_acceptance([F(1, 2), F(1, 2)], [F(3, 4), F(1, 4)], 2, replacement=False)
    Fraction(1, 1)
    >>> round(optimal_acceptance([0.6, 0.3, 0.1], [0.1, 0.3, 0.6], 2), 6)
    0.59
    >>> round(optimal_acceptance([0.6, 0.3, 0.1], [0.1, 0.3, 0.6], 2, replacement=False), 6)
    0.692857
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    if not _check_flag(replacement, "replacement"):
        return _without_optimum(target, draft, k)
    return _iid_optimum(target, draft, k)


def lp_acceptance(
    target: Any,
    draft: Any,
    num_drafts: int,
    replacement: bool = True,
    *,
    shape: Shape | None = None,
) -> float:
    r"""Solve the acceptance LP itself (HiGHS), over every ordered draft tuple: small cases only.

    Builds the max-flow form of the module docstring with one variable
    :math:`\pi(\bar x, y)` per ordered tuple :math:`\bar x` of positive probability and distinct
    token :math:`y \in \bar x`: i.i.d. tuples have :math:`Q(\bar x) = \prod_i q(x_i)`, tuples
    without replacement :math:`Q(\bar x) = \prod_i q(x_i) / (1 - \sum_{j<i} q(x_j))`, of length
    :math:`\min(k, |\mathrm{supp}\, q|)`. An independent check of :func:`optimal_acceptance`;
    float result (``Fraction`` inputs are converted).

    Parameters
    ----------
    target, draft : array_like, shape (vocab_size,)
        :math:`p` and :math:`q`.
    num_drafts : int
        :math:`k`.
    replacement : bool
        i.i.d. (``True``) or without-replacement (``False``) draft tuples.
    shape : Shape, optional
        A single-position shape (depth 1, e.g. ``Shape.greedy((3,))`` or ``Shape.hub()``): its
        own draft law, from :meth:`Shape.enumerate`, replaces the star of ``num_drafts`` and
        ``replacement``; the result is the optimum for that draft law.

    Raises
    ------
    ValueError
        When the LP would have more than :data:`MAX_LP_VARIABLES` variables, or ``shape``
        drafts deeper than one position.

    Examples
    --------
    >>> round(lp_acceptance([1/2, 1/3, 1/6], [1/3] * 3, 2), 9)
    1.0
    >>> round(lp_acceptance([0.6, 0.3, 0.1], [0.1, 0.3, 0.6], 2), 9)
    0.59
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    replacement = _check_flag(replacement, "replacement")
    p = np.asarray(target, dtype=np.float64)
    if shape is not None:
        return _solve_lp(p, _shape_tuples(check_shape(shape), target, draft))
    q = np.asarray(draft, dtype=np.float64)
    tokens = [int(x) for x in np.flatnonzero(q > 0)]
    size = len(tokens)
    length = k if replacement else min(k, size)
    if replacement:
        num_tuples = size**length
        variables = size * (size**length - (size - 1) ** length)
    else:
        num_tuples = math.perm(size, length)
        variables = length * num_tuples
    if variables > MAX_LP_VARIABLES:
        raise ValueError(
            f"lp_acceptance: {num_tuples:,} draft tuples ({size} draft tokens, "
            f"num_drafts={k}) give {variables:,} LP variables, more than "
            f"MAX_LP_VARIABLES={MAX_LP_VARIABLES:,}; use optimal_acceptance"
        )
    tuples = (
        itertools.product(tokens, repeat=length)
        if replacement
        else itertools.permutations(tokens, length)
    )
    return _solve_lp(p, ((drafts, _tuple_probability(q, drafts, replacement)) for drafts in tuples))


def _solve_lp(target: Probs, tuples: Iterable[tuple[tuple[int, ...], float]]) -> float:
    """Max-flow LP: variable ``pi(tuple, y)`` sits in its tuple's row and in token ``y``'s row."""
    bounds: list[float] = []
    tuple_of: list[int] = []  # per variable: its tuple
    token_of: list[int] = []  # per variable: its token y
    for row, (drafts, prob) in enumerate(tuples):
        bounds.append(prob)
        for y in sorted(set(drafts)):
            tuple_of.append(row)
            token_of.append(y)
        if len(tuple_of) > MAX_LP_VARIABLES:
            raise ValueError(
                f"lp_acceptance: more than MAX_LP_VARIABLES={MAX_LP_VARIABLES:,} LP variables"
            )
    num_tuples, num_vars = len(bounds), len(tuple_of)
    rows = np.concatenate([tuple_of, np.add(token_of, num_tuples)]).astype(np.intp)
    cols = np.concatenate([np.arange(num_vars), np.arange(num_vars)])
    from scipy import sparse  # imported here: scipy.optimize costs half a second to import
    from scipy.optimize import linprog

    matrix = sparse.csr_array(
        (np.ones(2 * num_vars), (rows, cols)), shape=(num_tuples + len(target), num_vars)
    )
    result = linprog(
        -np.ones(num_vars),
        A_ub=matrix,
        b_ub=np.concatenate([bounds, target]),
        bounds=(0, None),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if result.status != 0:
        raise RuntimeError(f"lp_acceptance: HiGHS failed: {result.message}")
    return float(min(max(-result.fun, 0.0), 1.0))


def _shape_tuples(
    shape: Shape, target: Probs, draft: Probs
) -> Iterator[tuple[tuple[int, ...], float]]:
    if shape.depth != 1:
        raise ValueError(f"lp_acceptance: shape must draft one position (depth 1), got {shape!r}")
    for tree, weight in shape.enumerate(Stationary(target, draft)):
        yield tuple(tree.tokens[c] for c in tree.children(0)), float(weight)


# ---------------------------------------------------------------- i.i.d. drafts


def _iid_optimum(target: Probs, draft: Probs, k: int) -> Any:
    order = _ratio_order(target, draft)
    if is_exact(target):
        inside = np.cumsum(draft[order])
        spent = np.cumsum(target[order])
        values = [Fraction(1)] + [s + 1 - h**k for s, h in zip(spent, inside, strict=True)]
        return min(values)
    spent = np.concatenate([[0.0], np.cumsum(target[order])])
    rest = np.clip(np.concatenate([np.cumsum(draft[order][::-1])[::-1], [0.0]]), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        missed = -np.expm1(k * np.log1p(-rest))  # 1 - Q_j^k = 1 - (1 - q(A_j))^k
    return float(np.clip((spent + missed).min(), 0.0, 1.0))


# ---------------------------------------------------------------- without replacement


def _without_optimum(target: Probs, draft: Probs, k: int) -> Any:
    support = [int(x) for x in np.flatnonzero(np.asarray(draft > 0, dtype=bool))]
    if k >= len(support):  # every supported token is drafted
        return _float_or_exact(sum(target[support], 0 * target[0]))
    if k == 1:
        return _iid_optimum(target, draft, 1)
    if len(support) <= MAX_SUBSET_SUPPORT:
        return _subset_optimum(target[support].tolist(), draft[support].tolist(), k)
    return _prefix_optimum(
        np.asarray(target, dtype=np.float64), np.asarray(draft, dtype=np.float64), k
    )


def _subset_optimum(target: list[Any], draft: list[Any], k: int) -> Any:
    r"""Exact :math:`\min_H [p(H) + 1 - W(H)]` over every subset of the (positive) draft.

    ``first[S]`` is the probability that the first :math:`|S|` draws are the set :math:`S`
    (in any order), built over subsets by the last draw; :math:`W(H)` sums it over the
    :math:`k`-subsets of :math:`H` (a subset-sum transform). :math:`O(2^V V)`.
    """
    size = len(draft)
    full = (1 << size) - 1
    zero = 0 * draft[0]
    mass = [zero] * (full + 1)
    spent = [zero] * (full + 1)
    bits = [0] * (full + 1)
    for mask in range(1, full + 1):
        low = (mask & -mask).bit_length() - 1
        mass[mask] = mass[mask & (mask - 1)] + draft[low]
        spent[mask] = spent[mask & (mask - 1)] + target[low]
        bits[mask] = bits[mask & (mask - 1)] + 1
    first = [zero] * (full + 1)
    first[0] = zero + 1
    for mask in range(1, full + 1):
        if bits[mask] > k:
            continue
        for x in range(size):
            if mask >> x & 1:
                before = mask ^ (1 << x)
                first[mask] += first[before] * draft[x] / mass[full ^ before]
    inside = [first[m] if bits[m] == k else zero for m in range(full + 1)]
    for x in range(size):
        for mask in range(full + 1):
            if mask >> x & 1:
                inside[mask] += inside[mask ^ (1 << x)]
    return _float_or_exact(min(spent[m] + 1 - inside[m] for m in range(full + 1)))


def _prefix_optimum(target: Probs, draft: Probs, k: int) -> float:
    r"""Minimum over sorted prefixes :math:`H_j`, :math:`W` by the exponential race.

    Branch and bound over :math:`j`: :math:`W` is non-decreasing in :math:`j` and at most
    :math:`Q_j^k`, so with :math:`W` known at some prefixes, :math:`P_j + 1 - \min(Q_j^k,
    W_{j'})` (:math:`j'` the next evaluated prefix) bounds each unevaluated prefix's value from
    below. Prefixes whose bound is within :data:`PRUNE_MARGIN` of the best value found are
    evaluated, a batch of at most :data:`BATCH` per exponential-race pass, until none is left.
    """
    order = _ratio_order(target, draft)
    order = order[draft[order] > 0]
    inside = draft[order]
    spent = np.concatenate([[0.0], np.cumsum(target[order])])  # spent[j] = P_j
    size = inside.size
    rest = np.concatenate([np.cumsum(inside[::-1])[::-1] / inside.sum(), [0.0]])  # q(A_j)
    masses = np.full(size + 1, np.nan)  # W(H_j), evaluated lazily
    masses[:k] = 0.0  # fewer than k draftable tokens
    masses[size] = 1.0
    with np.errstate(divide="ignore"):
        iid_bound = np.exp(k * np.log1p(-np.clip(rest, 0.0, 1.0)))  # Q_j^k >= W_j
    batch = np.unique(np.linspace(k, size - 1, BATCH).astype(np.intp))
    while batch.size:
        masses[batch] = _optimal_race.prefix_masses(inside, k, batch)
        best = float(np.nanmin(spent + 1.0 - masses))
        following = np.minimum.accumulate(np.where(np.isnan(masses), 1.0, masses)[::-1])[::-1]
        lower = spent + 1.0 - np.minimum(iid_bound, following)
        alive = np.flatnonzero(np.isnan(masses) & (lower <= best + PRUNE_MARGIN))
        batch = alive[:: -(-alive.size // BATCH)] if alive.size else alive
    return float(np.clip(np.nanmin(spent + 1.0 - masses), 0.0, 1.0))


# ---------------------------------------------------------------- helpers


def _ratio_order(target: Probs, draft: Probs) -> npt.NDArray[np.intp]:
    """Token ids by ascending ``target / draft``; ``draft == 0`` last (ratio +inf)."""
    if is_exact(target):
        keys = [(q == 0, p / q if q else 0) for p, q in zip(target, draft, strict=True)]
        return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.intp)
    ratio = np.full(target.shape, np.inf)
    np.divide(target, draft, out=ratio, where=draft > 0)
    return np.argsort(ratio)


def _tuple_probability(draft: Probs, drafts: tuple[int, ...], replacement: bool) -> float:
    remaining = draft.copy()
    prob = 1.0
    for x in drafts:
        prob *= float(remaining[x] / remaining.sum())
        if not replacement:
            remaining[x] = 0.0
    return prob


def _float_or_exact(value: Any) -> Any:
    return value if isinstance(value, Fraction) else float(value)


def _check_flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return bool(value)
