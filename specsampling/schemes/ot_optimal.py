r"""OT-optimal verification: the optimal selected-token law, realised exactly by split trees.

Derived in this project (``docs/schemes/ot_optimal.md``); it reaches the
multi-draft optimum :math:`\alpha^*` of :func:`specsampling.optimal_acceptance` for i.i.d. drafts,
exactly with ``Fraction`` inputs.

Algorithm (per node with :math:`n \ge 2` i.i.d. candidates; one candidate is standard
speculative sampling). Canonical decomposition (Khisti et al.): **select** one draft with a rule
whose exact selected-token law is :math:`r`, then keep it with probability
:math:`\min(1, p/r)`, else emit :math:`y \sim \mathrm{norm}((p - r)_+)`; lossless for every rule.
The plan fixes the optimal :math:`r` in closed form and a rule realising it:

1. Sort the draft's support by **descending** :math:`\rho = p/q` (tokens with :math:`q = 0`
   first, ties by ascending id). With :math:`P_j, X_j` the prefix masses, :math:`Y_j = 1 - X_j`
   the suffix and :math:`\varphi(x) = 1 - (1 - x)^n`, :math:`j^*` is the smallest maximiser of
   :math:`D_j = P_j - \varphi(X_j)`; :math:`A^* = A_{j^*}` (under-drafted), :math:`H^*` the rest,
   :math:`Y^* = q(H^*)` and :math:`\alpha^* = 1 - D_{j^*}`.
2. Levels: :math:`r = \min(p, c\,q)` on :math:`A^*` with :math:`\sum_{A^*} r = 1 - Y^{*n}`;
   :math:`r = \max(p, d\,q)` on :math:`H^*` with :math:`\sum_{H^*} r = Y^{*n}`, :math:`d` the
   smallest root (two 1-D piecewise-linear equations).
3. Split trees: on each part the cumulative :math:`T` of :math:`r` over the part's cells lies
   below the concave profile :math:`\psi` (:math:`\varphi` on :math:`A^*`,
   :math:`\varphi_H(x) = Y^{*n} - (Y^* - x)^n` on :math:`H^*`). Peeling writes :math:`T` as a
   binary tree of **block rules** ("pick a uniform draw of the first block holding a draw"):
   node :math:`[a, b)` stops with probability :math:`\mu = \min_i g_i`,
   :math:`g_i = (\psi_i - T_i)/(\psi_i - L_i)` (:math:`L` the chord), else splits at the argmin
   :math:`j` with :math:`T' = (T - \mu L)/(1 - \mu)`.
4. Query: the part is :math:`A^*` if a draw lies in it, else :math:`H^*`; walk from the root
   towards the cell of the top draw, giving each node's stop probability, split uniformly over
   **the draws** (with multiplicity) of its block. The realised law :math:`r_\text{real}` of this
   walk (exactly :math:`r` in exact arithmetic) is what stage 2 uses.

The per-node decision is one inverse-CDF draw over (distinct children in first-drafted order,
then "reject") with ``noise.accept[first child]``; a reject draws from the residual with
``noise.sample[node]``.

Theorem. Lossless on i.i.d. draft trees (canonical decomposition with the exact law of the
implemented rule), and optimal: :math:`r` satisfies :math:`A^*`-priority with full rank and
over-coverage of :math:`H^*`, so no hit occurs and :math:`\alpha = p(H^*) + \varphi(X^*) =
\alpha^*`.

Reference: derived in this project (``docs/schemes/ot_optimal.md``) on the canonical
decomposition of Khisti et al. (arXiv 2410.18234); it has the guarantees Thomas & Pal claim
for "Partial Resolution" (NeurIPS 2025), whose algorithm was not available to this project.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .._types import Probs
from ..noise import Noise
from ..ops import (
    accept_probability,
    categorical,
    clip_probability,
    memo_by_distribution,
    standard_step,
    standard_step_law,
)
from ..optimal import optimal_acceptance
from ..tree import DraftTree, DrawLaw
from ..validation import check_pair, check_positive_int, is_exact
from .base import NodeScheme, Step

#: Float guard of the peel: a stop probability within this of 1 makes a leaf.
LEAF_MARGIN = 1e-15
#: Tokens looked ahead at once by the float grouping of ``ot_binned`` (grown as needed).
CELL_WINDOW = 256
#: Index of the under-drafted part :math:`A^*` and of :math:`H^*` in :attr:`Plan.parts`.
A_STAR, H_STAR = 0, 1


@dataclass(frozen=True)
class SplitTree:
    """One part's split tree over its cells ``0..num_cells - 1`` (pre-order node arrays).

    Node ``i`` covers the cells ``[lo[i], hi[i])``; it stops with probability ``stop[i]``
    (``1`` at a leaf), else continues to ``left[i]`` (cells ``[lo, split)``) or ``right[i]``
    (cells ``[split, hi)``); ``-1`` marks a leaf. ``slope[i]`` is the chord slope of the profile
    over the node's block (its block rule selects a token ``y`` with mass ``slope * q(y)``).
    """

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    stop: tuple[Any, ...]
    split: tuple[int, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    slope: tuple[Any, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.lo)

    @property
    def height(self) -> int:
        """Edges on the longest root-to-leaf path (0 for a single leaf; -1 when empty)."""
        if not self.lo:
            return -1
        depth = [0] * self.num_nodes
        for node in range(self.num_nodes):  # pre-order: a parent precedes its children
            for child in (self.left[node], self.right[node]):
                if child >= 0:
                    depth[child] = depth[node] + 1
        return max(depth)


@dataclass(frozen=True)
class Plan:
    r"""Everything a node's verification needs, from ``(p, q, n)`` alone (cache it per node).

    ``order`` lists the draft's support (``q > 0``) by descending ``p/q``, ties by ascending id;
    ``cut`` of them form the support of :math:`A^*` and the rest that of :math:`H^*`.
    ``cell_bounds[part]`` are the cell boundaries of a part as indices into its slice of
    ``order`` (one token per cell for ``ot_optimal``, a group for ``ot_binned``). Per support
    position (aligned with ``order``): ``support_cell`` (the cell within its part),
    ``support_target_r`` (the closed-form law of step 2) and ``support_realised_r`` (the exact law
    of the implemented selection rule; equal in exact arithmetic). ``support`` is the same
    tokens by ascending id and ``support_position[i]`` the index in ``order`` of
    ``support[i]`` (:meth:`position`). ``residual`` is
    :math:`\mathrm{norm}((p - r_\text{real})_+)` (the target when that has no mass), ``alpha``
    :math:`\alpha^*`, ``levels`` :math:`(c, d)` and ``loss_bound`` :math:`\sum_g \ell_g` (0
    without groups). Only ``residual`` has the vocabulary's size; the per-token
    views :attr:`part`, :attr:`cell`, :attr:`target_r` and :attr:`realised_r` are built on request.
    """

    num_drafts: int
    order: npt.NDArray[np.intp]
    cut: int
    cell_bounds: tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]
    support: npt.NDArray[np.intp]
    support_position: npt.NDArray[np.intp]
    support_cell: npt.NDArray[np.intp]
    trees: tuple[SplitTree, SplitTree]
    support_target_r: Probs
    support_realised_r: Probs
    residual: Probs
    alpha: Any
    levels: tuple[Any, Any]
    loss_bound: Any

    def position(self, token: int) -> int:
        """The index of ``token`` in :attr:`order`, ``-1`` off the support (a binary search)."""
        index = int(np.searchsorted(self.support, token))
        if index < len(self.support) and self.support[index] == token:
            return int(self.support_position[index])
        return -1

    def realised(self, token: int) -> Any:
        r"""The realised law :math:`r_\text{real}` of one token (0 off the support)."""
        index = self.position(token)
        return self.support_realised_r[index] if index >= 0 else self.residual[token] * 0

    def _spread(self, values: Probs) -> Probs:
        out = self.residual * 0
        out[self.order] = values
        return out

    @property
    def target_r(self) -> Probs:
        """The closed-form law per token, ``[V]``."""
        return self._spread(self.support_target_r)

    @property
    def realised_r(self) -> Probs:
        """The realised selection law per token, ``[V]``."""
        return self._spread(self.support_realised_r)

    @property
    def part(self) -> npt.NDArray[np.int8]:
        """Per token: ``A_STAR``, ``H_STAR`` or ``-1`` (off the support), ``[V]``."""
        out = np.full(len(self.residual), -1, dtype=np.int8)
        out[self.order[: self.cut]], out[self.order[self.cut :]] = A_STAR, H_STAR
        return out

    @property
    def cell(self) -> npt.NDArray[np.intp]:
        """Per token: its cell within its part (``-1`` off the support), ``[V]``."""
        out = np.full(len(self.residual), -1, dtype=np.intp)
        out[self.order] = self.support_cell
        return out


def plan(target: Any, draft: Any, num_drafts: int, tau: Any = None) -> Plan:
    r"""The node plan of ``ot_optimal`` (``tau=None``) or ``ot_binned`` (group loss bound ``tau``).

    Parameters
    ----------
    target, draft : array_like, shape (vocab_size,)
        :math:`p` and :math:`q` (float64, or ``Fraction`` entries for an exact plan).
    num_drafts : int
        :math:`n \ge 1` i.i.d. drafts.
    tau : float or Fraction, optional
        ``None``: one cell per supported token (``ot_optimal``). Otherwise the cells are the
        maximal runs of each part whose loss bound :math:`\ell_g` stays at most ``tau``
        (``ot_binned``); ``0`` merges only equal ratios, ``inf`` makes one cell per part.

    Examples
    --------
    The golden case G2 (``tests/test_ot_optimal.py``):

    >>> from fractions import Fraction as F
    >>> node = plan([F(3, 5), F(3, 10), F(1, 10)], [F(1, 10), F(3, 10), F(3, 5)], 3)
    >>> node.alpha, node.levels
    (Fraction(671, 1000), (Fraction(271, 100), Fraction(143, 200)))
    >>> [str(x) for x in node.realised_r]
    ['271/1000', '3/10', '429/1000']
    >>> [str(x) for x in node.trees[1].stop], node.trees[1].split
    (['71/90', '1', '1'], (1, -1, -1))
    """
    target, draft = check_pair(target, draft)
    n = check_positive_int(num_drafts, "num_drafts")
    return _plan(target, draft, n, tau)


def _plan(target: Probs, draft: Probs, n: int, tau: Any, cut: int | None = None) -> Plan:
    """:func:`plan` on validated input; ``cut`` forces the size of :math:`A^*`'s support (a
    non-optimal variant for the tests: lossless, below the optimum)."""
    exact = is_exact(target)
    one: Any = target[0] * 0 + 1
    support, perm = _ratio_order(target, draft, exact)
    order = support[perm]  # the support by descending p/q
    p_sorted, q_sorted = target[order], draft[order]  # [m] each
    total = target.sum()
    # p(Z), Z the tokens with q = 0 (ratio +inf, first): in float by subtraction from the total
    # (two sums instead of a masked pass over the vocabulary; an absolute error of rounding).
    off_support = total - p_sorted.sum() if exact else max(float(total - p_sorted.sum()), 0.0)
    # Suffix masses S_i = q(order[i:]) and their powers S_i^n (no 1 - X subtraction).
    suffix = np.concatenate([np.cumsum(q_sorted[::-1])[::-1], [one * 0]])  # [m + 1]
    power = _power(suffix, n, exact)  # [m + 1]
    spent = np.concatenate([[off_support], off_support + np.cumsum(p_sorted)])  # [m + 1] P_i
    gain = spent - (one - power)  # D_i = P_i - phi(X_i), i = 0: A = Z
    best = max(gain) if exact else gain.max()
    if cut is None:
        cut = int(np.flatnonzero(gain == best)[0])  # the smallest maximiser
    alpha = clip_probability(one - best)
    top = power[cut]  # Y*^n
    bounds = (
        _cells(p_sorted[:cut], q_sorted[:cut], tau, A_STAR),
        _cells(p_sorted[cut:], q_sorted[cut:], tau, H_STAR),
    )
    cell_p = [_group_sums(p_sorted[:cut], bounds[0]), _group_sums(p_sorted[cut:], bounds[1])]
    cell_q = [_group_sums(q_sorted[:cut], bounds[0]), _group_sums(q_sorted[cut:], bounds[1])]
    c = _upper_level(cell_p[0], cell_q[0], one - top)
    d = _lower_level(cell_p[1], cell_q[1], top)
    ratio_a, ratio_h = cell_p[0] / cell_q[0], cell_p[1] / cell_q[1]  # group ratios
    cell_r = [
        np.minimum(cell_p[0], c * cell_q[0]) if len(cell_q[0]) else cell_q[0],
        np.maximum(cell_p[1], d * cell_q[1]) if len(cell_q[1]) else cell_q[1],
    ]
    # Profiles on each part's cell grid: psi_A = 1 - S^n from the top of A*, psi_H = Y*^n - S^n.
    grid = [power[: cut + 1][bounds[0]], power[cut:][bounds[1]]]
    profiles = (one - grid[0], top - grid[1])
    trees = (
        _split_tree(profiles[0], cell_q[0], cell_r[0], exact),
        _split_tree(profiles[1], cell_q[1], cell_r[1], exact),
    )
    coefficient = [_coefficients(trees[0]), _coefficients(trees[1])]
    ratio_level = [
        np.minimum(ratio_a, c) if len(ratio_a) else ratio_a,
        np.maximum(ratio_h, d) if len(ratio_h) else ratio_h,
    ]
    cells = [np.repeat(np.arange(len(b) - 1), np.diff(b)) for b in bounds]  # cell of each token
    support_cell = np.concatenate(cells).astype(np.intp)  # [m]
    if tau is None:  # one token per cell: the closed form itself, not ratio * q
        support_target_r = np.concatenate(cell_r)
    else:
        support_target_r = np.concatenate(
            [ratio_level[0][cells[0]] * q_sorted[:cut], ratio_level[1][cells[1]] * q_sorted[cut:]]
        )
    support_realised_r = np.concatenate(
        [coefficient[0][cells[0]] * q_sorted[:cut], coefficient[1][cells[1]] * q_sorted[cut:]]
    )  # [m]
    support_position = np.empty(len(order), dtype=np.intp)  # order[support_position] = support
    support_position[perm] = np.arange(len(order))
    # (p - r_real)_+ is p off the support (r_real = 0 there): one pass over the vocabulary.
    support_excess = np.maximum(p_sorted - support_realised_r, 0 * one)  # [m]
    mass = off_support + support_excess.sum()
    if mass > 0:
        residual = target / mass
        residual[order] = support_excess / mass
    else:
        residual = target
    loss = _loss(p_sorted[:cut], q_sorted[:cut], bounds[0], A_STAR) + _loss(
        p_sorted[cut:], q_sorted[cut:], bounds[1], H_STAR
    )
    return Plan(
        num_drafts=n,
        order=order,
        cut=cut,
        cell_bounds=bounds,
        support=support,
        support_position=support_position,
        support_cell=support_cell,
        trees=trees,
        support_target_r=support_target_r,
        support_realised_r=support_realised_r,
        residual=residual,
        alpha=alpha,
        levels=(c, d),
        loss_bound=loss,
    )


def _ratio_order(
    target: Probs, draft: Probs, exact: bool
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``(support, perm)``: the draft's support by ascending id, and ``perm`` with
    ``support[perm]`` by descending ``p/q`` (float64 division), ties by ascending id."""
    support = np.flatnonzero(np.asarray(draft > 0, dtype=bool)) if exact else np.flatnonzero(draft)
    if exact:
        keys = [-(target[t] / draft[t]) for t in support]
        perm = sorted(range(len(support)), key=lambda i: (keys[i], i))
        return support.astype(np.intp), np.array(perm, dtype=np.intp)
    ratio = target[support] / draft[support]
    # A stable sort of -ratio keeps equal ratios in ascending id (the support's own order).
    return support.astype(np.intp), np.argsort(-ratio, kind="stable").astype(np.intp)


