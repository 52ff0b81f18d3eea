"""Padded batches of draft trees: the tensor layout of :class:`specsampling.DraftTree`.

A :class:`TreeBatch` holds ``B`` trees padded to ``N`` nodes and ``C`` candidate slots per node.
Node ``0`` of every row is the root (parent and token ``PAD``); a row's nodes ``n >=
num_nodes[b]`` are padding (parent, token, depth and candidates all ``PAD``). ``candidates[b,
n]`` lists the child nodes of ``n`` in drafting order **with multiplicity**, then ``PAD``: the
same multiset the reference ratio schemes test in order. Each row keeps its tree's
:class:`~specsampling.DrawLaw` (host metadata, checked once per verify call), so
:meth:`TreeBatch.to_trees` gives back the reference trees exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from specsampling.tree import DraftTree, DrawLaw

#: The one placeholder of every padded id tensor (nodes, tokens, candidates, depths).
PAD = -1


@dataclass(frozen=True, eq=False)
class TreeBatch:
    """A padded batch of ``B`` draft trees on one device.

    Attributes
    ----------
    parents : LongTensor [B, N]
        Parent node of every node; ``PAD`` for the root and for padding.
    tokens : LongTensor [B, N]
        Drafted token of every node; ``PAD`` for the root and for padding.
    num_nodes : LongTensor [B]
        Real nodes per row, the root included.
    candidates : LongTensor [B, N, C]
        Child nodes in drafting order with multiplicity, ``PAD`` padded (``C >= 1``).
    depth : LongTensor [B, N]
        Drafted tokens from the root to the node; ``PAD`` for padding.
    laws : tuple of DrawLaw, length B
        Each tree's draw law.
    chains : tuple of bool, length B
        Whether each tree is a chain (every node at most one candidate). Host metadata, computed
        from ``candidates`` when not given.
    max_depth : int
        Depth of the deepest node in the batch (a Python int: the walk's static loop bound).
    level_slots : tuple of int, length max_depth + 1
        At each depth, a bound on the candidates of any node there (host metadata: the walk
        reads only that many slots at that depth). Computed from ``candidates`` when not given,
        in the same host read as ``chains`` and ``max_depth``.
    guesses : LongTensor [B, N], optional
        The child of each node guessed from the context alone (its last candidate; rows of
        law ``grafted``, :meth:`specsampling.DraftTree.graft`), ``PAD`` where none and in rows
        of other laws; ``None`` when no row is grafted. Their values are checked by
        ``verify(..., validate=True)`` (:func:`guesses_valid`), not at construction: building a
        batch or moving it with :meth:`to` never synchronises.

    Examples
    --------
    >>> import specsampling as ss
    >>> trees = [ss.DraftTree.from_draws([(0, 2), (0, 1), (0, 2)], law="iid"),
    ...          ss.DraftTree.chain([3], law="iid")]
    >>> batch = TreeBatch.from_trees(trees)
    >>> batch.candidates[0, 0].tolist(), batch.tokens[1].tolist(), batch.max_depth
    ([1, 2, 1], [-1, 3, -1], 1)
    >>> batch.to_trees() == trees
    True
    """

    parents: torch.Tensor  # [B, N]
    tokens: torch.Tensor  # [B, N]
    num_nodes: torch.Tensor  # [B]
    candidates: torch.Tensor  # [B, N, C]
    depth: torch.Tensor  # [B, N]
    laws: tuple[DrawLaw, ...]
    chains: tuple[bool, ...] = field(default=())
    max_depth: int = -1
    level_slots: tuple[int, ...] = field(default=())
    guesses: torch.Tensor | None = None  # [B, N]

    def __post_init__(self) -> None:
        batch_size, num_nodes = self.parents.shape
        if self.tokens.shape != (batch_size, num_nodes) or self.depth.shape != (
            batch_size,
            num_nodes,
        ):
            raise ValueError("TreeBatch: parents, tokens and depth must all be [B, N]")
        if self.candidates.ndim != 3 or self.candidates.shape[:2] != (batch_size, num_nodes):
            raise ValueError("TreeBatch: candidates must be [B, N, C]")
        if self.num_nodes.shape != (batch_size,):
            raise ValueError("TreeBatch: num_nodes must be [B]")
        if self.guesses is not None and self.guesses.shape != (batch_size, num_nodes):
            raise ValueError("TreeBatch: guesses must be [B, N]")
        if num_nodes < 1:
            raise ValueError("TreeBatch: every row needs its root (N >= 1 nodes)")
        for name in ("parents", "tokens", "num_nodes", "candidates", "depth", "guesses"):
            value = getattr(self, name)
            if value is None or value.dtype == torch.long:
                continue
            if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
                raise ValueError(f"TreeBatch: {name} must be an integer tensor, got {value.dtype}")
            object.__setattr__(self, name, value.long())  # int32 ids and the like: as int64
        laws = tuple(DrawLaw.of(law) for law in self.laws)
        if len(laws) != batch_size:
            raise ValueError(f"TreeBatch: laws needs one law per row ({batch_size})")
        object.__setattr__(self, "laws", laws)
        if self.guesses is None and DrawLaw.GRAFTED in laws:
            raise ValueError("TreeBatch: rows of law 'grafted' need their guesses ([B, N])")
        # (the guesses' values: verify(..., validate=True), guesses_valid, in its one host read)
        # Host metadata, computed once here (never inside a verify call), in one host read.
        if not self.chains or self.max_depth < 0 or not self.level_slots:
            counts = (self.candidates != PAD).sum(-1)  # [B, N]
            at = self.depth.clamp(0, num_nodes - 1).reshape(-1)  # [B N] (padding: 0 candidates)
            widest = counts.new_zeros(num_nodes).scatter_reduce(0, at, counts.reshape(-1), "amax")
            deepest = (
                self.depth.amax().clamp_min(0)[None] if self.depth.numel() else counts.new_zeros(1)
            )
            read = torch.cat([(counts <= 1).all(-1).long(), deepest, widest]).tolist()
            if not self.chains:
                object.__setattr__(self, "chains", tuple(bool(c) for c in read[:batch_size]))
            if self.max_depth < 0:
                object.__setattr__(self, "max_depth", int(read[batch_size]))
            if not self.level_slots:
                widths = read[batch_size + 1 : batch_size + 2 + self.max_depth]
                object.__setattr__(self, "level_slots", tuple(int(w) for w in widths))
        slots = tuple(self.level_slots)
        if len(slots) != self.max_depth + 1 or not all(
            isinstance(w, int) and w >= 0 for w in slots
        ):
            raise ValueError(
                f"TreeBatch: level_slots needs a non-negative int per depth 0..{self.max_depth}, "
                f"got {slots!r}"
            )
        object.__setattr__(self, "level_slots", slots)

    @property
    def batch_size(self) -> int:
        return int(self.parents.shape[0])

    @property
    def device(self) -> torch.device:
        return self.parents.device

    @classmethod
    def from_trees(
        cls, trees: Sequence[DraftTree], device: torch.device | str | None = None
    ) -> TreeBatch:
        """Pad reference trees into one batch (``N``: the largest tree, ``C``: the longest
        candidate list, at least 1)."""
        if isinstance(trees, DraftTree):
            raise TypeError("trees: expected a sequence of DraftTrees, got one DraftTree ([tree])")
        if not isinstance(trees, Iterable) or isinstance(trees, (str, bytes)):
            raise TypeError(f"trees: expected a sequence of DraftTrees, got {trees!r}")
        trees = list(trees)
        if not trees:
            raise ValueError("trees: expected at least one DraftTree")
        for index, tree in enumerate(trees):
            if not isinstance(tree, DraftTree):
                raise TypeError(f"trees[{index}]: expected a DraftTree, got {tree!r}")
        num_nodes = max(tree.num_nodes for tree in trees)
        slots = max(1, max(len(c) for tree in trees for c in tree.candidates))
        parents = torch.full((len(trees), num_nodes), PAD, dtype=torch.long)  # [B, N]
        tokens = torch.full((len(trees), num_nodes), PAD, dtype=torch.long)  # [B, N]
        depth = torch.full((len(trees), num_nodes), PAD, dtype=torch.long)  # [B, N]
        candidates = torch.full((len(trees), num_nodes, slots), PAD, dtype=torch.long)
        max_depth = max(tree.max_depth for tree in trees)
        level_slots = [0] * (max_depth + 1)  # the most candidates of a node at each depth
        guesses = None
        if any(tree.guesses for tree in trees):
            guesses = torch.full((len(trees), num_nodes), PAD, dtype=torch.long)  # [B, N]
        for row, tree in enumerate(trees):
            size = tree.num_nodes
            if guesses is not None and tree.guesses:
                guesses[row, :size] = torch.tensor(tree.guesses)
            parents[row, :size] = torch.tensor(tree.parents)
            tokens[row, :size] = torch.tensor(tree.tokens)
            depth[row, :size] = torch.tensor([tree.depth(n) for n in range(size)])
            for node, cands in enumerate(tree.candidates):
                if cands:
                    candidates[row, node, : len(cands)] = torch.tensor(cands)
                    at = tree.depth(node)
                    level_slots[at] = max(level_slots[at], len(cands))
        return cls(
            parents=parents.to(device),
            tokens=tokens.to(device),
            num_nodes=torch.tensor([tree.num_nodes for tree in trees], device=device),
            candidates=candidates.to(device),
            depth=depth.to(device),
            laws=tuple(tree.law for tree in trees),
            chains=tuple(tree.is_chain for tree in trees),
            max_depth=max_depth,
            level_slots=tuple(level_slots),
            guesses=None if guesses is None else guesses.to(device),
        )

    def to_trees(self) -> list[DraftTree]:
        """The reference trees, laws included (copies to the host)."""
        parents = self.parents.tolist()
        tokens = self.tokens.tolist()
        candidates = self.candidates.tolist()
        guesses = None if self.guesses is None else self.guesses.tolist()
        trees = []
        for row, size in enumerate(self.num_nodes.tolist()):
            cands = tuple(tuple(c for c in candidates[row][n] if c != PAD) for n in range(size))
            guessed = ()
            if guesses is not None and self.laws[row] is DrawLaw.GRAFTED:
                guessed = tuple(guesses[row][:size])
            trees.append(
                DraftTree(
                    tuple(parents[row][:size]),
                    tuple(tokens[row][:size]),
                    cands,
                    self.laws[row],
                    guessed,
                )
            )
        return trees

    def to(self, device: torch.device | str) -> TreeBatch:
        """The same batch on ``device``."""
        return TreeBatch(
            self.parents.to(device),
            self.tokens.to(device),
            self.num_nodes.to(device),
            self.candidates.to(device),
            self.depth.to(device),
            self.laws,
            self.chains,
            self.max_depth,
            self.level_slots,
            None if self.guesses is None else self.guesses.to(device),
        )

    def real_nodes(self) -> torch.Tensor:
        """Mask of real (non-padding) nodes, ``[B, N]`` bool."""
        nodes = torch.arange(self.parents.shape[1], device=self.device)  # [N]
        return nodes[None, :] < self.num_nodes[:, None]  # [B, N]

    @classmethod
    def roots(cls, batch_size: int, device: torch.device | str | None = None) -> TreeBatch:
        """``batch_size`` trees of the root alone (nothing drafted: plain decoding).

        >>> TreeBatch.roots(2).num_nodes.tolist()
        [1, 1]
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size: expected an integer >= 0, got {batch_size!r}")
        pad = torch.full((batch_size, 1), PAD, dtype=torch.long, device=device)  # [B, 1]
        return cls(
            parents=pad,
            tokens=pad,
            num_nodes=torch.ones(batch_size, dtype=torch.long, device=device),
            candidates=pad[..., None],
            depth=torch.zeros_like(pad),
            laws=(DrawLaw.IID,) * batch_size,
            chains=(True,) * batch_size,
            max_depth=0,
            level_slots=(0,),
        )


#: What :func:`guesses_valid` checks, for the error of ``verify(..., validate=True)``.
GUESSES_RULE = (
    "batch.guesses: each entry must be -1, or in rows of law 'grafted' the node's last "
    "candidate, listed once (TreeBatch.from_trees of DraftTree.graft trees)"
)


def guesses_valid(batch: TreeBatch) -> torch.Tensor:
    """0-dim bool tensor, no host read: every entry of ``batch.guesses [B, N]`` is ``PAD`` or,
    in a row of law ``grafted``, its node's last candidate listed once (what
    :meth:`specsampling.DraftTree.graft` builds; :data:`GUESSES_RULE`). True without guesses.
    Guesses elsewhere would be tested as point masses by the lowering and not by the
    reference, so ``verify(..., validate=True)`` refuses them.

    >>> import specsampling as ss, dataclasses
    >>> tree = ss.DraftTree.from_draws([(0, 2), (0, 1)], law="iid").graft([3])
    >>> batch = TreeBatch.from_trees([tree])
    >>> bool(guesses_valid(batch))
    True
    >>> bool(guesses_valid(dataclasses.replace(batch, guesses=torch.tensor([[2, -1, -1, -1]]))))
    False
    """
    guesses, candidates = batch.guesses, batch.candidates
    if guesses is None:
        return torch.ones((), dtype=torch.bool, device=batch.device)
    grafted = torch.tensor(
        [law is DrawLaw.GRAFTED for law in batch.laws], device=guesses.device
    )  # [B]
    counts = (candidates != PAD).sum(-1)  # [B, N]
    last = candidates.gather(-1, (counts - 1).clamp_min(0)[..., None]).squeeze(-1)  # [B, N]
    once = (candidates == guesses[..., None]).sum(-1) == 1  # [B, N]
    placed = grafted[:, None] & (counts > 0) & (last == guesses) & once  # [B, N]
    return ((guesses == PAD) | ((guesses >= 0) & placed)).all()


#: What :func:`structure_valid` checks, for the error of ``verify(..., validate=True)``.
STRUCTURE_RULE = (
    "a padded forest as TreeBatch.from_trees builds it: 1 <= num_nodes <= N; every real node "
    "n >= 1 with a parent in [0, n), a token >= 0, its parent's depth + 1 and a place among "
    "its parent's candidates, which list real children only; the root at depth 0; host "
    "metadata (max_depth, level_slots, chains) covering the candidates"
)


def structure_valid(batch: TreeBatch) -> torch.Tensor:
    """``[7]`` bool tensor, no host read: the checks of :data:`STRUCTURE_RULE` in the order
    :func:`structure_defect` names them (all true for a batch built by :meth:`TreeBatch.
    from_trees`, :meth:`TreeBatch.roots` or the tensor drafter). A hand-built batch that breaks
    them would send the walk to nodes that are not there (``-1`` tokens, verdicts read from
    padding rows), so ``verify(..., validate=True)`` refuses it."""
    return torch.stack([flags.all() for flags in _structure_flags(batch)])


def _structure_flags(batch: TreeBatch) -> list[torch.Tensor]:
    size, num = batch.parents.shape
    device = batch.device
    nodes = torch.arange(num, device=device)  # [N]
    real = batch.real_nodes()  # [B, N]
    inner = real & (nodes > 0)  # [B, N]: real nodes below the root
    parents, depth, candidates = batch.parents, batch.depth, batch.candidates
    safe_parent = parents.clamp(0, num - 1)  # [B, N]
    parent_depth = depth.gather(1, safe_parent)  # [B, N]
    listed = candidates != PAD  # [B, N, C]
    safe = candidates.clamp(0, num - 1).reshape(size, -1)  # [B, N C]
    child_parent = parents.gather(1, safe).reshape(candidates.shape)  # [B, N, C]
    child_real = real.gather(1, safe).reshape(candidates.shape)  # [B, N, C]
    own = (candidates >= 0) & (candidates < num) & child_real
    own &= child_parent == nodes[None, :, None]
    seen = torch.zeros((size, num + 1), dtype=torch.long, device=device)
    seen.scatter_add_(
        1,
        torch.where(listed & real[..., None], candidates, num).clamp(0, num).reshape(size, -1),
        torch.ones_like(safe),
    )
    counts = listed.sum(-1)  # [B, N]
    slots = torch.tensor(batch.level_slots, dtype=torch.long, device=device)  # [D + 1]
    chains = torch.tensor(batch.chains, dtype=torch.bool, device=device).reshape(size)  # [B]
    return [
        (batch.num_nodes >= 1) & (batch.num_nodes <= num),  # num_nodes
        ~inner | ((parents >= 0) & (parents < nodes)),  # parents
        ~inner | (batch.tokens >= 0),  # tokens
        torch.where(inner, depth == parent_depth + 1, ~real | (nodes > 0) | (depth == 0)),  # depth
        ~(listed & real[..., None]) | own,  # candidates: real children of the node
        ~inner | (seen[:, :num] > 0),  # every real node listed by its parent
        ~real
        | ((depth <= batch.max_depth) & (counts <= slots[depth.clamp(0, batch.max_depth)]))
        & (~chains[:, None] | (counts <= 1)),  # host metadata
    ]


def structure_defect(batch: TreeBatch) -> str:
    """The first :data:`STRUCTURE_RULE` defect of ``batch`` as ``"field[b, n]: what"`` (host
    reads: call it once :func:`structure_valid` has found one)."""
    names = (
        ("batch.num_nodes", "outside [1, N]"),
        ("batch.parents", "not a node before it"),
        ("batch.tokens", "negative token on a real node"),
        ("batch.depth", "not its parent's depth + 1 (the root: 0)"),
        ("batch.candidates", "lists a node that is not a real child of it"),
        ("batch.parents", "a real node missing from its parent's candidates"),
        ("batch.max_depth/level_slots/chains", "host metadata below the candidates"),
    )
    for flags, (field_name, what) in zip(_structure_flags(batch), names, strict=True):
        bad = ~flags
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0][:2])
            return f"{field_name}{list(where)}: {what} (a TreeBatch must be {STRUCTURE_RULE})"
    return ""


