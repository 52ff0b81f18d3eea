r"""Tree policies: deterministic draft trees built per context under a node budget.

A :class:`~specsampling.Shape` is a fixed drafting plan; a *policy* builds a different tree for
every context from the draft's own probabilities, as dynamic-tree drafters do. Both policies here
choose tokens deterministically, so the trees have law ``deterministic`` and only schemes exact
for every tree drawn independently of the verifier's noise accept them (``nss``: the target's
sample walks down the tree while it stays inside).

With :math:`\hat{q}(v) = \prod_{u \in \mathrm{path}(v)} q(u \mid \mathrm{parent}(u))` the
draft's probability of a node's path, both aim at the proxy
:math:`E(A) = \sum_{v \in A} \hat{q}(v)`, which is NSS's expected accepted length when the draft
equals the target (OPT-Tree's objective, Wang et al., arXiv 2406.17276):

* :class:`HeapTree` (DDTree, Ringel & Romano, arXiv 2604.12989): best-first on a heap, the
  ``budget`` prefixes of largest :math:`\hat q`. Scores never increase along a path, so the set is
  prefix-closed and it is the exact maximiser of :math:`E(A)` under the budget;
* :class:`OptTree` (OPT-Tree, Wang et al., arXiv 2406.17276): layer by layer, the ``width``
  children of largest :math:`\hat q` among the last layer's top children, stopping when a layer's
  gain :math:`\sum \hat q` falls below ``threshold``.

Each policy calls the draft once per added node (heap) or per layer (OPT-Tree), batched over the
rows of a batch. Pass a policy where a shape goes: ``sim.estimate("nss", pair, HeapTree(16))``.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch

import specsampling as ss
from specsampling.tree import DrawLaw
from specsampling.validation import check_positive_int

from .sources import draft_at


class _Policy(ABC):
    """What a tree source needs of a policy (:func:`~specsampling.simulators.sources.draft_batches`
    drafts with any object that has ``draft_trees``): the trees' ``law``, ``max_nodes`` for the
    batch size, and :meth:`draft_trees`."""

    law: ClassVar[DrawLaw] = DrawLaw.DETERMINISTIC
    budget: int

    @property
    def max_nodes(self) -> int:
        """Nodes of the largest tree (the root included)."""
        return 1 + self.budget

    @abstractmethod
    def draft_trees(self, pair: Any, roots: Sequence[tuple[int, ...]]) -> list[ss.DraftTree]:
        """One tree per root context, drafted after it from ``pair``'s draft."""


@dataclass(frozen=True, repr=False)
class HeapTree(_Policy):
    """DDTree's best-first tree: the ``budget`` draft-likeliest prefixes of each context.

    Parameters
    ----------
    budget : int
        Drafted nodes per tree (the root excluded).
    max_depth : int, optional
        Deepest node allowed (default: ``budget``).

    Examples
    --------
    >>> import specsampling as ss
    >>> pair = ss.pairs.Stationary([0.5, 0.5], [0.7, 0.3])
    >>> tree = HeapTree(3).draft_trees(pair, [()])[0]
    >>> [tree.prefix(n) for n in range(1, tree.num_nodes)]  # 0.7, 0.49, 0.343 beat 0.3
    [(0,), (0, 0), (0, 0, 0)]
    """

    budget: int
    max_depth: int | None = None  # resolved to ``budget`` when not given

    def __post_init__(self) -> None:
        budget = check_positive_int(self.budget, "budget")
        depth = (
            budget if self.max_depth is None else check_positive_int(self.max_depth, "max_depth")
        )
        object.__setattr__(self, "budget", budget)
        object.__setattr__(self, "max_depth", depth)

    def __repr__(self) -> str:
        depth = "" if self.max_depth == self.budget else f", max_depth={self.max_depth}"
        return f"HeapTree({self.budget}{depth})"

    def draft_trees(self, pair: Any, roots: Sequence[tuple[int, ...]]) -> list[ss.DraftTree]:
        """One tree per root context."""
        rows = len(roots)
        ranks = min(self.budget, pair.vocab_size)
        max_depth = cast(int, self.max_depth)  # resolved by __post_init__
        draws: list[list[tuple[int, int]]] = [[] for _ in range(rows)]
        paths: list[list[tuple[int, ...]]] = [[()] for _ in range(rows)]  # node -> tokens
        scores: list[list[float]] = [[0.0] for _ in range(rows)]  # node -> log q-hat
        tops: list[list[tuple[list[int], list[float]]]] = [[] for _ in range(rows)]
        heaps: list[list[tuple[float, int, int]]] = [[] for _ in range(rows)]

        def expand(owners: list[tuple[int, int]]) -> None:
            """Read the draft at these (row, node)s and push each one's first child."""
            if not owners:
                return
            probs = draft_at(pair, [roots[b] + paths[b][n] for b, n in owners])
            values, ids = torch.topk(probs, ranks, dim=-1)
            for (b, n), vals, toks in zip(owners, values.tolist(), ids.tolist(), strict=True):
                logs = [math.log(v) if v > 0 else -math.inf for v in vals]
                tops[b].append((toks, logs))
                if logs[0] > -math.inf and len(paths[b][n]) < max_depth:
                    heapq.heappush(heaps[b], (-(scores[b][n] + logs[0]), n, 0))

        expand([(b, 0) for b in range(rows)])
        for _ in range(self.budget):
            owners = []
            for b in range(rows):
                if not heaps[b]:
                    continue
                neg, parent, rank = heapq.heappop(heaps[b])
                toks, logs = tops[b][parent]
                draws[b].append((parent, toks[rank]))
                paths[b].append(paths[b][parent] + (toks[rank],))
                scores[b].append(-neg)
                if rank + 1 < ranks and logs[rank + 1] > -math.inf:  # the next sibling
                    heapq.heappush(
                        heaps[b], (-(scores[b][parent] + logs[rank + 1]), parent, rank + 1)
                    )
                owners.append((b, len(paths[b]) - 1))
            expand(owners)
        return [ss.DraftTree.from_draws(d, law=self.law) for d in draws]