def _power(values: Probs, n: int, exact: bool) -> Probs:
    """``values ** n``, in float as ``exp(n log v)`` (0 at 0)."""
    if exact:
        return np.array([v**n for v in values], dtype=object)
    out = np.zeros_like(values)
    positive = values > 0
    out[positive] = np.exp(n * np.log(values[positive]))
    return out


def _cells(p_part: Probs, q_part: Probs, tau: Any, part: int) -> npt.NDArray[np.intp]:
    """Cell boundaries of one part (indices into the part's tokens, ``0`` and ``m`` included).

    Left to right, a token joins the current group unless the group's loss bound would exceed
    ``tau``. In float the group sums are running sums from the group's first token (a
    ``cumsum`` over a window, the same additions in the same order as a token-by-token loop).
    """
    m = len(q_part)
    if tau is None or m <= 1:
        return np.arange(m + 1, dtype=np.intp)
    ratio = p_part / q_part
    if is_exact(p_part):
        return _cells_exact(p_part, q_part, ratio, tau, part)
    edges = [0]
    start, window = 0, CELL_WINDOW
    while start < m - 1:
        end = min(m, start + window)
        spent, mass = np.cumsum(p_part[start:end]), np.cumsum(q_part[start:end])
        if part == A_STAR:
            loss = spent - ratio[start:end] * mass
        else:
            loss = ratio[start] * mass - spent
        over = np.flatnonzero(loss[1:] > tau)
        if len(over):
            start += 1 + int(over[0])
            edges.append(start)
            window = CELL_WINDOW
        elif end == m:
            break
        else:
            window *= 4  # the group is longer than the window: look further, from its start
    edges.append(m)
    return np.array(edges, dtype=np.intp)


