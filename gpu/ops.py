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
* :func:`block_sums`, :func:`categorical_blocks` -- the float32 inverse CDF in two levels
  (sums of 128-token blocks, then one block), never normalising and never materialising a
  ``[B, V]`` cumulative sum or a float64 copy of a row. On the CPU outside ``torch.compile``
  (where a host read costs nothing) up to :data:`HOST_DRAW_ROWS` rows search their block sums
  in numpy instead of ~25 small torch ops: the same tokens.
* :func:`host_reads_free` -- whether a CPU route may read the device (a CPU tensor, eager).
* :func:`argmax_blocks` -- ``torch.argmax`` over the last axis in the same two levels (block
  maxima, then one block): the same index, several times faster on CPU; :func:`max_off_token`,
  the largest entry of a row but one token's, the same way; :func:`topk_blocks`, the ``m``
  largest values of every row (``torch.topk``'s values) from the ``m`` blocks with the largest
  maxima.

Dtype rule: distributions are computed in :func:`compute_dtype` (float64 for float64 input, at
least float32 otherwise); uniforms are float64 and every comparison with them is in float64.
Below float64, where the lowering promises agreement up to rounding at a boundary only, the
chain fast paths draw with :func:`categorical_blocks`; float64 keeps :func:`categorical`, the
reference's own sequence of roundings.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch


def host_reads_free(tensor: torch.Tensor) -> bool:
    """Whether reading values of ``tensor`` on the host costs nothing: a CPU tensor, outside
    ``torch.compile``'s tracing. The lowerings' CPU routes (work on the rows a host read picks)
    take it; elsewhere they run their sync-free twins, which give the same values."""
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling()


def compute_dtype(*tables: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32 (bf16/fp16 are upcast before any ratio).

    >>> compute_dtype(torch.zeros(1, dtype=torch.bfloat16)), compute_dtype(torch.zeros(1).double())
    (torch.float32, torch.float64)
    """
    dtype = torch.float32
    for table in tables:
        dtype = torch.promote_types(dtype, table.dtype)
    return dtype


def table_rows(table: torch.Tensor, rows: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """``table[rows, nodes]`` of a ``[B, N, V]`` table (``rows``, ``nodes`` ``[L]``, ids in
    range: the flat index checks only ``rows * N + nodes``) -> ``[L, V]``, a copy: one
    ``index_select`` of the flattened ``[B * N, V]`` rows where ``table`` is contiguous (row
    copies; the CPU's advanced indexing computes an offset per element and costs about a
    third more), advanced indexing otherwise.

    >>> table = torch.arange(12.0).reshape(2, 3, 2)
    >>> table_rows(table, torch.tensor([1, 0]), torch.tensor([2, 0])).tolist()
    [[10.0, 11.0], [0.0, 1.0]]
    """
    if not table.is_contiguous():
        return table[rows, nodes]  # [L, V]
    num_nodes = table.shape[1]
    return table.view(-1, table.shape[-1]).index_select(0, rows * num_nodes + nodes)  # [L, V]


def take_rows(rows_of: torch.Tensor, rows: torch.Tensor | slice) -> torch.Tensor:
    """``rows_of[rows]`` of a ``[B, ...]`` tensor, for an index ``rows [R]`` (a copy, by one
    ``index_select``: row copies, where the CPU's advanced indexing computes an offset per
    element and costs about a third more on ``[R, V]`` rows) or a ``slice`` (a view).

    >>> take_rows(torch.arange(6.0).reshape(3, 2), torch.tensor([2, 0])).tolist()
    [[4.0, 5.0], [0.0, 1.0]]
    """
    if isinstance(rows, slice):
        return rows_of[rows]
    return rows_of.index_select(0, rows)


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
    weights = (target_probs - draft_probs).clamp_min_(0)  # [B, V], the one new row buffer
    return normalise_in_place(weights, target_probs)  # [B, V]


def normalise_in_place(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of ``weights [B, V]`` divided by their sums (in numpy's order in float64), or the
    ``fallback`` row where a sum is 0, written into ``weights`` (no ``[B, V]`` temporary).

    >>> normalise_in_place(torch.tensor([[1.0, 3.0], [0.0, 0.0]]), torch.full((2, 2), 0.5))
    tensor([[0.2500, 0.7500],
            [0.5000, 0.5000]])
    """
    mass = numpy_sum(weights)[..., None]  # [B, 1]
    has_mass = mass > 0  # [B, 1]
    weights.div_(torch.where(has_mass, mass, torch.ones_like(mass)))  # [B, V]
    return torch.where(has_mass, weights, fallback, out=weights)  # [B, V]


def remove_token(
    probs: torch.Tensor, token: torch.Tensor, *, in_place: bool = False
) -> torch.Tensor:
    """Rows of ``probs [B, V]`` with ``token [B]`` set to zero and renormalised; a row with
    nothing left stays all zeros. ``in_place=True`` writes them over ``probs`` (a buffer the
    caller owns, such as rows it gathered): one pass less, and no new buffer.

    >>> remove_token(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64),
    ...              torch.tensor([0])).tolist()
    [[0.0, 0.5, 0.5]]
    """
    column = token[:, None]  # [B, 1]
    out = probs.scatter_(-1, column, 0.0) if in_place else probs.scatter(-1, column, 0.0)  # static
    mass = numpy_sum(out)[..., None]  # [B, 1], in numpy's order in float64
    return out.div_(torch.where(mass > 0, mass, torch.ones_like(mass)))  # zeros stay zeros


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


def row_major(table: torch.Tensor) -> torch.Tensor:
    """``table``, or a copy whose last axis is contiguous where it is not (a column-major
    table): in-place softmaxes need rows, and a float32 sum along a strided row adds in
    another order than along its contiguous copy."""
    return table if table.stride(-1) == 1 else table.contiguous()


def numpy_sum(values: torch.Tensor) -> torch.Tensor:
    r"""Sum over the last axis in numpy's pairwise order, bit for bit (``[..., V] -> [...]``).

    numpy adds a contiguous float64 row of :math:`n` entries sequentially when :math:`n < 8`;
    with eight running sums (stride 8), combined as a balanced tree, plus a sequential tail when
    :math:`n \le 128`; and otherwise splits at :math:`\lfloor n/2 \rfloor` rounded down to a
    multiple of 8 and adds the halves' sums. On the CPU outside ``torch.compile``
    (:func:`host_reads_free`) numpy itself sums the rows (its reduction over a contiguous last
    axis runs that pairwise sum on each row). Elsewhere the structure, which depends on ``V``
    only, is replayed as a static plan: one gather of every block's 8-wide rows, 16 + 3 + 7
    batched adds, then one batched add per level of the split tree, branching on the static
    ``V`` only, never on tensor values (zero padding is exact: ``x + 0.0 == x``). Below float64
    (where the lowering promises agreement up to boundary rounding only) it is ``torch.sum``,
    which is much cheaper.

    >>> import numpy as np
    >>> row = np.random.default_rng(0).random(300)
    >>> float(numpy_sum(torch.tensor(row)[None])[0]) == float(row.sum())
    True
    """
    if values.dtype != torch.float64:  # host metadata: path-wise equality is a float64 claim
        return values.sum(-1)  # [...]
    if values.numel() == 0:  # no rows (or empty ones, which sum to 0): nothing to plan
        return values.sum(-1)  # [...]
    if host_reads_free(values):  # static: numpy sums each contiguous row in this same order
        rows = np.ascontiguousarray(values.detach().numpy())  # [..., V], no copy when contiguous
        return torch.from_numpy(np.asarray(rows.sum(-1)))  # [...], 50x the replay's speed
    return _replayed_sum(values)


def _replayed_sum(values: torch.Tensor) -> torch.Tensor:
    """:func:`numpy_sum` on any device, sync-free: numpy's pairwise plan replayed in torch ops
    (non-empty float64 ``[..., V]``)."""
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


#: Width of the blocks of :func:`block_sums` and :func:`categorical_blocks`.
CDF_BLOCK = 128


def block_sums(weights: torch.Tensor, width: int = CDF_BLOCK) -> torch.Tensor:
    """Sums of consecutive ``width``-token blocks (128 by default) over the last axis,
    ``[..., V] -> [..., V // width + 1]`` (the last block takes the ``V % width`` tail, 0 when
    there is none); a view of the rows, no copy of them.

    >>> block_sums(torch.ones(2, 300)).tolist()
    [[128.0, 128.0, 44.0], [128.0, 128.0, 44.0]]
    >>> block_sums(torch.ones(1, 8), width=4).tolist()
    [[4.0, 4.0, 0.0]]
    """
    vocab = weights.shape[-1]
    full = vocab - vocab % width
    blocks = weights[..., :full].unflatten(-1, (full // width, width)).sum(-1)
    return torch.cat([blocks, weights[..., full:].sum(-1, keepdim=True)], -1)


def pick_block(sums: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first level of :func:`categorical_blocks`: ``(block [N], rest [N] float64)``, the
    first block whose running total exceeds ``u`` times the total (clipped to the last positive
    block) and the part of the threshold left for inside it."""
    running = sums.to(torch.float64).cumsum(-1)  # [N, nb] (small)
    threshold = u.to(torch.float64) * running[:, -1]  # [N]
    block = torch.searchsorted(running, threshold[:, None], right=True).squeeze(-1)  # [N]
    block = torch.minimum(block, last_positive(sums))  # [N]
    before = running.gather(1, (block - 1).clamp_min(0)[:, None]).squeeze(-1)  # [N]
    return block, threshold - torch.where(block > 0, before, 0.0)  # [N], [N] >= 0


def block_index(block: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of every lane of ``block [N]`` (clipped into ``[0, V)``), ``[N, 128]``, and
    which lanes are real tokens."""
    lanes = torch.arange(CDF_BLOCK, device=block.device)  # [128]
    index = block[:, None] * CDF_BLOCK + lanes[None, :]  # [N, 128]
    return index.clamp_max(vocab - 1), index < vocab


def pick_in_block(block: torch.Tensor, values: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """The second level: the token in ``block [N]`` whose running weight (``values [N, 128]``,
    zero past ``V``) first exceeds ``rest [N]``, clipped to the block's last positive token."""
    inner = values.to(torch.float64).cumsum(-1)  # [N, 128]
    offset = torch.searchsorted(inner, rest[:, None], right=True).squeeze(-1)  # [N]
    return block * CDF_BLOCK + torch.minimum(offset, last_positive(values))  # [N]


def categorical_blocks(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    r"""Inverse-CDF draw from unnormalised ``weights [N, V]`` with ``u [N]`` in ``[0, 1)``: the
    first token whose cumulative weight exceeds :math:`u \sum w`, found in two levels.

    The 128-token block sums (:func:`block_sums`, one read of the rows) are accumulated in
    float64 and searched for the first block whose running total exceeds the threshold
    (:func:`pick_block`); that block's 128 weights are gathered, accumulated and searched for
    the remainder (:func:`pick_in_block`). Each level is clipped to its last positive entry (as
    :func:`categorical`), so a zero-weight token is never returned, also when rounding pushes
    the threshold past a total. Exact in law; the token may differ from :func:`categorical`'s
    only where the threshold lies within rounding of a cumulative boundary.

    >>> weights = torch.tensor([[0.0, 2.0, 0.0, 2.0]] * 3)
    >>> categorical_blocks(weights, torch.tensor([0.0, 0.5, 1 - 2**-53], dtype=torch.float64))
    tensor([1, 3, 3])
    """
    if _draws_on_host(weights):
        return _categorical_blocks_host(weights, None, None, u)
    return categorical_blocks_batched(weights, u)


def categorical_blocks_batched(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`categorical_blocks` on the device, sync-free (every route but the CPU's for a few
    rows)."""
    block, rest = pick_block(block_sums(weights), u)  # [N], [N]
    index, inside = block_index(block, weights.shape[-1])  # [N, 128]
    values = torch.where(inside, weights.gather(1, index), 0.0)  # [N, 128]
    return pick_in_block(block, values, rest)


def draw_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws from every row of ``probs [N, V]`` with ``u [N]``: float64 by
    :func:`categorical` (the reference's roundings, path-wise), below float64 by
    :func:`categorical_blocks` (one blocked read, no ``[N, V]`` cumulative sum; exact in law,
    the token differing only where the threshold lies within rounding of a boundary). Host
    dispatch on the dtype only.

    >>> draw_rows(torch.tensor([[0.0, 2.0, 0.0, 2.0]]), torch.tensor([0.75], dtype=torch.float64))
    tensor([3])
    """
    if probs.dtype == torch.float64:
        return categorical(probs, u)
    return categorical_blocks(probs, u)


def categorical_blocks_or(
    weights: torch.Tensor, fallback: torch.Tensor, use_fallback: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """:func:`categorical_blocks` from ``weights [N, V]``, or from ``fallback [N, V]`` in the
    rows where ``use_fallback [N]``: the choice is made on the block sums and the gathered block
    only (never a ``[N, V]`` select), so a non-finite row that is not chosen never counts.

    >>> categorical_blocks_or(torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[0.0, 1.0],
    ...     [0.0, 1.0]]), torch.tensor([False, True]), torch.zeros(2, dtype=torch.float64))
    tensor([0, 1])
    """
    if _draws_on_host(weights) and _draws_on_host(fallback):
        return _categorical_blocks_host(weights, fallback, use_fallback, u)
    return categorical_blocks_or_batched(weights, fallback, use_fallback, u)


def categorical_blocks_or_batched(
    weights: torch.Tensor, fallback: torch.Tensor, use_fallback: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """:func:`categorical_blocks_or` on the device, sync-free."""
    choose = use_fallback[:, None]  # [N, 1]
    sums = torch.where(choose, block_sums(fallback), block_sums(weights))  # [N, nb]
    block, rest = pick_block(sums, u)  # [N], [N]
    index, inside = block_index(block, weights.shape[-1])  # [N, 128]
    values = torch.where(choose, fallback.gather(1, index), weights.gather(1, index))
    return pick_in_block(block, torch.where(inside, values, 0.0), rest)


#: The most rows :func:`categorical_blocks` draws on the host (CPU, eager): after the block sums
#: (one torch pass per row), the two searches are a few numpy calls per row instead of ~25
#: small torch ops on the batch (70 µs against ~25 µs at one row of 152k tokens).
HOST_DRAW_ROWS = 4


def _draws_on_host(weights: torch.Tensor) -> bool:
    """Whether :func:`categorical_blocks` takes its host route for ``weights [N, V]`` (and
    :func:`categorical_blocks_or` for its fallback rows too): a few float32/float64 CPU rows
    outside ``torch.compile`` that numpy can read."""
    return weights.shape[0] <= HOST_DRAW_ROWS and _row_on_host(weights)


def _row_on_host(row: torch.Tensor) -> bool:
    """:func:`_draws_on_host`'s checks but the row count: float32/float64 on the CPU outside
    ``torch.compile``, no gradient (numpy reads it)."""
    return (
        row.dtype in (torch.float32, torch.float64)
        and not row.requires_grad
        and host_reads_free(row)
    )


def _categorical_blocks_host(
    weights: torch.Tensor,
    fallback: torch.Tensor | None,
    use_fallback: torch.Tensor | None,
    u: torch.Tensor,
) -> torch.Tensor:
    """:func:`categorical_blocks` (``fallback=None``) or :func:`categorical_blocks_or` on the
    host: :func:`draw_row_host` of each row's chosen table (only that row is read). The same
    tokens, bit for bit (tested against the batched route)."""
    chosen = [False] * weights.shape[0] if use_fallback is None else use_fallback.tolist()
    tokens = [
        draw_row_host(fallback[row] if choose and fallback is not None else weights[row], u_row)
        for row, (u_row, choose) in enumerate(zip(u.tolist(), chosen, strict=True))
    ]
    return torch.tensor(tokens, dtype=torch.long, device=weights.device)  # [N]


def draw_one(row: torch.Tensor, u: float) -> int:
    """:func:`draw_rows` of one row ``[V]`` below float64 with a Python uniform, as an ``int``:
    :func:`draw_row_host` where :func:`categorical_blocks` would draw on the host, else its
    batched route. For the CPU routes' stop draws, which hold their values on the host: no
    ``[1]`` tensors formed and read back.

    >>> draw_one(torch.tensor([0.0, 2.0, 0.0, 2.0]), 0.75)
    3
    """
    if _row_on_host(row):
        return draw_row_host(row, u)
    uniform = torch.tensor([u], dtype=torch.float64, device=row.device)
    return int(categorical_blocks_batched(row[None], uniform)[0])


def draw_row_host(row: torch.Tensor, u: float) -> int:
    """:func:`categorical_blocks` of one row ``[V]`` (float32 or float64, on the CPU) with the
    uniform ``u``, on the host: the row's block sums by torch (the one pass over ``V``, the
    same values as the batched route's), then the float64 running sums (sequential, as
    ``torch.cumsum``) and right-sided searches in numpy. The clips to the last positive entry
    are needed only where a search runs off the end: a search that stops inside lands on a
    positive entry (its running sum rose there, and a zero leaves a float64 sum unchanged).
    The batched route's token, bit for bit (tested)."""
    sums = _host_block_sums(row)  # [nb]
    return _draw_host_sums(row, sums, sums.astype(np.float64).cumsum(), u)


def draw_one_or(row: torch.Tensor, fallback: torch.Tensor, u: float) -> int:
    """:func:`draw_one` of ``row [V]`` (non-negative weights), or of ``fallback [V]`` where
    ``row`` has no mass: :func:`categorical_blocks_or` of one row with the choice made on the
    values it reads anyway. On the host route the row's own block sums decide (their float64
    total is positive exactly when an entry is, as a sum of non-negative floats is at least
    its largest term), so the residual of a chain's stop is read once for its draw and never
    summed apart.

    >>> draw_one_or(torch.tensor([0.0, 2.0, 0.0]), torch.tensor([1.0, 1.0, 1.0]), 0.9)
    1
    >>> draw_one_or(torch.zeros(3), torch.tensor([1.0, 1.0, 1.0]), 0.9)
    2
    """
    if _row_on_host(row) and _row_on_host(fallback):
        sums = _host_block_sums(row)  # [nb]
        running = sums.astype(np.float64).cumsum()  # [nb]
        if running[-1] > 0:
            return _draw_host_sums(row, sums, running, u)
        return draw_row_host(fallback, u)
    use_fallback = ~(numpy_sum(row[None]) > 0)  # [1]
    uniform = torch.tensor([u], dtype=torch.float64, device=row.device)
    return int(categorical_blocks_or_batched(row[None], fallback[None], use_fallback, uniform)[0])


def _host_block_sums(row: torch.Tensor) -> np.ndarray:
    """:func:`block_sums` of one CPU row ``[V]`` as numpy, the same values: the full blocks
    by torch, the tail block only where ``V`` leaves one (a trailing block of no tokens
    changes no search)."""
    vocab = row.shape[-1]
    full = vocab - vocab % CDF_BLOCK
    head = row[:full] if full < vocab else row
    shape = (full // CDF_BLOCK, CDF_BLOCK)
    blocks = (head.view(shape) if head.is_contiguous() else head.unflatten(-1, shape)).sum(-1)
    blocks = blocks.numpy()  # [V // 128]
    if full == vocab:
        return blocks
    return np.append(blocks, row[full:].sum().numpy())  # [V // 128 + 1]


def _draw_host_sums(row: torch.Tensor, sums: np.ndarray, running: np.ndarray, u: float) -> int:
    """The two searches of :func:`draw_row_host` from the row's block ``sums [nb]`` and their
    float64 ``running`` sums."""
    threshold = u * running[-1]
    block = int(running.searchsorted(threshold, side="right"))
    if block == len(sums):  # past the total (rounding, or no mass): the last positive block
        block = _last_positive(sums)
    rest = threshold - (running[block - 1] if block > 0 else 0.0)
    start = block * CDF_BLOCK
    values = row.numpy()[start : start + CDF_BLOCK]  # [<= 128]: the block's weights
    inner = values.astype(np.float64).cumsum()  # entries past V count 0: never searched past
    offset = int(inner.searchsorted(rest, side="right"))
    if offset == len(values):  # past the block's last entry: its last positive one
        offset = _last_positive(values)
    return start + offset


def _last_positive(values: np.ndarray) -> int:
    """:func:`last_positive` of one numpy row: the last index holding a positive entry, 0 if
    none."""
    positive = np.flatnonzero(values > 0)
    return int(positive[-1]) if positive.size else 0


def argmax_blocks(values: torch.Tensor) -> torch.Tensor:
    """``values.argmax(-1)`` for ``values [..., V]`` (the lowest index of each row's maximum;
    NaN counts as the maximum, as in torch), found in two levels: the maxima of 128-token blocks
    (one vectorised read of the rows), the first block holding the row's maximum, then the first
    maximum inside that block. The same index as :func:`torch.argmax` (ties included), which on
    CPU reduces element by element and is 4-7x slower at V = 32k-152k.

    >>> argmax_blocks(torch.tensor([[0.0, 2.0, 1.0, 2.0], [-1.0, -3.0, -1.0, -2.0]]))
    tensor([1, 0])
    >>> values = torch.zeros(2, 300)
    >>> values[0, [7, 200]] = 1.0
    >>> values[1, 299] = 1.0
    >>> argmax_blocks(values).tolist()
    [7, 299]
    """
    vocab = values.shape[-1]
    if vocab < CDF_BLOCK or values.numel() == 0:
        return values.argmax(-1)
    rows = values.reshape(-1, vocab)  # [N, V]
    block = _block_maxima(rows).argmax(-1)  # [N] the first block holding the maximum
    index, _ = block_index(block, vocab)  # [N, 128]; lanes past V repeat token V - 1, after it
    inner = rows.gather(1, index).argmax(-1)  # [N]
    return (block * CDF_BLOCK + inner).reshape(values.shape[:-1])


def _block_maxima(rows: torch.Tensor) -> torch.Tensor:
    """Maxima of consecutive 128-token blocks of ``rows [N, V]`` (``V >= 128``), the ragged
    tail as one more block: ``[N, ceil(V / 128)]``."""
    vocab = rows.shape[-1]
    full = vocab - vocab % CDF_BLOCK
    maxima = rows[:, :full].unflatten(-1, (full // CDF_BLOCK, CDF_BLOCK)).amax(-1)  # [N, nb]
    if full < vocab:
        maxima = torch.cat([maxima, rows[:, full:].amax(-1, keepdim=True)], -1)
    return maxima


def topk_blocks(rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The ``m`` largest values of every row of ``rows [N, V]``, decreasing, with token ids
    holding them (distinct; which of several equal values is unspecified, as for
    :func:`torch.topk`): ``(values [N, m], index [N, m])``, ``values`` equal to
    ``torch.topk(rows, m).values``.

    Two levels: the maxima of consecutive blocks of ``s`` tokens (one vectorised read of the
    rows; ``s`` a power of two near :math:`2\sqrt{V / m}`, 16 to 128), the ``m`` blocks with the
    largest maxima (any of equal ones), and ``torch.topk`` over their ``m s`` entries and the
    ragged tail's. Exact: if the ``j``-th largest entry :math:`e_j` (``j <= m``) lies in a block
    left out, each of the ``m`` chosen blocks holds a maximum of at least :math:`e_j`, so the
    candidates hold ``m`` entries of at least every value the top ``m`` has; the candidates being
    a subset of the row, their ``i``-th largest is then the row's for every ``i <= m``. On the CPU
    ``torch.topk`` works row by row over the whole vocabulary: this is 2-3x faster at
    ``V >= 32,000`` and ``m`` near 50. Falls back to ``torch.topk`` when the blocks would not
    narrow the rows (fewer than ``4 m`` whole blocks).

    >>> rows = torch.arange(1000.0).flip(0)[None, :]  # 999, 998, ..., 0
    >>> values, index = topk_blocks(rows, 3)
    >>> values.tolist(), index.tolist()
    ([[999.0, 998.0, 997.0]], [[0, 1, 2]])
    """
    num_rows, vocab = rows.shape
    block = 1 << max(4, min(7, round(math.log2(2 * math.sqrt(vocab / max(m, 1))))))
    whole = vocab // block
    if m < 1 or whole < 4 * m or num_rows == 0:
        return torch.topk(rows, m, dim=-1)
    rows = rows.contiguous()
    full = whole * block
    blocks = rows[:, :full].view(num_rows, whole, block)  # [N, nb, s]
    chosen = blocks.amax(-1).topk(m, dim=-1).indices  # [N, m]
    offsets = torch.arange(num_rows, device=rows.device)[:, None] * whole  # [N, 1]
    flat = blocks.reshape(num_rows * whole, block)  # [N nb, s], a view
    candidates = flat.index_select(0, (chosen + offsets).flatten()).view(num_rows, m * block)
    if full < vocab:  # the ragged tail: always a candidate
        candidates = torch.cat([candidates, rows[:, full:]], -1)  # [N, m s + tail]
    values, position = candidates.topk(m, dim=-1)  # [N, m] each
    slot = torch.div(position, block, rounding_mode="floor").clamp_max(m - 1)  # [N, m]
    in_block = chosen.gather(-1, slot) * block + position % block  # [N, m]
    return values, torch.where(position < m * block, in_block, position - m * block + full)


def max_off_token(rows: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The largest entry of each row of ``rows [N, V]`` other than ``rows[n, token[n]]``
    (``token [N]`` in range), ``[N]``; ``-inf`` when ``V = 1``. Block maxima (one vectorised
    read), the token's own block dropped from them, and that block re-read without the token:
    no ``[N, V]`` temporary.

    >>> max_off_token(torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]), torch.tensor([1, 0]))
    tensor([0.0000, 0.5000])
    >>> values = torch.zeros(2, 300)
    >>> values[0, 7], values[1, 299], values[1, 298] = 1.0, 1.0, 1e-30
    >>> max_off_token(values, torch.tensor([7, 299])).tolist()
    [0.0, 1e-30]
    """
    vocab = rows.shape[-1]
    lowest = torch.tensor(float("-inf"), dtype=rows.dtype, device=rows.device)
    if vocab < CDF_BLOCK:
        return rows.scatter(1, token[:, None], float("-inf")).amax(-1)  # [N] (a small copy)
    maxima = _block_maxima(rows)  # [N, nb]
    block = token // CDF_BLOCK  # [N]
    others = maxima.scatter(1, block[:, None], float("-inf")).amax(-1)  # [N] outside the block
    index, inside = block_index(block, vocab)  # [N, 128]
    values = rows.gather(1, index)  # [N, 128]
    lanes = torch.arange(CDF_BLOCK, device=rows.device)[None, :]  # [1, 128]
    mine = (lanes == (token % CDF_BLOCK)[:, None]) | ~inside  # [N, 128]: the token, past V
    own = torch.where(mine, lowest, values).amax(-1)  # [N] inside the block, without it
    return torch.maximum(others, own)
