"""Lookaheads: what one speculative round drafts, and how one target pass verifies it.

A :class:`Chain` drafts ``length`` states in a row and verifies them with a chain verifier of
:mod:`specsampling.continuous` (:func:`reflection_chain`, :func:`block_chain`); a :class:`Tree`
drafts i.i.d. children per node and walks them with :func:`specsampling.continuous.verify`
(:func:`dgrs_tree`). Either evaluates the target once, over every node that needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from specsampling import continuous

# Absolute imports: pytest (importlib mode) also loads these files as simulators.diffusion.*
from specsampling.simulators.diffusion.drafts import Draft
from specsampling.simulators.diffusion.process import Array, VPDiffusion
from specsampling.validation import check_positive_int


class _Advance(NamedTuple):
    committed: Array  # (n,) states committed this round (>= 1)
    states: Array  # (n, dim) the last committed state
    anchors: Array  # (n, dim) target increment at its parent
    rows: int  # rows of the one target pass, per path
    drafted: int  # states drafted, per path


ChainVerifier = Callable[[Array, Array, Array, Array, np.random.Generator], Any]


def _verify_chain(*args: Any) -> Any:
    return continuous.verify_chain(*args)


def _verify_block(*args: Any) -> Any:
    return continuous.verify_block(*args)


def _draft_children(
    draft: Draft,
    process: VPDiffusion,
    nodes: Array,
    steps: Array,
    anchors: Array,
    num: int,
    rng: np.random.Generator,
) -> tuple[Array, Array]:
    """Draft means at ``nodes`` (n, m, d) and ``num`` i.i.d. children each, (n, m, num, d)."""
    n, m, d = nodes.shape
    means = draft.means(
        process, nodes.reshape(-1, d), np.repeat(steps, m), np.repeat(anchors, m, axis=0)
    ).reshape(n, m, d)
    noise = rng.standard_normal((n, m, num, d))
    return means, means[:, :, None, :] + process.stds[steps][:, None, None, None] * noise


@dataclass(frozen=True)
class Chain:
    """A drafted chain of ``length`` states verified in one pass by ``verifier``.

    ``verifier`` has the signature of :func:`specsampling.continuous.verify_block`. Build the
    library's chains with :func:`reflection_chain` and :func:`block_chain`.
    """

    length: int
    verifier: ChainVerifier = field(repr=False)
    label: str = "chain"

    def __post_init__(self) -> None:
        check_positive_int(self.length, "length")

    def span(self, remaining: Array) -> Array:
        """Lookahead used with ``remaining`` steps left (0 means a plain step)."""
        return np.asarray(np.minimum(self.length, remaining - 1))

    def advance(
        self,
        process: VPDiffusion,
        draft: Draft,
        steps: Array,
        states: Array,
        anchors: Array,
        depth: int,
        rng: np.random.Generator,
    ) -> _Advance:
        n = states.shape[0]
        parents, draft_means, children = [states], [], []
        for level in range(depth):
            means, kids = _draft_children(
                draft, process, parents[-1][:, None], steps + level, anchors, 1, rng
            )
            draft_means.append(means[:, 0])
            children.append(kids[:, 0, 0])
            parents.append(kids[:, 0, 0])
        nodes = np.stack(parents, axis=1)  # (n, depth + 1, d)
        node_steps = steps[:, None] + np.arange(depth + 1)
        target = process.target_mean(nodes.reshape(n * (depth + 1), -1), node_steps.ravel())
        target = target.reshape(nodes.shape)
        out = self.verifier(
            target, np.stack(draft_means, 1), process.stds[node_steps], np.stack(children, 1), rng
        )
        accepted = np.asarray(out.num_committed, dtype=np.int64)
        rows = np.arange(n)
        anchors = target[rows, accepted] - nodes[rows, accepted]
        return _Advance(accepted + 1, np.asarray(out.states), anchors, depth + 1, depth)


def reflection_chain(length: int) -> Chain:
    """Reflection-coupling chain lookahead (:func:`specsampling.continuous.verify_chain`)."""
    return Chain(length, _verify_chain, f"reflection chain L={length}")


def block_chain(length: int) -> Chain:
    """Block-verification chain lookahead (:func:`specsampling.continuous.verify_block`)."""
    return Chain(length, _verify_block, f"block chain L={length}")


@dataclass(frozen=True)
class Tree:
    """A uniform draft tree, ``num_children`` i.i.d. children per node and ``depth`` levels.

    The target is evaluated at the internal nodes only, in one pass; the walk verifies the
    children of the current node with :func:`specsampling.continuous.verify` (``scheme``
    ``"dgrs"``, or ``"reflection"`` with one child), descends into an accepted child and ends
    the round at a rejection (committing the residual state) or at a leaf.
    """

    num_children: int
    depth: int
    scheme: str = "dgrs"

    def __post_init__(self) -> None:
        check_positive_int(self.num_children, "num_children")
        check_positive_int(self.depth, "depth")
        if self.scheme not in ("dgrs", "reflection"):
            raise ValueError(f"scheme: expected 'dgrs' or 'reflection', got {self.scheme!r}")
        if self.scheme == "reflection" and self.num_children != 1:
            raise ValueError(
                f"num_children: reflection verifies one child, got {self.num_children}"
            )

    @property
    def label(self) -> str:
        return f"{self.scheme} tree K={self.num_children} L={self.depth}"

    def span(self, remaining: Array) -> Array:
        """Depth used with ``remaining`` steps left (the tree is truncated at the horizon)."""
        return np.asarray(np.minimum(self.depth, remaining))

    def advance(
        self,
        process: VPDiffusion,
        draft: Draft,
        steps: Array,
        states: Array,
        anchors: Array,
        depth: int,
        rng: np.random.Generator,
    ) -> _Advance:
        n, dim = states.shape
        width = self.num_children
        levels, draft_means, children = [states[:, None]], [], []
        for level in range(depth):
            means, kids = _draft_children(
                draft, process, levels[-1], steps + level, anchors, width, rng
            )
            draft_means.append(means)
            children.append(kids)
            levels.append(kids.reshape(n, -1, dim))
        internal = np.concatenate(levels[:depth], axis=1)  # (n, num_internal, d)
        sizes = [lv.shape[1] for lv in levels[:depth]]
        node_steps = steps[:, None] + np.repeat(np.arange(depth), sizes)
        target = process.target_mean(internal.reshape(-1, dim), node_steps.ravel())
        target_levels = np.split(target.reshape(internal.shape), np.cumsum(sizes)[:-1], axis=1)

        committed = np.zeros(n, dtype=np.int64)
        out_states, out_anchors = np.empty_like(states), np.empty_like(states)
        walking, node = np.arange(n), np.zeros(n, dtype=np.int64)
        for level in range(depth):
            at = node[walking]
            target_mean = target_levels[level][walking, at]
            out = continuous.verify(
                self.scheme,
                target_mean,
                draft_means[level][walking, at],
                process.stds[steps[walking] + level],
                children[level][walking, at],
                rng,
            )
            index = np.asarray(out.index)
            out_states[walking] = out.states
            out_anchors[walking] = target_mean - levels[level][walking, at]
            committed[walking] = level + 1
            accepted = index >= 0
            node[walking[accepted]] = at[accepted] * width + index[accepted]
            walking = walking[accepted]
            if walking.size == 0:
                break
        return _Advance(committed, out_states, out_anchors, internal.shape[1], sum(sizes) * width)


def dgrs_tree(num_children: int, depth: int) -> Tree:
    """A D-GRS draft tree with ``num_children`` per node and ``depth`` levels."""
    return Tree(num_children, depth, "dgrs")


class Lookahead(Protocol):
    """What a round drafts and how it verifies: a :class:`Chain` or a :class:`Tree`."""

    @property
    def label(self) -> str: ...

    def span(self, remaining: Array) -> Array: ...

    def advance(
        self,
        process: VPDiffusion,
        draft: Draft,
        steps: Array,
        states: Array,
        anchors: Array,
        depth: int,
        rng: np.random.Generator,
    ) -> _Advance: ...


__all__ = [
    "Chain",
    "ChainVerifier",
    "Lookahead",
    "Tree",
    "block_chain",
    "dgrs_tree",
    "reflection_chain",
]
