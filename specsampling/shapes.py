"""Draft shapes: how a round drafts a tree, and the exact law of every tree it can draft.

A shape is a static plan of *draw steps*. Step ``s`` draws one token below the node produced by
its parent step (the root for ``-1``) in one of four modes:

* ``iid`` -- from the draft distribution ``q(. | node)``;
* ``without`` -- from ``q`` with the node's earlier candidates removed and renormalised (skipped,
  with its descendants, once the draft's support is exhausted);
* ``top`` -- deterministically, the most probable draft token not yet a child (ties: lowest id);
* ``hub`` -- the draft's most probable token (the hub) if it is not yet a child, otherwise a
  draw from ``q`` without the node's earlier candidates (SpecHub's second draft).

Draws of a token the node already has add that child to the node's candidate list again, so
i.i.d. children keep their multiplicity (see :class:`~specsampling.tree.DraftTree`). Every tree a
shape drafts or enumerates carries the shape's :class:`~specsampling.tree.DrawLaw`, so verifiers
called on it directly can refuse laws they are not exact for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ._types import Prefix, Probs, Scalar
from .errors import InvalidDistribution
from .ops import categorical, support
from .pairs import ModelPair
from .tree import DraftTree, DrawLaw
from .validation import check_positive_int

Mode = Literal["iid", "without", "top", "hub"]
#: ``choose(proposal, node_path, step)``: the drawn tokens with their weights.
Chooser = Callable[[Probs, Prefix, int], Iterable[tuple[int, Scalar]]]


@dataclass(frozen=True)
class Shape:
    """A drafting plan. Build one with the class methods, e.g. ``Shape.paths(2, 3)``.

    Attributes
    ----------
    kind, params
        The constructor and its arguments (also the ``repr``).
    steps
        ``(parent_step, mode)`` per draw step, parents before children.
    law
        The :class:`~specsampling.tree.DrawLaw` of sibling candidates: ``IID``, ``WITHOUT``,
        ``DETERMINISTIC`` (``top``), or the schemes' own ``GREEDY`` and ``HUB``.
    is_chain
        Every node has at most one candidate and drafts are sampled: a single path.
    """

    kind: str
    params: tuple[Any, ...]
    steps: tuple[tuple[int, Mode], ...]
    law: DrawLaw
    is_chain: bool

    def __repr__(self) -> str:
        return f"{self.kind}({', '.join(repr(p) for p in self.params)})"

    # ------------------------------------------------------------------ constructors
    @classmethod
    def chain(cls, length: int) -> Shape:
        """One path of ``length`` tokens drafted autoregressively from ``q``.

        >>> Shape.chain(3).depth
        3
        """
        length = check_positive_int(length, "length")
        return cls("chain", (length,), _path_steps(-1, length), DrawLaw.IID, True)

    @classmethod
    def star(cls, num_drafts: int, replacement: bool = True) -> Shape:
        """``num_drafts`` candidates at one position, i.i.d. or without replacement.

        >>> Shape.star(4, replacement=False)
        star(4, replacement=False)
        """
        k = check_positive_int(num_drafts, "num_drafts")
        replacement = _check_bool(replacement, "replacement")
        mode: Mode = "iid" if replacement else "without"
        law = DrawLaw.IID if replacement else DrawLaw.WITHOUT
        return cls("star", (k, _Kw("replacement", replacement)), ((-1, mode),) * k, law, k == 1)

    @classmethod
    def paths(cls, num_drafts: int, length: int) -> Shape:
        """``num_drafts`` i.i.d. paths of ``length`` tokens merged into a trie."""
        k = check_positive_int(num_drafts, "num_drafts")
        length = check_positive_int(length, "length")
        steps: list[tuple[int, Mode]] = []
        for _ in range(k):
            steps.extend(_path_steps(-1, length, offset=len(steps)))
        return cls("paths", (k, length), tuple(steps), DrawLaw.IID, k == 1)

    @classmethod
    def branching(cls, widths: Sequence[int], replacement: bool = False) -> Shape:
        """``widths[d]`` children below every node of depth ``d`` (default without replacement)."""
        widths = _check_widths(widths)
        replacement = _check_bool(replacement, "replacement")
        mode: Mode = "iid" if replacement else "without"
        law = DrawLaw.IID if replacement else DrawLaw.WITHOUT
        steps = _level_steps(widths, mode)
        chain = all(w == 1 for w in widths)
        return cls("branching", (widths, _Kw("replacement", replacement)), steps, law, chain)

    @classmethod
    def delayed(cls, num_drafts: int, trunk: int, branch: int) -> Shape:
        """Delayed tree expansion: one trunk path, then ``num_drafts`` i.i.d. branch paths."""
        k = check_positive_int(num_drafts, "num_drafts")
        trunk = check_positive_int(trunk, "trunk", minimum=0)
        branch = check_positive_int(branch, "branch")
        steps = list(_path_steps(-1, trunk))
        for _ in range(k):
            steps.extend(_path_steps(trunk - 1, branch, offset=len(steps)))
        params = (k, _Kw("trunk", trunk), _Kw("branch", branch))
        return cls("delayed", params, tuple(steps), DrawLaw.IID, k == 1)

    @classmethod
    def top(cls, widths: Sequence[int]) -> Shape:
        """Deterministic tree of the draft's top ``widths[d]`` tokens per node (EAGLE style)."""
        widths = _check_widths(widths)
        return cls("top", (widths,), _level_steps(widths, "top"), DrawLaw.DETERMINISTIC, False)

    @classmethod
    def greedy(cls, widths: Sequence[int]) -> Shape:
        """Greedy multi-draft (Hu et al. 2025): per node of depth ``d``, the draft's top
        ``widths[d] - 1`` tokens plus one draw from ``q`` restricted to the other tokens.

        >>> Shape.greedy((3,)).steps
        ((-1, 'top'), (-1, 'top'), (-1, 'without'))
        """
        widths = _check_widths(widths)
        steps = _level_steps(widths, "top", last="without")
        return cls("greedy", (widths,), steps, DrawLaw.GREEDY, all(w == 1 for w in widths))

    @classmethod
    def hub(cls, depth: int = 1) -> Shape:
        """SpecHub's two-draft law per node: ``x1 ~ q``, then the hub ``a = argmax q`` if
        ``x1 != a``, else ``x2 ~ q`` without ``a``; nodes of depth below ``depth`` branch."""
        depth = check_positive_int(depth, "depth")
        steps = _level_steps((2,) * depth, "iid", last="hub")
        return cls("hub", (depth,), steps, DrawLaw.HUB, False)

    # ------------------------------------------------------------------ queries
    @property
    def depth(self) -> int:
        """Maximum number of drafted tokens on a path."""
        depths: list[int] = []
        for parent, _ in self.steps:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths)

    @property
    def level_widths(self) -> tuple[int, ...] | None:
        """Children per node at each depth when every node of a depth has the same number of
        draw steps (chains, stars, ``branching``, ``top``, ``greedy``); else ``None``.

        >>> Shape.star(3, replacement=False).level_widths, Shape.branching((2, 1)).level_widths
        ((3,), (2, 1))
        >>> Shape.paths(2, 2).level_widths  # structurally branching((2, 1), replacement=True)
        (2, 1)
        """
        below: dict[int, list[int]] = {}
        for step, (parent, _) in enumerate(self.steps):
            below.setdefault(parent, []).append(step)
        widths: list[int] = []
        level = [-1]
        while any(node in below for node in level):
            counts = {len(below.get(node, ())) for node in level}
            if len(counts) != 1:
                return None
            widths.append(counts.pop())
            level = [child for node in level for child in below[node]]
        return tuple(widths)

    @property
    def root_paths(self) -> tuple[int, ...] | None:
        """Lengths of the i.i.d. paths when the shape is paths drafted independently from the
        root and merged into a trie (``paths``, i.i.d. ``star``, ``chain``, ``delayed`` without a
        trunk); else ``None``.

        >>> Shape.delayed(2, trunk=0, branch=2).root_paths == Shape.paths(2, 2).root_paths
        True
        >>> Shape.star(2).root_paths, Shape.delayed(2, trunk=1, branch=1).root_paths
        ((1, 1), None)
        """
        if any(mode != "iid" for _, mode in self.steps):
            return None
        children: dict[int, int] = {}
        lengths: list[int] = []
        for step, (parent, _) in enumerate(self.steps):
            if parent < 0:
                lengths.append(1)
            elif children.get(parent, 0) or parent != step - 1:
                return None
            else:
                lengths[-1] += 1
            children[parent] = children.get(parent, 0) + 1
        return tuple(lengths)

    def count_trees(self, support_size: int) -> int:
        """Upper bound on the trees :meth:`enumerate` yields when every draft has
        ``support_size`` tokens of positive probability: an i.i.d. or hub step has
        ``support_size`` outcomes, the ``i``-th sibling drawn without replacement
        ``support_size - i`` (at least one: exhausted steps are skipped), a top step one.

        >>> Shape.star(2, replacement=False).count_trees(3), Shape.paths(2, 2).count_trees(3)
        (6, 81)
        """
        bound = 1
        siblings: dict[int, int] = {}
        for parent, mode in self.steps:
            index = siblings.get(parent, 0)
            siblings[parent] = index + 1
            if mode in ("iid", "hub"):
                bound *= support_size
            elif mode == "without":
                bound *= max(1, support_size - index)
        return bound

    def draft(self, pair: ModelPair, rng: np.random.Generator, prefix: Prefix = ()) -> DraftTree:
        """Draft one tree after ``prefix``, drawing each token by inverse CDF from ``rng``."""

        def choose(probs: Probs, path: Prefix, step: int) -> Iterable[tuple[int, Scalar]]:
            return ((categorical(probs, float(rng.random())), 1),)

        tree, _ = next(self._grow(pair, tuple(prefix), choose))
        return tree

    def draft_with(
        self, pair: ModelPair, pick: Callable[[Probs, Prefix, int], int], prefix: Prefix = ()
    ) -> DraftTree:
        """Draft one tree choosing each token with ``pick(proposal, node_path, step)``.

        ``proposal`` is the step's law at the node (``q`` for ``iid``, ``q`` without the node's
        earlier candidates for ``without``), ``node_path`` the node's tokens after ``prefix`` and
        ``step`` the index into :attr:`steps`. Keyed couplings use it to draft from their shared
        noise: the race winner ``argmin E / proposal`` is an exact draw from ``proposal``.

        >>> from specsampling.pairs import Stationary
        >>> pair = Stationary([0.5, 0.5], [0.25, 0.75])
        >>> most_likely = lambda proposal, path, step: int(proposal.argmax())
        >>> Shape.star(2, replacement=False).draft_with(pair, most_likely).tokens
        (-1, 1, 0)
        """

        def choose(probs: Probs, path: Prefix, step: int) -> Iterable[tuple[int, Scalar]]:
            return ((pick(probs, path, step), 1),)

        tree, _ = next(self._grow(pair, tuple(prefix), choose))
        return tree

    def draft_with_noise(self, pair: ModelPair, noise: Any, prefix: Prefix = ()) -> DraftTree:
        """Draft one tree after ``prefix`` from explicit drafting noise.

        Parameters
        ----------
        pair : ModelPair
            Only its draft distributions are read.
        noise : array_like of float, shape (len(steps),)
            The drafting noise: one uniform in ``[0, 1)`` per draw step, in :attr:`steps`
            order. Step ``s`` draws its token by inverse CDF
            (:func:`~specsampling.ops.categorical`, clipped to the last token of positive mass)
            from its proposal with ``noise[s]``. A step that draws deterministically (``top``,
            and ``hub`` when it takes the hub) or is skipped (its parent was skipped, or
            ``without``/``top`` found the draft's support exhausted) leaves its uniform unread,
            so the layout does not depend on the tree drafted.
        prefix : tuple of int
            The context drafted after.

        Returns
        -------
        DraftTree
            The tree :meth:`draft` would draw had its generator returned these uniforms, with
            the shape's law. Fed the same noise, :func:`specsampling.gpu.drafting.draft` (the
            tensor drafter) returns the same tree.

        Examples
        --------
        >>> from specsampling.pairs import Stationary
        >>> pair = Stationary([0.5, 0.5], [0.25, 0.75])
        >>> Shape.star(2, replacement=False).draft_with_noise(pair, [0.1, 0.9]).tokens
        (-1, 0, 1)
        >>> Shape.chain(2).draft_with_noise(pair, [0.3, 0.2]).tokens  # 0.3 >= q(0) = 0.25
        (-1, 1, 0)
        """
        uniforms = np.asarray(noise, dtype=np.float64)
        if uniforms.shape != (len(self.steps),):
            raise ValueError(
                f"noise: expected {len(self.steps)} uniforms (one per draw step of {self!r}), "
                f"got shape {uniforms.shape}"
            )
        if not bool(np.all((uniforms >= 0) & (uniforms < 1))):
            raise ValueError("noise: uniforms must lie in [0, 1)")

        def choose(probs: Probs, path: Prefix, step: int) -> Iterable[tuple[int, Scalar]]:
            return ((categorical(probs, float(uniforms[step])), 1),)

        tree, _ = next(self._grow(pair, tuple(prefix), choose))
        return tree

    def enumerate(self, pair: ModelPair, prefix: Prefix = ()) -> Iterator[tuple[DraftTree, Any]]:
        """Every tree this shape can draft after ``prefix``, with its exact probability.

        The probabilities are products of draft probabilities, so exact (``Fraction``) pairs give
        exact weights. Exponential in the number of steps: meant for small vocabularies.

        >>> from specsampling.pairs import Stationary
        >>> from fractions import Fraction as F
        >>> pair = Stationary([F(1, 2), F(1, 2)], [F(1, 4), F(3, 4)])
        >>> [(t.tokens, w) for t, w in Shape.star(2, replacement=False).enumerate(pair)]
        [((-1, 0, 1), Fraction(1, 4)), ((-1, 1, 0), Fraction(3, 4))]
        """

        def choose(probs: Probs, path: Prefix, step: int) -> Iterable[tuple[int, Scalar]]:
            return ((int(t), probs[t]) for t in support(probs))

        return self._grow(pair, tuple(prefix), choose)

    # ------------------------------------------------------------------ machinery
    def _grow(
        self, pair: ModelPair, prefix: Prefix, choose: Chooser
    ) -> Iterator[tuple[DraftTree, Any]]:
        """Depth-first over the steps, in ``choose`` order; a stack, not recursion, so shapes
        of many steps do not hit the interpreter's recursion limit."""
        pending: list[tuple[int, _State, Any]] = [(0, _State((), (), {0: ()}, {0: ()}), 1)]
        while pending:
            step, state, weight = pending.pop()
            if step == len(self.steps):
                yield DraftTree.from_draws(state.draws, self.law), weight
                continue
            parent_step, mode = self.steps[step]
            node = 0 if parent_step < 0 else state.node_of_step[parent_step]
            proposal = None if node is None else _proposal(pair, prefix, state, node, mode)
            if node is None or proposal is None:
                pending.append((step + 1, state.skip(), weight))
                continue
            assert node is not None
            grown = [
                (step + 1, state.add(node, token), weight * prob)
                for token, prob in choose(proposal, state.prefixes[node], step)
            ]
            pending.extend(reversed(grown))


