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
``Y = argmin_z min_{k in R} log E[t, k, z] - log p(z)`` over a set of rows ``R``; the shared
:meth:`KeyedLowering.walk` keeps the descent's bookkeeping and the subclasses say, per node, how
``R`` and the descent are chosen (:meth:`KeyedLowering.follow`). With nothing drafted, the
target's selection over all ``K`` rows is keyed target-only decoding
(:func:`keyed_select_root`).

Ties go to the lowest index (``argmin``); ``p = 0`` or ``pi = 0`` scores ``+inf`` and is never
chosen. The logs are the portable :func:`specsampling.gpu.keyed.log`, the reference race's own,
so the winners are the reference's bit for bit on the same proposals: the draft as the pair gives
it (validated, not renormalised, as the reference races it), and for a ``without`` step the
remaining mass divided by its sum in numpy's order (for an exact, ``Fraction`` pair the reference
divides exactly, so there a winner can differ where two scores lie within float64 rounding of
each other; see :mod:`specsampling.gpu.keyed`).
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
from .. import ops
from ..tree import PAD, TreeBatch
from .base import Descent, Lowering, Verified


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


class Selection(NamedTuple):
    """The target's decision at every row's node (:meth:`KeyedLowering.follow`): its token,
    whether the row descends into the child holding it, that child, and the rows of keyed
    exponentials still in play for the next position."""

    token: torch.Tensor  # [B]
    descend: torch.Tensor  # [B] bool
    child: torch.Tensor  # [B]
    active: torch.Tensor  # [B, K] bool


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
    mass = ops.numpy_sum(remaining)  # [B], numpy's order in float64
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

    Subclasses give :meth:`follow`, the per-node rule of the walk (and :meth:`step_row` when
    rows differ per step).
    """

    hot_path: ClassVar[tuple[str, ...]] = (
        "draft_step",
        "node_exponentials",
        "select",
        "child_with_token",
        "walk",
        "follow",
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

    def walk(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        keys: torch.Tensor,  # [B]
        target_probs: torch.Tensor,  # [B, M, V] float64, the target after every node
    ) -> Verified:
        """The target's walk down every row's tree: the reference verdict per row.

        One position per iteration (``depth + 1``, a static bound): :meth:`follow` selects the
        target's token at each row's node from the node's ``K`` rows of exponentials and says
        whether the row descends; the last position is the bonus, where every row still walking
        stops with its token.
        """
        batch_size, _, vocab_size = target_probs.shape
        device = target_probs.device
        rows = torch.arange(batch_size, device=device)  # [B]
        walk = Descent.start(batch_size, plan.depth, device)
        active = torch.ones((batch_size, plan.num_rows), dtype=torch.bool, device=device)  # [B, K]
        for position in range(plan.depth + 1):
            node = walk.node  # [B]
            contexts = drafted.contexts[rows, node]  # [B]
            exps = self.node_exponentials(keys, contexts, plan.num_rows, vocab_size)  # [B, K, V]
            chosen = self.follow(
                drafted, plan, position, node, target_probs[rows, node], exps, active
            )
            descend = chosen.descend & (position < plan.depth)  # [B]: the bonus ends every row
            walk = walk.advance(position, chosen.token, chosen.token, descend, chosen.child)
            active = chosen.active
        return walk.verified(drafted.depth)

    @abstractmethod
    def follow(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        position: int,
        node: torch.Tensor,  # [B]
        target: torch.Tensor,  # [B, V] float64, the target after each row's node
        exps: torch.Tensor,  # [B, K, V] float64, the node's keyed exponentials
        active: torch.Tensor,  # [B, K] bool, rows in play (all at the root)
    ) -> Selection:
        """The per-node rule of :meth:`walk` at ``position`` (``plan.depth``: the bonus, whose
        ``descend`` the walk ignores)."""


def keyed_select_root(
    lowering: KeyedLowering,
    plan: DraftPlan,
    keys: torch.Tensor,  # [B] int64-held words
    contexts: torch.Tensor,  # [B] int64-held words
    target_probs: torch.Tensor,  # [B, V]
) -> Verified:
    """Keyed target-only decoding, one position: the target's keyed selection over all ``K``
    rows of ``plan`` (:func:`specsampling.keyed.laws.keyed_select`, one step of
    :func:`specsampling.keyed.laws.decode`), for row ``b``'s key and context word.

    The round with nothing drafted, stateless: every row stops at the root (``node`` 0) with
    the selected ``token``; ``tokens [B, 1]`` is that token and ``num_emitted`` is 1.

    Parameters
    ----------
    lowering : KeyedLowering
        The keyed coupling (its exponentials and selection).
    plan : DraftPlan
        ``lowering.plan(shape)``: ``plan.num_rows`` is ``K`` (GLS: the shape's paths; else 1).
    keys, contexts : Tensor of int64, shape (B,)
        64-bit words (two's-complement form, :func:`specsampling.gpu.keyed.as_words`): each
        row's key and the context word of the position it decodes
        (:meth:`specsampling.keyed.KeyedNoise.context`).
    target_probs : Tensor, shape (B, V)
        The target's distribution at that position.

    Examples
    --------
    >>> import numpy as np, torch, specsampling as ss
    >>> from specsampling.gpu import keyed as gk
    >>> from specsampling.gpu.schemes.coupled import keyed_select_root
    >>> from specsampling.gpu.schemes.gls import GLS_STRONG
    >>> from specsampling.keyed import KeyedNoise
    >>> from specsampling.keyed.laws import keyed_select
    >>> plan = GLS_STRONG.plan(ss.Shape.paths(2, 2))
    >>> probs = np.array([0.1, 0.2, 0.3, 0.4])
    >>> noise = KeyedNoise(7)
    >>> out = keyed_select_root(GLS_STRONG, plan, gk.as_words([7]),
    ...                         gk.as_words([noise.context(())]), torch.from_numpy(probs[None]))
    >>> int(out.token[0]) == keyed_select(probs, noise.exponentials((), 2, 4))
    True
    """
    if not isinstance(lowering, KeyedLowering):
        raise TypeError(
            f"lowering: expected a keyed coupling's lowering, got {type(lowering).__name__}"
        )
    if target_probs.ndim != 2:
        raise ValueError(f"target_probs: expected shape (B, V), got {tuple(target_probs.shape)}")
    batch_size, vocab_size = target_probs.shape
    for name, words in (("keys", keys), ("contexts", contexts)):
        if tuple(words.shape) != (batch_size,):
            raise ValueError(
                f"{name}: expected shape ({batch_size},) (one word per row of target_probs), "
                f"got {tuple(words.shape)}"
            )
    exps = lowering.node_exponentials(keys, contexts, plan.num_rows, vocab_size)  # [B, K, V]
    raced = torch.ones(exps.shape[:2], dtype=torch.bool, device=exps.device)  # [B, K]
    token = lowering.select(target_probs, exps, raced)  # [B]
    return Verified(torch.zeros_like(token), token, token[:, None], torch.ones_like(token))


__all__ = [
    "ContextsOf",
    "DraftPlan",
    "DraftProbsOf",
    "Drafted",
    "KeyedLowering",
    "Selection",
    "keyed_select_root",
]
