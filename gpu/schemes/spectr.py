r"""SpecTr K-SEQ, lowered (reference: :mod:`specsampling.schemes.spectr`).

Per row at a node with :math:`k` i.i.d. candidates :math:`x_1..x_k` (the valid slots, with
multiplicity), :math:`\beta(\rho) = \sum_x \min(p(x)/\rho, q(x))` and
:math:`\gamma(\rho) = \sum_{i<k} (1 - \beta(\rho))^i`. :math:`\rho^*` is the feasible end of the
root of :math:`p_\text{acc}(\rho) - \rho\beta(\rho)` on :math:`[1, k]`, found by the reference's
bisection (:func:`bisection_rho`: the same midpoints, the same stopping width :math:`2^{-40}`, one
static loop with a per-row "still bisecting" mask), or on the CPU in float32 by a Newton search
on the same feasibility test (:func:`newton_rho`; :func:`optimal_rho` picks). For
:math:`i = 1..k` accept :math:`x_i` iff

.. math:: u_i\,\rho^* q(x_i) < p(x_i),

else stop with :math:`\mathrm{norm}((p - \gamma\min(p/\rho^*, q))_+)` (:math:`p` when that has
zero mass; :math:`\gamma = 0` on disjoint supports).

Duplicates (the reuse rule of :class:`specsampling.Noise`): a repeated token is one child with one
uniform; after a copy is rejected with acceptance :math:`a = \min(1, p(x)/(\rho^* q(x)))` the next
copy of the same token reads :math:`(u - a)/(1 - a)` (:func:`reuse_uniform`), clipped into
:math:`[0, 1)`. Within a node a token identifies its child, so the slots are matched by token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes.spectr import RHO_TOLERANCE

from .. import ops
from ..tree import PAD
from .base import NodeLowering, NodeStep, standard_step

#: The reference's bisection width as a float (:data:`~specsampling.schemes.spectr.RHO_TOLERANCE`).
TOLERANCE = float(RHO_TOLERANCE)


def accept_probability(target_x: torch.Tensor, draft_x: torch.Tensor) -> torch.Tensor:
    r"""Batched :func:`specsampling.ops.accept_probability`: :math:`\min(1, p(x)/q(x))`, 0 when
    :math:`p(x) \le 0` (``[B]``, float64).

    >>> accept_probability(torch.tensor([0.0, 0.5, 0.25]), torch.tensor([0.5, 0.25, 0.5])).tolist()
    [0.0, 1.0, 0.5]
    """
    target_x, draft_x = target_x.to(torch.float64), draft_x.to(torch.float64)  # [B]
    full = target_x >= draft_x  # [B]
    ratio = target_x / torch.where(full, torch.ones_like(draft_x), draft_x)  # [B]
    return torch.where(target_x <= 0, 0.0, torch.where(full, 1.0, ratio))  # [B]


def reuse_uniform(u: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
    """Batched :func:`specsampling.ops.reuse_uniform`: ``(u - a) / (1 - a)`` clipped into
    ``[0, 1)`` (``[B]`` float64; a row with ``a == 1`` is never rejected and gets ``u``).

    >>> reuse_uniform(torch.tensor([0.75, 0.5], dtype=torch.float64),
    ...               torch.tensor([0.5, 0.5], dtype=torch.float64)).tolist()
    [0.5, 0.0]
    """
    rest = 1 - accept  # [B]
    rescaled = (u - accept) / torch.where(rest > 0, rest, torch.ones_like(rest))  # [B]
    return rescaled.clamp(0.0, LARGEST_BELOW_ONE)  # [B]


def later_copies(candidate_tokens: torch.Tensor, slot: int) -> torch.Tensor:
    """``[B, C]`` mask of the slots after ``slot`` holding the same token (the same child)."""
    after = torch.arange(candidate_tokens.shape[1], device=candidate_tokens.device) > slot  # [C]
    return (candidate_tokens == candidate_tokens[:, slot : slot + 1]) & after  # [B, C]


def gamma(rejected: torch.Tensor, counts: torch.Tensor, max_count: int) -> torch.Tensor:
    r""":math:`\gamma = \sum_{i<k} (1 - \beta)^i` per row by the reference's Horner loop
    (``rejected`` :math:`= 1 - \beta`, ``counts`` :math:`= k`, both ``[B]``): the loop run to
    the largest ``k`` for every row, each row's value taken after its own ``k - 1`` steps (the
    same roundings as stopping there; two operations a step instead of a masked five).

    >>> gamma(torch.tensor([0.5, 0.5]), torch.tensor([1, 3]), 3).tolist()
    [1.0, 1.75]
    """
    values = [torch.ones_like(rejected)]  # [B] each: the loop's value after 0, 1, ... steps
    for _ in range(max_count - 1):
        values.append(1 + rejected * values[-1])
    steps = (counts.clamp(1, max_count) - 1)[None, :]  # [1, B]: each row's k - 1
    return torch.stack(values).gather(0, steps).squeeze(0)  # [B]


def rejection(
    target: torch.Tensor,
    draft: torch.Tensor,
    rho: torch.Tensor,
    work: torch.Tensor | None = None,
) -> torch.Tensor:
    r""":math:`1 - \beta(\rho) = \sum_x (q(x) - p(x)/\rho)_+` per row (``[B, V]`` rows, ``[B]``).

    One fused ``addcdiv`` (``q + (-1) (p / \rho)``: the same rounding as ``q - p / \rho``, since
    negation is exact), clipped in place, then summed (in numpy's order in float64, as the
    reference): one ``[B, V]`` temporary instead of three, written into ``work`` when given (a
    buffer like ``draft``, reused across the bisection's steps).
    """
    terms = torch.addcdiv(draft, target, rho[:, None], value=-1, out=work)  # [B, V]
    return ops.numpy_sum(terms.clamp_min_(0))


def mantissa_bits(dtype: torch.dtype) -> int:
    """Explicit mantissa bits of a float dtype (52 for float64, 23 for float32)."""
    return round(-math.log2(torch.finfo(dtype).eps))


def bisection_steps(max_count: int, dtype: torch.dtype) -> int:
    """The static number of bisection steps :func:`optimal_rho` runs for ``max_count``
    candidates in ``dtype``: the reference's (enough to narrow ``[1, k]`` to ``TOLERANCE``),
    capped where ``dtype`` runs out of bits (mantissa bits + 3 steps past the integer part:
    the bracket is then two adjacent floats, a midpoint rounds to one of them and no later step
    moves ``high``). 0 for ``max_count <= 1`` (:math:`\rho^* = 1`: nothing to bisect).

    >>> bisection_steps(4, torch.float64), bisection_steps(4, torch.float32)
    (43, 28)
    >>> bisection_steps(1, torch.float64)
    0
    """
    span = max(max_count - 1, 1).bit_length()
    return min(41 + span, mantissa_bits(dtype) + 3 + span) * (max_count > 1)


def optimal_rho(
    target: torch.Tensor, draft: torch.Tensor, counts: torch.Tensor, max_count: int
) -> torch.Tensor:
    r"""Batched :func:`specsampling.schemes.spectr.optimal_rho` (float): :math:`\rho^*` per row.

    The reference's bisection (:func:`bisection_rho`), except on the CPU outside
    ``torch.compile`` below float64, where the lowering promises agreement with the reference up
    to float32 rounding only: there :func:`newton_rho` finds the same root in fewer passes. 1
    where :math:`\rho = 1` is feasible or the supports are disjoint.

    Parameters
    ----------
    target, draft : Tensor [B, V]
    counts : LongTensor [B]
        Candidates :math:`1 \le k \le` ``max_count`` per row (rows with 0 are treated as 1).
    max_count : int
        A static bound on ``counts`` (the number of candidate slots).

    >>> rho = optimal_rho(torch.tensor([[1/2, 1/3, 1/6]], dtype=torch.float64),
    ...                   torch.full((1, 3), 1/3, dtype=torch.float64), torch.tensor([2]), 2)
    >>> round(rho.tolist()[0], 6)
    1.274292
    """
    steps = bisection_steps(max_count, target.dtype)
    if steps == 0:  # static: one candidate slot, rho* = 1 without a pass over V
        return torch.ones(target.shape[0], dtype=target.dtype, device=target.device)  # [B]
    if target.dtype == torch.float32 and ops.host_reads_free(target):  # static: the CPU route
        return newton_rho(target, draft, counts.clamp_min(1), max_count, 2 * steps)
    return bisection_rho(target, draft, counts, max_count)


def rho_ceiling(counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    r""":math:`\max(k, 1)` per row (``[B]``, in ``dtype``): no smaller than any :math:`\rho`
    :func:`optimal_rho` returns, since both of its searches keep :math:`\rho` in
    :math:`[1, k]` (the bracket's upper end starts at :math:`k`; :math:`\rho^* = 1` for
    :math:`k \le 1`). A first candidate accepted under it is accepted under :math:`\rho^*`.

    >>> rho_ceiling(torch.tensor([0, 1, 3]), torch.float32).tolist()
    [1.0, 1.0, 3.0]
    """
    return counts.clamp_min(1).to(dtype)  # [B]


def searched_where(
    searched: torch.Tensor,  # [B] bool
    bound: torch.Tensor,  # [B]
    search: Callable[[Any], torch.Tensor],
) -> torch.Tensor:
    """``bound`` with the rows ``searched`` replaced by ``search(rows)`` (their values, for an
    index of rows; ``slice(None)``, a view of every row, when all are searched): the CPU
    routes' restriction of a per-row search, read on the host (``[B]``; ``bound`` is written).

    >>> searched_where(torch.tensor([True, False]), torch.tensor([3.0, 3.0]),
    ...                lambda rows: torch.tensor([1.5, 2.5])[rows]).tolist()
    [1.5, 3.0]
    """
    rows = searched.nonzero()[:, 0]  # [R], the host read
    if rows.shape[0] == searched.shape[0]:
        return search(slice(None))  # [B]
    if rows.shape[0] > 0:
        bound[rows] = search(rows)
    return bound  # [B]


def bisection_rho(
    target: torch.Tensor, draft: torch.Tensor, counts: torch.Tensor, max_count: int
) -> torch.Tensor:
    r""":func:`optimal_rho` by the reference's bisection on :math:`[1, k]` with its midpoints,
    sync-free: a static number of steps (:func:`bisection_steps`: enough for ``max_count``, the
    largest ``k``, in the tables' dtype) while each row's bracket is wider than ``TOLERANCE``.
    Bit for bit the reference's :math:`\rho^*` in float64 (``[B]``)."""
    steps = bisection_steps(max_count, target.dtype)
    counts = counts.clamp_min(1)  # [B]
    work = torch.empty_like(draft)  # [B, V]: every step's terms, one buffer

    def feasible(rho: torch.Tensor) -> torch.Tensor:  # [B] bool
        return gamma(rejection(target, draft, rho, work), counts, max_count) <= rho

    low = torch.ones(target.shape[0], dtype=target.dtype, device=target.device)  # [B]
    high = counts.to(target.dtype)  # [B]
    overlap = torch.minimum(target, draft, out=work).sum(-1) > 0  # [B]
    settled = ~overlap | feasible(low)  # [B]
    for _ in range(steps):
        active = ~settled & (high - low > TOLERANCE)  # [B]
        middle = (low + high) / 2  # [B]
        ok = feasible(middle)  # [B]
        high = torch.where(active & ok, middle, high)
        low = torch.where(active & ~ok, middle, low)
    return torch.where(settled, torch.ones_like(high), high)  # [B]


#: The relative width at which :func:`newton_rho` stops: its feasible point within this of an
#: infeasible one or of a lower bound on :math:`\rho^*` (a few float32 ulps).
NEWTON_WIDTH = 2.0**-21


def beta_slope(terms: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_{x: q(x) > p(x)/\rho} p(x)`, the slope of :math:`\beta` in :math:`t = 1/\rho`
    at :math:`\rho`, from the clipped terms :func:`rejection` left in its buffer (``terms``,
    overwritten): their signs dotted with ``target`` (``[B]``)."""
    return terms.sign_().mul_(target).sum(-1)  # [B]


def newton_rho(
    target: torch.Tensor,
    draft: torch.Tensor,
    counts: torch.Tensor,
    max_count: int,
    max_passes: int,
) -> torch.Tensor:
    r""":func:`optimal_rho` on the CPU below float64: Newton's method on tangent models of the
    float32 feasibility test, to a relative width of :data:`NEWTON_WIDTH`.

    Feasibility, :math:`\gamma(\rho) \le \rho`, is :math:`F(t) = t\,\gamma(1 - \beta(t)) \le 1`
    in :math:`t = 1/\rho`, where :math:`\beta(t) = \sum_x \min(p(x)\,t, q(x))` is concave and
    piecewise linear with :math:`\beta(0) = 0`. :math:`F` is nondecreasing (with
    :math:`t\beta'(t) \le \beta(t)` and :math:`\gamma(r) - (1 - r)\gamma'(r) = k r^{k-1} \ge 0`,
    :math:`F' \ge 0`), so the feasible set is :math:`\rho \ge \rho^*` and any bracketing
    method finds the bisection's root. Each pass over the rows tests one point per row and gives
    :math:`1 - \beta` there and its exact slope :math:`\sum_{q > p/\rho} p`
    (:func:`beta_slope`, from the same buffer). By concavity the tangent
    :math:`\beta(t_j) + \beta'(t_j)(t - t_j)` bounds :math:`\beta` from above everywhere, so
    the root of the model :math:`t\,\gamma(1 - \beta(t_j) - \beta'(t_j)(t - t_j)) = 1`
    (:func:`tangent_bound`, solved on the host; the model keeps :math:`F`'s monotony) is a lower
    bound on :math:`\rho^*` -- exact once :math:`t_j` lies on the root's linear piece, and
    converging like Newton's method from either side. The next point is the best bound times
    :math:`1 + 2^{-22}`: feasible as soon as the bound is within that of the root. A row is done
    when its feasible end ``high`` is within :data:`NEWTON_WIDTH` of the bound or of its
    infeasible end ``low``; a bound no better than ``low`` (float32 rounding) makes it probe
    just above ``low`` (four times farther each time it lands infeasible again), and a point
    outside the bracket is replaced by its midpoint. It stops when every row is done, or after
    ``max_passes`` passes (twice the bisection's), and returns ``high``: as the bisection's, a
    value the same float32 test (:func:`gamma` of :func:`rejection`) found feasible, or ``k``,
    so the residual :math:`p - \gamma\min(p/\rho, q)` keeps its sign; 1 where :math:`\rho = 1`
    is feasible or the supports are disjoint (a row without slope at :math:`\rho = 1`, as
    disjoint supports give, is checked for overlap by one pass over those rows).

    Measured on the trees benchmark's levels (:math:`V = 32{,}000`, 19--32 searching rows,
    :math:`k = 2, 3, 4`): 4, 5 and 5 passes over the level's rows, against 5, 7--8 and 11 for
    the previous safeguarded Newton iteration on :math:`F` from the feasible end (which needed a
    probe below the converged end to close its bracket) and 27--29 for the bisection; on fuzzed
    batches (:math:`V` from 2 to 50,000, :math:`k` up to 12, peaked, flat, sparse, equal and
    disjoint rows) about 3 passes on average against 10, and at most 27 (36 on rows summing to
    1.1 instead of 1) against 60. :math:`\rho` is the float64 :math:`\rho^*` to
    :math:`2.4 \cdot 10^{-7}` relative at the median (the float32 bisection's:
    :math:`7 \cdot 10^{-8}`) and to :math:`1.2 \cdot 10^{-6}` at most where the float32 test is
    well conditioned (:math:`\gamma - \rho` with a slope above 1/2). On ill-conditioned rows
    (:math:`\gamma(\rho) \approx \rho` over a wide interval: tiny
    vocabularies with large :math:`k`, peaked rows) the float32 test itself flips between
    feasible and infeasible along :math:`\rho`, and the search and the float32 bisection may
    stop at different feasible points, both possibly far from the float64 root: exactness holds
    (the point is feasible), the acceptance is that of the point found; so on rows that do not
    sum to one, for which :math:`F` need not be monotone. "Feasible" is the float32 test as
    evaluated in the pass that found the point: with several threads a float32 sum over a row
    can round differently in a batch of another shape (the gathered passes), so a point may
    fail the test by a rounding in another batch; the residual's clips keep its sign. The
    scalar work runs on the host in float64 (a host read per pass, free on the CPU).
    """
    work = torch.empty_like(draft)  # [B, V]
    k = counts.numpy().astype(np.int64)  # [B]
    ones = torch.ones(target.shape[0], dtype=target.dtype)  # [B]
    rejected = rejection(target, draft, ones, work).numpy()  # [B]; work holds the terms
    feasible = host_gamma(rejected, k, max_count) <= 1  # [B]
    slope = beta_slope(work, target).double().numpy()  # [B]
    searching = ~feasible & (k > 1)  # [B]
    flat = np.flatnonzero(searching & (slope == 0))  # disjoint supports give no slope
    if len(flat):  # rare: whether those rows overlap at all (one pass over them only)
        index = torch.from_numpy(flat)
        searching[flat] = (torch.minimum(target[index], draft[index]).sum(-1) > 0).numpy()
    # [1, k] where searching (k is feasible: gamma <= k for any rejection mass), else done at 1
    state = _NewtonState(np.where(searching, k, 1.0), rejected.astype(np.float64), slope, k)
    result = state.high.copy()  # [B]
    rows = np.arange(len(k))  # the rows in the passes: all, until few are still searching
    for _ in range(max_passes):
        done = state.done()  # [R]
        if done.all():
            break
        if 4 * int((~done).sum()) <= len(rows):  # gather the rows still searching
            keep = np.flatnonzero(~done)
            rows, state = rows[keep], state.take(keep)
            index = torch.from_numpy(keep)
            target, draft = ops.take_rows(target, index), ops.take_rows(draft, index)
            work = work[: len(keep)]
        point = state.proposal()  # [R] float32 values, as float64
        rho = point.astype(np.float32)  # [R]
        rejected = rejection(target, draft, torch.from_numpy(rho), work).numpy()  # [R]
        feasible = host_gamma(rejected, state.k, max_count) <= rho  # [R]
        slope = beta_slope(work, target).double().numpy()  # [R]; from the terms in work
        state.update(point, feasible, rejected.astype(np.float64), slope)
        result[rows] = state.high
    return torch.from_numpy(result.astype(np.float32))  # [B]


class _NewtonState:
    """Per-row state of :func:`newton_rho`'s search (numpy float64 ``[R]`` arrays): the bracket
    ``[low, high]`` (``low`` tested infeasible or 1, ``high`` tested feasible or ``k``), the best
    lower bound on :math:`\rho^*` from the tangent models (:func:`tangent_bound`), and the probe
    distance multiplier."""

    def __init__(self, high: np.ndarray, rejected: np.ndarray, slope: np.ndarray, k: np.ndarray):
        self.low, self.high, self.k = np.ones_like(high), high, k
        self.bound = tangent_bound(self.low, rejected, slope, k)  # from the test at rho = 1
        self.scale = np.ones_like(high)  # the probe distance above low, in NEWTON_WIDTHs

    def take(self, keep: np.ndarray) -> _NewtonState:
        """The state of the rows ``keep``."""
        state = _NewtonState.__new__(_NewtonState)
        state.low, state.high, state.k = self.low[keep], self.high[keep], self.k[keep]
        state.bound, state.scale = self.bound[keep], self.scale[keep]
        return state

    def done(self) -> np.ndarray:
        """Rows whose ``high`` is within :data:`NEWTON_WIDTH` of ``low`` or of the bound."""
        high = self.high
        return (high - self.low <= NEWTON_WIDTH * high) | (high <= self.bound * (1 + NEWTON_WIDTH))

    def proposal(self) -> np.ndarray:
        """The next point per row, a float32 value strictly inside the bracket where one is
        left (a row done or without room proposes its ``high``, and keeps its state)."""
        low, high = self.low, self.high
        step = self.bound * (1 + NEWTON_WIDTH / 2)  # feasible once the bound is that close
        probe = step <= low * (1 + NEWTON_WIDTH / 2)  # a bound no better than low: probe above
        step = np.where(probe, low * (1 + 0.9 * NEWTON_WIDTH * self.scale), step)
        self.scale = np.where(probe, 4 * self.scale, 1.0)
        step = np.where((step > low) & (step < high), step, (low + high) / 2)
        step = step.astype(np.float32).astype(np.float64)
        inside = (step > low) & (step < high) & ~self.done()
        return np.where(inside, step, high)

    def update(
        self, point: np.ndarray, feasible: np.ndarray, rejected: np.ndarray, slope: np.ndarray
    ) -> None:
        """Narrow each bracket by the test at ``point`` and raise the bound by its tangent."""
        moved = (point > self.low) & (point < self.high)
        self.high = np.where(moved & feasible, point, self.high)
        self.low = np.where(moved & ~feasible, point, self.low)
        at = np.flatnonzero(moved)  # Newton's method on each new model from the best bound
        bound = tangent_bound(point[at], rejected[at], slope[at], self.k[at], self.bound[at])
        self.bound[at] = np.fmax(self.bound[at], bound)


def tangent_bound(
    rho: np.ndarray,
    rejected: np.ndarray,
    slope: np.ndarray,
    k: np.ndarray,
    start: np.ndarray | None = None,
) -> np.ndarray:
    r"""The lower bound on :math:`\rho^*` from the test at ``rho`` (``[R]`` float64 arrays on the
    host): :math:`1/t` for the root :math:`t` of :math:`t\,\gamma(r + s\,(1/\rho - t)) = 1`,
    the feasibility test with :math:`\beta` replaced by its tangent at :math:`1/\rho`
    (:math:`r` = ``rejected``, :math:`s` = ``slope``), at least 1. For :math:`k \le 2` the
    model is a quadratic, solved in closed form; otherwise Newton's method from ``start`` (an
    earlier bound: the roots move little between passes) or :math:`\rho`, inside the bracket
    :math:`[0, 1]` of :math:`t`, a bisection step where it would leave it, until the step is
    below :math:`10^{-10}` relative (a few iterations; the float32 test's own rounding is a
    thousand times coarser).

    >>> rho = tangent_bound(np.array([1.0]), np.array([0.5]), np.array([0.0]), np.array([2]))
    >>> round(float(rho[0]), 9)  # beta flat: gamma(1/2) = 1.5 for k = 2
    1.5
    """
    k_max = int(k.max(initial=1))
    reach = rejected + slope / rho  # the model's r at t = 0: r(t) = reach - slope t
    if k_max <= 2:  # t (1 + reach - slope t) = 1 (k = 2; slope 0 for k = 1: t = 1)
        half = (1 + np.where(k > 1, reach, 0.0)) / 2
        slope = np.where(k > 1, slope, 0.0)
        with np.errstate(invalid="ignore"):
            t = 1 / (half + np.sqrt(half * half - slope))  # the smaller root, stably
        return np.where(np.isfinite(t) & (t < 1), 1 / t, 1.0)  # no root below 1: rho 1
    low, high = np.zeros_like(rho), np.ones_like(rho)  # t: F(0) - 1 < 0; a root past 1 is rho 1
    value, _ = _gamma_and_derivative(reach - slope, k, k_max)
    settled = value < 1  # F(1) < 1: the model's root lies beyond t = 1
    if start is None:  # r(t) >= r for t <= 1/rho, so the root is at most 1 / gamma(r)
        start = np.maximum(rho, _gamma_and_derivative(rejected, k, k_max)[0])
    t = np.where(settled, 1.0, np.minimum(1 / start, 1.0))  # settled rows stay at t = 1
    for _ in range(64):
        value, derivative = _gamma_and_derivative(reach - slope * t, k, k_max)
        excess = t * value - 1
        low = np.where(excess < 0, t, low)
        high = np.where(excess >= 0, t, high)
        rise = value - t * slope * derivative  # the model's F'(t) >= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            step = t - excess / rise
        step = np.where(np.isfinite(step) & (step > low) & (step < high), step, (low + high) / 2)
        converged = (np.abs(step - t) <= 1e-10 * t) | (excess == 0)
        t = np.where(excess == 0, t, step)
        if bool(converged.all()):
            break
    return np.where(settled, 1.0, 1 / np.maximum(t, 1e-300))


def _gamma_and_derivative(
    rejected: np.ndarray, k: np.ndarray, k_max: int
) -> tuple[np.ndarray, np.ndarray]:
    r""":math:`\gamma(r) = \sum_{i<k} r^i` and :math:`\gamma'(r)` per row by Horner's rule, in
    float64 on the host (``[R]`` each; the float32 test decides, these only aim)."""
    value, derivative = np.ones_like(rejected), np.zeros_like(rejected)
    if bool((k == k_max).all()):  # every row the same k (a level's usual case): no masks
        for _ in range(1, k_max):
            derivative = value + rejected * derivative
            value = 1 + rejected * value
        return value, derivative
    for step in range(1, k_max):
        more = step < k
        derivative = np.where(more, value + rejected * derivative, derivative)
        value = np.where(more, 1 + rejected * value, value)
    return value, derivative


def host_gamma(rejected: np.ndarray, k: np.ndarray, max_count: int) -> np.ndarray:
    """:func:`gamma` on the host, in ``rejected``'s dtype (numpy ``[R]``): the same Horner loop,
    each row's value after its own ``k - 1`` steps, bit for bit (the same roundings, one
    operation at a time) without a tensor operation per step.

    >>> host_gamma(np.array([0.5, 0.5], dtype=np.float32), np.array([1, 3]), 3).tolist()
    [1.0, 1.75]
    """
    one = rejected.dtype.type(1)
    value, out = np.ones_like(rejected), np.ones_like(rejected)
    for step in range(1, max_count):
        value = one + rejected * value
        out = np.where(k - 1 == step, value, out)
    return out


def residual(
    target: torch.Tensor,
    draft: torch.Tensor,
    rho: torch.Tensor,
    counts: torch.Tensor,
    max_count: int,
) -> torch.Tensor:
    r"""K-SEQ's residual :math:`\mathrm{norm}((p - \gamma\min(p/\rho, q))_+)` per row, ``[B, V]``;
    :math:`\gamma = 0` on disjoint supports, :math:`p` where the weights have zero mass.

    In float64 the reference's operations and roundings. Below float64 (agreement up to float32
    rounding) the same weights as :math:`\max(p\,((\rho - \gamma)/\rho)_+,\ p - \gamma q)`,
    which equals :math:`(p - \gamma\min(p/\rho, q))_+` for :math:`p \ge 0` and is :math:`p` on
    disjoint supports whatever :math:`\gamma` (no overlap pass, no clip): three passes fewer.
    :math:`\rho - \gamma` is exact where :math:`\gamma` is near :math:`\rho` (Sterbenz), so the
    floor keeps its digits at a :math:`\rho` a few ulps above :math:`\rho^*`.
    One ``[B, V]`` buffer is written in place from the rejection terms to the result: fresh
    temporaries of this size cost a page fault per 4 KiB wherever the allocator has returned
    freed ones to the system, which on the CPU measured several times this function's
    arithmetic.
    """
    weights = torch.empty_like(draft)  # [B, V]: the rejection terms, then the weights
    scale = gamma(rejection(target, draft, rho, weights), counts, max_count)  # [B]
    if target.dtype != torch.float64:  # static: the float32 formula
        floor = torch.mul(target, ((rho - scale) / rho).clamp_min(0)[:, None])  # [B, V]
        torch.addcmul(target, draft, scale[:, None], value=-1, out=weights)  # p - gamma q
        return ops.normalise_in_place(torch.maximum(weights, floor, out=weights), target)
    torch.div(target, rho[:, None], out=weights)  # p / rho, then min(p / rho, q) in place
    torch.minimum(weights, draft, out=weights)
    scale = torch.where(weights.sum(-1) > 0, scale, 0.0)  # [B]: 0 on disjoint supports
    torch.sub(target, weights.mul_(scale[:, None]), out=weights).clamp_min_(0)  # [B, V]
    return ops.normalise_in_place(weights, target)


class SpecTr(NodeLowering):
    """SpecTr K-SEQ per node with the optimal :math:`\rho^*`, batched; exact on i.i.d. drafts.

    ``reuse`` and ``stop_weights`` are the hooks the mutants override.
    """

    name = "spectr"

    def reuse(self, u: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
        """The uniform the next copy of a rejected token reads (``[B]``)."""
        return reuse_uniform(u, accept)

    def stop_probs(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        rho: torch.Tensor,  # [B]
        counts: torch.Tensor,  # [B]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
    ) -> torch.Tensor:
        """The distribution to stop with when every candidate is rejected (``[B, V]``)."""
        return residual(target, draft, rho, counts, candidate_tokens.shape[1])

    def step(
        self,
        extras: torch.Tensor,  # [B, 0]: none
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C] bool
        accept_uniforms: torch.Tensor,  # [B, C] float64
        owned: bool = False,
    ) -> NodeStep:
        """:meth:`node_step`, told whether ``target`` is the caller's own scratch rows."""
        return self.node_step(
            target, draft, candidate_tokens, candidate_valid, accept_uniforms, owned=owned
        )

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
        owned: bool = False,
    ) -> NodeStep:
        """K-SEQ at every row's node; ``owned``: ``target`` may be overwritten by the stop
        rows (:meth:`stopping_rows`; the walk's own gathered rows)."""
        num_slots = candidate_tokens.shape[1]
        if num_slots == 1:  # static: the level's slots; rho* = 1, the standard rule bit for bit
            return standard_step(
                self.accepts, target, draft, candidate_tokens, candidate_valid, accept_uniforms
            )
        counts = candidate_valid.sum(-1)  # [B]
        if self.rejecting_rows_only(counts):  # static: the CPU outside torch.compile
            rho = self.searched_rows_only(
                target, draft, counts, candidate_tokens, candidate_valid, accept_uniforms
            )  # [B]
        else:
            rho = optimal_rho(target, draft, counts, num_slots)  # [B]
        uniforms = accept_uniforms  # [B, C]
        accepted = torch.full_like(counts, PAD)  # [B]
        for slot in range(num_slots):
            token = candidate_tokens[:, slot]  # [B]
            target_x = ops.gather_tokens(target, token)  # [B]
            scaled = rho * ops.gather_tokens(draft, token)  # [B]
            u = uniforms[:, slot]  # [B]
            testing = candidate_valid[:, slot] & (accepted == PAD)  # [B]
            passes = self.accepts(u, target_x, scaled)  # [B]
            accepted = torch.where(testing & passes, slot, accepted)
            rejected = testing & ~passes  # [B]
            reused = self.reuse(u, accept_probability(target_x, scaled))  # [B]
            copies = rejected[:, None] & later_copies(candidate_tokens, slot)  # [B, C]
            uniforms = torch.where(copies, reused[:, None], uniforms)  # [B, C]
        if self.rejecting_rows_only(accepted):  # static: the CPU outside torch.compile
            stopping = (accepted == PAD) & (counts > 0)  # [B]: every candidate rejected
            stop = self.stopping_rows(
                stopping, target, draft, rho, counts, candidate_tokens, candidate_valid, owned
            )
            return NodeStep(accepted, stop)
        stop = self.stop_probs(target, draft, rho, counts, candidate_tokens, candidate_valid)
        return NodeStep(accepted, stop)

    def rejecting_rows_only(self, rows: torch.Tensor) -> bool:
        r"""Whether :meth:`node_step` works on the rows that need it only: :math:`\rho^*` for
        the rows whose first verdict depends on it (:meth:`searched_rows_only`) and the stop
        distribution for the rows that rejected every candidate (:meth:`stopping_rows`). On the
        CPU outside ``torch.compile``, where reading which rows those are is free (``rows``: any
        tensor of the node's rows)."""
        return ops.host_reads_free(rows)

    def searched_rows_only(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        counts: torch.Tensor,  # [B]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> torch.Tensor:
        r""":func:`optimal_rho` on the CPU route, searched only for the rows whose verdict
        depends on it (a host read, free there); ``[B]``.

        The search returns :math:`\rho \le k` (its bracket's upper end starts at :math:`k`), and
        the first candidate's test :math:`u\,\mathrm{fl}(\rho\,q(x)) < p(x)` is monotone in
        :math:`\rho` in every bit (a correctly rounded product): a row that accepts its first
        candidate at :math:`\rho = k` accepts it at the search's :math:`\rho` too, and reads
        nothing else of the node. Such rows, and rows of one candidate (:math:`\rho^* = 1 = k`)
        or none, take :math:`\rho = \max(k, 1)` without a pass over ``V``: the same verdicts
        (the accelerators' route searches every row). About a third of the rows on the trees
        benchmark's levels."""
        bound = rho_ceiling(counts, target.dtype)  # [B]
        token = candidate_tokens[:, 0]  # [B]
        scaled = bound * ops.gather_tokens(draft, token)  # [B]
        first = self.accepts(accept_uniforms[:, 0], ops.gather_tokens(target, token), scaled)
        searched = (counts > 1) & ~(candidate_valid[:, 0] & first)  # [B]
        num_slots = candidate_tokens.shape[1]
        return searched_where(
            searched,
            bound,
            lambda rows: optimal_rho(
                ops.take_rows(target, rows), ops.take_rows(draft, rows), counts[rows], num_slots
            ),
        )  # [B]

    def stopping_rows(
        self,
        stopping: torch.Tensor,  # [B] bool
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        rho: torch.Tensor,  # [B]
        counts: torch.Tensor,  # [B]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        owned: bool = False,
    ) -> torch.Tensor:
        """:meth:`stop_probs` on the CPU route: formed for the ``stopping`` rows only (a host
        read, free there), written over a copy of ``target`` (over ``target`` itself when the
        caller ``owned`` it); the other rows keep ``target``, a distribution the walk draws
        from but never reads (it reads a draw only where every candidate was rejected).
        ``[B, V]``."""
        rows = stopping.nonzero()[:, 0]  # [R], the host read
        if rows.shape[0] == stopping.shape[0]:
            return self.stop_probs(target, draft, rho, counts, candidate_tokens, candidate_valid)
        if rows.shape[0] == 0:
            return target
        out = target if owned else target.clone()  # [B, V]
        out[rows] = self.stop_probs(
            ops.take_rows(target, rows), ops.take_rows(draft, rows), rho[rows], counts[rows],
            candidate_tokens[rows], candidate_valid[rows],
        )  # fmt: skip
        return out


LOWERING = SpecTr()
LOWERINGS = (LOWERING,)
