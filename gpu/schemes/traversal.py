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
        "walk",
        "links",
        "accepts",
        "child_weight",
        "descend",
        "reject",
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
    ) -> torch.Tensor:
        """From ``start`` down the first children to a leaf (rows with ``going``), entering
        each node with its weight from the untouched tables; the leaf, ``[B]``."""
        rows = torch.arange(batch.batch_size, device=batch.device)  # [B]
        node = start  # [B]
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
        mass = leftover.sum(-1, keepdim=True)  # [B, 1]
        has_mass = mass > 0  # [B, 1]
        leftover.div_(torch.where(has_mass, mass, 1.0))
        mass64 = mass.squeeze(-1).to(torch.float64)  # [B]
        new_weight = torch.where(
            has_mass.squeeze(-1), mass64 / (mass64 + (1 - weight)), 0.0
        )  # [B] (S > 0: the denominator is positive)
        draft.scatter_(1, token[:, None], 0.0)
        remaining = draft.sum(-1, keepdim=True)  # [B, 1]
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
        """The batched reference :meth:`~specsampling.schemes.traversal.Traversal.verify`."""
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
        updated_draft = torch.zeros_like(updated_target)  # [B, N]
        slots = max(batch.max_depth, 1)  # slot `slots` is scratch: rows that write nothing
        state_target = target_probs.new_zeros((batch_size, slots + 1, vocab))  # [B, D + 1, V]
        state_draft = torch.zeros_like(state_target)  # [B, D + 1, V]
        flat = [t.reshape(-1, vocab) for t in (target_probs, draft_probs)]  # [B*N, V] each
        flat_state = [t.view(-1, vocab) for t in (state_target, state_draft)]  # [B*(D+1), V]
        buffers = [target_probs.new_empty((batch_size, vocab)) for _ in range(6)]  # [B, V]
        target, draft, leftover, table_row, state_row, _ = buffers
        going = torch.ones(batch_size, dtype=torch.bool, device=device)  # [B]
        start = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        leaf = self.descend(batch, links, start, going, weights, edge_target, edge_draft)  # [B]
        done = torch.zeros(batch_size, dtype=torch.bool, device=device)  # [B]
        for _ in range(num_nodes - 1):
            accepted = (leaf == 0) | self.accepts(noise.accept[rows, leaf], weights[rows, leaf])
            done = done | accepted
            rejected = ~done  # [B]
            parent = parents[rows, leaf]  # [B]
            slot = batch.depth[rows, parent].clamp(0, slots - 1)  # [B]
            # The parent's current P and Q: its table rows, or its updated rows.
            for table, state, updated, out in (
                (flat[0], flat_state[0], updated_target, target),
                (flat[1], flat_state[1], updated_draft, draft),
            ):
                torch.index_select(table, 0, rows * num_nodes + parent, out=table_row)
                torch.index_select(state, 0, rows * (slots + 1) + slot, out=state_row)
                torch.where(updated[rows, parent][:, None], state_row, table_row, out=out)
            new_weight, has_mass = self.reject(
                weights[rows, parent], target, draft, node_tokens[rows, leaf], leftover
            )  # [B], [B, 1]; leftover and draft now hold the new rows
            writes_target = rejected & has_mass.squeeze(-1)  # [B]
            state_target.index_put_((rows, torch.where(writes_target, slot, slots)), leftover)
            state_draft.index_put_((rows, torch.where(rejected, slot, slots)), draft)
            updated_target[rows, parent] = updated_target[rows, parent] | writes_target
            updated_draft[rows, parent] = updated_draft[rows, parent] | rejected
            weights[rows, parent] = torch.where(rejected, new_weight, weights[rows, parent])
            # The cursor moves into the next sibling's subtree, or up to the parent.
            sibling = links.next_sibling[rows, leaf]  # [B]
            entering = rejected & (sibling != PAD)  # [B]
            safe = sibling.clamp_min(0)  # [B]
            sibling_tokens = node_tokens[rows, safe][:, None]  # [B, 1]
            sibling_target = torch.where(
                has_mass, leftover.gather(1, sibling_tokens), target.gather(1, sibling_tokens)
            ).squeeze(-1)  # [B]
            entered = self.child_weight(
                new_weight, sibling_target, draft.gather(1, sibling_tokens).squeeze(-1)
            )  # [B]
            weights[rows, safe] = torch.where(entering, entered, weights[rows, safe])
            below = self.descend(batch, links, safe, entering, weights, edge_target, edge_draft)
            moved = torch.where(entering, below, parent)  # [B]
            leaf = torch.where(rejected, moved, leaf)
        # Every row has accepted by now (at the root at the latest).
        slot = batch.depth[rows, leaf].clamp(0, slots - 1)  # [B]
        probs = torch.where(
            updated_target[rows, leaf][:, None], state_target[rows, slot], target_probs[rows, leaf]
        )  # [B, V]
        token = ops.categorical(probs, noise.sample[rows, leaf])  # [B]
        return self.emitted_tokens(batch, leaf, token)


LOWERING = Traversal()
LOWERINGS = (LOWERING,)