@dataclass(frozen=True)
class _State:
    draws: tuple[tuple[int, int], ...]
    node_of_step: tuple[int | None, ...]
    prefixes: dict[int, Prefix]
    child_tokens: dict[int, tuple[int, ...]]

    def skip(self) -> _State:
        return _State(self.draws, (*self.node_of_step, None), self.prefixes, self.child_tokens)

    def add(self, node: int, token: int) -> _State:
        prefixes = self.prefixes
        child_tokens = dict(self.child_tokens)
        child = next((c for c, p in prefixes.items() if p == (*prefixes[node], token)), None)
        if child is None:
            child = len(prefixes)
            prefixes = {**prefixes, child: (*prefixes[node], token)}
            child_tokens[child] = ()
        child_tokens[node] = (*child_tokens[node], token)
        draws = (*self.draws, (node, token))
        return _State(draws, (*self.node_of_step, child), prefixes, child_tokens)


def _proposal(pair: ModelPair, prefix: Prefix, state: _State, node: int, mode: Mode) -> Any:
    context = prefix + state.prefixes[node]
    draft = pair.draft(context)
    check_draft_row(draft, f"pair: draft{context}")
    if mode == "iid":
        return draft
    remaining = draft.copy()
    for token in state.child_tokens[node]:
        remaining[token] = 0 * remaining[token]
    if not remaining.sum() > 0:
        return None
    if mode == "hub":
        hub = int(np.argmax(_as_float(draft)))
        if hub not in state.child_tokens[node]:
            mode = "top"
            remaining = draft
        else:
            mode = "without"
    if mode == "without":
        return remaining / remaining.sum()
    best = int(np.argmax(_as_float(remaining)))
    one_hot = np.zeros_like(draft)
    one_hot[best] = 1
    return one_hot