def _cells_exact(
    p_part: Probs, q_part: Probs, ratio: Probs, tau: Any, part: int
) -> npt.NDArray[np.intp]:
    """:func:`_cells` token by token (``Fraction`` rows)."""
    edges = [0]
    group_p, group_q = p_part[0], q_part[0]
    first = ratio[0]
    for i in range(1, len(q_part)):
        new_p, new_q = group_p + p_part[i], group_q + q_part[i]
        loss = new_p - ratio[i] * new_q if part == A_STAR else first * new_q - new_p
        if loss > tau:
            edges.append(i)
            group_p, group_q, first = p_part[i], q_part[i], ratio[i]
        else:
            group_p, group_q = new_p, new_q
    edges.append(len(q_part))
    return np.array(edges, dtype=np.intp)


def _group_sums(values: Probs, bounds: npt.NDArray[np.intp]) -> Probs:
    """Sums of ``values`` over the cells ``[bounds[i], bounds[i + 1])``, in order."""
    if len(bounds) <= 1:
        return values[:0]
    if len(bounds) == len(values) + 1:
        return values.copy()
    return np.array([values[a:b].sum() for a, b in itertools.pairwise(bounds)])


def _loss(p_part: Probs, q_part: Probs, bounds: npt.NDArray[np.intp], part: int) -> Any:
    r""":math:`\sum_g \ell_g` of the part's cells (0 for single tokens)."""
    total: Any = 0
    for a, b in itertools.pairwise(bounds):
        if b - a <= 1:
            continue
        group_p, group_q = p_part[a:b].sum(), q_part[a:b].sum()
        if part == A_STAR:
            total = total + group_p - p_part[b - 1] / q_part[b - 1] * group_q
        else:
            total = total + p_part[a] / q_part[a] * group_q - group_p
    return total


