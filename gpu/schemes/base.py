"""The bases of the lowerings, and the batched top-down node walk of
:class:`specsampling.schemes.NodeScheme`.

:class:`Lowering` names the reference; :class:`TreeLowering` verifies a :class:`TreeBatch`
(``walk``); :class:`NodeLowering` is the tree lowering of the node schemes.

Every row of a :class:`~specsampling.gpu.TreeBatch` walks its own tree from the root, one depth
per iteration (``max_depth + 1`` iterations, a static bound): at a node with candidates the
scheme's :meth:`NodeLowering.node_step` either accepts a candidate slot or gives the
distribution to stop with; at a node without candidates the bonus is drawn from the target
after that node. The stop token is drawn by inverse CDF with the node's ``sample`` uniform, and
a token that equals a drafted child (a residual "hit") descends into that child -- exactly the
reference's rule. Rows that have stopped keep their verdict while the others go on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

import specsampling as ss
from specsampling.errors import UnsupportedShape
from specsampling.schemes.base import TreeScheme

from .. import ops
from ..noise import Noise
from ..tree import PAD, TreeBatch


class Verified(NamedTuple):
    """The verdict of every row: the reference :class:`~specsampling.Verdict`, batched.

    ``node [B]`` is the deepest accepted node (``0``: nothing accepted), ``token [B]`` the next
    token; ``tokens [B, max_depth + 1]`` the emitted tokens (the accepted path, then ``token``)
    padded with ``PAD``, and ``num_emitted [B]`` their count (``depth(node) + 1``).
    """

    node: torch.Tensor  # [B]
    token: torch.Tensor  # [B]
    tokens: torch.Tensor  # [B, max_depth + 1]
    num_emitted: torch.Tensor  # [B]


class Descent(NamedTuple):
    """Every row's place in a top-down walk, one depth per step: the node reached, whether the
    row has stopped, its stop token (``PAD`` until then) and the tokens emitted so far.

    The bookkeeping of every top-down walk (:meth:`NodeLowering.walk` and the keyed
    :meth:`KeyedLowering.walk <specsampling.gpu.schemes.coupled.KeyedLowering.walk>`), written
    once; the walks differ only in how each node's token and descent are decided.
    """

    node: torch.Tensor  # [B]
    done: torch.Tensor  # [B] bool
    token: torch.Tensor  # [B]
    emitted: torch.Tensor  # [B, max_depth + 1], written in place by advance

    @classmethod
    def start(cls, batch_size: int, max_depth: int, device: torch.device) -> Descent:
        """Every row at the root, nothing emitted."""
        return cls(
            node=torch.zeros(batch_size, dtype=torch.long, device=device),
            done=torch.zeros(batch_size, dtype=torch.bool, device=device),
            token=torch.full((batch_size,), PAD, dtype=torch.long, device=device),
            emitted=torch.full((batch_size, max_depth + 1), PAD, dtype=torch.long, device=device),
        )

    def advance(
        self,
        depth: int,
        record: torch.Tensor,  # [B]
        drawn: torch.Tensor,  # [B]
        descend: torch.Tensor,  # [B] bool
        child: torch.Tensor,  # [B]
    ) -> Descent:
        """Depth ``depth`` for the rows still walking: each emits ``record`` there; a row that
        does not ``descend`` stops with ``drawn``, the others move to ``child``."""
        live = ~self.done  # [B]
        stops = live & ~descend  # [B]
        self.emitted[:, depth] = torch.where(live, record, self.emitted[:, depth])
        return Descent(
            node=torch.where(live & descend, child, self.node),
            done=self.done | stops,
            token=torch.where(stops, drawn, self.token),
            emitted=self.emitted,
        )

    def widen(self, rows: torch.Tensor, *parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`advance`'s ``record, drawn, descend, child`` of the walking ``rows [L]`` as
        ``[B]`` tensors; the other rows have stopped, and advance keeps their verdict whatever
        they hold."""
        fills = (self.token, self.token, self.done, self.node)
        return tuple(
            fill.clone().index_put_((rows,), part) for fill, part in zip(fills, parts, strict=True)
        )

    def verified(self, depth: torch.Tensor) -> Verified:
        """The verdicts, with ``depth [B, N]`` the depth of every node."""
        rows = torch.arange(self.node.shape[0], device=self.node.device)  # [B]
        return Verified(self.node, self.token, self.emitted, depth[rows, self.node] + 1)