def check_draft_row(draft: Any, where: str) -> None:
    """Refuse a float draft row with a NaN, an infinite or a negative entry, or no positive
    mass, naming it as ``where`` (an inverse CDF over it would return some token, or a ``top``
    step skip, without error; exact rows are checked by the pair's own constructors). The
    reference drafting and the tensor drafter's pair source share it."""
    row = np.asarray(draft)
    if row.dtype == object:
        return
    total = row.sum()  # finite with a non-negative minimum: every entry finite, non-negative
    if not (row.size and row.min() >= 0 and np.isfinite(total)):
        raise InvalidDistribution(f"{where} has a NaN, infinite or negative entry")
    if not total > 0:
        raise InvalidDistribution(f"{where} has no positive mass")


def _as_float(probs: Probs) -> Any:
    return np.asarray([float(x) for x in probs]) if probs.dtype == object else probs


def _path_steps(parent: int, length: int, offset: int = 0) -> tuple[tuple[int, Mode], ...]:
    return tuple((parent if i == 0 else offset + i - 1, "iid") for i in range(length))


def _level_steps(
    widths: tuple[int, ...], mode: Mode, last: Mode | None = None
) -> tuple[tuple[int, Mode], ...]:
    """Steps of a tree with ``widths[d]`` draws below each node of depth ``d``; ``last``
    overrides the mode of each node's last draw."""
    steps: list[tuple[int, Mode]] = []
    level = [-1]
    for width in widths:
        next_level = []
        for parent in level:
            for i in range(width):
                next_level.append(len(steps))
                group_mode = last if last is not None and i == width - 1 else mode
                steps.append((parent, group_mode))
        level = next_level
    return tuple(steps)


def check_shape(shape: Any, name: str = "shape") -> Shape:
    """``shape`` if it is a :class:`Shape`; a clear :class:`TypeError` otherwise.

    >>> check_shape("chain(2)")
    Traceback (most recent call last):
    ...
    TypeError: shape: expected a specsampling.Shape, got 'chain(2)'
    """
    if not isinstance(shape, Shape):
        raise TypeError(f"{name}: expected a specsampling.Shape, got {shape!r}")
    return shape


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def _check_widths(widths: Sequence[int]) -> tuple[int, ...]:
    widths = tuple(widths)
    if not widths:
        raise ValueError("widths: needs at least one depth")
    return tuple(check_positive_int(w, f"widths[{i}]") for i, w in enumerate(widths))


@dataclass(frozen=True)
class _Kw:
    name: str
    value: Any

    def __repr__(self) -> str:
        return f"{self.name}={self.value!r}"
