"""Draft trees: the tokens a round drafted, as a trie with ordered candidate lists and the law
they were drawn from."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from ._types import Prefix


class DrawLaw(str, Enum):
    """How a tree's candidates were drawn, given their parent node.

    A verifier is exact only for some laws (specinfer for i.i.d. candidates, rsd for candidates
    without replacement, ...), so every tree carries its law and verifiers refuse the others.
    Members compare equal to their string values (``DrawLaw.IID == "iid"``).

    * ``IID``: each candidate an independent draw from the draft ``q(. | node)``;
    * ``WITHOUT``: drawn in turn from ``q`` with the node's earlier candidates removed;
    * ``DETERMINISTIC``: chosen without randomness (the draft's top tokens, EAGLE style);
    * ``GREEDY``, ``HUB``: the own drafting laws of the ``greedy`` and ``spechub`` schemes;
    * ``GRAFTED``: i.i.d. candidates from ``q`` and, at the nodes of
      :attr:`DraftTree.guesses`, one more candidate, last, chosen from the context alone (a
      prompt-lookup continuation grafted into a sampled tree, :meth:`DraftTree.graft`);
    * ``UNKNOWN``: not stated (a hand-built tree). Only schemes exact for every tree drawn
      independently of the verifier's noise (``nss``) accept it.

    >>> DrawLaw("without") is DrawLaw.WITHOUT, DrawLaw.IID == "iid"
    (True, True)
    """

    IID = "iid"
    WITHOUT = "without"
    DETERMINISTIC = "deterministic"
    GREEDY = "greedy"
    HUB = "hub"
    GRAFTED = "grafted"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, law: Any) -> DrawLaw:
        """``law`` as a member; a clear :class:`ValueError` for anything else.

        >>> DrawLaw.of("iid")
        <DrawLaw.IID: 'iid'>
        >>> DrawLaw.of("random")
        Traceback (most recent call last):
        ...
        ValueError: law: expected one of ['iid', 'without', 'deterministic', 'greedy', 'hub', \
'grafted', 'unknown'], got 'random'
        """
        try:
            return cls(law)
        except ValueError:
            raise ValueError(
                f"law: expected one of {[m.value for m in cls]}, got {law!r}"
            ) from None


#: Laws under which a node's single candidate is a plain draw from ``q``: a tree of them whose
#: every node has at most one candidate is a *sampled chain*, which every ratio scheme verifies.
SAMPLED_LAWS = frozenset({DrawLaw.IID, DrawLaw.WITHOUT, DrawLaw.GREEDY})


@dataclass(frozen=True)
class DraftTree:
    """An immutable draft tree.

    Node 0 is the root (parent ``-1``, token ``-1``); node ``n > 0`` holds the drafted token
    ``tokens[n]`` and its parent ``parents[n] < n``. Nodes are a trie: no two children of a node
    share a token. ``candidates[n]`` lists the child nodes of ``n`` **in drafting order, with
    multiplicity**: i.i.d. drafting can draw the same token twice, and the ratio schemes need
    that multiset in order. Without ``candidates`` each child is a candidate once, in index order.
    ``law`` (a :class:`DrawLaw`) records how the candidates were drawn: every
    :class:`~specsampling.Shape` sets it, and whoever builds a tree by hand states it (the default
    ``"unknown"`` is accepted only by verifiers exact for any tree, such as ``nss``).
    ``guesses`` (law ``"grafted"`` only, one entry per node) names the child of each node that was
    guessed from the context alone rather than drawn from the draft, ``-1`` where none; a guess
    is its node's last candidate, listed once, beside none of the drawn ones
    (:meth:`graft` builds such trees).

    Examples
    --------
    >>> tree = DraftTree.from_draws([(0, 2), (0, 1), (0, 2), (1, 0)], law="iid")
    >>> tree.tokens, tree.parents, tree.law
    ((-1, 2, 1, 0), (-1, 0, 0, 1), <DrawLaw.IID: 'iid'>)
    >>> tree.candidates[0], tree.children(0), tree.prefix(3)
    ((1, 2, 1), (1, 2), (2, 0))
    """

    parents: tuple[int, ...]
    tokens: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...] = field(default=())
    law: DrawLaw = DrawLaw.UNKNOWN
    guesses: tuple[int, ...] = ()
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parents = tuple(_node_id(p, "parents") for p in self.parents)
        tokens = tuple(_node_id(t, "tokens") for t in self.tokens)
        if not parents or parents[0] != -1 or tokens[0] != -1:
            raise ValueError("tree: node 0 must be the root with parent -1 and token -1")
        if len(parents) != len(tokens):
            raise ValueError("tree: parents and tokens differ in length")
        seen: set[tuple[int, int]] = set()
        for node in range(1, len(parents)):
            if not 0 <= parents[node] < node:
                raise ValueError(
                    f"tree: node {node} has parent {parents[node]}, not an earlier node"
                )
            if tokens[node] < 0:
                raise ValueError(f"tree: node {node} has negative token {tokens[node]}")
            key = (parents[node], tokens[node])
            if key in seen:
                raise ValueError(f"tree: node {node} repeats token {tokens[node]} under its parent")
            seen.add(key)
        kids: list[list[int]] = [[] for _ in parents]
        for node in range(1, len(parents)):
            kids[parents[node]].append(node)
        candidates = tuple(tuple(c) for c in self.candidates) or tuple(tuple(k) for k in kids)
        if len(candidates) != len(parents):
            raise ValueError("tree: candidates needs one entry per node")
        for node, cands in enumerate(candidates):
            if set(cands) != set(kids[node]):
                raise ValueError(f"tree: candidates of node {node} must list exactly its children")
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "candidates", candidates)
        law = DrawLaw.of(self.law)
        object.__setattr__(self, "law", law)
        object.__setattr__(self, "guesses", _checked_guesses(self.guesses, law, candidates))
        object.__setattr__(self, "_children", tuple(_unique(c) for c in candidates))

    @classmethod
    def from_draws(
        cls, draws: Iterable[tuple[int, int]], law: DrawLaw | str = DrawLaw.UNKNOWN
    ) -> DraftTree:
        """Build a tree from ``(parent_node, token)`` draws in drafting order, drawn by ``law``.

        A draw of a token its parent already has adds that child again to the parent's
        candidate list instead of a new node.

        >>> DraftTree.from_draws([(0, 2), (0, 2), (1, 0)], law="iid").candidates
        ((1, 1), (2,), ())
        >>> DraftTree.from_draws([(0, 2), 3])
        Traceback (most recent call last):
        ...
        TypeError: draws[1]: expected a (parent_node, token) pair, got 3
        """
        parents, tokens = [-1], [-1]
        candidates: list[list[int]] = [[]]
        index: dict[tuple[int, int], int] = {}
        if isinstance(draws, (str, bytes)):
            raise TypeError(f"draws: expected (parent_node, token) pairs, got {draws!r}")
        for i, draw in enumerate(draws):
            if isinstance(draw, (str, bytes)) or not hasattr(draw, "__len__") or len(draw) != 2:
                raise TypeError(f"draws[{i}]: expected a (parent_node, token) pair, got {draw!r}")
            parent, token = _node_id(draw[0], "draws"), _node_id(draw[1], "draws")
            if not 0 <= parent < len(parents):
                raise ValueError(f"tree: draw names parent {parent}, which does not exist yet")
            node = index.get((parent, token))
            if node is None:
                node = len(parents)
                index[(parent, token)] = node
                parents.append(parent)
                tokens.append(token)
                candidates.append([])
            candidates[parent].append(node)
        nodes = tuple(tuple(c) for c in candidates)
        return cls(tuple(parents), tuple(tokens), nodes, DrawLaw.of(law))

    @classmethod
    def chain(cls, tokens: Sequence[int], law: DrawLaw | str = DrawLaw.UNKNOWN) -> DraftTree:
        """A single path of drafted tokens.

        >>> DraftTree.chain([3, 1], law="iid").prefix(2)
        (3, 1)
        """
        return cls.from_draws(((node, token) for node, token in enumerate(tokens)), law)

    def with_law(self, law: DrawLaw | str) -> DraftTree:
        """The same tree, stating that its candidates were drawn by ``law`` (its guesses kept
        only when ``law`` is ``"grafted"``)."""
        law = DrawLaw.of(law)
        guesses = self.guesses if law is DrawLaw.GRAFTED else ()
        return DraftTree(self.parents, self.tokens, self.candidates, law, guesses)

    def guess(self, node: int) -> int | None:
        """The child of ``node`` guessed from the context (its last candidate), or ``None``.

        >>> tree = DraftTree.chain([4, 2], law="iid").graft([4, 7])
        >>> tree.guess(1), tree.guess(0)
        (3, None)
        """
        child = self.guesses[node] if self.guesses else -1
        return None if child < 0 else child

    def graft(self, chain: Sequence[int]) -> DraftTree:
        """This tree with ``chain`` (token ids guessed from the context alone, e.g. a
        prompt-lookup continuation) grafted in: from the root, follow the child holding the
        chain's next token while there is one, then hang the chain's remaining tokens below as
        new nodes (numbered after the existing ones), each its parent's last candidate.

        A tree that gains nodes is a mixed tree: law ``"grafted"``, the new nodes its
        :attr:`guesses`, when this tree's candidates are i.i.d. draws (law ``"iid"``, or a
        sampled chain: one candidate per node drawn by a law of ``SAMPLED_LAWS``, a plain
        draw); else law ``"unknown"``. A chain the tree already holds adds nothing (a guess
        that equals a drawn candidate would be rejected surely after it, see ``specinfer``).

        >>> tree = DraftTree.chain([4, 2], law="iid").graft([4, 7, 8])
        >>> tree.tokens, tree.candidates, tree.law, tree.guesses
        ((-1, 4, 2, 7, 8), ((1,), (2, 3), (), (4,), ()), <DrawLaw.GRAFTED: 'grafted'>, \
(-1, 3, -1, 4, -1))
        >>> DraftTree.chain([4, 2], law="iid").graft([4]).law
        <DrawLaw.IID: 'iid'>
        """
        if self.law is DrawLaw.GRAFTED:
            raise ValueError("tree: already grafted (law 'grafted' holds one guess per node)")
        if isinstance(chain, (str, bytes)) or not isinstance(chain, Iterable):
            raise TypeError(f"chain: expected a sequence of token ids, got {chain!r}")
        parents, tokens = list(self.parents), list(self.tokens)
        candidates = [list(c) for c in self.candidates]
        guesses = [-1] * len(parents)
        node, grown = 0, False
        for token in chain:
            token = _node_id(token, "chain")
            child = None if grown else self.child_with_token(node, token)
            if child is None:
                parents.append(node)
                tokens.append(token)
                candidates.append([])
                guesses.append(-1)
                child, grown = len(tokens) - 1, True
                candidates[node].append(child)
                guesses[node] = child
            node = child
        if not grown:
            return self
        law = grafted_law(self.law, self.is_chain)
        kept = tuple(guesses) if law is DrawLaw.GRAFTED else ()
        return DraftTree(tuple(parents), tuple(tokens), tuple(map(tuple, candidates)), law, kept)

    @property
    def num_nodes(self) -> int:
        """Number of nodes, the root included."""
        return len(self.parents)

    @property
    def is_chain(self) -> bool:
        """Every node has at most one candidate (counted with multiplicity).

        >>> DraftTree.chain([3, 1]).is_chain, DraftTree.from_draws([(0, 1), (0, 1)]).is_chain
        (True, False)
        """
        return all(len(c) <= 1 for c in self.candidates)

    @property
    def is_sampled_chain(self) -> bool:
        """A chain whose candidates are plain draws from the draft (law in ``SAMPLED_LAWS``)."""
        return self.is_chain and self.law in SAMPLED_LAWS

    def children(self, node: int) -> tuple[int, ...]:
        """Distinct children of ``node`` in first-drafted order."""
        return self._children[node]

    def child_with_token(self, node: int, token: int) -> int | None:
        """The child of ``node`` holding ``token``, or ``None``."""
        for child in self.children(node):
            if self.tokens[child] == token:
                return child
        return None

    def prefix(self, node: int) -> Prefix:
        """Tokens on the path from the root to ``node`` (empty for the root)."""
        path: list[int] = []
        while node > 0:
            path.append(self.tokens[node])
            node = self.parents[node]
        return tuple(reversed(path))

    def depth(self, node: int) -> int:
        """Number of drafted tokens from the root to ``node``."""
        return len(self.prefix(node))

    @property
    def max_depth(self) -> int:
        """Depth of the deepest node."""
        return max(self.depth(n) for n in range(self.num_nodes))


def grafted_law(law: DrawLaw | str, chain: bool) -> DrawLaw:
    """The law of a tree drawn by ``law`` (a chain when ``chain``) once a guess is grafted
    in (:meth:`DraftTree.graft`): ``"grafted"`` where its candidates are i.i.d. draws (law
    ``"iid"``, or a sampled chain), else ``"unknown"``.

    >>> grafted_law("iid", False), grafted_law("without", True), grafted_law("without", False)
    (<DrawLaw.GRAFTED: 'grafted'>, <DrawLaw.GRAFTED: 'grafted'>, <DrawLaw.UNKNOWN: 'unknown'>)
    """
    law = DrawLaw.of(law)
    if law is DrawLaw.IID or (chain and law in SAMPLED_LAWS):
        return DrawLaw.GRAFTED
    return DrawLaw.UNKNOWN


def _checked_guesses(
    guesses: Any, law: DrawLaw, candidates: tuple[tuple[int, ...], ...]
) -> tuple[int, ...]:
    """``guesses`` as a tuple of node ids, checked against the law and the candidate lists."""
    if isinstance(guesses, (str, bytes)) or not isinstance(guesses, Iterable):
        raise ValueError(f"tree: guesses must be a sequence of node ids, got {guesses!r}")
    ids = tuple(_node_id(g, "guesses") for g in guesses)
    if any(g < -1 for g in ids):
        raise ValueError(f"tree: guesses hold child node ids or -1 (none), got {min(ids)}")
    if law is not DrawLaw.GRAFTED:
        if any(g >= 0 for g in ids):
            raise ValueError(
                f"tree: guesses are for law 'grafted' (drawn candidates plus guesses), got law "
                f"{law.value!r}"
            )
        return ()
    if len(ids) != len(candidates):
        raise ValueError(
            f"tree: law 'grafted' needs one guess per node ({len(candidates)}, -1 for none), "
            f"got {len(ids)}"
        )
    for node, (guess, cands) in enumerate(zip(ids, candidates, strict=True)):
        if guess < 0:
            continue
        if not cands or cands[-1] != guess or cands.count(guess) != 1:
            raise ValueError(
                f"tree: the guess {guess} of node {node} must be its last candidate, listed once "
                f"(candidates {cands})"
            )
    return ids


def _unique(nodes: Sequence[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(nodes))


def _node_id(value: Any, name: str) -> int:
    """An integer id (token or node), refusing floats, bools and strings with a clear error."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"tree: {name} holds integer ids, got {value!r}")
    return int(value)