class NodeStep(NamedTuple):
    """One node decision for every row: the accepted candidate slot (``PAD``: none) and the
    distribution to stop with when no slot is accepted."""

    accepted: torch.Tensor  # [B] slot index or PAD
    stop_probs: torch.Tensor  # [B, V]


def standard_step(
    accepts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    target: torch.Tensor,  # [B, V]
    draft: torch.Tensor,  # [B, V]
    candidate_tokens: torch.Tensor,  # [B, C] (0 in padded slots)
    candidate_valid: torch.Tensor,  # [B, C] bool
    accept_uniforms: torch.Tensor,  # [B, C] float64
) -> NodeStep:
    r"""Standard speculative sampling on candidate slot 0, for every row: accept iff
    ``accepts(u[x], p(x), q(x))`` (:meth:`NodeLowering.accepts`: :math:`u\,q(x) < p(x)`), else
    stop with the residual :math:`\mathrm{norm}((p - q)_+)`.

    The rule of :class:`~specsampling.gpu.schemes.standard.Standard` and of the one-candidate
    nodes of :class:`HostPlanned`, written once.
    """
    token = candidate_tokens[:, 0]  # [B]
    accepted = candidate_valid[:, 0] & accepts(
        accept_uniforms[:, 0], ops.gather_tokens(target, token), ops.gather_tokens(draft, token)
    )  # [B]
    return NodeStep(torch.where(accepted, 0, PAD), ops.residual(target, draft))


class Lowering:
    """Base of every lowering: ``name`` is the reference scheme's registry name.

    Tree verifiers derive from :class:`TreeLowering`; the keyed couplings have their own base
    (:mod:`specsampling.gpu.schemes.coupled`). ``hot_path`` names the methods that run inside a
    verify call and must never synchronise with the host (checked by a test).
    """

    name: ClassVar[str] = ""
    hot_path: ClassVar[tuple[str, ...]] = ()

    @property
    def reference_scheme(self) -> Any:
        """The numpy reference object this lowers."""
        return ss.SCHEMES[self.name]

    def __repr__(self) -> str:
        return f"<torch lowering {self.name!r}>"


class TreeLowering(Lowering, ABC):
    """Base of the lowered tree verifiers: :meth:`walk` gives every row its reference verdict.

    The draw-law refusals follow from the reference's own ``exact_for(law, chain)``.
    """

    hot_path: ClassVar[tuple[str, ...]] = ("walk",)

    @property
    def reference_scheme(self) -> TreeScheme:
        """The numpy reference this object lowers."""
        scheme = ss.SCHEMES[self.name]
        assert isinstance(scheme, TreeScheme)
        return scheme

    def check_batch(self, batch: TreeBatch) -> None:
        """Raise :class:`~specsampling.UnsupportedShape` for the first row whose tree law the
        reference is not exact for (host metadata only)."""
        reference = self.reference_scheme
        for row, (law, chain) in enumerate(zip(batch.laws, batch.chains, strict=True)):
            if not reference.exact_for(law, chain):
                shape = "chain" if chain else "tree"
                raise UnsupportedShape(
                    f"batch row {row}: scheme {self.name!r} is not exact for a {shape} drawn by "
                    f"law {law.value!r}; it is exact for {reference.support_text()}"
                )

    @abstractmethod
    def walk(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V] compute dtype
        draft_probs: torch.Tensor,  # [B, N, V] compute dtype
        noise: Noise,  # [B, N] float64 each
    ) -> Verified:
        """The batched reference ``verify`` on validated inputs (no host synchronisation)."""


