r"""Traversal verification, lowered (reference: :mod:`specsampling.schemes.traversal`).

The reference repeatedly tests the first live leaf in depth-first order and deletes it on
rejection, so the nodes are tested in **post-order** (distinct children in first-drafted order),
the root last, where it always accepts. Every row runs that traversal with a cursor, one test per
iteration (at most ``N - 1`` rejections, a static bound):

1. at the cursor :math:`\ell` accept iff :math:`\ell` is the root or
   :math:`u_\text{accept}[\ell] < w[\ell]`; then emit the path to :math:`\ell` and
   :math:`y \sim P[\ell]` by inverse CDF with :math:`u_\text{sample}[\ell]`;
2. on rejection update the parent :math:`\pi`: :math:`r = (w[\pi] P[\pi] - Q[\pi])_+`,
   :math:`S = \sum r`; if :math:`S > 0`, :math:`P[\pi] \leftarrow r / S` and
   :math:`w[\pi] \leftarrow S / (S + 1 - w[\pi])`, else :math:`w[\pi] \leftarrow 0`; then
   :math:`Q[\pi] \leftarrow \mathrm{norm}(Q[\pi] \text{ without } x_\ell)`;
3. move the cursor to :math:`\pi` if :math:`\ell` was its last child, else into the next sibling
   :math:`s` and down its first children to a leaf, computing each entered node's weight
   :math:`w[c] = \min(1, w[v] P[v](x_c) / Q[v](x_c))` (0 if :math:`Q[v](x_c) = 0`) from its
   parent's *current* :math:`P, Q` (the updated ones at :math:`\pi`, the tables below).

Only the nodes on the cursor's root path ever hold updated distributions (the subtrees to the
right are untouched), so :math:`P` and :math:`Q` are kept once per depth, ``[B, D + 1, V]``
(the last slot is scratch for rows that write nothing), and the per-step rows live in reused
``[B, V]`` buffers; a node's weight computed on entry equals the reference's ``reweigh`` value
when it is read. Weights and acceptances are float64 and computed in the reference's order.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch

from .. import ops
from ..noise import Noise
from ..tree import PAD, TreeBatch
from .base import TreeLowering, Verified


class Links(NamedTuple):
    """The traversal order of every tree: ``first_child [B, N]`` and ``next_sibling [B, N]``
    over distinct children in first-drafted order (``PAD`` where there is none)."""

    first_child: torch.Tensor  # [B, N]
    next_sibling: torch.Tensor  # [B, N]


class WalkState(NamedTuple):
    """The traversal walk's state between rounds (:meth:`Traversal.start`): the tree's links and
    edge values, every node's weight and whether its P / Q were updated, the per-depth updated
    rows (``state_*``, and ``flat_state``: their views ``[B (D + 1), V]``), the tables as
    ``[B N, V]``, reused row buffers, and every row's cursor ``leaf [B]`` (written in place)."""

    links: Links
    node_tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N]
    edge_target: torch.Tensor  # [B, N]
    edge_draft: torch.Tensor  # [B, N]
    weights: torch.Tensor  # [B, N] float64
    updated_target: torch.Tensor  # [B, N] bool
    updated_draft: torch.Tensor  # [B, N] bool
    slots: int
    state_target: torch.Tensor  # [B, D + 1, V]
    state_draft: torch.Tensor  # [B, D + 1, V]
    flat_state: tuple[torch.Tensor, torch.Tensor]  # views of the two above, [B (D + 1), V]
    tables: tuple[torch.Tensor, torch.Tensor]  # target and draft tables, [B N, V]
    buffers: tuple[torch.Tensor, ...]  # four [B, V] row buffers
    leaf: torch.Tensor  # [B]


