r"""Block verification on chains, lowered (reference: :mod:`specsampling.schemes.block`).

Every row is a sampled chain :math:`x_1..x_\gamma` (its own :math:`\gamma`; node :math:`n` at
depth :math:`i` holds :math:`x_i`). Top-down over the depth, with :math:`w_0 = 1`,

.. math:: w_i = \begin{cases} 1 & w_{i-1}\,p_{i-1}(x_i) \ge q_{i-1}(x_i) \\
          w_{i-1}\,p_{i-1}(x_i) / q_{i-1}(x_i) & \text{otherwise,} \end{cases}

then, for every node (one pass over the tables), the *w-weighted* residual
:math:`r_i = (w_i\,p_i - q_i)_+` and its mass :math:`S_i`, the block acceptance
:math:`h_i = S_i / (S_i + 1 - w_i)` (1 when the denominator is 0) for :math:`1 \le i < \gamma`
and :math:`h_\gamma = w_\gamma`. :math:`\tau` is the **deepest** :math:`i \ge 1` with
:math:`u_\text{accept}[x_i] < h_i` (0 if none); the next token is drawn by inverse CDF with
:math:`u_\text{sample}` of node :math:`\tau` from :math:`p_\gamma` (the bonus) when
:math:`\tau = \gamma`, else from :math:`r_\tau / S_\tau` (the target row when :math:`S_\tau = 0`).

The weights and acceptances are float64 scalars computed in the reference's order (multiply,
compare, divide), so float64 inputs give the reference verdict bit for bit.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .. import ops
from ..noise import Noise
from ..tree import PAD, TreeBatch
from .base import TreeLowering, Verified


class Block(TreeLowering):
    """Block verification (Sun et al.), batched over chains of different lengths.

    Examples
    --------
    Row 0 is the 11/9 example's chain (``w = (1, 1/2, 1/4)``, ``tau = 2``: the bonus); row 1
    accepts its only token (``w_1 = 1``) and draws its bonus:

    >>> import numpy as np
    >>> import specsampling as ss
    >>> from specsampling import gpu as ssg
    >>> trees = [ss.DraftTree.chain([0, 0], law="iid"), ss.DraftTree.chain([1], law="iid")]
    >>> target = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64).expand(2, 3, 2)
    >>> noise = ssg.Noise.from_reference(
    ...     [ss.Noise(np.array([0, 0, 0.2]), np.full(3, 0.5)), ss.Noise.constant(0.5, 2)])
    >>> out = ssg.verify("block", ssg.TreeBatch.from_trees(trees), target, target.flip(-1), noise)
    >>> out.node.tolist(), out.tokens.tolist(), out.num_emitted.tolist()
    ([2, 1], [[0, 0, 1], [1, 1, -1]], [3, 2])
    """

    name = "block"
    hot_path: ClassVar[tuple[str, ...]] = (
        "walk",
        "chain_weights",
        "block_acceptances",
        "accepts",
        "choose_tau",
        "emit",
    )

    def chain_weights(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [B, N] float64, path [B, D + 1])``: the capped cumulative ratio ``w`` of
        every chain node (1 at the root; padding lanes 1, never read), and the chain's nodes by
        depth (``PAD`` past the row's end)."""
        batch_size, num_nodes = batch.parents.shape
        rows = torch.arange(batch_size, device=batch.device)  # [B]
        weights = torch.ones(
            (batch_size, num_nodes), dtype=torch.float64, device=batch.device
        )  # [B, N]
        path = torch.full(
            (batch_size, batch.max_depth + 1), PAD, dtype=torch.long, device=batch.device
        )  # [B, D + 1]
        path[:, 0] = 0
        node = torch.zeros(batch_size, dtype=torch.long, device=batch.device)  # [B]
        alive = torch.ones(batch_size, dtype=torch.bool, device=batch.device)  # [B]
        for depth in range(1, batch.max_depth + 1):
            child = batch.candidates[rows, node, 0]  # [B]
            alive = alive & (child != PAD)  # [B]
            safe = child.clamp_min(0)  # [B]
            token = batch.tokens[rows, safe].clamp_min(0)  # [B]
            scaled = weights[rows, node] * target_probs[rows, node, token].to(torch.float64)
            draft_x = draft_probs[rows, node, token].to(torch.float64)  # [B]
            capped = torch.where(scaled >= draft_x, 1.0, scaled / draft_x)  # [B]
            weights[rows, safe] = torch.where(alive, capped, weights[rows, safe])
            path[:, depth] = torch.where(alive, child, PAD)
            node = torch.where(alive, safe, node)
        return weights, path

    def block_acceptances(
        self,
        batch: TreeBatch,
        weights: torch.Tensor,  # [B, N] float64
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
    ) -> torch.Tensor:
        """``h`` of every node, ``[B, N]`` float64 (``w`` at the chain's last node).

        The w-weighted residual masses are computed node by node in one reused ``[B, V]``
        buffer (a loop over the node index), so the tables are read once without a
        ``[B, N, V]`` temporary."""
        batch_size, num_nodes, vocab = target_probs.shape
        scale = weights.to(target_probs.dtype)  # [B, N]
        buffer = target_probs.new_empty((batch_size, vocab))  # [B, V]
        mass = target_probs.new_empty((batch_size, num_nodes))  # [B, N]
        for node in range(num_nodes):
            torch.mul(target_probs[:, node], scale[:, node, None], out=buffer)
            buffer.sub_(draft_probs[:, node]).clamp_min_(0)  # (w p - q)_+
            mass[:, node] = ops.numpy_sum(buffer)  # float64: numpy's order, as the reference
        mass64 = mass.to(torch.float64)  # [B, N]
        denominator = mass64 + (1 - weights)  # [B, N]
        positive = denominator > 0  # [B, N]
        inner = torch.where(positive, mass64 / torch.where(positive, denominator, 1.0), 1.0)
        last = batch.candidates[:, :, 0] == PAD  # [B, N]: no child, the chain's end
        return torch.where(last, weights, inner)  # [B, N]

    def accepts(self, etas: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
        """The reference test ``eta_i < h_i`` (strict, float64), elementwise."""
        return etas < accept

    def choose_tau(
        self,
        path: torch.Tensor,  # [B, D + 1]
        accept: torch.Tensor,  # [B, N] float64
        noise: Noise,  # [B, N] float64 each
    ) -> torch.Tensor:
        """The chain node of the **deepest** depth ``i >= 1`` with ``eta_i < h_i`` (node 0 if
        none), ``[B]``."""
        safe = path.clamp_min(0)  # [B, D + 1]
        etas = noise.accept.gather(1, safe)  # [B, D + 1]
        passes = self.accepts(etas, accept.gather(1, safe)) & (path != PAD)  # [B, D + 1]
        passes[:, 0] = True  # tau = 0 when no later test passes
        depths = torch.arange(path.shape[1], device=path.device)  # [D + 1]
        tau = torch.where(passes, depths, 0).amax(-1)  # [B]
        return safe.gather(1, tau[:, None]).squeeze(-1)  # [B]

    def emit(
        self,
        batch: TreeBatch,
        node: torch.Tensor,  # [B]
        weights: torch.Tensor,  # [B, N] float64
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
    ) -> torch.Tensor:
        """Law of the token emitted after accepting up to ``node``, ``[B, V]``: the bonus at the
        chain's end, else the normalised w-weighted residual (the target if it has no mass)."""
        rows = torch.arange(node.shape[0], device=node.device)  # [B]
        target = ops.table_rows(target_probs, rows, node)  # [B, V]
        scale = weights[rows, node].to(target.dtype)[:, None]  # [B, 1]
        residual = (target * scale).sub_(ops.table_rows(draft_probs, rows, node)).clamp_min_(0)
        mass = ops.numpy_sum(residual)[:, None]  # [B, 1]
        has_mass = mass > 0  # [B, 1]
        normalised = residual.div_(torch.where(has_mass, mass, 1.0))  # [B, V]
        at_end = (batch.candidates[rows, node, 0] == PAD)[:, None]  # [B, 1]
        return torch.where(at_end | ~has_mass, target, normalised)  # [B, V]

    def walk(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V] compute dtype
        draft_probs: torch.Tensor,  # [B, N, V] compute dtype
        noise: Noise,  # [B, N] float64 each
    ) -> Verified:
        """The batched reference :meth:`~specsampling.schemes.block.Block.verify`."""
        rows = torch.arange(batch.batch_size, device=batch.device)  # [B]
        weights, path = self.chain_weights(batch, target_probs, draft_probs)  # [B, N], [B, D+1]
        accept = self.block_acceptances(batch, weights, target_probs, draft_probs)  # [B, N]
        node = self.choose_tau(path, accept, noise)  # [B]
        probs = self.emit(batch, node, weights, target_probs, draft_probs)  # [B, V]
        token = ops.draw_rows(probs, noise.sample[rows, node])  # [B]
        depth = batch.depth[rows, node]  # [B]
        positions = torch.arange(batch.max_depth + 1, device=batch.device)  # [D + 1]
        path_tokens = batch.tokens.gather(1, path[:, 1:].clamp_min(0))  # [B, D]
        emitted = torch.full_like(path, PAD)  # [B, D + 1]
        emitted[:, :-1] = torch.where(positions[None, :-1] < depth[:, None], path_tokens, PAD)
        emitted = torch.where(positions[None, :] == depth[:, None], token[:, None], emitted)
        return Verified(node, token, emitted, depth + 1)


LOWERING = Block()
LOWERINGS = (LOWERING,)
