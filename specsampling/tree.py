"""Draft trees: the tokens a round drafted, as a trie with ordered candidate lists."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ._types import Prefix


@dataclass(frozen=True)
class DraftTree:
    """An immutable draft tree.

    Node 0 is the root (parent ``-1``, token ``-1``); node ``n > 0`` holds the drafted token
    ``tokens[n]`` and its parent ``parents[n] < n``. Nodes are a trie: no two children of a node
    share a token. ``candidates[n]`` lists the child nodes of ``n`` **in drafting order, with
    multiplicity**: i.i.d. drafting can draw the same token twice, and the ratio schemes need
    that multiset in order. Without ``candidates`` each child is a candidate once, in index order.

    Examples
    --------
    >>> tree = DraftTree.from_draws([(0, 2), (0, 1), (0, 2), (1, 0)])
    >>> tree.tokens, tree.parents
    ((-1, 2, 1, 0), (-1, 0, 0, 1))
    >>> tree.candidates[0], tree.children(0), tree.prefix(3)
    ((1, 2, 1), (1, 2), (2, 0))
    """

    parents: tuple[int, ...]
    tokens: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        parents, tokens = tuple(self.parents), tuple(self.tokens)
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
        object.__setattr__(self, "_children", tuple(_unique(c) for c in candidates))

    @classmethod
    def from_draws(cls, draws: Iterable[tuple[int, int]]) -> DraftTree:
        """Build a tree from ``(parent_node, token)`` draws in drafting order.

        A draw of a token its parent already has adds that child again to the parent's
        candidate list instead of a new node.
        """
        parents, tokens = [-1], [-1]
        candidates: list[list[int]] = [[]]
        index: dict[tuple[int, int], int] = {}
        for parent, token in draws:
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
        return cls(tuple(parents), tuple(tokens), tuple(tuple(c) for c in candidates))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        """A single path of drafted tokens.

        >>> DraftTree.chain([3, 1]).prefix(2)
        (3, 1)
        """
        return cls.from_draws((node, token) for node, token in enumerate(tokens))

    @property
    def num_nodes(self) -> int:
        """Number of nodes, the root included."""
        return len(self.parents)

    def children(self, node: int) -> tuple[int, ...]:
        """Distinct children of ``node`` in first-drafted order."""
        kids: tuple[tuple[int, ...], ...] = self._children  # type: ignore[attr-defined]
        return kids[node]

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


def _unique(nodes: Sequence[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(nodes))