class Traversal(TreeLowering):
    """Traversal verification (Weng et al.), batched over trees of different shapes.

    Examples
    --------
    Both rows hold a star with tokens 0 and 1 (``p = (1/3, 2/3)``, ``q = (2/3, 1/3)``): node 1
    has ``w = 1/2``; row 0 accepts it, row 1 rejects it and then accepts node 2 (``w = 1``):

    >>> import numpy as np
    >>> import specsampling as ss
    >>> from specsampling import gpu as ssg
    >>> star = ss.DraftTree.from_draws([(0, 0), (0, 1)], law="iid")
    >>> target = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64).expand(2, 3, 2)
    >>> noise = ssg.Noise.from_reference(
    ...     [ss.Noise(np.array([0, u, 0.9]), np.full(3, 0.2)) for u in (0.4, 0.7)])
    >>> batch = ssg.TreeBatch.from_trees([star, star])
    >>> out = ssg.verify("traversal", batch, target, target.flip(-1), noise)
    >>> out.node.tolist(), out.tokens.tolist()
    ([1, 2], [[0, 0], [1, 0]])
    """

    name = "traversal"
    hot_path: ClassVar[tuple[str, ...]] = (
        "start",
        "links",
        "accepts",
        "child_weight",
        "descend",
        "reject",
        "reject_round",
        "dense_enter",
        "selected_rows",
        "finish",
        "emitted_tokens",
    )

    def links(self, batch: TreeBatch) -> Links:
        """First child and next sibling among the distinct children, in first-drafted order."""
        candidates = batch.candidates  # [B, N, C]
        batch_size, num_nodes, slots = candidates.shape
        valid = candidates != PAD  # [B, N, C]
        index = torch.arange(slots, device=batch.device)  # [C]
        earlier = index[None, :] < index[:, None]  # [C, C]: [j, k] = k < j
        repeats = (candidates[..., :, None] == candidates[..., None, :]) & earlier  # [B,N,C,C]
        first = valid & ~repeats.any(-1)  # [B, N, C]: first occurrence of a child
        head = first.to(torch.int8).argmax(-1, keepdim=True)  # [B, N, 1]
        first_child = torch.where(
            first.any(-1), candidates.gather(-1, head).squeeze(-1), PAD
        )  # [B, N]
        later = first[..., None, :] & (index[None, :] > index[:, None])  # [B, N, C, C]
        following = later.to(torch.int8).argmax(-1)  # [B, N, C]
        sibling = torch.where(later.any(-1), candidates.gather(-1, following), PAD)  # [B, N, C]
        target = torch.where(first, candidates, num_nodes).reshape(batch_size, -1)  # [B, N*C]
        next_sibling = torch.full(
            (batch_size, num_nodes + 1), PAD, dtype=torch.long, device=batch.device
        )  # [B, N + 1]; the last column takes the padded slots
        next_sibling.scatter_(1, target, sibling.reshape(batch_size, -1))
        return Links(first_child, next_sibling[:, :num_nodes])

    def accepts(self, u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The reference test ``u < w`` (strict, float64), ``[B]`` bool."""
        return u < weight  # [B]

    def child_weight(
        self,
        parent_weight: torch.Tensor,  # [B] float64
        target_x: torch.Tensor,  # [B]
        draft_x: torch.Tensor,  # [B]
    ) -> torch.Tensor:
        """The reference ``reweigh`` rule: ``0`` if ``q(x) = 0``, else ``min(1, w p(x) / q(x))``
        (multiply, compare, divide), ``[B]`` float64."""
        scaled = parent_weight * target_x.to(torch.float64)  # [B]
        draft_x = draft_x.to(torch.float64)  # [B]
        capped = torch.where(scaled >= draft_x, 1.0, scaled / draft_x)  # [B]
        return torch.where(draft_x > 0, capped, 0.0)  # [B]

    def descend(
        self,
        batch: TreeBatch,
        links: Links,
        start: torch.Tensor,  # [B]
        going: torch.Tensor,  # [B] bool
        weights: torch.Tensor,  # [B, N] float64, updated in place
        edge_target: torch.Tensor,  # [B, N]
        edge_draft: torch.Tensor,  # [B, N]
        rows: torch.Tensor,  # [L]: the rows of start and going
    ) -> torch.Tensor:
        """From ``start [L]`` down the first children to a leaf (rows with ``going [L]``),
        entering each node with its weight from the untouched tables; the leaf, ``[L]``."""
        node = start  # [L]
        for _ in range(batch.max_depth):
            child = links.first_child[rows, node]  # [B]
            going = going & (child != PAD)  # [B]
            safe = child.clamp_min(0)  # [B]
            entered = self.child_weight(
                weights[rows, node], edge_target[rows, safe], edge_draft[rows, safe]
            )  # [B]
            weights[rows, safe] = torch.where(going, entered, weights[rows, safe])
            node = torch.where(going, safe, node)
        return node

    def enter(
        self,
        batch: TreeBatch,
        state: WalkState,
        start: torch.Tensor,  # [L]
        entering: torch.Tensor,  # [L] bool
        rows: torch.Tensor,  # [L]
    ) -> torch.Tensor:
        """:meth:`descend` from ``start`` for the rows ``entering`` a sibling's subtree, ``[L]``
        (``start`` elsewhere, never read there). On the CPU outside ``torch.compile`` (host
        reads are free) only those rows, and only while one still has a child
        (:meth:`sparse_descend`); elsewhere every row, ``max_depth`` levels, sync-free."""
        if not ops.host_reads_free(rows):
            return self.dense_enter(batch, state, start, entering, rows)
        picked = entering.nonzero()[:, 0]  # [M]
        if picked.shape[0] == 0:
            return start
        below = self.sparse_descend(state, start[picked], rows[picked])  # [M]
        return start.index_put((picked,), below)

    def current_rows(
        self,
        tables: tuple[torch.Tensor, torch.Tensor],  # [R, V] table, [L] rows of it
        states: tuple[torch.Tensor, torch.Tensor],  # [R', V] updated rows, [L] rows of it
        updated: torch.Tensor,  # [L] bool
        out: torch.Tensor,  # [L, V], written
        scratch: torch.Tensor,  # [L, V]
    ) -> torch.Tensor:
        """``out[l]`` = the state row where ``updated[l]``, else the table row. On the CPU outside
        ``torch.compile`` (host reads are free) the table rows, then the updated rows copied over
        them; elsewhere :meth:`selected_rows`, sync-free (the same values)."""
        if not ops.host_reads_free(out):
            return self.selected_rows(tables, states, updated, out, scratch)
        torch.index_select(tables[0], 0, tables[1], out=out)
        picked = updated.nonzero()[:, 0]  # the host read
        if picked.shape[0] > 0:
            out[picked] = states[0].index_select(0, states[1][picked])
        return out

    def selected_rows(
        self,
        tables: tuple[torch.Tensor, torch.Tensor],
        states: tuple[torch.Tensor, torch.Tensor],
        updated: torch.Tensor,
        out: torch.Tensor,
        scratch: torch.Tensor,
    ) -> torch.Tensor:
        """:meth:`current_rows` sync-free: both rows gathered, one select."""
        torch.index_select(tables[0], 0, tables[1], out=out)
        torch.index_select(states[0], 0, states[1], out=scratch)
        return torch.where(updated[:, None], scratch, out, out=out)

    def dense_enter(
        self,
        batch: TreeBatch,
        state: WalkState,
        start: torch.Tensor,  # [L]
        entering: torch.Tensor,  # [L] bool
        rows: torch.Tensor,  # [L]
    ) -> torch.Tensor:
        """:meth:`enter` sync-free: every row, ``max_depth`` levels (:meth:`descend`)."""
        weights, edge_target, edge_draft = state.weights, state.edge_target, state.edge_draft
        return self.descend(
            batch, state.links, start, entering, weights, edge_target, edge_draft, rows
        )

    def sparse_descend(
        self, state: WalkState, start: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`descend` on the CPU for rows that all enter ``start [M]``: each level only the
        rows whose node has a child, and no level after the last such row (host reads); the
        entered weights are :meth:`child_weight`'s, as the dense descent writes them."""
        leaf = start.clone()  # [M]
        index = torch.arange(start.shape[0], device=start.device)  # [M]: positions still going
        node = start
        while True:
            child = state.links.first_child[rows, node]  # [m]
            going = (child != PAD).nonzero()[:, 0]  # the host read
            if going.shape[0] == 0:
                return leaf
            rows, node, child, index = rows[going], node[going], child[going], index[going]
            state.weights[rows, child] = self.child_weight(
                state.weights[rows, node],
                state.edge_target[rows, child],
                state.edge_draft[rows, child],
            )
            leaf[index] = child
            node = child

    def reject(
        self,
        weight: torch.Tensor,  # [B] float64
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V], updated in place
        token: torch.Tensor,  # [B]
        leftover: torch.Tensor,  # [B, V], written
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Delete the parent's child holding ``token``: ``(new weight [B], has_mass [B, 1])``.

        ``leftover`` receives the normalised w-weighted residual ``r / S`` (the new target
        where ``has_mass``; elsewhere the target is kept), the weight is ``S / (S + 1 - w)``
        (``0`` when ``S = 0``), and ``draft`` has the token removed and is renormalised (all
        zeros when nothing is left), as :func:`specsampling.ops.remove_token`."""
        torch.mul(target, weight.to(target.dtype)[:, None], out=leftover)
        leftover.sub_(draft).clamp_min_(0)  # (w P - Q)_+
        mass = ops.numpy_sum(leftover)[:, None]  # [B, 1], numpy's order in float64
        has_mass = mass > 0  # [B, 1]
        leftover.div_(torch.where(has_mass, mass, 1.0))
        mass64 = mass.squeeze(-1).to(torch.float64)  # [B]
        new_weight = torch.where(
            has_mass.squeeze(-1), mass64 / (mass64 + (1 - weight)), 0.0
        )  # [B] (S > 0: the denominator is positive)
        draft.scatter_(1, token[:, None], 0.0)
        remaining = ops.numpy_sum(draft)[:, None]  # [B, 1]
        draft.div_(torch.where(remaining > 0, remaining, 1.0))  # zeros stay zeros
        return new_weight, has_mass

    def emitted_tokens(self, batch: TreeBatch, node: torch.Tensor, token: torch.Tensor) -> Verified:
        """The verdict with the path to ``node`` and then ``token``, ``-1`` padded."""
        batch_size = batch.batch_size
        rows = torch.arange(batch_size, device=batch.device)  # [B]
        width = batch.max_depth + 1
        depth = batch.depth[rows, node]  # [B]
        emitted = torch.full((batch_size, width + 1), PAD, dtype=torch.long, device=batch.device)
        emitted[rows, depth] = token  # [B, D + 2]; the last column takes finished walks
        cursor = node  # [B]
        for _ in range(batch.max_depth):
            position = batch.depth[rows, cursor] - 1  # [B]
            position = torch.where(position >= 0, position, width)  # [B]
            emitted[rows, position] = batch.tokens[rows, cursor]
            cursor = batch.parents[rows, cursor].clamp_min(0)  # [B]
        return Verified(node, token, emitted[:, :width], depth + 1)

    def walk(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V] compute dtype
        draft_probs: torch.Tensor,  # [B, N, V] compute dtype
        noise: Noise,  # [B, N] float64 each
    ) -> Verified:
        """The batched reference :meth:`~specsampling.schemes.traversal.Traversal.verify`: the
        first descent, up to ``N - 1`` rejection rounds (:meth:`reject_round`), the stop draw.

        On an accelerator and under ``torch.compile`` every round runs on every row (rows that
        have accepted write into scratch), sync-free. On the CPU, where host reads are free,
        each round runs on the rows still rejecting only (:meth:`still_rejecting`), and the
        loop ends when none is left: the rows' work drops from ``N - 1`` rounds each to their
        own number of rejections."""
        state = self.start(batch, target_probs, draft_probs)
        rows = torch.arange(batch.batch_size, device=batch.device)  # [L]: the rows still going
        for _ in range(target_probs.shape[1] - 1):
            rejected = self.reject_round(batch, state, noise, rows)  # [L]
            rows = self.still_rejecting(rows, rejected)
            if rows.shape[0] == 0:  # static off the CPU (rows stay the whole batch there)
                break
        return self.finish(batch, state, target_probs, noise)

    def still_rejecting(self, rows: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
        """The rows the next round runs on: on the CPU outside ``torch.compile`` those that
        rejected (a host read, free there), elsewhere ``rows`` unchanged."""
        if ops.host_reads_free(rows):
            return rows[rejected]
        return rows

    def start(
        self, batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor
    ) -> WalkState:
        """The walk's state after the first descent (:class:`WalkState`)."""
        batch_size, num_nodes, vocab = target_probs.shape
        device = batch.device
        rows = torch.arange(batch_size, device=device)  # [B]
        links = self.links(batch)
        node_tokens = batch.tokens.clamp_min(0)  # [B, N]
        parents = batch.parents.clamp_min(0)  # [B, N]
        # p(x_n | parent), q(x_n | parent) from the tables: the edges of untouched parents.
        edge_target = target_probs[rows[:, None], parents, node_tokens]  # [B, N]
        edge_draft = draft_probs[rows[:, None], parents, node_tokens]  # [B, N]
        weights = torch.ones((batch_size, num_nodes), dtype=torch.float64, device=device)
        # Updated P (after a residual with mass) and Q (after any rejection) of each node.
        updated_target = torch.zeros((batch_size, num_nodes), dtype=torch.bool, device=device)
        slots = max(batch.max_depth, 1)  # slot `slots` is scratch: rows that write nothing
        # never read before written: a slot's row is selected only once its `updated` flag is
        # set (the `where`s read it unselected), so no zero fill (16 MB at B = 32, V = 32k)
        state_target = target_probs.new_empty((batch_size, slots + 1, vocab))  # [B, D + 1, V]
        going = torch.ones(batch_size, dtype=torch.bool, device=device)  # [B]
        start = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        leaf = self.descend(batch, links, start, going, weights, edge_target, edge_draft, rows)
        state_draft = torch.empty_like(state_target)  # [B, D + 1, V], as state_target
        return WalkState(
            links=links,
            node_tokens=node_tokens,
            parents=parents,
            edge_target=edge_target,
            edge_draft=edge_draft,
            weights=weights,
            updated_target=updated_target,
            updated_draft=torch.zeros_like(updated_target),
            slots=slots,
            state_target=state_target,
            state_draft=state_draft,
            flat_state=(state_target.view(-1, vocab), state_draft.view(-1, vocab)),
            tables=(target_probs.reshape(-1, vocab), draft_probs.reshape(-1, vocab)),
            buffers=tuple(target_probs.new_empty((batch_size, vocab)) for _ in range(4)),
            leaf=leaf,
        )

    def reject_round(
        self, batch: TreeBatch, state: WalkState, noise: Noise, rows: torch.Tensor
    ) -> torch.Tensor:
        """One test at the cursor of each row in ``rows [L]`` (rows that accepted earlier test
        their accepted node again and write nothing), and for the rows that reject, the parent's
        update and the cursor's move; returns which rejected, ``[L]``."""
        num_nodes = batch.parents.shape[1]
        count = rows.shape[0]
        slots, weights = state.slots, state.weights
        parents, node_tokens, links = state.parents, state.node_tokens, state.links
        state_target, state_draft = state.state_target, state.state_draft
        updated_target, updated_draft = state.updated_target, state.updated_draft
        target, draft, leftover, state_row = (b[:count] for b in state.buffers)
        leaf = state.leaf[rows]  # [L]
        accepted = (leaf == 0) | self.accepts(noise.accept[rows, leaf], weights[rows, leaf])
        rejected = ~accepted  # [L]
        parent = parents[rows, leaf]  # [L]
        slot = batch.depth[rows, parent].clamp(0, slots - 1)  # [L]
        # The parent's current P and Q: its table rows, or its updated rows.
        for table, flat, updated, out in (
            (state.tables[0], state.flat_state[0], updated_target, target),
            (state.tables[1], state.flat_state[1], updated_draft, draft),
        ):
            self.current_rows(
                (table, rows * num_nodes + parent),
                (flat, rows * (slots + 1) + slot),
                updated[rows, parent],
                out,
                state_row,
            )
        new_weight, has_mass = self.reject(
            weights[rows, parent], target, draft, node_tokens[rows, leaf], leftover
        )  # [L], [L, 1]; leftover and draft now hold the new rows
        writes_target = rejected & has_mass.squeeze(-1)  # [L]
        state_target.index_put_((rows, torch.where(writes_target, slot, slots)), leftover)
        state_draft.index_put_((rows, torch.where(rejected, slot, slots)), draft)
        updated_target[rows, parent] = updated_target[rows, parent] | writes_target
        updated_draft[rows, parent] = updated_draft[rows, parent] | rejected
        weights[rows, parent] = torch.where(rejected, new_weight, weights[rows, parent])
        # The cursor moves into the next sibling's subtree, or up to the parent.
        sibling = links.next_sibling[rows, leaf]  # [L]
        entering = rejected & (sibling != PAD)  # [L]
        safe = sibling.clamp_min(0)  # [L]
        sibling_tokens = node_tokens[rows, safe][:, None]  # [L, 1]
        sibling_target = torch.where(
            has_mass, leftover.gather(1, sibling_tokens), target.gather(1, sibling_tokens)
        ).squeeze(-1)  # [L]
        entered = self.child_weight(
            new_weight, sibling_target, draft.gather(1, sibling_tokens).squeeze(-1)
        )  # [L]
        weights[rows, safe] = torch.where(entering, entered, weights[rows, safe])
        below = self.enter(batch, state, safe, entering, rows)  # [L]
        moved = torch.where(entering, below, parent)  # [L]
        state.leaf[rows] = torch.where(rejected, moved, leaf)
        return rejected

    def finish(
        self, batch: TreeBatch, state: WalkState, target_probs: torch.Tensor, noise: Noise
    ) -> Verified:
        """Every row has accepted (at the root at the latest): the stop draw at its cursor."""
        rows = torch.arange(batch.batch_size, device=batch.device)  # [B]
        leaf = state.leaf  # [B]
        slot = batch.depth[rows, leaf].clamp(0, state.slots - 1)  # [B]
        probs = torch.where(
            state.updated_target[rows, leaf][:, None],
            ops.table_rows(state.state_target, rows, slot),
            ops.table_rows(target_probs, rows, leaf),
        )  # [B, V]
        token = ops.draw_rows(probs, noise.sample[rows, leaf])  # [B]
        return self.emitted_tokens(batch, leaf, token)


LOWERING = Traversal()
LOWERINGS = (LOWERING,)
