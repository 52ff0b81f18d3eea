"""Batches of drafted trees with both models' tables: what every Monte-Carlo estimator reads.

A *tree source* is anything the estimators can draw rounds from:

* a :class:`~specsampling.simulators.pairs.Synthetic` pair: trees are drafted level by level
  on torch (:class:`specsampling.gpu.drafting.TreeDrafter`) and every node's distributions are
  computed in one batched call per level;
* any other :class:`~specsampling.pairs.ModelPair`: the same tensor drafter, with the pair called
  once per node (numpy models are called per node);
* :class:`~specsampling.simulators.recorded.RecordedTrees`: trees and tables recorded from real
  models, replayed in order.

Each batch is a :class:`Drafted`: a :class:`~specsampling.gpu.TreeBatch` and the float64
target / draft tables ``[B, N, V]`` of its nodes (``table[b, n]`` is the distribution after node
``n`` of row ``b``; padding rows are zeros and never read).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

import specsampling as ss
from specsampling.gpu import drafting, tables_batch
from specsampling.gpu.tree import TreeBatch
from specsampling.pairs import ModelPair, check_model_pair
from specsampling.schemes import tables
from specsampling.shapes import Shape, check_shape
from specsampling.validation import check_positive_int, check_prefix

from .pairs import Synthetic

#: Most table elements (trees x nodes x vocabulary) one batch holds, per table.
BATCH_ELEMENTS = 1 << 23


class Drafted(NamedTuple):
    """One batch of drafted trees and the distributions at their nodes."""

    trees: TreeBatch
    target: torch.Tensor  # [B, N, V] float64
    draft: torch.Tensor  # [B, N, V] float64
    roots: tuple[tuple[int, ...], ...]  # the context each tree was drafted after


def as_generator(generator: Any) -> np.random.Generator:
    """``None`` (fresh entropy), an int seed (>= 0) or a numpy ``Generator``, as a ``Generator``.

    >>> as_generator(-1)
    Traceback (most recent call last):
    ...
    ValueError: generator: expected a seed >= 0, got -1
    """
    if generator is None:
        return np.random.default_rng()
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"generator: expected a seed >= 0, got {generator}")
        return np.random.default_rng(generator)
    if isinstance(generator, np.random.Generator):
        return generator
    raise TypeError(
        "generator: expected None, an integer seed or a numpy.random.Generator, got "
        f"{type(generator).__name__}"
    )


def default_batch_size(shape: Any, vocab_size: int) -> int:
    """Trees per batch so that one table holds at most :data:`BATCH_ELEMENTS` values."""
    nodes = shape.max_nodes if hasattr(shape, "max_nodes") else 1 + len(shape.steps)
    return max(1, BATCH_ELEMENTS // (nodes * vocab_size))


def draft_batches(
    pair: ModelPair,
    shape: Shape,
    num_trees: int,
    generator: np.random.Generator,
    *,
    prefix: Sequence[int] | None = None,
    batch_size: int | None = None,
) -> Iterator[Drafted]:
    """Draft ``num_trees`` trees of ``shape`` from ``pair``, in batches.

    Roots: every tree drafts after ``prefix`` when it is given; otherwise after a fresh root
    context per tree from ``pair.roots(num, generator)`` when the pair has one (a
    :class:`Synthetic` pair), else after ``()``.
    """
    if isinstance(shape, Shape) or not hasattr(shape, "draft_trees"):
        shape = check_shape(shape)
    pair = check_model_pair(pair, "pair")
    if batch_size is not None:
        batch_size = check_positive_int(batch_size, "batch_size")
    size = batch_size or default_batch_size(shape, pair.vocab_size)
    # Roots and drafting noise come from separate streams, the roots drawn all at once: every
    # shape (whatever its batch size) drafts after the same contexts for the same generator.
    root_rng, noise_rng = generator.spawn(2)
    if prefix is not None:
        all_roots = [check_prefix(prefix, pair.vocab_size)] * num_trees
    elif hasattr(pair, "roots"):
        all_roots = list(pair.roots(num_trees, root_rng))
    else:
        all_roots = [()] * num_trees
    for start in range(0, num_trees, size):
        roots = all_roots[start : start + size]
        count = len(roots)
        if not isinstance(shape, Shape):  # a tree policy drafts its own trees
            yield tables_for(pair, shape.draft_trees(pair, roots), roots)
            continue
        uniforms = noise_rng.random((count, len(shape.steps)))
        noise = torch.as_tensor(uniforms, dtype=torch.float64)
        if isinstance(pair, Synthetic):
            yield _synthetic_batch(pair, shape, roots, noise)
        else:
            trees = drafting.draft(shape, pair, noise, prefix=roots)
            target, draft = [], []
            for tree, root in zip(trees.to_trees(), roots, strict=True):
                t, d = tables(pair, tree, root)
                target.append(t)
                draft.append(d)
            yield Drafted(trees, *tables_batch(target, draft), tuple(roots))


def draft_at(pair: ModelPair, prefixes: Sequence[tuple[int, ...]]) -> torch.Tensor:
    """The draft distributions after each prefix, float64 ``[M, V]`` (one batched call for a
    :class:`Synthetic` pair, one ``pair.draft`` per prefix otherwise)."""
    if isinstance(pair, Synthetic):
        lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=pair.device)
        return pair.draft_probs(pair.hash_prefixes(prefixes), lengths)
    rows = [np.asarray(pair.draft(p), dtype=np.float64) for p in prefixes]
    return torch.tensor(np.stack(rows), dtype=torch.float64)


def tables_for(
    pair: ModelPair, trees: Sequence[ss.DraftTree], roots: Sequence[tuple[int, ...]]
) -> Drafted:
    """Batch hand-made (or policy-made) ``trees`` drafted after ``roots`` with their tables."""
    device = pair.device if isinstance(pair, Synthetic) else None
    batch = TreeBatch.from_trees(list(trees), device=device)
    if isinstance(pair, Synthetic):
        root_hash = pair.hash_prefixes(list(roots))
        root_len = torch.tensor([len(r) for r in roots], dtype=torch.long, device=pair.device)
        target, draft = node_tables(pair, batch, root_hash, root_len)
        return Drafted(batch, target, draft, tuple(roots))
    target_rows, draft_rows = [], []
    for tree, root in zip(trees, roots, strict=False):
        t, d = tables(pair, tree, root)
        target_rows.append(t)
        draft_rows.append(d)
    return Drafted(batch, *tables_batch(target_rows, draft_rows), tuple(roots))


class _Known(NamedTuple):
    """Distributions already computed at some prefixes of each row: ``hashes``, ``lengths`` and
    ``valid`` ``[B, K]``, ``target`` and ``draft`` ``[B, K, V]`` (any values where not valid)."""

    hashes: torch.Tensor
    lengths: torch.Tensor
    valid: torch.Tensor
    target: torch.Tensor
    draft: torch.Tensor


def _synthetic_batch(
    pair: Synthetic, shape: Shape, roots: list[tuple[int, ...]], noise: torch.Tensor
) -> Drafted:
    """Draft on torch, level by level. Each level's frontier gets both distributions in one
    call; drafting reads the draft, and :func:`node_tables` reuses both at the expanded nodes
    (a node's distributions are a pure function of its prefix's hash and length)."""
    device = pair.device
    root_hash = pair.hash_prefixes(roots)  # [B]
    root_len = torch.tensor([len(r) for r in roots], dtype=torch.long, device=device)
    vocab = pair.vocab_size
    levels: list[_Known] = []

    def source(frontier: drafting.Frontier) -> torch.Tensor:
        batch, slots = frontier.exists.shape
        paths = frontier.paths.to(device)
        hashes = root_hash[:, None].expand(batch, slots)
        for column in range(paths.shape[-1]):
            hashes = pair.extend(hashes, paths[..., column].clamp_min(0))
        lengths = (root_len[:, None] + paths.shape[-1]).expand(batch, slots)
        real = frontier.exists.to(device)  # [B, F]
        flat = real.reshape(-1)
        target = torch.zeros(batch * slots, vocab, dtype=torch.float64, device=device)
        draft = torch.zeros_like(target)
        target[flat], draft[flat] = pair.node_probs(
            hashes.reshape(-1)[flat], lengths.reshape(-1)[flat]
        )
        shaped = (batch, slots, vocab)
        levels.append(_Known(hashes, lengths, real, target.reshape(shaped), draft.reshape(shaped)))
        return draft.reshape(shaped)

    drafter = drafting.TreeDrafter(shape, len(roots), device)
    noise = noise.to(device)
    while not drafter.done:
        columns = list(drafter.levels[drafter.level])
        drafter.next_level(source(drafter.frontier), noise[:, columns])
    trees = drafter.finish()
    known = _Known(*(torch.cat(parts, dim=1) for parts in zip(*levels, strict=True)))
    target, draft = node_tables(pair, trees, root_hash, root_len, known)
    return Drafted(trees, target, draft, tuple(roots))


def node_tables(
    pair: Synthetic,
    trees: TreeBatch,
    root_hash: torch.Tensor,
    root_len: torch.Tensor,
    known: _Known | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft tables ``[B, N, V]`` of every node of ``trees`` (zeros on padding),
    copied from ``known`` where a node's prefix (hash and length) is there, computed otherwise."""
    batch, nodes = trees.parents.shape
    hashes = [root_hash]
    for node in range(1, nodes):
        parent = trees.parents[:, node].clamp_min(0)
        parent_hash = torch.stack(hashes, dim=1).gather(1, parent[:, None])[:, 0]
        hashes.append(pair.extend(parent_hash, trees.tokens[:, node].clamp_min(0)))
    words = torch.stack(hashes, dim=1)  # [B, N]
    lengths = root_len[:, None] + trees.depth.clamp_min(0)  # [B, N]
    real = trees.real_nodes()  # [B, N]
    shape = (batch, nodes, pair.vocab_size)
    target = torch.zeros(shape, dtype=torch.float64, device=pair.device)
    draft = torch.zeros_like(target)
    missing = real
    if known is not None:
        same = (
            (words[:, :, None] == known.hashes[:, None, :])
            & (lengths[:, :, None] == known.lengths[:, None, :])
            & known.valid[:, None, :]
        )  # [B, N, K]
        found = real & same.any(-1)  # [B, N]
        row, node = found.nonzero(as_tuple=True)  # [F] each
        slot = same[row, node].to(torch.int8).argmax(-1)  # [F]: a known entry of that prefix
        target[row, node] = known.target[row, slot]
        draft[row, node] = known.draft[row, slot]
        missing = real & ~found
    target[missing], draft[missing] = pair.node_probs(words[missing], lengths[missing])
    return target, draft


__all__ = [
    "BATCH_ELEMENTS",
    "Drafted",
    "as_generator",
    "default_batch_size",
    "draft_at",
    "draft_batches",
    "tables_for",
]