@dataclass(frozen=True, repr=False)
class OptTree(_Policy):
    """OPT-Tree's layer-wise greedy tree: per layer, the ``width`` likeliest children.

    Parameters
    ----------
    budget : int
        Drafted nodes per tree at most (the root excluded).
    width : int, optional
        Nodes added per layer at most (default ``budget``: the first layer may take the whole
        budget; smaller widths leave room for depth).
    threshold : float, default 0.0
        Stop when a layer's gain ``sum q-hat`` is below it (OPT-Tree runs with 0.5 at budget 60);
        a finite number >= 0, not a bool.
    max_depth : int, default 10
        Layers at most.

    Examples
    --------
    >>> import specsampling as ss
    >>> pair = ss.pairs.Stationary([0.5, 0.5], [0.7, 0.3])
    >>> tree = OptTree(4, width=2).draft_trees(pair, [()])[0]
    >>> [tree.prefix(n) for n in range(1, tree.num_nodes)]
    [(0,), (1,), (0, 0), (0, 1)]
    """

    budget: int
    width: int | None = None  # resolved to ``budget`` when not given
    threshold: float = 0.0
    max_depth: int = 10

    def __post_init__(self) -> None:
        budget = check_positive_int(self.budget, "budget")
        width = budget if self.width is None else check_positive_int(self.width, "width")
        threshold = self.threshold
        if not (
            isinstance(threshold, (int, float))
            and not isinstance(threshold, bool)
            and math.isfinite(threshold)
            and threshold >= 0
        ):
            raise ValueError(f"threshold: expected a finite number >= 0, got {threshold!r}")
        object.__setattr__(self, "budget", budget)
        object.__setattr__(self, "width", width)
        object.__setattr__(self, "threshold", float(threshold))
        object.__setattr__(self, "max_depth", check_positive_int(self.max_depth, "max_depth"))

    def __repr__(self) -> str:
        parts = [str(self.budget)]
        if self.width != self.budget:
            parts.append(f"width={self.width}")
        if self.threshold:
            parts.append(f"threshold={self.threshold:g}")
        if self.max_depth != 10:
            parts.append(f"max_depth={self.max_depth}")
        return f"OptTree({', '.join(parts)})"

    def draft_trees(self, pair: Any, roots: Sequence[tuple[int, ...]]) -> list[ss.DraftTree]:
        """One tree per root context."""
        rows = len(roots)
        width = cast(int, self.width)  # resolved by __post_init__
        ranks = min(width, self.budget, pair.vocab_size)
        draws: list[list[tuple[int, int]]] = [[] for _ in range(rows)]
        paths: list[list[tuple[int, ...]]] = [[()] for _ in range(rows)]
        probs_hat: list[list[float]] = [[1.0] for _ in range(rows)]
        layers: list[list[int]] = [[0] for _ in range(rows)]
        left = [self.budget] * rows
        for _ in range(self.max_depth):
            owners = [(b, n) for b in range(rows) if left[b] > 0 for n in layers[b]]
            if not owners:
                break
            probs = draft_at(pair, [roots[b] + paths[b][n] for b, n in owners])
            values, ids = torch.topk(probs, ranks, dim=-1)
            options: list[list[tuple[float, int, int]]] = [[] for _ in range(rows)]
            for (b, n), vals, toks in zip(owners, values.tolist(), ids.tolist(), strict=True):
                pairs = zip(vals, toks, strict=True)
                options[b].extend((probs_hat[b][n] * v, n, t) for v, t in pairs if v > 0)
            for b in range(rows):
                chosen = sorted(options[b], key=lambda o: (-o[0], o[1], o[2]))[
                    : min(width, left[b])
                ]
                if not chosen or sum(c[0] for c in chosen) < self.threshold:
                    left[b] = 0
                    layers[b] = []
                    continue
                layer = []
                for value, parent, token in sorted(chosen, key=lambda o: (o[1], -o[0], o[2])):
                    draws[b].append((parent, token))
                    paths[b].append(paths[b][parent] + (token,))
                    probs_hat[b].append(value)
                    layer.append(len(paths[b]) - 1)
                left[b] -= len(chosen)
                layers[b] = layer
        return [ss.DraftTree.from_draws(d, law=self.law) for d in draws]


#: Tree policies by the name ``search_shape`` takes.
POLICIES = {"ddtree": HeapTree, "opt-tree": OptTree}

__all__ = ["POLICIES", "HeapTree", "OptTree"]
