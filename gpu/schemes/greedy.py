r"""Greedy multi-draft verification, lowered (reference: :mod:`specsampling.schemes.greedy`).

Per row at a node with candidates :math:`x_1..x_c` in drafting order (the walk gathers them),
:math:`T = \{x_1..x_{c-1}\}` and :math:`X = x_c` (the last real slot), read from the tree as the
reference does: the tree's own drafting (``Shape.greedy``: top :math:`k-1` of :math:`q`, ties to
the lowest id, then one draw off them) decides which tokens are deterministic. With
:math:`q' = \mathrm{norm}(q\,\mathbf 1_{V \setminus T})`:

* if the candidates cover :math:`\mathrm{supp}\,q`, stop with :math:`p`;
* else accept :math:`X` iff :math:`u_\text{accept}[X]\,q'(X) < p(X)` (strict), and otherwise stop
  with

.. math:: \mathrm{norm}\bigl(p\,\mathbf 1_T + (p - q')_+\,\mathbf 1_{V \setminus T}\bigr)

  (:math:`p` when that has zero mass). The walk draws the stop token with the node's ``sample``
  uniform; a drawn token in :math:`T` is a residual hit and descends.

Float64 equality. :math:`q'(X)` meets :math:`p(X)` exactly when :math:`p = q`, so the mass that
normalises :math:`q'` must round as the reference's does: every normalising sum here is
:func:`numpy_sum`, numpy's own pairwise summation order replayed on tensors (torch's ``sum``
rounds differently from five tokens on).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch

from .. import ops
from ..tree import PAD
from .base import NodeLowering, NodeStep

#: numpy's pairwise-summation block (``PW_BLOCKSIZE``) and unroll factor.
_BLOCK, _UNROLL = 128, 8


@functools.lru_cache(maxsize=64)
def _sum_plan(vocab_size: int) -> tuple[list[tuple[int, int]], list[list[tuple[int, int, int]]]]:
    """numpy's recursion over ``vocab_size >= 8`` elements: the leaf blocks ``(start, length)``
    in order, and the internal nodes ``(node, left, right)`` grouped by height (leaves are
    nodes ``0..L-1``)."""
    leaves: list[tuple[int, int]] = []
    levels: list[list[tuple[int, int, int]]] = []
    internal: list[tuple[int, int, int]] = []  # (height, left, right), ids before renumbering

    def build(start: int, length: int) -> tuple[int, int]:  # (node id, height)
        if length <= _BLOCK:
            leaves.append((start, length))
            return -len(leaves), 0  # leaf ids negative until renumbered
        half = length // 2
        half -= half % _UNROLL
        left, left_height = build(start, half)
        right, right_height = build(start + half, length - half)
        height = max(left_height, right_height) + 1
        internal.append((height, left, right))
        return len(internal) - 1, height

    build(0, vocab_size)
    num_leaves = len(leaves)

    def renumber(node: int) -> int:
        return -node - 1 if node < 0 else num_leaves + node

    for index, (height, left, right) in enumerate(internal):
        while len(levels) < height:
            levels.append([])
        levels[height - 1].append((num_leaves + index, renumber(left), renumber(right)))
    return leaves, levels


@functools.lru_cache(maxsize=64)
def _sum_indices(
    vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """Gather indices of :func:`numpy_sum`: the 8-wide rows of every leaf block ``[L * 16]``
    (index ``vocab_size // 8`` reads an appended zero row) and the split tree's levels.

    Every split point is a multiple of 8, so every leaf starts on a row boundary and only the
    last leaf has a tail (the final ``vocab_size % 8`` entries)."""
    leaves, levels = _sum_plan(vocab_size)
    num_rows, per_leaf = vocab_size // _UNROLL, _BLOCK // _UNROLL
    rows = torch.full((len(leaves), per_leaf), num_rows, dtype=torch.long)  # [L, 16]
    for leaf, (start, length) in enumerate(leaves):
        assert start % _UNROLL == 0 and (length % _UNROLL == 0 or leaf == len(leaves) - 1)
        first = start // _UNROLL
        rows[leaf, : length // _UNROLL] = torch.arange(first, first + length // _UNROLL)
    steps = [
        tuple(
            torch.tensor(column, dtype=torch.long, device=device)
            for column in zip(*level, strict=True)
        )
        for level in levels
    ]
    return rows.flatten().to(device), steps  # type: ignore[return-value]


def numpy_sum(values: torch.Tensor) -> torch.Tensor:
    r"""Sum over the last axis in numpy's pairwise order, bit for bit (``[..., V] -> [...]``).

    numpy adds a contiguous float64 row of :math:`n` entries sequentially when :math:`n < 8`;
    with eight running sums (stride 8), combined as a balanced tree, plus a sequential tail when
    :math:`n \le 128`; and otherwise splits at :math:`\lfloor n/2 \rfloor` rounded down to a
    multiple of 8 and adds the halves' sums. The structure depends on ``V`` only, so it is a
    static plan: one gather of every block's 8-wide rows, 16 + 3 + 7 batched adds, then one
    batched add per level of the split tree. Branches are on the static ``V`` only, never on
    tensor values. (Zero padding is exact: ``x + 0.0 == x``.)

    >>> import numpy as np
    >>> row = np.random.default_rng(0).random(300)
    >>> float(numpy_sum(torch.tensor(row)[None])[0]) == float(row.sum())
    True
    """
    vocab_size = values.shape[-1]
    if vocab_size < _UNROLL:
        total = torch.zeros_like(values[..., 0])  # [...]
        for index in range(vocab_size):
            total = total + values[..., index]
        return total
    row_index, steps = _sum_indices(vocab_size, values.device)
    lead = values.shape[:-1]
    blocked = vocab_size - vocab_size % _UNROLL
    rows = values[..., :blocked].reshape(*lead, blocked // _UNROLL, _UNROLL)  # [..., R, 8]
    rows = torch.cat([rows, torch.zeros_like(rows[..., :1, :])], dim=-2)  # [..., R + 1, 8]
    blocks = rows.index_select(-2, row_index)  # [..., L * 16, 8]
    blocks = blocks.reshape(*lead, -1, _BLOCK // _UNROLL, _UNROLL)  # [..., L, 16, 8]
    lanes = blocks[..., 0, :]  # [..., L, 8]
    for row in range(1, blocks.shape[-2]):
        lanes = lanes + blocks[..., row, :]
    leaf_sums = (lanes[..., 0] + lanes[..., 1]) + (lanes[..., 2] + lanes[..., 3])  # [..., L]
    leaf_sums = leaf_sums + ((lanes[..., 4] + lanes[..., 5]) + (lanes[..., 6] + lanes[..., 7]))
    last = leaf_sums[..., -1]  # [...] the last leaf takes the tail, one entry at a time
    for index in range(blocked, vocab_size):
        last = last + values[..., index]
    num_leaves = leaf_sums.shape[-1]
    num_internal = sum(len(step[0]) for step in steps)
    sums = torch.cat(
        [leaf_sums[..., :-1], last[..., None], leaf_sums.new_zeros((*lead, num_internal))], -1
    )  # [..., L + internal]
    for node, left, right in steps:
        sums[..., node] = sums[..., left] + sums[..., right]
    return sums[..., num_leaves + num_internal - 1]


def normalise(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights / mass, mass > 0)`` per row of ``weights [B, V]``, the mass summed as numpy
    sums it; rows without mass come back unchanged (all zeros)."""
    mass = numpy_sum(weights)[:, None]  # [B, 1]
    has_mass = mass > 0  # [B, 1]
    return weights / torch.where(has_mass, mass, torch.ones_like(mass)), has_mass


def token_mask(tokens: torch.Tensor, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B, V]`` bool: ``True`` at ``tokens[b, c]`` for every slot with ``keep[b, c]``."""
    counts = torch.zeros_like(like).scatter_add(1, tokens, keep.to(like.dtype))  # [B, V]
    return counts > 0


class Greedy(NodeLowering):
    """Hu et al.'s verifier for greedy drafts (top :math:`k-1` plus one draw), batched."""

    name = "greedy"
    hot_path: ClassVar[tuple[str, ...]] = ("walk", "node_step", "split", "residual")

    def split(
        self,
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(deterministic [B, V], random slot [B], rest [B, V], covered [B])``: the mask of
        :math:`T`, the slot of :math:`X`, :math:`q'` and whether the drafts cover supp q."""
        slots = torch.arange(candidate_tokens.shape[1], device=draft.device)  # [C]
        last = (candidate_valid.sum(-1) - 1).clamp_min(0)  # [B]
        drafted = token_mask(candidate_tokens, candidate_valid, draft)  # [B, V]
        fixed = candidate_valid & (slots[None, :] != last[:, None])  # [B, C]
        deterministic = token_mask(candidate_tokens, fixed, draft)  # [B, V]
        covered = ~((draft > 0) & ~drafted).any(-1)  # [B]
        rest, _ = normalise(torch.where(deterministic, torch.zeros_like(draft), draft))
        return deterministic, last, rest, covered

    def residual(
        self, target: torch.Tensor, deterministic: torch.Tensor, rest: torch.Tensor
    ) -> torch.Tensor:
        r""":math:`\mathrm{norm}(p\,\mathbf 1_T + (p - q')_+\,\mathbf 1_{V \setminus T})`, or
        :math:`p` where that has zero mass (``[B, V]``)."""
        weights = torch.where(deterministic, target, (target - rest).clamp_min(0))  # [B, V]
        normalised, has_mass = normalise(weights)
        return torch.where(has_mass, normalised, target)

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        deterministic, last, rest, covered = self.split(draft, candidate_tokens, candidate_valid)
        token = candidate_tokens.gather(1, last[:, None]).squeeze(-1)  # [B]
        passes = self.accepts(
            accept_uniforms.gather(1, last[:, None]).squeeze(-1),
            ops.gather_tokens(target, token),
            ops.gather_tokens(rest, token),
        )  # [B]
        accepted = torch.where(candidate_valid.any(-1) & ~covered & passes, last, PAD)  # [B]
        stop = self.residual(target, deterministic, rest)  # [B, V]
        return NodeStep(accepted, torch.where(covered[:, None], target, stop))


LOWERING = Greedy()
LOWERINGS = (LOWERING,)