def _upper_level(cell_p: Probs, cell_q: Probs, mass: Any) -> Any:
    r"""The :math:`c` with :math:`\sum \min(p, c q) = ` ``mass`` (cells by descending ratio)."""
    if not len(cell_q):
        return mass * 0
    asc_p, asc_q = cell_p[::-1], cell_q[::-1]  # ascending ratio
    ratio = asc_p / asc_q
    below = np.cumsum(asc_p)  # sum of p over cells l <= i
    above = np.concatenate([np.cumsum(asc_q[::-1])[::-1][1:], [asc_q[0] * 0]])  # q over l > i
    value = below + ratio * above  # F(ratio_i)
    hits = np.flatnonzero(np.asarray(value >= mass, dtype=bool))
    i = int(hits[0]) if len(hits) else len(asc_q) - 1
    before = below[i - 1] if i > 0 else asc_p[0] * 0
    return (mass - before) / (above[i] + asc_q[i])


def _lower_level(cell_p: Probs, cell_q: Probs, mass: Any) -> Any:
    r"""The smallest :math:`d \ge 0` with :math:`\sum \max(p, d q) = ` ``mass``."""
    if not len(cell_q) or not cell_p.sum() < mass:
        return mass * 0
    asc_p, asc_q = cell_p[::-1], cell_q[::-1]  # ascending ratio
    ratio = asc_p / asc_q
    covered = np.cumsum(asc_q)  # q over cells l <= i
    rest = np.concatenate([np.cumsum(asc_p[::-1])[::-1][1:], [asc_p[0] * 0]])  # p over l > i
    value = ratio * covered + rest  # G(ratio_i)
    hits = np.flatnonzero(np.asarray(value >= mass, dtype=bool))
    if not len(hits):
        return mass / covered[-1]
    i = max(int(hits[0]), 1)  # d lies in [ratio_{i-1}, ratio_i]: max(p, d q) = d q below i
    return (mass - rest[i - 1]) / covered[i - 1]


