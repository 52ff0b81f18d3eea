r"""SpecTr K-SEQ, lowered (reference: :mod:`specsampling.schemes.spectr`).

Per row at a node with :math:`k` i.i.d. candidates :math:`x_1..x_k` (the valid slots, with
multiplicity), :math:`\beta(\rho) = \sum_x \min(p(x)/\rho, q(x))` and
:math:`\gamma(\rho) = \sum_{i<k} (1 - \beta(\rho))^i`. :math:`\rho^*` is the feasible end of the
root of :math:`p_\text{acc}(\rho) - \rho\beta(\rho)` on :math:`[1, k]`, found by the reference's
bisection (:func:`optimal_rho`: the same midpoints, the same stopping width :math:`2^{-40}`, one
static loop with a per-row "still bisecting" mask). For :math:`i = 1..k` accept :math:`x_i` iff

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

import torch

from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.schemes.spectr import RHO_TOLERANCE

from .. import ops
from ..tree import PAD
from .base import NodeLowering, NodeStep

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


def rejection(target: torch.Tensor, draft: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    r""":math:`1 - \beta(\rho) = \sum_x (q(x) - p(x)/\rho)_+` per row (``[B, V]`` rows, ``[B]``).

    One fused ``addcdiv`` (``q + (-1) (p / \rho)``: the same rounding as ``q - p / \rho``, since
    negation is exact), clipped in place, then summed (in numpy's order in float64, as the
    reference): one ``[B, V]`` temporary instead of three.
    """
    return ops.numpy_sum(torch.addcdiv(draft, target, rho[:, None], value=-1).clamp_min_(0))


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

    The reference's bisection on :math:`[1, k]` with its midpoints, run for a static number of
    iterations (enough for ``max_count``, the largest ``k``) while each row's bracket is wider
    than ``TOLERANCE``; 1 where :math:`\rho = 1` is feasible or the supports are disjoint.

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
    counts = counts.clamp_min(1)  # [B]

    def feasible(rho: torch.Tensor) -> torch.Tensor:  # [B] bool
        return gamma(rejection(target, draft, rho), counts, max_count) <= rho

    low = torch.ones(target.shape[0], dtype=target.dtype, device=target.device)  # [B]
    high = counts.to(target.dtype)  # [B]
    overlap = torch.minimum(target, draft).sum(-1) > 0  # [B]
    settled = ~overlap | feasible(low)  # [B]
    for _ in range(steps):
        active = ~settled & (high - low > TOLERANCE)  # [B]
        middle = (low + high) / 2  # [B]
        ok = feasible(middle)  # [B]
        high = torch.where(active & ok, middle, high)
        low = torch.where(active & ~ok, middle, low)
    return torch.where(settled, torch.ones_like(high), high)  # [B]


def residual(
    target: torch.Tensor,
    draft: torch.Tensor,
    rho: torch.Tensor,
    counts: torch.Tensor,
    max_count: int,
) -> torch.Tensor:
    r"""K-SEQ's residual :math:`\mathrm{norm}((p - \gamma\min(p/\rho, q))_+)` per row, ``[B, V]``;
    :math:`\gamma = 0` on disjoint supports, :math:`p` where the weights have zero mass."""
    capped = torch.minimum(target / rho[:, None], draft)  # [B, V]
    overlap = capped.sum(-1) > 0  # [B]
    scale = torch.where(overlap, gamma(rejection(target, draft, rho), counts, max_count), 0.0)
    weights = (target - scale[:, None] * capped).clamp_min(0)  # [B, V]
    return normalised_or_target(weights, target)


def normalised_or_target(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``weights / sum`` per row, or ``target`` where the weights have no mass (``[B, V]``; the
    sum in numpy's order in float64)."""
    mass = ops.numpy_sum(weights)[:, None]  # [B, 1]
    has_mass = mass > 0  # [B, 1]
    return torch.where(
        has_mass, weights / torch.where(has_mass, mass, torch.ones_like(mass)), target
    )


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

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        num_slots = candidate_tokens.shape[1]
        counts = candidate_valid.sum(-1)  # [B]
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
        stop = self.stop_probs(target, draft, rho, counts, candidate_tokens, candidate_valid)
        return NodeStep(accepted, stop)


LOWERING = SpecTr()
LOWERINGS = (LOWERING,)
