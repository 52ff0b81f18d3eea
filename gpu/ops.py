r"""The small batched pieces every lowered ratio scheme is assembled from.

Mirrors :mod:`specsampling.ops` row by row: every function takes ``[B, V]`` distributions (one
row per batch row) and ``[B]`` tokens / uniforms, and makes the decision the reference makes on
each row. No host synchronisation, no loop over rows or the vocabulary.

* :func:`accepts` -- the division-free accept test :math:`u\,q(x) < p(x)`, strict.
* :func:`residual` -- :math:`\mathrm{norm}((p - q)_+)`, the target where it has zero mass.
* :func:`categorical` -- inverse CDF, clipped to the last token of positive mass.
* :func:`remove_token` -- one token deleted, the rest renormalised (all zeros if none is left).
* :func:`numpy_sum` -- a row sum in numpy's pairwise order, bit for bit (exact ties round as in
  the reference); :func:`normalise` divides by it.

Dtype rule: distributions are computed in :func:`compute_dtype` (float64 for float64 input, at
least float32 otherwise); uniforms are float64 and every comparison with them is in float64.
"""

from __future__ import annotations

import functools

import torch


def compute_dtype(*tables: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32 (bf16/fp16 are upcast before any ratio).

    >>> compute_dtype(torch.zeros(1, dtype=torch.bfloat16)), compute_dtype(torch.zeros(1).double())
    (torch.float32, torch.float64)
    """
    dtype = torch.float32
    for table in tables:
        dtype = torch.promote_types(dtype, table.dtype)
    return dtype


def gather_tokens(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs[b, tokens[b]]`` for ``probs [B, V]``, ``tokens [B]`` (ids in range) -> ``[B]``."""
    return probs.gather(-1, tokens[:, None]).squeeze(-1)  # [B]


def accepts(u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> torch.Tensor:
    """Accept test without a division, ``u * draft_x < target_x``, in float64 (``[B]`` bool).

    Strict: a token with ``target_x == 0`` is never accepted, even when ``u == 0``.

    >>> accepts(torch.tensor([0.0, 0.999, 0.5], dtype=torch.float64),
    ...         torch.tensor([0.0, 0.5, 0.1]), torch.tensor([0.5, 0.5, 0.0])).tolist()
    [False, True, True]
    """
    return u * draft_x.to(torch.float64) < target_x.to(torch.float64)  # [B]


def residual(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    r"""Per row :math:`\mathrm{norm}((p - q)_+)`, or the target row where that has zero mass.

    >>> residual(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64),
    ...          torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)).tolist()
    [[1.0, 0.0], [0.5, 0.5]]
    """
    weights = (target_probs - draft_probs).clamp_min(0)  # [B, V]
    mass = weights.sum(-1, keepdim=True)  # [B, 1]
    has_mass = mass > 0  # [B, 1]
    normalised = weights / torch.where(has_mass, mass, torch.ones_like(mass))  # [B, V]
    return torch.where(has_mass, normalised, target_probs)  # [B, V]


def remove_token(probs: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Rows of ``probs [B, V]`` with ``token [B]`` set to zero and renormalised; a row with
    nothing left stays all zeros.

    >>> remove_token(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64),
    ...              torch.tensor([0])).tolist()
    [[0.0, 0.5, 0.5]]
    """
    out = probs.scatter(-1, token[:, None], 0.0)  # [B, V]
    mass = out.sum(-1, keepdim=True)  # [B, 1]
    has_mass = mass > 0  # [B, 1]
    return torch.where(has_mass, out / torch.where(has_mass, mass, torch.ones_like(mass)), out)


def last_positive(probs: torch.Tensor) -> torch.Tensor:
    """Index of the last token with positive mass per row (``0`` for a row without any)."""
    vocab = torch.arange(probs.shape[-1], device=probs.device, dtype=torch.int32)  # [V]
    return ((probs > 0) * vocab).amax(-1).to(torch.long)  # [B]; int32: ~15x cheaper than int64


def categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    r"""Draw one token per row by inverse CDF from ``u [B]`` in ``[0, 1)``.

    The first token whose cumulative mass exceeds ``u * sum(probs)`` (``searchsorted`` on the
    right, as the reference), clipped to the last token with positive mass: zero-mass tokens are
    never returned, also when rounding pushes ``u * sum`` past the last cumulative value. The
    cumulative sum is in the compute dtype, the comparison in float64.

    >>> probs = torch.tensor([[0.5, 0.0, 0.5], [0.5, 0.0, 0.5]], dtype=torch.float64)
    >>> categorical(probs, torch.tensor([0.5, 0.0], dtype=torch.float64)).tolist()
    [2, 0]
    """
    cdf = torch.cumsum(probs, dim=-1).to(torch.float64)  # [B, V] (no copy for float64)
    threshold = u[:, None] * cdf[:, -1:]  # [B, 1]
    index = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)  # [B]
    return torch.minimum(index, last_positive(probs))  # [B]


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
    tensor values. (Zero padding is exact: ``x + 0.0 == x``.) Below float64 (where the lowering
    promises agreement up to boundary rounding only) it is ``torch.sum``, which is much cheaper.

    >>> import numpy as np
    >>> row = np.random.default_rng(0).random(300)
    >>> float(numpy_sum(torch.tensor(row)[None])[0]) == float(row.sum())
    True
    """
    if values.dtype != torch.float64:  # host metadata: path-wise equality is a float64 claim
        return values.sum(-1)  # [...]
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