def _split_tree(profile: Probs, cell_q: Probs, cell_r: Probs, exact: bool) -> SplitTree:
    """Peel the cumulative of ``cell_r`` below the concave ``profile`` into block rules."""
    m = len(cell_q)
    if m == 0:
        return SplitTree((), (), (), (), (), (), ())
    zero = profile[0] * 0
    grid = np.concatenate([[zero], np.cumsum(cell_q)])  # x_0..x_m
    cumulative = profile[0] + np.concatenate([[zero], np.cumsum(cell_r)])  # T_0..T_m
    cumulative[0], cumulative[m] = profile[0], profile[m]
    cumulative = np.minimum(cumulative, profile)
    lo: list[int] = []
    hi: list[int] = []
    stop: list[Any] = []
    split: list[int] = []
    left: list[int] = []
    right: list[int] = []
    slope: list[Any] = []
    # Scalar reads from Python sequences (numpy scalar arithmetic is slow; the values and every
    # rounding are the same), vector work on the arrays.
    profile_at, grid_at = (profile, grid) if exact else (profile.tolist(), grid.tolist())
    pending: list[tuple[int, int, int, int]] = [(0, m, -1, 0)]  # (a, b, parent, side)
    while pending:
        a, b, parent, side = pending.pop()
        node = len(lo)
        if parent >= 0:
            (left if side == 0 else right)[parent] = node
        chord = (profile_at[b] - profile_at[a]) / (grid_at[b] - grid_at[a])
        lo.append(a)
        hi.append(b)
        slope.append(chord)
        split.append(-1)
        left.append(-1)
        right.append(-1)
        if b - a == 1:  # a single cell: a leaf
            stop.append(zero + 1)
            continue
        mu, j = _peel(profile, grid, cumulative, a, b, chord, exact)
        if mu is None:
            stop.append(zero + 1)
            continue
        stop.append(mu)
        split[node] = j
        inner = slice(a, b + 1)
        line = profile[a] + chord * (grid[inner] - grid[a])
        cumulative[inner] = (cumulative[inner] - mu * line) / (1 - mu)
        cumulative[a], cumulative[j], cumulative[b] = profile[a], profile[j], profile[b]
        cumulative[inner] = np.minimum(cumulative[inner], profile[inner])
        pending.append((j, b, node, 1))
        pending.append((a, j, node, 0))  # popped first: pre-order, left before right
    return SplitTree(
        tuple(lo), tuple(hi), tuple(stop), tuple(split), tuple(left), tuple(right), tuple(slope)
    )