class NodeLowering(TreeLowering):
    """Base of the lowered node schemes (:class:`~specsampling.schemes.NodeScheme`); a subclass
    gives :meth:`node_step`, and the shared top-down :meth:`walk` does the rest.

    A rule that needs per-node parameters computed once per call (ResiSpec's policy choice, each
    row's law) gives :meth:`node_extras` and decides in :meth:`step`, which receives the node's
    extras; by default there are none and :meth:`step` is :meth:`node_step`.
    """

    hot_path: ClassVar[tuple[str, ...]] = ("walk", "level_extras", "step", "node_step")
    #: Whether the walk hands :meth:`step` only the slots of the level
    #: (:meth:`level_candidates`); ``False`` for rules whose extras are laid out by slot.
    trims_slots: ClassVar[bool] = True

    def node_extras(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
    ) -> Any:
        """Per-node parameters ``[B, N, P]`` for :meth:`step`, once per call (default ``P = 0``),
        read by :meth:`level_extras`."""
        return draft_probs.new_zeros(batch.batch_size, draft_probs.shape[1], 0)

    def level_extras(
        self,
        extras: Any,  # what node_extras gave: [B, N, P], or a ReachedPlan
        depth: int,
        node: torch.Tensor,  # [B]
        done: torch.Tensor,  # [B] bool
    ) -> torch.Tensor:
        """The extras of every row's node at iteration ``depth`` of the walk, ``[B, P]``: the
        rows of ``node_extras``' table (sync-free). A host-planned rule overrides it to plan
        there only the nodes the walk reaches (:class:`ReachedPlan`)."""
        table: torch.Tensor = extras  # [B, N, P]
        return table[torch.arange(node.shape[0], device=node.device), node]  # [B, P]

    def step(
        self,
        extras: torch.Tensor,  # [B, P]
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C] bool
        accept_uniforms: torch.Tensor,  # [B, C] float64
        owned: bool = False,
    ) -> NodeStep:
        """Decide at a node given its extras; by default :meth:`node_step` (no extras).
        ``owned``: ``target`` and ``draft`` are the caller's scratch rows (the walk's gathered
        copies, read by nothing after the step), which a rule may overwrite instead of
        copying; otherwise they are read-only."""
        return self.node_step(target, draft, candidate_tokens, candidate_valid, accept_uniforms)

    # ------------------------------------------------------------------ the per-node rule
    @abstractmethod
    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C] (0 in padded slots)
        candidate_valid: torch.Tensor,  # [B, C] bool
        accept_uniforms: torch.Tensor,  # [B, C] float64
    ) -> NodeStep:
        """Decide at a node with candidates, for every row at once."""

    def accepts(
        self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor
    ) -> torch.Tensor:
        """The accept test the schemes use (:func:`specsampling.gpu.ops.accepts`)."""
        return ops.accepts(u, target_x, draft_x)

    def candidate_mask(self, candidate_nodes: torch.Tensor) -> torch.Tensor:
        """Which candidate slots hold a real child, ``[B, C]`` bool."""
        return candidate_nodes != PAD

    def walking_rows(self, done: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The rows a walk step decides for, ``[L]``: on the CPU outside ``torch.compile`` those
        not ``done`` (a host read, free there), elsewhere every row (``rows``)."""
        if ops.host_reads_free(done):
            return rows[~done]
        return rows

    def leaf_rows(self, leaf: torch.Tensor) -> tuple[bool, bool]:
        """``(some, all)``: whether some / every row of a walk step is at a leaf (``leaf [L]``).
        On the CPU outside ``torch.compile`` a host read (free there), so a level without leaves
        gathers no bonus rows and a level of leaves runs no rule; elsewhere ``(True, False)``,
        sync-free: both computed and selected per row (the same verdicts)."""
        if ops.host_reads_free(leaf):
            leaves = int(leaf.sum())
            return leaves > 0, leaves == leaf.shape[0]
        return True, False

    def level_candidates(self, batch: TreeBatch, depth: int) -> torch.Tensor:
        """The candidate table the walk reads at ``depth``, ``[B, N, C_depth]``: only the slots
        a node at that depth can hold (:attr:`TreeBatch.level_slots
        <specsampling.gpu.TreeBatch.level_slots>`, at least one), so a rule's loop over the
        slots runs as often as that level needs, not as the widest node of the batch. Rows
        that have stopped read garbage there, never used. A view, no copy."""
        if not self.trims_slots:
            return batch.candidates
        return batch.candidates[..., : max(1, batch.level_slots[depth])]

    def bonus_row(self, batch: TreeBatch, node: torch.Tensor) -> torch.Tensor:
        """The table row the bonus at a leaf is drawn from: the leaf itself (``[B]``)."""
        return node

    # ------------------------------------------------------------------ the walk
    def walk(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V] compute dtype
        draft_probs: torch.Tensor,  # [B, N, V] compute dtype
        noise: Noise,  # [B, N] float64 each
    ) -> Verified:
        """The batched :meth:`NodeScheme.verify`, on validated inputs.

        Each depth decides for the rows still walking (:meth:`walking_rows`: on the CPU only
        those, gathered by a free host read; elsewhere every row, sync-free, the stopped ones
        keeping their verdict), so a row's cost ends where its walk does; there, too, a level
        without leaves gathers no bonus rows and a level of leaves runs no rule
        (:meth:`leaf_rows`)."""
        batch_size = batch.batch_size
        rows = torch.arange(batch_size, device=batch.device)  # [B]
        walk = Descent.start(batch_size, batch.max_depth, batch.device)
        node_tokens = batch.tokens.clamp_min(0)  # [B, N]
        extras = self.node_extras(batch, target_probs, draft_probs)  # [B, N, P]
        for depth in range(batch.max_depth + 1):
            sub = self.walking_rows(walk.done, rows)  # [L]
            if sub.shape[0] == 0:  # static: a shape (every row stopped; only on the CPU)
                break
            node = walk.node[sub]  # [L]
            candidate_nodes = self.level_candidates(batch, depth)[sub, node]  # [L, C_depth]
            valid = self.candidate_mask(candidate_nodes)  # [L, C]
            safe_nodes = candidate_nodes.clamp_min(0)  # [L, C]
            candidate_tokens = node_tokens[sub[:, None], safe_nodes]  # [L, C]
            accept_uniforms = noise.accept[sub[:, None], safe_nodes]  # [L, C]
            leaf = ~valid.any(-1)  # [L]
            some_leaf, all_leaf = self.leaf_rows(leaf)
            if all_leaf:  # static off the CPU (never); there a free host read: no rule to run
                bonus_node = self.bonus_row(batch, walk.node)[sub]  # [L]
                stop_probs = ops.table_rows(target_probs, sub, bonus_node)  # [L, V]
                accepted = torch.full_like(node, PAD)  # [L]
            else:
                target = ops.table_rows(target_probs, sub, node)  # [L, V]
                draft = ops.table_rows(draft_probs, sub, node)  # [L, V]
                extra = self.level_extras(extras, depth, walk.node, walk.done)[sub]  # [L, P]
                step = self.step(
                    extra, target, draft, candidate_tokens, valid, accept_uniforms, owned=True
                )  # target, draft: this level's own gathered rows
                stop_probs = step.stop_probs  # [L, V]
                if some_leaf:  # static off the CPU (always); there a free host read
                    bonus_node = self.bonus_row(batch, walk.node)[sub]  # [L]
                    bonus = ops.table_rows(target_probs, sub, bonus_node)  # [L, V]
                    stop_probs = torch.where(leaf[:, None], bonus, stop_probs)  # [L, V]
                accepted = torch.where(leaf, PAD, step.accepted)  # [L]
            drawn = ops.draw_rows(stop_probs, noise.sample[sub, node])  # [L]

            hit = valid & (candidate_tokens == drawn[:, None])  # [L, C]
            slot = torch.where(accepted >= 0, accepted, hit.to(torch.int8).argmax(-1))  # [L]
            descend = (accepted >= 0) | hit.any(-1)  # [L]
            child = safe_nodes.gather(1, slot[:, None]).squeeze(-1)  # [L]
            record = torch.where(descend, node_tokens[sub, child], drawn)  # [L]
            if sub is not rows:  # static: the CPU's subset (walking_rows), widened to [B]
                record, drawn, descend, child = walk.widen(sub, record, drawn, descend, child)
            walk = walk.advance(depth, record, drawn, descend, child)
        return walk.verified(batch.depth)


class ReachedPlan:
    """A host plan of the nodes with two or more candidates that a walk reaches, made level by
    level: what a host-planned rule's :meth:`NodeLowering.level_extras` returns instead of a
    table of every node.

    ``default(node [B]) -> [B, P]`` gives the extras of nodes not planned (sync-free);
    ``plan(pairs) -> [M, P]`` plans the ``(row, node)`` pairs on the host. Built with one host
    read (which nodes have two or more candidates, at which depths; none at all when no node can
    have two, e.g. chains); then :meth:`at` reads the rows' nodes once per depth that holds such
    a node (none at the root, where every row starts) and plans only the live rows' nodes there,
    as the reference plans only the nodes its walk visits. Unvisited nodes cost nothing.
    """

    def __init__(
        self,
        batch: TreeBatch,
        default: Callable[[torch.Tensor], torch.Tensor],
        plan: Callable[[list[tuple[int, int]]], torch.Tensor],
    ) -> None:
        self.default = default
        self.plan = plan
        self.multi: list[list[bool]] = []
        self.levels: set[int] = set()
        if batch.candidates.shape[-1] >= 2:  # static: otherwise no node has two candidates
            multi = (batch.candidates != PAD).sum(-1) >= 2  # [B, N]
            depth = torch.where(multi, batch.depth, -1)  # [B, N]
            both = torch.stack([multi.long(), depth]).tolist()  # the host read
            self.multi = [[bool(flag) for flag in row] for row in both[0]]
            self.levels = {level for row in both[1] for level in row if level >= 0}

    def at(self, depth: int, node: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """The extras of every row's node at walk iteration ``depth`` (``[B, P]``), planning the
        live rows' multi-candidate nodes (one host read when ``depth`` holds any)."""
        out = self.default(node)  # [B, P]
        if depth not in self.levels:
            return out
        if depth == 0:  # every row is at the root and walking
            nodes, stopped = [0] * node.shape[0], [0] * node.shape[0]
        else:
            nodes, stopped = torch.stack([node, done.long()]).tolist()  # the host read
        pairs = [
            (row, at)
            for row, (at, gone) in enumerate(zip(nodes, stopped, strict=True))
            if not gone and self.multi[row][at]
        ]
        if not pairs:
            return out
        rows = torch.tensor([row for row, _ in pairs], device=node.device)  # [M]
        out = out.clone()
        out[rows] = self.plan(pairs).to(out.device, out.dtype)  # [M, P]
        return out


class HostPlanned(NodeLowering):
    """A node scheme whose multi-candidate decision is planned on the host by its reference.

    The reference gives ``decision(tree, node, target_probs, draft_probs) -> (weights per
    distinct child, pi_reject, residual)``; nodes with one candidate run the standard rule here.
    The plan is made level by level for the nodes the walk reaches (:class:`ReachedPlan`).
    """

    hot_path: ClassVar[tuple[str, ...]] = ("walk", "step", "node_step")
    trims_slots: ClassVar[bool] = False  # the plans' rows are laid out by the batch's slots

    def __init__(self, scheme: Any) -> None:
        self.scheme = scheme
        self.name = scheme.name

    @property
    def reference_scheme(self) -> TreeScheme:
        scheme: TreeScheme = self.scheme
        return scheme

    def node_extras(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
    ) -> ReachedPlan:
        """A :class:`ReachedPlan` of rows ``[C + 1 + V]``: slot weights, ``pi_reject``, residual
        (float64; zeros at nodes not planned, a zero-stride view when a level plans none).

        Each planned row's tables are copied to the host once, as float64, when the walk first
        reaches one of its multi-candidate nodes; the reference trees are rebuilt only then."""
        batch_size, _, vocab_size = target_probs.shape
        slots = batch.candidates.shape[-1]
        width = slots + 1 + vocab_size
        zeros = target_probs.new_zeros((1, 1), dtype=torch.float64)
        tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row -> its [N, V] tables
        trees: list[Any] = []

        def default(node: torch.Tensor) -> torch.Tensor:
            return zeros.expand(batch_size, width)  # [B, C + 1 + V]

        def row_tables(row: int) -> tuple[np.ndarray, np.ndarray]:
            if row not in tables:
                target, draft = (
                    t[row].detach().to("cpu", torch.float64).numpy()  # [N, V]
                    for t in (target_probs, draft_probs)
                )
                tables[row] = (target, draft)
            return tables[row]

        def plan(pairs: list[tuple[int, int]]) -> torch.Tensor:
            if not trees:
                trees.extend(batch.to_trees())
            extras = np.zeros((len(pairs), width))  # [M, C + 1 + V]
            for index, (row, node) in enumerate(pairs):
                tree = trees[row]
                weights, rejected, residual = self.scheme.decision(tree, node, *row_tables(row))
                first_slot: dict[int, int] = {}
                for slot, child in enumerate(tree.candidates[node]):
                    first_slot.setdefault(child, slot)
                for child, weight in zip(tree.children(node), weights, strict=True):
                    extras[index, first_slot[child]] = weight
                extras[index, slots] = rejected
                extras[index, slots + 1 :] = residual
            return torch.from_numpy(extras)

        return ReachedPlan(batch, default, plan)

    def level_extras(
        self, extras: Any, depth: int, node: torch.Tensor, done: torch.Tensor
    ) -> torch.Tensor:
        """The reached nodes' plans (:meth:`ReachedPlan.at`: host reads, outside the hot path)."""
        plan: ReachedPlan = extras
        return plan.at(depth, node, done)

    def step(
        self,
        extras: torch.Tensor,  # [B, C + 1 + V]: slot weights, pi_reject, residual
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C] bool
        accept_uniforms: torch.Tensor,  # [B, C] float64
        owned: bool = False,
    ) -> NodeStep:
        single = self.node_step(target, draft, candidate_tokens, candidate_valid, accept_uniforms)
        slots = candidate_tokens.shape[-1]
        planned = candidate_valid.sum(-1) >= 2  # [B]
        weights = extras[:, : slots + 1]  # [B, C + 1]: slots, then reject
        reject_only = torch.zeros_like(weights)  # [B, C + 1]
        reject_only[:, slots] = 1.0
        weights = torch.where(planned[:, None], weights, reject_only)  # [B, C + 1]
        pick = ops.categorical(weights, accept_uniforms[:, 0])  # [B]
        accepted = torch.where(pick < slots, pick, PAD)  # [B]
        residual = extras[:, slots + 1 :].to(target.dtype)  # [B, V]
        return NodeStep(
            torch.where(planned, accepted, single.accepted),
            torch.where(planned[:, None], residual, single.stop_probs),
        )

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C] bool
        accept_uniforms: torch.Tensor,  # [B, C] float64
    ) -> NodeStep:
        """A node with one candidate: standard speculative sampling on slot 0."""
        return standard_step(
            self.accepts, target, draft, candidate_tokens, candidate_valid, accept_uniforms
        )
