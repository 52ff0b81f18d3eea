r"""Chain fast paths for ``nss``, ``block`` and ``traversal`` (the padded FlashInfer/vLLM layout of
:mod:`specsampling.gpu.chain`): each reads gathered :math:`p_i(x_i), q_i(x_i)` ``[B, γ]`` and
O(1) rows of :math:`V` per sequence and position, never a ``[B, γ + 1, V]`` temporary.

Layout (as :func:`~specsampling.gpu.verify_chain`): node :math:`i` of a chain of
:math:`n_b` drafts holds draft lane :math:`i - 1`; ``target[b, i]`` is :math:`p_i` (the target
after :math:`i` drafts), ``draft[b, i]`` is :math:`q_i`, from which draft lane :math:`i` was
drawn (``None``: the point mass :math:`\mathbf 1_{x_i}`). Noise lane :math:`i` is node
:math:`i`'s.

**nss** (:mod:`specsampling.schemes.nss`). The walk draws :math:`y_i \sim p_i` with
:math:`u^\text{sample}_i` at every node and descends while :math:`y_i = x_i`. All
:math:`\gamma + 1` draws are made at once -- in float32 by :func:`~specsampling.gpu.ops.
categorical_blocks` on the target table viewed as ``[B (γ + 1), V]`` (one blocked sum over the
target table, then ``[B, γ + 1, 128]``); the draft table is never read. Then
:math:`k = \min\{i : y_i \ne x_i\}` (or :math:`n_b`) and the row emits
:math:`x_{0..k-1}, y_k`. On the CPU (host reads are free) :meth:`NSSChain.host_run` draws node
by node only for the rows still descending, and stops at the first node where none is: the same
draws, about the chain's acceptance in rows instead of the whole target table.

**block** (:mod:`specsampling.schemes.block`, Sun et al. 2024) and **traversal**
(:mod:`specsampling.schemes.traversal`, which on a chain tests the same leaves in the same order,
deepest first). The capped ratios :math:`w_i` come from the gathers alone. The acceptance of
node :math:`i` is :math:`h_n = w_n` at the end of the chain and, for :math:`1 \le i < n`,

.. math:: h_i = \frac{S_i}{S_i + 1 - w_i}, \qquad S_i = \sum_y (w_i\,p_i(y) - q_i(y))_+,

the one genuinely row-level quantity (one fused pass over the rows :math:`p_i, q_i`; for point-
mass drafts :math:`q_i` is not read at all: :math:`S_i` is the sum of :math:`w_i p_i` with the
drafted entry replaced by :math:`(w_i p_i(x_i) - 1)_+`). Since :math:`S_i \le w_i` makes
:math:`h_i \le w_i`, a node whose uniform is at least :math:`w_i` (up to a rounding margin)
fails without its mass, and nodes shallower than a passing one cannot be :math:`\tau`. On the
CPU (host reads are free) only the other rows are read, deepest node first
(:meth:`BlockChain.deciding_masses`: about the rows at or below the chain's acceptance instead
of every inner node's); on an accelerator and under ``torch.compile`` every inner node's mass is
read, sync-free, through a reused ``[B, V]`` buffer (:meth:`BlockChain.row_masses`). Both give
the same verdicts. For up to :data:`HOST_RUN_ROWS` rows the CPU runs the whole verdict on the host
(:meth:`BlockChain.host_run`: weights, acceptances and :math:`\tau` as Python floats, torch only for
the rows over ``V``), the same tokens with a fraction of the small operations. The rules differ at a
zero mass only: block takes :math:`h_i = 1` when the denominator is 0 (:math:`S_i = 0, w_i = 1`),
traversal deletes such a node (weight 0). :math:`\tau` is the deepest :math:`i \ge 1` with
:math:`u^\text{accept}_i < h_i` (0 if none), and the next token is drawn by inverse CDF with
:math:`u^\text{sample}_\tau` from :math:`p_n` when :math:`\tau = n`, else from
:math:`\mathrm{norm}((w_\tau p_\tau - q_\tau)_+)` (the target where that has no mass): one more row
per sequence. In float64 every value is computed in the lowerings' order
(:mod:`specsampling.gpu.schemes.block`, :mod:`specsampling.gpu.schemes.traversal`), so the verdicts
are the reference's bit for bit.
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import numpy as np
import torch

from . import ops
from .api import TOLERANCE
from .noise import Noise
from .schemes.base import Verified
from .tree import PAD


class ChainRound(NamedTuple):
    """A validated chain round in the padded layout, tables in the compute dtype.

    ``draft_tokens [B, γ]`` (padding lanes ``0``), ``num_drafts [B]``, ``target [B, γ + 1, V]``,
    ``draft [B, γ, V]`` or ``None`` (point-mass drafts).
    """

    draft_tokens: torch.Tensor  # [B, γ]
    num_drafts: torch.Tensor  # [B]
    target: torch.Tensor  # [B, γ + 1, V]
    draft: torch.Tensor | None  # [B, γ, V]


def pack_chain(
    draft_tokens: torch.Tensor, num_accepted: torch.Tensor, token: torch.Tensor
) -> Verified:
    """The accepted drafts, then ``token``, ``PAD`` after: ``tokens [B, γ + 1]``."""
    gamma = draft_tokens.shape[1]
    lanes = torch.arange(gamma + 1, device=token.device)[None, :]  # [1, γ + 1]
    drafts = torch.cat([draft_tokens, torch.zeros_like(draft_tokens[:, :1])], 1)  # [B, γ + 1]
    tokens = torch.where(lanes < num_accepted[:, None], drafts, PAD)  # [B, γ + 1]
    tokens = torch.where(lanes == num_accepted[:, None], token[:, None], tokens)
    return Verified(num_accepted, token, tokens, num_accepted + 1)


def host_verdicts(
    nodes: list[int], drawn: list[int], drafted: list[list[int]], device: torch.device
) -> Verified:
    """:func:`pack_chain` of the host routes (at least one row): per row the accepted drafts
    (``nodes`` of ``drafted [B][γ]``), then its ``drawn`` token, ``PAD`` after."""
    gamma = len(drafted[0])
    rows = [
        tokens[:n] + [token] + [PAD] * (gamma - n)
        for tokens, n, token in zip(drafted, nodes, drawn, strict=True)
    ]
    node = torch.tensor(nodes, dtype=torch.long, device=device)  # [B]
    return Verified(
        node,
        torch.tensor(drawn, dtype=torch.long, device=device),  # [B]
        torch.tensor(rows, dtype=torch.long, device=device),  # [B, γ + 1]
        node + 1,
    )


def take_rows(table: torch.Tensor, lane: torch.Tensor) -> torch.Tensor:
    """``table[b, lane[b]]`` of a contiguous ``table [B, L, V]``, ``[B, V]``, by one
    ``index_select`` (on CPU several times faster than advanced indexing)."""
    batch_size, lanes, vocab = table.shape
    rows = torch.arange(batch_size, device=lane.device) * lanes + lane  # [B]
    return table.view(batch_size * lanes, vocab).index_select(0, rows)  # [B, V]


class NSSChain:
    """Naive speculative sampling on a batch of chains: every node's draw at once, or on the
    CPU (outside ``torch.compile``) node by node for the rows still descending."""

    hot_path: ClassVar[tuple[str, ...]] = ("batched_run",)

    def uniforms(self, sample: torch.Tensor) -> torch.Tensor:
        """The uniform of each node's draw, ``[B, γ + 1]``: node ``i`` draws with sample lane
        ``i`` (both routes read it here)."""
        return sample

    def draws(self, chain: ChainRound, sample: torch.Tensor) -> torch.Tensor:
        """``y [B, γ + 1]``: the target's own draw at every node (``sample [B, γ + 1]``).
        Host dispatch: float64 draws node by node (one ``[B, V]`` cumulative sum at a time)."""
        target = chain.target  # [B, γ + 1, V]
        batch_size, nodes, vocab = target.shape
        if target.dtype == torch.float64:
            return torch.stack([ops.draw_rows(target[:, i], sample[:, i]) for i in range(nodes)], 1)
        flat = target.reshape(batch_size * nodes, vocab)  # [B (γ + 1), V], a view if contiguous
        return ops.categorical_blocks(flat, sample.reshape(-1)).view(batch_size, nodes)

    def run(self, chain: ChainRound, noise: Noise) -> Verified:
        """The verdicts: :meth:`host_run` where host reads are free (the CPU outside
        ``torch.compile``), else :meth:`batched_run`; the same tokens."""
        if ops.host_reads_free(chain.target):
            return self.host_run(chain, noise)
        return self.batched_run(chain, noise)

    def host_run(self, chain: ChainRound, noise: Noise) -> Verified:
        r""":meth:`batched_run`'s verdicts drawing, node by node, only the rows whose drafts all
        matched so far (each row's draw at a node is the batched route's: the same row, uniform
        and function, row by row), and stopping at the first node where none is left: about
        the chain's acceptance in nodes instead of all :math:`\gamma + 1`. One host read a
        node."""
        target = chain.target  # [B, γ + 1, V]
        batch_size, gamma = chain.draft_tokens.shape
        sample = self.uniforms(noise.sample)  # [B, γ + 1]
        drafted, ends = chain.draft_tokens.tolist(), chain.num_drafts.tolist()
        nodes, drawn = [gamma] * batch_size, [0] * batch_size
        alive = list(range(batch_size))  # the rows whose drafts matched up to this node
        for node in range(gamma + 1):
            rows, u = self.host_node_rows(chain, sample, alive, node)  # [L, V], [L]
            descend = []
            for row, token in zip(alive, ops.draw_rows(rows, u).tolist(), strict=True):
                if node < ends[row] and token == drafted[row][node]:
                    descend.append(row)
                else:
                    nodes[row], drawn[row] = node, token
            alive = descend
            if not alive:
                break
        return host_verdicts(nodes, drawn, drafted, target.device)

    def host_node_rows(
        self, chain: ChainRound, sample: torch.Tensor, alive: list[int], node: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`host_run`'s target rows at ``node`` of the ``alive`` rows and their
        uniforms, ``([L, V], [L])``: the table's own rows where every row is alive (no copy)."""
        target = chain.target  # [B, γ + 1, V]
        if len(alive) == target.shape[0]:
            return target[:, node], sample[:, node]  # [B, V], [B]
        index = torch.tensor(alive, device=target.device)  # [L]
        return ops.table_rows(target, index, torch.full_like(index, node)), sample[index, node]

    def batched_run(self, chain: ChainRound, noise: Noise) -> Verified:
        """The verdicts: descend while the draw is the drafted token."""
        gamma = chain.draft_tokens.shape[1]
        drawn = self.draws(chain, self.uniforms(noise.sample))  # [B, γ + 1]
        lanes = torch.arange(gamma, device=drawn.device)  # [γ]
        real = lanes[None, :] < chain.num_drafts[:, None]  # [B, γ]
        matches = real & (drawn[:, :gamma] == chain.draft_tokens)  # [B, γ]
        num_accepted = matches.to(torch.long).cumprod(-1).sum(-1)  # [B]
        token = drawn.gather(1, num_accepted[:, None]).squeeze(-1)  # [B]
        return pack_chain(chain.draft_tokens, num_accepted, token)