def _peel(
    profile: Probs,
    grid: Probs,
    cumulative: Probs,
    a: int,
    b: int,
    chord: Any,
    exact: bool,
) -> tuple[Any, int]:
    """``(mu, j)`` of the block ``[a, b)``, or ``(None, -1)`` for a leaf (stop 1)."""
    if b - a <= 1:
        return None, -1
    inner = slice(a + 1, b)
    line = profile[a] + chord * (grid[inner] - grid[a])
    gap = profile[inner] - line  # > 0 by strict concavity (exact); may round to <= 0
    slack = profile[inner] - cumulative[inner]
    if exact:
        finite = [(s / g, i) for i, (s, g) in enumerate(zip(slack, gap, strict=True)) if g > 0]
        if not finite:
            return None, -1
        mu, index = min(finite, key=lambda item: (item[0], item[1]))
        if mu >= 1:
            return None, -1
        return max(mu, mu * 0), a + 1 + index
    quotient = np.full(len(gap), np.inf)
    np.divide(slack, gap, out=quotient, where=gap > 0)
    index = int(np.argmin(quotient))
    mu = float(quotient[index])
    if not mu < 1 - LEAF_MARGIN:  # also inf: no interior point to peel at
        return None, -1
    return max(mu, 0.0), a + 1 + index


