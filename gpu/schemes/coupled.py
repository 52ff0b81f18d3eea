r"""The base of the lowered keyed couplings (``gumbel``, ``poisson``, ``gls``, ``gls_strong``).

Lowers :mod:`specsampling.schemes.coupled`. A keyed coupling reads no per-node uniforms: drafter
and verifier read the *same* keyed exponentials ``E[t, k, z]`` (:mod:`specsampling.gpu.keyed`,
bit for bit with the reference field), indexed by the context word ``t`` of a position (its
absolute position, or the watermark's context hash), a row ``k`` and a token ``z``.

Drafting. The shape's draw steps run in order, batched over rows. Step ``s`` expands the node
its parent step produced (the root for ``-1``) and takes the race winner

.. math:: x_s = \arg\min_{z:\ \pi_s(z) > 0} \; \log E[t, k_s, z] - \log \pi_s(z)

with ``t`` the context of that node, ``k_s`` the step's row (:meth:`KeyedLowering.step_row`)
and ``pi_s`` its proposal: the draft ``q`` for an ``iid`` step, ``q`` without the node's
earlier children, renormalised, for a ``without`` step (skipped with its descendants when that
mass is zero). A draw of a token the node already has adds that child again (the reference
trie, multiplicity kept).

Walk. From the root, the target's token at a node is its keyed selection
``Y = argmin_z min_{k in R} log E[t, k, z] - log p(z)`` over a set of rows ``R``; the
subclasses say how ``R`` and the descent are chosen (:meth:`KeyedLowering.walk`).

Ties go to the lowest index (``argmin``); ``p = 0`` or ``pi = 0`` scores ``+inf`` and is never
chosen. The logs are the portable :func:`specsampling.gpu.keyed.log`; the reference's race calls
``np.log``, within one ulp of it, so the winners are the reference's except where two scores lie
within that rounding of each other (never met in the tests; see :mod:`specsampling.gpu.keyed`).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import torch

import specsampling as ss
from specsampling.schemes.coupled import KeyedScheme
from specsampling.shapes import Shape, check_shape

from .. import keyed as gk
from ..tree import PAD, TreeBatch
from .base import Lowering, Verified


class DraftPlan(NamedTuple):
    """A shape's draw steps, resolved on the host once per :func:`~specsampling.gpu.generate`.

    ``parents[s]`` is the parent step of step ``s`` (``-1``: the root), ``without[s]`` whether
    it draws without replacement, ``rows[s]`` the exponential row it races, ``paths[s]`` and
    ``positions[s]`` the draft path (GLS row) and position it fills (step ``s`` is position
    ``s mod depth`` of path ``s // depth``). ``num_rows`` is ``K``, ``num_paths`` the paths,
    ``depth`` the deepest draft, ``num_nodes = 1 + len(steps)``, ``slots`` the candidate slots.
    """

    shape: Shape
    parents: tuple[int, ...]
    without: tuple[bool, ...]
    rows: tuple[int, ...]
    paths: tuple[int, ...]
    positions: tuple[int, ...]
    num_rows: int
    num_paths: int
    depth: int
    num_nodes: int
    slots: int


class Drafted(NamedTuple):
    """The trees drafted for a batch, in the :class:`~specsampling.gpu.TreeBatch` layout plus
    the keyed bookkeeping. Node ``0`` is the root; unused nodes are ``PAD``."""

    parents: torch.Tensor  # [B, M]
    tokens: torch.Tensor  # [B, M]
    depth: torch.Tensor  # [B, M]
    num_nodes: torch.Tensor  # [B]
    candidates: torch.Tensor  # [B, M, C]
    paths: torch.Tensor  # [B, M, D] tokens from the root, PAD after the node's depth
    contexts: torch.Tensor  # [B, M] int64-held context word of the position after each node
    step_nodes: torch.Tensor  # [B, S] node each step produced, PAD when skipped
    draft_tokens: torch.Tensor  # [B, P, D] token of draft path k at position j, PAD if none

    def tree_batch(self, shape: Shape) -> TreeBatch:
        """The drafted trees as a :class:`~specsampling.gpu.TreeBatch` with the shape's law."""
        return TreeBatch(
            self.parents,
            self.tokens,
            self.num_nodes,
            self.candidates,
            self.depth,
            (shape.law,) * int(self.parents.shape[0]),
        )


def iid_proposal(
    draft: torch.Tensor,  # [B, V]
    taken: torch.Tensor,  # [B, V] bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """An ``iid`` step races the draft itself; it can always draw: ``(draft, all True)``."""
    return draft, torch.ones(draft.shape[0], dtype=torch.bool, device=draft.device)


def without_proposal(
    draft: torch.Tensor,  # [B, V]
    taken: torch.Tensor,  # [B, V] bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``without`` step races ``q`` without the node's children, renormalised (the reference
    ``remaining / remaining.sum()``); it is skipped where that mass is zero."""
    remaining = torch.where(taken, torch.zeros_like(draft), draft)  # [B, V]
    mass = remaining.sum(-1)  # [B]
    drawable = mass > 0  # [B]
    return remaining / torch.where(drawable, mass, 1.0)[:, None], drawable


#: The proposal of a draw step, by its ``without`` flag (host metadata of the plan).
_PROPOSALS = {False: iid_proposal, True: without_proposal}


#: ``draft_probs_of(paths [B, D], depth [B], alive [B]) -> [B, V]``: the draft distribution
#: after each row's node (any values where ``alive`` is false).
DraftProbsOf = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``contexts_of(paths [B, D], depth [B]) -> [B]``: the context word after each row's node.
ContextsOf = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class KeyedLowering(Lowering):
    """Base of the lowered keyed couplings: batched keyed drafting and the target's walk.

    Subclasses give :meth:`walk` (and :meth:`step_row` when rows differ per step).
    """

    hot_path: ClassVar[tuple[str, ...]] = (
        "draft_step",
        "node_exponentials",
        "select",
        "child_with_token",
        "walk",
    )

    @property
    def reference_scheme(self) -> KeyedScheme:
        """The numpy reference this object lowers."""
        scheme = ss.SCHEMES[self.name]
        assert isinstance(scheme, KeyedScheme)
        return scheme

    # ------------------------------------------------------------------ host metadata
    def step_row(self, step: int, depth: int) -> int:
        """The exponential row draw step ``step`` races (the reference ``race_pick`` rows)."""
        return 0

    def plan(self, shape: Shape) -> DraftPlan:
        """Resolve ``shape`` (refusing it as the reference does: ``UnsupportedShape``)."""
        check_shape(shape)
        reference = self.reference_scheme
        reference.check(shape)
        depth = shape.depth
        steps = shape.steps
        for _parent, mode in steps:
            if mode not in ("iid", "without"):  # pragma: no cover - refused by the reference
                raise ss.UnsupportedShape(f"shape: draw mode {mode!r} is not keyed-drafted")
        rows = tuple(self.step_row(step, depth) for step in range(len(steps)))
        return DraftPlan(
            shape=shape,
            parents=tuple(parent for parent, _ in steps),
            without=tuple(mode == "without" for _, mode in steps),
            rows=rows,
            paths=tuple(step // depth for step in range(len(steps))),
            positions=tuple(step % depth for step in range(len(steps))),
            num_rows=reference.rows(shape),
            num_paths=-(-len(steps) // depth),
            depth=depth,
            num_nodes=1 + len(steps),
            slots=max(1, len(steps)),
        )

    # ------------------------------------------------------------------ drafting
    def start(self, plan: DraftPlan, root_contexts: torch.Tensor) -> Drafted:
        """An empty trie per row: the root only, with its context word ``root_contexts [B]``."""
        batch_size = int(root_contexts.shape[0])
        device = root_contexts.device
        size = plan.num_nodes

        def pads(*shape: int) -> torch.Tensor:
            return torch.full(shape, PAD, dtype=torch.long, device=device)

        depth = pads(batch_size, size)  # [B, M]
        depth[:, 0] = 0
        contexts = torch.zeros((batch_size, size), dtype=torch.long, device=device)  # [B, M]
        contexts[:, 0] = root_contexts
        return Drafted(
            parents=pads(batch_size, size),
            tokens=pads(batch_size, size),
            depth=depth,
            num_nodes=torch.ones(batch_size, dtype=torch.long, device=device),
            candidates=pads(batch_size, size, plan.slots),
            paths=pads(batch_size, size, plan.depth),
            contexts=contexts,
            step_nodes=pads(batch_size, len(plan.parents)),
            draft_tokens=pads(batch_size, plan.num_paths, plan.depth),
        )

    def parent_nodes(self, drafted: Drafted, plan: DraftPlan, step: int) -> torch.Tensor:
        """The node step ``step`` expands in every row (``PAD`` where it is skipped), ``[B]``."""
        parent_step = plan.parents[step]
        if parent_step < 0:
            return torch.zeros_like(drafted.num_nodes)
        return drafted.step_nodes[:, parent_step]

    def node_exponentials(
        self, keys: torch.Tensor, contexts: torch.Tensor, num_rows: int, vocab_size: int
    ) -> torch.Tensor:
        """``E[b, k, z]`` for each row's key ``keys [B]`` and context ``contexts [B]``,
        rows ``k < num_rows``: ``[B, K, V]`` float64."""
        device = contexts.device
        rows = torch.arange(num_rows, device=device)[None, :, None]  # [1, K, 1]
        tokens = torch.arange(vocab_size, device=device)[None, None, :]  # [1, 1, V]
        return gk.exponentials(keys[:, None, None], contexts[:, None, None], rows, tokens)

    def draft_step(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        step: int,
        keys: torch.Tensor,  # [B] int64-held words
        draft_probs: torch.Tensor,  # [B, V] float64, the draft after each row's parent node
    ) -> tuple[Drafted, torch.Tensor, torch.Tensor]:
        """Draw step ``step`` in every row: ``(drafted, node [B], created [B])``, where ``node``
        is the child drawn (``PAD`` if skipped) and ``created`` marks new nodes, whose
        ``contexts`` entry the caller fills (:meth:`with_contexts`)."""
        batch_size, vocab_size = draft_probs.shape
        device = draft_probs.device
        rows = torch.arange(batch_size, device=device)  # [B]
        parent = self.parent_nodes(drafted, plan, step)  # [B]
        alive = parent != PAD  # [B]
        safe_parent = parent.clamp_min(0)  # [B]
        context = drafted.contexts[rows, safe_parent]  # [B]
        exps = self.node_exponentials(keys, context, plan.rows[step] + 1, vocab_size)
        exps = exps[:, plan.rows[step]]  # [B, V]
        cands = drafted.candidates[rows, safe_parent]  # [B, C]
        cand_valid = cands != PAD  # [B, C]
        cand_tokens = drafted.tokens.gather(1, cands.clamp_min(0))  # [B, C]
        draft = draft_probs.to(torch.float64)  # [B, V]
        lanes = torch.where(cand_valid, cand_tokens, vocab_size)  # [B, C]
        taken = torch.zeros((batch_size, vocab_size + 1), dtype=torch.bool, device=device)
        taken = taken.scatter(1, lanes, True)[:, :vocab_size]  # [B, V]: the node's children
        proposal, drawable = _PROPOSALS[plan.without[step]](draft, taken)  # [B, V], [B]
        alive = alive & drawable
        token = gk.race_winner(proposal, exps)  # [B]

        same = cand_valid & (cand_tokens == token[:, None])  # [B, C]
        existing = same.any(-1)  # [B]
        found = cands.gather(1, same.to(torch.int8).argmax(-1, keepdim=True))[:, 0]  # [B]
        created = alive & ~existing  # [B]
        node = torch.where(existing, found, drafted.num_nodes)  # [B]
        node = torch.where(alive, node, PAD)  # [B]
        slot_node = torch.where(created, node, 0)  # [B]; row 0 rewritten with itself otherwise

        def put(table: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            out = table.clone()
            mask = created.view(-1, *([1] * (value.ndim - 1)))
            out[rows, slot_node] = torch.where(mask, value, table[rows, slot_node])
            return out

        parent_depth = drafted.depth[rows, safe_parent]  # [B]
        path = drafted.paths[rows, safe_parent].clone()  # [B, D]
        path[rows, parent_depth.clamp(0, plan.depth - 1)] = token
        parents = put(drafted.parents, safe_parent)
        tokens = put(drafted.tokens, token)
        depth = put(drafted.depth, parent_depth + 1)
        paths = put(drafted.paths, path)

        candidates = drafted.candidates.clone()  # [B, M, C]
        slot = cand_valid.sum(-1).clamp_max(plan.slots - 1)  # [B]
        current = candidates[rows, safe_parent, slot]  # [B]
        candidates[rows, safe_parent, slot] = torch.where(alive, node, current)
        step_nodes = drafted.step_nodes.clone()  # [B, S]
        step_nodes[:, step] = node
        draft_tokens = drafted.draft_tokens.clone()  # [B, P, D]
        column = (plan.paths[step], plan.positions[step])
        draft_tokens[:, column[0], column[1]] = torch.where(alive, token, PAD)
        drafted = drafted._replace(
            parents=parents,
            tokens=tokens,
            depth=depth,
            num_nodes=drafted.num_nodes + created.to(torch.long),
            candidates=candidates,
            paths=paths,
            step_nodes=step_nodes,
            draft_tokens=draft_tokens,
        )
        return drafted, node, created

    @staticmethod
    def with_contexts(
        drafted: Drafted, node: torch.Tensor, created: torch.Tensor, contexts: torch.Tensor
    ) -> Drafted:
        """Set the context word ``contexts [B]`` of the nodes ``node [B]`` where ``created``."""
        rows = torch.arange(node.shape[0], device=node.device)  # [B]
        slot_node = torch.where(created, node, 0)  # [B]
        out = drafted.contexts.clone()  # [B, M]
        out[rows, slot_node] = torch.where(created, contexts, out[rows, slot_node])
        return drafted._replace(contexts=out)

    def draft(
        self,
        plan: DraftPlan,
        keys: torch.Tensor,  # [B]
        root_contexts: torch.Tensor,  # [B]
        draft_probs_of: DraftProbsOf,
        contexts_of: ContextsOf,
    ) -> Drafted:
        """Draft every row's tree: one :meth:`draft_step` per draw step, reading each parent's
        draft distribution from ``draft_probs_of`` and each new node's context word from
        ``contexts_of`` (the model and the watermark window live with the caller)."""
        drafted = self.start(plan, root_contexts)
        rows = torch.arange(keys.shape[0], device=keys.device)  # [B]
        for step in range(len(plan.parents)):
            parent = self.parent_nodes(drafted, plan, step)  # [B]
            safe = parent.clamp_min(0)  # [B]
            probs = draft_probs_of(
                drafted.paths[rows, safe], drafted.depth[rows, safe], parent >= 0
            )
            drafted, node, created = self.draft_step(drafted, plan, step, keys, probs)
            safe = node.clamp_min(0)  # [B]
            contexts = contexts_of(drafted.paths[rows, safe], drafted.depth[rows, safe])
            drafted = self.with_contexts(drafted, node, created, contexts)
        return drafted

    # ------------------------------------------------------------------ the target
    def select(
        self,
        target_probs: torch.Tensor,  # [B, V]
        exps: torch.Tensor,  # [B, K, V]
        raced: torch.Tensor,  # [B, K] bool: the rows the target races
    ) -> torch.Tensor:
        """The target's keyed selection ``argmin_z min_{k raced} log E[k, z] - log p(z)``
        (:func:`specsampling.keyed.laws.keyed_select`), ``[B]``."""
        scores = gk.log(exps) - gk.log(target_probs.to(torch.float64))[:, None, :]  # [B, K, V]
        inf = torch.full_like(scores, math.inf)
        scores = torch.where(target_probs[:, None, :] == 0, inf, scores)
        scores = torch.where(raced[:, :, None], scores, inf)
        return scores.amin(dim=1).argmin(dim=-1)

    def child_with_token(
        self, drafted: Drafted, node: torch.Tensor, token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(found [B], child [B])``: whether ``node`` has a child holding ``token``, and it."""
        rows = torch.arange(node.shape[0], device=node.device)  # [B]
        cands = drafted.candidates[rows, node]  # [B, C]
        cand_tokens = drafted.tokens.gather(1, cands.clamp_min(0))  # [B, C]
        hit = (cands != PAD) & (cand_tokens == token[:, None])  # [B, C]
        child = cands.gather(1, hit.to(torch.int8).argmax(-1, keepdim=True))[:, 0]  # [B]
        return hit.any(-1), child

    @abstractmethod
    def walk(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        keys: torch.Tensor,  # [B]
        target_probs: torch.Tensor,  # [B, M, V] float64, the target after every node
    ) -> Verified:
        """The target's walk down every row's tree: the reference verdict per row."""


__all__ = ["ContextsOf", "DraftPlan", "DraftProbsOf", "Drafted", "KeyedLowering"]