def ieee_divide(numerator: float, denominator: float) -> float:
    """``numerator / denominator`` as a float64 tensor divides: ``±inf`` or NaN for a zero
    denominator (Python raises), the same quotient otherwise.

    >>> ieee_divide(1.0, 4.0), ieee_divide(-1.0, 0.0), ieee_divide(0.0, 0.0) != 0.0
    (0.25, -inf, True)
    """
    if denominator != 0:
        return numerator / denominator
    if numerator != numerator or numerator == 0:
        return math.nan
    return math.copysign(math.inf, numerator) * math.copysign(1.0, denominator)


#: The most rows :meth:`BlockChain.run` verifies on the host (CPU, eager), row by row: a few
#: Python steps per lane and node against ~150 small tensor ops per call (2026-12-05, 2 cores:
#: 0.17 against 0.40 ms at one row of 152k tokens, level with the batched route at 8-10 rows
#: of 32k, still ahead at 16 rows of 152k).
HOST_RUN_ROWS = 8

#: The most rows whose chain weights :meth:`BlockChain.weights` computes on the host (CPU, eager):
#: a Python loop of ``B γ`` steps against a few ops per lane.
HOST_WEIGHT_ROWS = 16


class BlockChain:
    """Block verification (Sun et al. 2024) on a batch of chains; :class:`TraversalChain` is
    the same engine with traversal's zero-mass rule and weight cap."""

    hot_path: ClassVar[tuple[str, ...]] = (
        "capped",
        "acceptance",
        "chain_weights",
        "row_masses",
        "acceptances",
        "choose_tau",
        "batched_run",
    )

    # ------------------------------------------------------------------ rule hooks
    def capped(self, scaled: torch.Tensor, draft_x: torch.Tensor) -> torch.Tensor:
        """:math:`\\min(1, w\\,p(x) / q(x))` as the block lowering computes it, ``[B]``."""
        return torch.where(scaled >= draft_x, 1.0, scaled / draft_x)

    @staticmethod
    def capped_value(scaled: float, draft_x: float) -> float:
        """:meth:`capped` of one row and lane, on the host (the same float64 rounding; a
        division by zero gives the tensor's IEEE value, never an exception)."""
        return 1.0 if scaled >= draft_x else ieee_divide(scaled, draft_x)

    def acceptance(self, mass: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``h`` from ``S`` (``mass``, compute dtype) and ``w`` (float64): block's rule, 1 when
        the denominator is 0."""
        mass64 = mass.to(torch.float64)
        denominator = mass64 + (1 - weights)
        positive = denominator > 0
        return torch.where(positive, mass64 / torch.where(positive, denominator, 1.0), 1.0)

    # ------------------------------------------------------------------ host dispatch
    def drafted_mass(self, chain: ChainRound) -> torch.Tensor:
        """:math:`q_i(x_i)` of every lane, ``[B, γ]`` (``1`` for point-mass drafts)."""
        if chain.draft is None:
            return torch.ones_like(chain.target[:, :-1, 0])  # [B, γ]
        return chain.draft.gather(2, chain.draft_tokens[..., None]).squeeze(-1)  # [B, γ]

    def weighted_residual(
        self,
        out: torch.Tensor,  # [B, V], written
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor | None,  # [B, V] or None (point mass on `token`)
        token: torch.Tensor,  # [B]
        scale: torch.Tensor | float,  # [B] float64, or one row's on the host
    ) -> torch.Tensor:
        """``out = (w p - q)_+`` (multiply, subtract, clamp, in the lowerings' order); for a point
        mass only the drafted entry changes. Returns ``out``. A host ``scale`` (one row,
        :meth:`host_run`) multiplies by its value rounded to the compute dtype, as the tensor's
        conversion does."""
        if isinstance(scale, float):
            factor = scale if target.dtype == torch.float64 else float(np.float32(scale))
            if factor == 1.0 and draft is not None:  # 1 * p is p exactly: one pass fewer
                return torch.sub(target, draft, out=out).clamp_min_(0)
            torch.mul(target, factor, out=out)
        else:
            torch.mul(target, scale.to(target.dtype)[:, None], out=out)
        if draft is not None:
            return out.sub_(draft).clamp_min_(0)
        drafted = (out.gather(1, token[:, None]) - 1).clamp_min_(0)  # [B, 1]
        return out.scatter_(1, token[:, None], drafted)

    def draft_row(self, chain: ChainRound, lane: int | torch.Tensor) -> torch.Tensor | None:
        """``q`` of every row at ``lane`` (an int, or ``[B]``), ``None`` for point masses."""
        if chain.draft is None:
            return None
        if isinstance(lane, int):
            return chain.draft[:, lane]  # [B, V] view
        return take_rows(chain.draft, lane)  # [B, V]

    def stop_draw(
        self,
        residual: torch.Tensor,
        target: torch.Tensor,
        use_target: torch.Tensor,
        u: torch.Tensor,
    ) -> torch.Tensor:
        """The stop token: from ``residual`` (normalised), or ``target`` where ``use_target``;
        float64 as the lowerings (normalise, select, :func:`~specsampling.gpu.ops.categorical`),
        below by :func:`~specsampling.gpu.ops.categorical_blocks_or` (no normalisation)."""
        if residual.dtype == torch.float64:
            mass = ops.numpy_sum(residual)[:, None]  # [B, 1]
            normalised = residual.div_(torch.where(mass > 0, mass, 1.0))  # [B, V]
            return ops.categorical(torch.where(use_target[:, None], target, normalised), u)
        return ops.categorical_blocks_or(residual, target, use_target, u)

    def weights(self, chain: ChainRound) -> torch.Tensor:
        """:meth:`chain_weights` (sync-free), or on the CPU outside ``torch.compile`` for up to
        :data:`HOST_WEIGHT_ROWS` rows :meth:`host_weights`: the same float64 values from one
        host read instead of a few small ops per lane."""
        if ops.host_reads_free(chain.target) and chain.target.shape[0] <= HOST_WEIGHT_ROWS:
            return self.host_weights(chain)
        return self.chain_weights(chain)

    def drafted_pair(self, chain: ChainRound) -> tuple[torch.Tensor, torch.Tensor]:
        """``(p_i(x_i), q_i(x_i))`` of every lane, ``[B, γ]`` each, float64: what the chain
        weights are formed from."""
        target_x = chain.target[:, :-1].gather(2, chain.draft_tokens[..., None]).squeeze(-1)
        return target_x.to(torch.float64), self.drafted_mass(chain).to(torch.float64)

    def host_weights(self, chain: ChainRound) -> torch.Tensor:
        """:meth:`chain_weights` by a host loop over the lanes: each step the same float64
        product, then :meth:`capped_value` (a comparison and a quotient, as :meth:`capped`)."""
        target_x, draft_x = self.drafted_pair(chain)  # [B, γ] each
        rows = []
        for target_row, draft_row in torch.stack([target_x, draft_x], 1).tolist():  # host read
            weight, row = 1.0, [1.0]
            for p_x, q_x in zip(target_row, draft_row, strict=True):
                weight = self.capped_value(weight * p_x, q_x)
                row.append(weight)
            rows.append(row)
        return torch.tensor(rows, dtype=torch.float64, device=target_x.device)  # [B, γ + 1]

    # ------------------------------------------------------------------ the hot path
    def chain_weights(self, chain: ChainRound) -> torch.Tensor:
        """``w [B, γ + 1]`` float64, ``w_0 = 1``, :math:`w_{i+1}` from :math:`w_i p_i(x_i)` and
        :math:`q_i(x_i)` (lanes past a row's end: never read)."""
        target_x, draft_x = self.drafted_pair(chain)  # [B, γ] each
        columns = [torch.ones_like(target_x[:, 0])]  # [B] each
        for lane in range(chain.draft_tokens.shape[1]):
            columns.append(self.capped(columns[-1] * target_x[:, lane], draft_x[:, lane]))
        return torch.stack(columns, 1)  # [B, γ + 1]

    def masses(self, chain: ChainRound, weights: torch.Tensor, noise: Noise) -> torch.Tensor:
        r"""The masses :math:`S_i` the acceptances read, ``[B, γ + 1]``: every inner node's
        (:meth:`row_masses`, sync-free), or on the CPU outside ``torch.compile`` only those that
        can decide :math:`\tau` (:meth:`deciding_masses`: host reads cost nothing there)."""
        if ops.host_reads_free(chain.target):
            return self.deciding_masses(chain, weights, noise)
        return self.row_masses(chain, weights)

    def deciding_masses(
        self, chain: ChainRound, weights: torch.Tensor, noise: Noise
    ) -> torch.Tensor:
        r""":meth:`row_masses`' values, float64, where they can decide :math:`\tau`, and
        :math:`S_i = w_i` (so :math:`h_i = w_i`) elsewhere, read deepest node first.

        :math:`S_i \le w_i \sum_y p_i(y)`, so :math:`h_i = S_i / (S_i + 1 - w_i) \le w_i`
        up to the row's mass error and roundings (:meth:`fail_margin`): a node whose uniform
        is at least :math:`w_i (1 + m)` fails whatever its mass, and one shallower than a
        node that passed cannot be :math:`\tau` (the deepest pass). Only the others are read:
        per inner node, deepest first, the rows still undecided whose uniform is under the
        bound, gathered into one ``[N, V]`` pass (host reads of the row lists). The verdicts
        are :meth:`row_masses`' exactly; the rows read drop from every inner node to about
        those at or below the chain's acceptance."""
        batch_size, gamma = chain.draft_tokens.shape
        target = chain.target  # [B, γ + 1, V]
        vocab = target.shape[-1]
        nodes = torch.arange(gamma + 1, device=weights.device)[None, :]  # [1, γ + 1]
        ends = chain.num_drafts[:, None]  # [B, 1]
        bound = weights * (1 + self.fail_margin(target.dtype, vocab))  # [B, γ + 1]
        open_ = ((nodes >= 1) & (nodes < ends) & (noise.accept < bound)).tolist()  # [B][γ + 1]
        decided = ((nodes == ends) & (nodes >= 1) & (noise.accept < weights)).any(-1).tolist()
        masses = weights.clone()  # [B, γ + 1] float64
        flat_target = target.view(batch_size * (gamma + 1), vocab)  # [B (γ + 1), V]
        flat_draft = None if chain.draft is None else chain.draft.view(batch_size * gamma, vocab)
        for node in range(gamma - 1, 0, -1):
            rows = [b for b in range(batch_size) if open_[b][node] and not decided[b]]
            if not rows:
                continue
            index = torch.tensor(rows, device=weights.device)  # [N]
            scale = weights[index, node]  # [N]
            token = chain.draft_tokens[index, node]  # [N]
            if len(rows) == batch_size:  # every row: the tables' own rows, one new buffer
                p, draft = target[:, node], self.draft_row(chain, node)  # [B, V] views
                out = target.new_empty((batch_size, vocab))  # [B, V]
            else:  # the rows gathered, then worked on in place
                p = out = flat_target.index_select(0, index * (gamma + 1) + node)  # [N, V]
                draft = None
                if flat_draft is not None:
                    draft = flat_draft.index_select(0, index * gamma + node)  # [N, V]
            mass = ops.numpy_sum(self.weighted_residual(out, p, draft, token, scale))  # [N]
            masses[index, node] = mass.to(torch.float64)
            passed = (noise.accept[index, node] < self.acceptance(mass, scale)).tolist()
            for b, ok in zip(rows, passed, strict=True):
                decided[b] = decided[b] or ok
        return masses

    @staticmethod
    def fail_margin(dtype: torch.dtype, vocab: int) -> float:
        r""":math:`m` with :math:`h_i \le w_i (1 + m)` in compute ``dtype`` for rows that pass
        the default validation: twice the loosest row-mass tolerance of tables computed in
        ``dtype`` (float64's; below it bf16/fp16's, which are upcast to float32) plus a
        summation's worst-case relative rounding, :math:`(V + 4)\,\epsilon`. Rows whose mass
        is further from 1 (``validate=False``, a looser ``tolerance``) may have :math:`h_i`
        above the bound; such nodes then fail, as they do for every row that is a
        distribution.

        >>> BlockChain.fail_margin(torch.float64, 100) < 1e-5
        True
        """
        loosest = TOLERANCE[torch.float64] if dtype == torch.float64 else TOLERANCE[torch.bfloat16]
        return 2 * (loosest + (vocab + 4) * torch.finfo(dtype).eps)

    def row_masses(self, chain: ChainRound, weights: torch.Tensor) -> torch.Tensor:
        """Every inner node's :math:`S_i`, ``[B, γ + 1]`` in the compute dtype (0 at node 0 and
        node γ, never read): one fused pass per inner node through one reused ``[B, V]``
        buffer."""
        batch_size, gamma = chain.draft_tokens.shape
        target = chain.target  # [B, γ + 1, V]
        buffer = target.new_empty((batch_size, target.shape[-1]))  # [B, V]
        masses = [torch.zeros_like(target[:, 0, 0])]  # [B] each; node 0's is never read
        for node in range(1, gamma):
            residual = self.weighted_residual(
                buffer,
                target[:, node],
                self.draft_row(chain, node),
                chain.draft_tokens[:, node],
                weights[:, node],
            )
            masses.append(ops.numpy_sum(residual))
        masses.append(torch.zeros_like(masses[0]))  # node γ: always the chain's end
        return torch.stack(masses, 1)  # [B, γ + 1]

    def acceptances(self, chain: ChainRound, weights: torch.Tensor, noise: Noise) -> torch.Tensor:
        """``h [B, γ + 1]`` float64 of nodes ``1..n`` (``w_n`` at the chain's end) from
        :meth:`masses`."""
        gamma = chain.draft_tokens.shape[1]
        inner = self.acceptance(self.masses(chain, weights, noise), weights)  # [B, γ + 1]
        nodes = torch.arange(gamma + 1, device=weights.device)  # [γ + 1]
        at_end = nodes[None, :] == chain.num_drafts[:, None]  # [B, γ + 1]
        return torch.where(at_end, weights, inner)  # [B, γ + 1]

    def choose_tau(self, chain: ChainRound, accept: torch.Tensor, noise: Noise) -> torch.Tensor:
        """The deepest node ``1 <= i <= n`` with ``u_accept[i] < h_i``, 0 if none, ``[B]``."""
        nodes = torch.arange(accept.shape[1], device=accept.device)  # [γ + 1]
        real = (nodes[None, :] >= 1) & (nodes[None, :] <= chain.num_drafts[:, None])
        passes = real & (noise.accept < accept)  # [B, γ + 1]
        return torch.where(passes, nodes[None, :], 0).amax(-1)  # [B]

    def run(self, chain: ChainRound, noise: Noise) -> Verified:
        """The verdicts: :meth:`host_run` on the CPU outside ``torch.compile`` for up to
        :data:`HOST_RUN_ROWS` rows, else :meth:`batched_run`; the same tokens."""
        if ops.host_reads_free(chain.target) and 0 < chain.target.shape[0] <= HOST_RUN_ROWS:
            return self.host_run(chain, noise)
        return self.batched_run(chain, noise)

    def host_run(self, chain: ChainRound, noise: Noise) -> Verified:
        r""":meth:`batched_run` row by row on the host: the chain weights, the acceptances and
        :math:`\tau` as Python floats (the same float64 operations as the tensors', and only
        the masses :meth:`deciding_masses` reads, deepest first), torch only for the passes over
        ``V`` -- each mass row and the stop row, on views of the tables through one reused
        buffer. The stop row is the last mass row read when :math:`\tau` passed there. Two
        host reads; the same tokens as :meth:`batched_run`, bit for bit (tested), in about a
        third of its small operations at one row."""
        gamma = chain.draft_tokens.shape[1]
        target = chain.target  # [B, γ + 1, V]
        vocab = target.shape[-1]
        target_x, draft_x = self.drafted_pair(chain)  # [B, γ] each, float64
        ends = chain.num_drafts[:, None].to(torch.float64)  # [B, 1]
        read = torch.cat([target_x, draft_x, noise.accept, noise.sample, ends], 1).tolist()
        drafted = chain.draft_tokens.tolist()  # [B][γ]
        margin = 1 + self.fail_margin(target.dtype, vocab)
        buffer = target.new_empty((1, vocab))  # [1, V], reused
        nodes, drawn = [], []
        for row, values in enumerate(read):
            p_x, q_x = values[:gamma], values[gamma : 2 * gamma]
            accept, sample = values[2 * gamma : 3 * gamma + 1], values[3 * gamma + 1 : -1]
            end = int(values[-1])
            weights = [1.0]  # w_0..w_end (padding lanes never read)
            for p, q in zip(p_x[:end], q_x[:end], strict=True):
                weights.append(self.capped_value(weights[-1] * p, q))
            tau, mass = (end, None) if end >= 1 and accept[end] < weights[end] else (0, None)
            for node in range(end - 1 if tau == 0 else 0, 0, -1):  # the deciding masses
                if not accept[node] < weights[node] * margin:
                    continue  # fails whatever its mass
                mass = self.host_residual(chain, buffer, row, node, weights[node])
                if accept[node] < self.acceptance_value(mass, weights[node]):
                    tau = node
                    break
            nodes.append(tau)
            drawn.append(self.host_stop(chain, buffer, row, tau, end, mass, weights[tau], sample))
        return host_verdicts(nodes, drawn, drafted, target.device)

    def host_stop(
        self,
        chain: ChainRound,
        buffer: torch.Tensor,  # [1, V]
        row: int,
        tau: int,
        end: int,
        mass: float | None,
        weight: float,
        sample: list[float],
    ) -> int:
        """The stop token of ``row`` at ``tau`` (:meth:`host_run`): the target row's draw at
        the chain's end, else the draw of tau's residual, or of the target where it has no
        mass, as :meth:`stop_draw`. ``mass`` is tau's residual mass where deciding tau read it
        (its rows are then in ``buffer``); otherwise the residual is formed here, and below
        float64 drawn by :func:`~specsampling.gpu.ops.draw_one_or`, whose block sums tell
        whether it has mass (no sum of its own)."""
        target = chain.target[row, tau]  # [V]
        formed = tau != end and (tau == 0 or mass is None)  # else tau's rows are in `buffer`
        if target.dtype != torch.float64:  # categorical_blocks(_or) on host values
            if formed:
                self.host_residual_rows(chain, buffer, row, tau, weight)
                return ops.draw_one_or(buffer[0], target, sample[tau])
            use_target = tau == end or not (mass is not None and mass > 0)
            return ops.draw_one(target if use_target else buffer[0], sample[tau])
        if formed:
            mass = self.host_residual(chain, buffer, row, tau, weight)
        u = torch.tensor([sample[tau]], dtype=torch.float64)
        if tau == end or not (mass is not None and mass > 0):  # the target row itself
            return int(ops.draw_rows(target[None], u)[0])
        return int(self.stop_draw(buffer, target[None], torch.tensor([False]), u)[0])

    def host_residual(
        self, chain: ChainRound, out: torch.Tensor, row: int, node: int, weight: float
    ) -> float:
        """:math:`S` of ``node`` in ``row``: :meth:`host_residual_rows`, its sum read on the
        host."""
        return float(ops.numpy_sum(self.host_residual_rows(chain, out, row, node, weight)))

    def host_residual_rows(
        self, chain: ChainRound, out: torch.Tensor, row: int, node: int, weight: float
    ) -> torch.Tensor:
        """``out [1, V]`` = :math:`(w p - q)_+` of ``node`` in ``row`` (:meth:`weighted_residual`
        on views of the tables)."""
        draft = None if chain.draft is None else chain.draft[row, node][None]  # [1, V]
        token = chain.draft_tokens[row : row + 1, node]  # [1]
        return self.weighted_residual(out, chain.target[row, node][None], draft, token, weight)

    @staticmethod
    def acceptance_value(mass: float, weight: float) -> float:
        """:meth:`acceptance` of one mass on the host (the same float64 operations)."""
        denominator = mass + (1 - weight)
        return mass / denominator if denominator > 0 else 1.0

    def batched_run(self, chain: ChainRound, noise: Noise) -> Verified:
        """The verdicts: ``tau`` from the gathered weights and row masses, then one stop row."""
        batch_size, gamma = chain.draft_tokens.shape
        rows = torch.arange(batch_size, device=chain.target.device)  # [B]
        weights = self.weights(chain)  # [B, γ + 1]
        tau = self.choose_tau(chain, self.acceptances(chain, weights, noise), noise)  # [B]
        target = take_rows(chain.target, tau)  # [B, V]
        lane = tau.clamp_max(gamma - 1)  # [B] (a padding lane at the end: never chosen)
        token = chain.draft_tokens.gather(1, lane[:, None]).squeeze(-1)  # [B]
        residual = self.weighted_residual(
            torch.empty_like(target), target, self.draft_row(chain, lane), token, weights[rows, tau]
        )  # [B, V]
        has_mass = residual.sum(-1) > 0  # [B]
        use_target = (tau == chain.num_drafts) | ~has_mass  # [B]
        drawn = self.stop_draw(residual, target, use_target, noise.sample[rows, tau])  # [B]
        return pack_chain(chain.draft_tokens, tau, drawn)


class TraversalChain(BlockChain):
    """Traversal verification (Weng et al. 2025) on chains: block's engine, with the reference's
    weight rule (0 where :math:`q(x) = 0`) and a node without residual mass deleted (weight 0)."""

    def capped(self, scaled: torch.Tensor, draft_x: torch.Tensor) -> torch.Tensor:
        """The traversal ``reweigh`` rule: 0 if ``q(x) = 0``, else ``min(1, w p(x) / q(x))``."""
        return torch.where(draft_x > 0, super().capped(scaled, draft_x), 0.0)

    @staticmethod
    def capped_value(scaled: float, draft_x: float) -> float:
        """:meth:`capped` of one row and lane, on the host."""
        return BlockChain.capped_value(scaled, draft_x) if draft_x > 0 else 0.0

    def acceptance(self, mass: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``S / (S + 1 - w)`` where ``S > 0``, else 0 (the node is deleted)."""
        mass64 = mass.to(torch.float64)
        return torch.where(mass > 0, mass64 / (mass64 + (1 - weights)), 0.0)

    @staticmethod
    def acceptance_value(mass: float, weight: float) -> float:
        """:meth:`acceptance` of one mass on the host."""
        return mass / (mass + (1 - weight)) if mass > 0 else 0.0


NSS_CHAIN = NSSChain()
BLOCK_CHAIN = BlockChain()
TRAVERSAL_CHAIN = TraversalChain()

__all__ = [
    "BLOCK_CHAIN",
    "NSS_CHAIN",
    "TRAVERSAL_CHAIN",
    "BlockChain",
    "ChainRound",
    "NSSChain",
    "TraversalChain",
    "pack_chain",
    "take_rows",
]