def _coefficients(tree: SplitTree) -> Probs:
    """Per cell: the realised ``r / q`` of the walk, sum of ``reach * stop * slope`` on its path."""
    if not tree.num_nodes:
        return np.zeros(0)
    m = tree.hi[0]
    zero = tree.slope[0] * 0
    out = np.array([zero] * m, dtype=object if not isinstance(zero, float) else np.float64)
    reach = [zero] * tree.num_nodes
    reach[0] = zero + 1
    for node in range(tree.num_nodes):  # pre-order: reach[node] is final when visited
        weight = reach[node] * tree.stop[node] * tree.slope[node]
        out[tree.lo[node] : tree.hi[node]] += weight
        for child in (tree.left[node], tree.right[node]):
            if child >= 0:
                reach[child] = reach[node] * (1 - tree.stop[node])
    return out


def selection(node_plan: Plan, draws: list[int]) -> dict[int, Any]:
    """The walk's selection law given the drawn tokens (drafting order, with multiplicity).

    Returns ``{token: P(select a draw of token)}``, summing to 1 unless no draw is on the draft's
    support (a probability-zero event under the draw law: then the empty dict, a rejection).
    """
    positions = [node_plan.position(t) for t in draws]
    parts = [-1 if i < 0 else A_STAR if i < node_plan.cut else H_STAR for i in positions]
    if A_STAR in parts:
        which = A_STAR
    elif H_STAR in parts:
        which = H_STAR
    else:
        return {}
    tree = node_plan.trees[which]
    kept = [
        (int(node_plan.support_cell[i]), t)
        for t, i, s in zip(draws, positions, parts, strict=True)
        if s == which
    ]
    top = min(cell for cell, _ in kept)
    chosen: dict[int, Any] = {}
    node, reach = 0, 1
    while True:
        members = [t for cell, t in kept if tree.lo[node] <= cell < tree.hi[node]]
        share = reach * tree.stop[node] / len(members)  # a uniform draw of the block
        for token in members:
            chosen[token] = chosen[token] + share if token in chosen else share
        if tree.left[node] < 0:
            return chosen
        reach = reach * (1 - tree.stop[node])
        node = tree.left[node] if top < tree.split[node] else tree.right[node]