def node_paths(tree: TreeBatch) -> torch.Tensor:
    """``paths [B, N, D]``: the tokens from the root to each node (``PAD`` past its depth).

    >>> tree = TreeBatch.from_trees([DraftTree((-1, 0, 1, 0), (-1, 5, 6, 7))])
    >>> node_paths(tree)[0].tolist()
    [[-1, -1], [5, -1], [5, 6], [7, -1]]
    """
    batch, num_nodes = tree.parents.shape
    depth_max = max(tree.max_depth, 0)
    paths = torch.full((batch, num_nodes, depth_max + 1), PAD, dtype=torch.long, device=tree.device)
    current = torch.arange(num_nodes, device=tree.device).expand(batch, num_nodes)  # [B, N]
    alive = tree.real_nodes()
    for _ in range(depth_max):
        depth = tree.depth.gather(1, current.clamp_min(0))  # [B, N]
        here = alive & (depth > 0)
        column = torch.where(here, depth - 1, depth_max)  # the extra column is a dump
        paths.scatter_(2, column[..., None], tree.tokens.gather(1, current.clamp_min(0))[..., None])
        current = torch.where(here, tree.parents.gather(1, current.clamp_min(0)), current)
        alive = here
    return paths[:, :, :depth_max]


def path_nodes(tree: TreeBatch, node: torch.Tensor) -> torch.Tensor:
    """``[B, D]``: column ``k`` holds the node of depth ``k + 1`` on the root path to
    ``node [B]`` (``PAD`` past its depth).

    >>> tree = TreeBatch.from_trees([DraftTree((-1, 0, 1, 0), (-1, 5, 6, 7))])
    >>> path_nodes(tree, torch.tensor([2])).tolist(), path_nodes(tree, torch.tensor([3])).tolist()
    ([[1, 2]], [[3, -1]])
    """
    batch = node.shape[0]
    depth_max = tree.max_depth
    out = torch.full((batch, depth_max + 1), PAD, dtype=torch.long, device=node.device)
    current = node
    for _ in range(depth_max):
        depth = tree.depth.gather(1, current[:, None]).squeeze(1)  # [B]
        here = depth > 0
        out.scatter_(1, torch.where(here, depth - 1, depth_max)[:, None], current[:, None])
        current = torch.where(here, tree.parents.gather(1, current[:, None]).squeeze(1), current)
    return out[:, :depth_max]
