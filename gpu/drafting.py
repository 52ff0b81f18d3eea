r"""Drafting on tensors: every :class:`~specsampling.Shape` law, batched over rows.

Mirrors the reference drafting of :mod:`specsampling.shapes`
(:meth:`Shape.draft_with_noise <specsampling.Shape.draft_with_noise>`): fed the same draft
distributions and the same drafting noise, every row drafts the reference tree token for token.

**Noise layout.** One float64 uniform per draw step, ``noise[b, s]`` for step ``s`` of
``shape.steps`` (``[B, S]``). Step ``s`` draws below the node of its parent step (the root for
``-1``) from its proposal, by inverse CDF with ``noise[b, s]`` (:func:`gpu.ops.categorical
<specsampling.gpu.ops.categorical>`, the reference's clipped rule). With :math:`q` the draft
distribution at the node and :math:`R` the tokens the node's earlier steps drew:

* ``iid``: :math:`x = F^{-1}_{q}(u)`;
* ``without``: :math:`x = F^{-1}_{\mathrm{norm}(q \cdot 1[\notin R])}(u)`, the step (and its
  descendants) skipped when :math:`q(R^c) = 0`;
* ``top``: :math:`x = \arg\max_{t \notin R} q(t)`, ties to the lowest id, skipped when
  :math:`q(R^c) = 0`; the uniform is unread;
* ``hub``: :math:`a = \arg\max q` if :math:`a \notin R`, else a ``without`` draw.

So ``greedy(widths)`` is ``top`` steps then one ``without`` step per node, ``hub(depth)`` an
``iid`` step then a ``hub`` step, and chains, paths, delayed trees and branching (with or without
replacement) are ``iid`` or ``without`` steps. A draw of a token the node already has (i.i.d.
duplicates) adds that child to the node's candidates again, as the reference does. Drafting reads
only the draft distributions and this noise: never the target, never the verifier's noise.

**Level by level.** A tree's deeper steps need the draft model at the nodes just drafted, so
:class:`TreeDrafter` works one depth at a time: :attr:`TreeDrafter.frontier` names the nodes
whose draft distributions the next level needs, :meth:`TreeDrafter.next_level` draws that level,
and :meth:`TreeDrafter.finish` assembles the :class:`~specsampling.gpu.TreeBatch` (node ids in
step order, as the reference's). :func:`draft` drives a :class:`~specsampling.pairs.ModelPair`
(one ``pair.draft(prefix)`` per distinct node: a numpy model is called per node).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from specsampling.errors import InvalidDistribution
from specsampling.pairs import ModelPair, check_model_pair
from specsampling.shapes import Shape, check_draft_row, check_shape

from . import ops
from .tree import PAD, TreeBatch

#: The modes of :attr:`Shape.steps` this drafter knows.
MODES = ("iid", "without", "top", "hub")


class Frontier(NamedTuple):
    """The nodes whose draft distributions the next level reads, one slot per step of the
    previous level (a single root slot at the first level).

    ``steps`` are those steps (``(-1,)`` for the root); ``exists [B, F]`` whether the slot's
    step drew a node in that row (skipped steps did not); ``fresh [B, F]`` whether that node is
    new (a duplicate i.i.d. draw points at an earlier slot's node); ``paths [B, F, d]`` the
    tokens from the root to the node (``PAD`` where it does not exist).
    """

    steps: tuple[int, ...]
    exists: torch.Tensor  # [B, F] bool
    fresh: torch.Tensor  # [B, F] bool
    paths: torch.Tensor  # [B, F, d]


class Level(NamedTuple):
    """One drafted level: ``tokens [B, S_d]`` of the level's steps (``steps``, in step order),
    ``PAD`` where a step was skipped."""

    steps: tuple[int, ...]
    tokens: torch.Tensor  # [B, S_d]


class TreeDrafter:
    """Draft ``batch_size`` trees of ``shape`` level by level from draft probability tensors.

    Parameters
    ----------
    shape : Shape
        The drafting plan; every tree gets its law.
    batch_size : int
        Rows ``B``.
    device : torch.device or str, optional
        Where the trees are built.

    Examples
    --------
    >>> import torch
    >>> import specsampling as ss
    >>> drafter = TreeDrafter(ss.Shape.greedy((3,)), batch_size=2)
    >>> draft_probs = torch.tensor([[[0.2, 0.5, 0.3, 0.0]], [[0.25, 0.25, 0.25, 0.25]]])
    >>> uniforms = torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64)
    >>> drafter.next_level(draft_probs.double(), uniforms).tokens.tolist()
    [[1, 2, 0], [0, 1, 2]]
    >>> drafter.finish().to_trees()[0] == ss.Shape.greedy((3,)).draft_with_noise(
    ...     ss.pairs.Stationary([0.25] * 4, [0.2, 0.5, 0.3, 0.0]), [0.0, 0.0, 0.5])
    True
    """

    def __init__(
        self, shape: Shape, batch_size: int, device: torch.device | str | None = None
    ) -> None:
        self.shape = check_shape(shape)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.parent_steps = tuple(parent for parent, _ in shape.steps)
        self.modes = tuple(mode for _, mode in shape.steps)
        unknown = sorted(set(self.modes) - set(MODES))
        if unknown:
            raise ValueError(f"shape: unknown draw modes {unknown}; expected {MODES}")
        depths: list[int] = []
        for parent in self.parent_steps:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        self.step_depths = tuple(depths)
        #: The steps of each depth, in step order.
        self.levels = tuple(
            tuple(s for s, d in enumerate(depths) if d == depth)
            for depth in range(1, max(depths) + 1)
        )
        num_steps = len(shape.steps)
        self._tokens = torch.full((batch_size, num_steps), PAD, dtype=torch.long, device=device)
        # The step that created each step's node (itself unless a duplicate), PAD if skipped.
        self._creator = torch.full((batch_size, num_steps), PAD, dtype=torch.long, device=device)
        self._paths: dict[int, torch.Tensor] = {}  # step -> [B, depth] tokens to its node
        self._level = 0

    @property
    def num_steps(self) -> int:
        """``S``: uniforms per row (one per draw step)."""
        return len(self.shape.steps)

    @property
    def level(self) -> int:
        """Index of the next level to draft (``len(levels)`` once done)."""
        return self._level

    @property
    def done(self) -> bool:
        """Every level has been drafted."""
        return self._level == len(self.levels)

    @property
    def frontier(self) -> Frontier:
        """The nodes the next level drafts below (see :class:`Frontier`)."""
        if self.done:
            raise RuntimeError("TreeDrafter: every level is drafted; call finish()")
        batch, device = self.batch_size, self.device
        if self._level == 0:
            exists = torch.ones((batch, 1), dtype=torch.bool, device=device)  # [B, 1]
            paths = torch.empty((batch, 1, 0), dtype=torch.long, device=device)  # [B, 1, 0]
            return Frontier((-1,), exists, exists.clone(), paths)
        steps = self.levels[self._level - 1]
        index = torch.tensor(steps, device=device)  # [F]
        creator = self._creator[:, index]  # [B, F]
        exists = creator != PAD  # [B, F]
        fresh = creator == index[None, :]  # [B, F]
        paths = torch.stack([self._paths[s] for s in steps], dim=1)  # [B, F, d]
        return Frontier(steps, exists, fresh, paths)

    def next_level(
        self, draft_probs: torch.Tensor, uniforms: torch.Tensor, *, validate: bool = True
    ) -> Level:
        """Draw the next level's steps for every row.

        Parameters
        ----------
        draft_probs : Tensor [B, F, V]
            The draft distribution at each :attr:`frontier` slot's node (slots whose node does
            not exist are never read): non-negative and finite with positive mass (normalised
            or not: the inverse CDF reads the row's own total, as the reference's).
        uniforms : Tensor [B, S_d] float64
            The drafting noise of this level's steps (``levels[d]``, in step order): the
            columns ``noise[:, levels[d]]`` of the full ``[B, S]`` noise, in ``[0, 1)``.
        validate : bool, default True
            Check the values above (one host synchronisation); ``False`` trusts them (a
            decoding loop drawing its uniforms with ``torch.rand`` from a model's softmax).

        Returns
        -------
        Level
            The tokens drawn (``PAD`` for skipped steps).
        """
        frontier = self.frontier
        steps = self.levels[self._level]
        batch = self.batch_size
        expected = (batch, len(frontier.steps))
        if draft_probs.ndim != 3 or tuple(draft_probs.shape[:2]) != expected:
            raise InvalidDistribution(
                f"draft_probs: expected shape ({expected[0]}, {expected[1]}, vocab_size) for "
                f"level {self._level}, got {tuple(draft_probs.shape)}"
            )
        if tuple(uniforms.shape) != (batch, len(steps)):
            raise InvalidDistribution(
                f"uniforms: expected shape ({batch}, {len(steps)}) for level {self._level}, got "
                f"{tuple(uniforms.shape)}"
            )
        for name, values in (("draft_probs", draft_probs), ("uniforms", uniforms)):
            if values.is_complex() or values.dtype == torch.bool:
                raise InvalidDistribution(f"{name}: expected real numbers, got {values.dtype}")
        device = self.device
        probs_all = draft_probs.to(device=device, dtype=ops.compute_dtype(draft_probs))
        u_all = uniforms.to(device=device, dtype=torch.float64)  # [B, S_d]
        if validate:
            check_level(probs_all, u_all, frontier.exists.to(device))
        slot_of = {step: f for f, step in enumerate(frontier.steps)}
        root_key = torch.full((batch,), self.num_steps, dtype=torch.long, device=device)  # [B]
        done: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (step, parent key, token)
        for column, step in enumerate(steps):
            parent = self.parent_steps[step]
            f = slot_of[parent]
            parent_exists = frontier.exists[:, f]  # [B]
            parent_key = root_key if parent < 0 else self._creator[:, parent]  # [B]
            probs = probs_all[:, f]  # [B, V]
            u = u_all[:, column]  # [B]
            token, exists = self.draw(self.modes[step], probs, u, parent_key, done)
            exists = exists & parent_exists  # [B]
            token = torch.where(exists, token, PAD)  # [B]
            creator = torch.full_like(token, step)  # [B]
            for earlier, earlier_key, earlier_token in done:
                same = (earlier_key == parent_key) & (earlier_token == token) & exists  # [B]
                creator = torch.where(same, self._creator[:, earlier], creator)
            self._tokens[:, step] = token
            self._creator[:, step] = torch.where(exists, creator, PAD)
            base = frontier.paths[:, f]  # [B, d]
            self._paths[step] = torch.cat([base, token[:, None]], dim=1)  # [B, d + 1]
            done.append((step, parent_key, token))
        self._level += 1
        return Level(steps, self._tokens[:, list(steps)])

    def draw(
        self,
        mode: str,
        probs: torch.Tensor,  # [B, V]
        u: torch.Tensor,  # [B] float64
        parent_key: torch.Tensor,  # [B]
        done: list[tuple[int, torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step's token and whether it exists (before the parent's existence), ``[B]``
        each; ``done`` holds the level's earlier ``(step, parent key, token)``."""
        if mode == "iid":
            return ops.categorical(probs, u), torch.ones_like(u, dtype=torch.bool)
        drawn = self.drawn_before(probs, parent_key, done)  # [B, V] bool
        remaining = probs.masked_fill(drawn, 0.0)  # [B, V]
        mass = ops.numpy_sum(remaining)[:, None]  # [B, 1], numpy's order in float64
        exists = mass[:, 0] > 0  # [B]
        if mode == "top":
            return self.top_token(remaining), exists
        proposal = remaining / torch.where(exists[:, None], mass, torch.ones_like(mass))
        without = ops.categorical(proposal, u)  # [B]
        if mode == "without":
            return without, exists
        hub = self.top_token(probs)  # [B]
        hub_free = ~drawn.gather(1, hub[:, None]).squeeze(1)  # [B]
        return torch.where(hub_free, hub, without), exists

    def drawn_before(
        self,
        probs: torch.Tensor,  # [B, V]
        parent_key: torch.Tensor,  # [B]
        done: list[tuple[int, torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Tokens the node already has as children (its earlier steps' draws), ``[B, V]``."""
        counts = torch.zeros(probs.shape, dtype=torch.long, device=probs.device)  # [B, V]
        for _, earlier_key, earlier_token in done:
            same = (earlier_key == parent_key) & (earlier_token != PAD)  # [B]
            counts.scatter_add_(1, earlier_token.clamp_min(0)[:, None], same.long()[:, None])
        return counts > 0

    def top_token(self, probs: torch.Tensor) -> torch.Tensor:
        """The most probable token per row, ties to the lowest id (``[B]``)."""
        return ops.argmax_blocks(probs)  # torch.argmax's index: the first maximum

    def finish(self) -> TreeBatch:
        """The drafted trees, node ids assigned in step order (the reference's), with the
        shape's law. One host synchronisation (the padded sizes)."""
        if not self.done:
            raise RuntimeError(
                f"TreeDrafter: {len(self.levels) - self._level} levels left to draft"
            )
        batch, device, num_steps = self.batch_size, self.device, self.num_steps
        steps = torch.arange(num_steps, device=device)  # [S]
        exists = self._creator != PAD  # [B, S]
        creates = self._creator == steps[None, :]  # [B, S]
        node_of_creator = torch.cumsum(creates.long(), dim=1)  # [B, S] (1-based node ids)
        node_of_step = torch.where(
            exists, node_of_creator.gather(1, self._creator.clamp_min(0)), PAD
        )  # [B, S]
        num_nodes = 1 + creates.sum(1)  # [B]
        # Node tables with one extra "sink" column N' = 1 + S that skipped steps write into.
        sink = 1 + num_steps
        parents = torch.full((batch, sink + 1), PAD, dtype=torch.long, device=device)  # [B, N']
        tokens = torch.full_like(parents, PAD)  # [B, N']
        depth = torch.full_like(parents, PAD)  # [B, N']
        depth[:, 0] = 0
        count = torch.zeros_like(parents)  # [B, N'] candidates so far per node
        slot = torch.zeros((batch, num_steps), dtype=torch.long, device=device)  # [B, S]
        parent_node = torch.zeros_like(slot)  # [B, S]
        for step in range(num_steps):
            parent = self.parent_steps[step]
            if parent < 0:
                pnode = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
            else:
                pnode = node_of_step[:, parent].clamp_min(0)  # [B]
            parent_node[:, step] = pnode
            slot[:, step] = count.gather(1, pnode[:, None]).squeeze(1)
            count.scatter_add_(1, pnode[:, None], exists[:, step].long()[:, None])
            at = torch.where(creates[:, step], node_of_step[:, step], sink)[:, None]  # [B, 1]
            parents.scatter_(1, at, pnode[:, None])
            tokens.scatter_(1, at, self._tokens[:, step, None])
            depth.scatter_(1, at, torch.full_like(at, self.step_depths[step]))
        width = max(1, int(count[:, :sink].max()))
        nodes = int(num_nodes.max())
        candidates = torch.full(
            (batch, sink + 1, width + 1), PAD, dtype=torch.long, device=device
        )  # [B, N', C + 1]
        rows = torch.arange(batch, device=device)[:, None].expand(batch, num_steps)  # [B, S]
        at_node = torch.where(exists, parent_node, sink)  # [B, S]
        at_slot = torch.where(exists, slot, width)  # [B, S]
        candidates[rows, at_node, at_slot] = node_of_step
        return TreeBatch(
            parents=parents[:, :nodes].contiguous(),
            tokens=tokens[:, :nodes].contiguous(),
            num_nodes=num_nodes,
            candidates=candidates[:, :nodes, :width].contiguous(),
            depth=depth[:, :nodes].contiguous(),
            laws=(self.shape.law,) * batch,
        )


#: ``draft_probs_of(frontier) -> Tensor [B, F, V]``: the draft model on the frontier.
DraftSource = Callable[[Frontier], torch.Tensor]


def check_level(
    draft_probs: torch.Tensor,  # [B, F, V]
    uniforms: torch.Tensor,  # [B, S_d] float64
    exists: torch.Tensor,  # [B, F] bool
) -> None:
    """Raise :class:`~specsampling.InvalidDistribution` naming the argument where a uniform is
    outside ``[0, 1)`` (NaN included) or an existing node's draft row has a NaN, an infinite or
    a negative entry, or no positive mass (the reference's ``categorical`` refuses it). One host
    synchronisation when the level is sound."""
    bad_u = ~((uniforms >= 0) & (uniforms < 1))  # [B, S_d]
    finite = torch.isfinite(draft_probs) & (draft_probs >= 0)  # [B, F, V]
    bad_row = exists & ~(finite.all(-1) & (draft_probs.sum(-1) > 0))  # [B, F]
    if not bool(bad_u.any() | bad_row.any()):
        return
    if bool(bad_u.any()):
        row, column = (int(i) for i in bad_u.nonzero()[0])
        raise InvalidDistribution(
            f"uniforms[{row}, {column}]: {float(uniforms[row, column])} is not in [0, 1)"
        )
    row, slot = (int(i) for i in bad_row.nonzero()[0])
    values = draft_probs[row, slot]
    if not bool(torch.isfinite(values).all()):
        what = "a NaN or infinite entry"
    elif bool((values < 0).any()):
        what = "a negative entry"
    else:
        what = "no positive mass"
    raise InvalidDistribution(f"draft_probs[{row}, {slot}]: the draft row has {what}")


def draft(
    shape: Shape,
    source: ModelPair | DraftSource,
    noise: Any,
    prefix: Sequence[int] | Sequence[Sequence[int]] = (),
    *,
    device: torch.device | str | None = None,
) -> TreeBatch:
    """Draft one tree per row of ``noise`` with :class:`TreeDrafter`.

    Parameters
    ----------
    shape : Shape
        The drafting plan.
    source : ModelPair or callable
        A model pair (only ``pair.draft`` is read, once per distinct node and row), or
        ``source(frontier) -> Tensor [B, F, V]`` giving the draft distributions at a
        :class:`Frontier`.
    noise : Tensor or array [B, S]
        Drafting noise, one uniform in ``[0, 1)`` per row and draw step (see the module doc).
    prefix : tuple of int, or one tuple per row
        The context each row drafts after (a pair only).
    device : torch.device or str, optional
        Where the trees are built (default: the noise's device).

    Returns
    -------
    TreeBatch
        Row ``b`` is ``shape.draft_with_noise(pair, noise[b], prefix_b)`` (for an exact,
        ``Fraction`` pair: of the pair's probabilities rounded once to float64, the precision
        this backend computes in; the exact pair's own drafts can differ where a uniform falls
        on an exact CDF boundary).

    Raises
    ------
    InvalidDistribution
        Noise of the wrong shape, complex or outside ``[0, 1)``; a draft row of the wrong
        length, with a NaN, infinite or negative entry, or without positive mass (named by the
        row and frontier slot of the level it was read at).

    Examples
    --------
    >>> import numpy as np
    >>> import specsampling as ss
    >>> pair, shape = ss.pairs.Random(vocab_size=5, seed=0), ss.Shape.hub(2)
    >>> noise = np.random.default_rng(0).random((3, len(shape.steps)))
    >>> trees = draft(shape, pair, noise).to_trees()
    >>> trees == [shape.draft_with_noise(pair, row) for row in noise]
    True
    """
    shape = check_shape(shape)
    if (isinstance(noise, torch.Tensor) and noise.is_complex()) or np.iscomplexobj(noise):
        raise InvalidDistribution("noise: expected real uniforms in [0, 1), got complex values")
    uniforms = torch.as_tensor(noise, dtype=torch.float64)
    if uniforms.ndim != 2 or uniforms.shape[1] != len(shape.steps) or not uniforms.shape[0]:
        raise InvalidDistribution(
            f"noise: expected shape (batch_size, {len(shape.steps)}) (one uniform per draw step "
            f"of {shape!r}, at least one row), got {tuple(uniforms.shape)}"
        )
    if not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise InvalidDistribution("noise: uniforms must lie in [0, 1)")
    batch = int(uniforms.shape[0])
    device = uniforms.device if device is None else torch.device(device)
    drafter = TreeDrafter(shape, batch, device)
    uniforms = uniforms.to(device)
    if not callable(source):
        source = pair_source(check_model_pair(source, "source"), _row_prefixes(prefix, batch))
    elif len(prefix):
        raise ValueError("prefix: only a model pair source drafts after a prefix")
    while not drafter.done:
        frontier = drafter.frontier
        columns = list(drafter.levels[drafter.level])
        drafter.next_level(source(frontier), uniforms[:, columns])
    return drafter.finish()


def pair_source(pair: ModelPair, prefixes: Sequence[tuple[int, ...]]) -> DraftSource:
    """A :data:`DraftSource` calling ``pair.draft(prefixes[b] + path)`` once per distinct node
    (float64; nodes that do not exist get zeros, never read). One host copy per level."""
    vocab = pair.vocab_size

    def source(frontier: Frontier) -> torch.Tensor:
        batch, slots = frontier.exists.shape
        out = np.zeros((batch, slots, vocab))  # [B, F, V]
        exists = frontier.exists.tolist()
        paths = frontier.paths.tolist()
        for b in range(batch):
            cache: dict[tuple[int, ...], np.ndarray] = {}
            for f in range(slots):
                if exists[b][f]:
                    key = tuple(paths[b][f])
                    if key not in cache:
                        row = np.asarray(pair.draft(prefixes[b] + key), dtype=np.float64)
                        check_pair_row(row, prefixes[b] + key, vocab)
                        cache[key] = row
                    out[b, f] = cache[key]
        return torch.tensor(out, dtype=torch.float64, device=frontier.exists.device)

    return source


def check_pair_row(row: np.ndarray, prefix: tuple[int, ...], vocab_size: int) -> None:
    """Refuse a draft row ``pair.draft(prefix)`` the drafter cannot draw from, naming it: the
    wrong length, a NaN, infinite or negative entry, or no positive mass."""
    where = f"source: pair.draft{prefix}"
    if row.shape != (vocab_size,):
        raise InvalidDistribution(
            f"{where} has shape {row.shape}, expected ({vocab_size},) (the pair's vocab_size)"
        )
    check_draft_row(row, where)


def _row_prefixes(prefix: Any, batch: int) -> list[tuple[int, ...]]:
    items = list(prefix)
    if items and isinstance(items[0], (tuple, list)):
        if len(items) != batch:
            raise ValueError(f"prefix: expected one prefix per row ({batch}), got {len(items)}")
        return [tuple(int(t) for t in p) for p in items]
    return [tuple(int(t) for t in items)] * batch


__all__ = [
    "MODES",
    "DraftSource",
    "Frontier",
    "Level",
    "TreeDrafter",
    "check_level",
    "draft",
    "pair_source",
]