_node_plan = memo_by_distribution(_plan)


class OTOptimal(NodeScheme):
    """Optimal-transport verification for i.i.d. drafts: acceptance equals the optimum.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> p, q = [F(2, 5), F(1, 4), F(1, 5), F(3, 20), F(0)], [F(1, 20), F(1, 10), F(1, 4)] + [
    ...     F(3, 10)
    ... ] * 2
    >>> ss.acceptance("ot_optimal", p, q, 4) == ss.optimal_acceptance(p, q, 4) == F(125679, 160000)
    True
    """

    name = "ot_optimal"
    reference = (
        "derived in this project (docs/schemes/ot_optimal.md) on the "
        "canonical decomposition of Khisti et al. 2025 (arXiv 2410.18234); cf. Thomas & Pal, "
        "Partial Resolution, NeurIPS 2025"
    )

    laws = frozenset({DrawLaw.IID})
    #: ``None``: one cell per token (exact optimum); a number: groups (``ot_binned``).
    tau: Any = None

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return optimal_acceptance(target, draft, num_drafts)

    def node_plan(self, target: Probs, draft: Probs, num_drafts: int) -> Plan:
        """The (memoised) plan of a node with ``num_drafts`` candidates."""
        return _node_plan(target, draft, num_drafts, self.tau)

    def select(self, node_plan: Plan, draws: list[int]) -> dict[int, Any]:
        """The selection law of the node's draws (:func:`selection`)."""
        return selection(node_plan, draws)

    def decision(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[Any], Any, Probs]:
        """``(pi per distinct child, pi_reject, residual)`` of a node with >= 2 candidates."""
        target, draft = target_probs[node], draft_probs[node]
        draws = [tree.tokens[child] for child in tree.candidates[node]]
        node_plan = self.node_plan(target, draft, len(draws))
        chosen = self.select(node_plan, draws)
        weights = []
        for child in tree.children(node):
            token = tree.tokens[child]
            share = chosen.get(token, 0 * target[token])
            weights.append(share * accept_probability(target[token], node_plan.realised(token)))
        rejected = clip_probability(1 - sum(weights, 0 * target[0]))
        return weights, rejected, node_plan.residual

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        candidates = tree.candidates[node]
        if len(candidates) == 1:
            child = candidates[0]
            token = standard_step(
                target_probs[node],
                draft_probs[node],
                tree.tokens[child],
                noise.accept[child],
                noise.sample[node],
            )
            return (child, None) if token is None else (None, token)
        weights, rejected, residual = self.decision(tree, node, target_probs, draft_probs)
        children = tree.children(node)
        pick = categorical(np.array([*weights, rejected]), noise.accept[candidates[0]])
        if pick < len(children):
            return children[pick], None
        return None, categorical(residual, noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        candidates = tree.candidates[node]
        if len(candidates) == 1:
            child = candidates[0]
            accept, stop = standard_step_law(
                target_probs[node], draft_probs[node], tree.tokens[child]
            )
            return [(child, accept)], stop
        weights, rejected, residual = self.decision(tree, node, target_probs, draft_probs)
        return list(zip(tree.children(node), weights, strict=True)), rejected * residual


SCHEME = OTOptimal()
