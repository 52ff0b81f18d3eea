"""The scheme contract, the verdict type and the node-by-node base class."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .._types import Prefix, Probs
from ..errors import InvalidDistribution, UnsupportedShape
from ..noise import Noise
from ..ops import categorical, support
from ..pairs import ModelPair
from ..shapes import Shape
from ..tree import DraftTree


class Verdict(NamedTuple):
    """Outcome of verifying one tree: the deepest accepted node and the next token.

    The round emits ``tree.prefix(node) + (token,)``; ``node == 0`` means no draft was accepted.
    """

    node: int
    token: int


#: Exact law of a verdict given the drafted tree.
VerdictLaw = dict[Verdict, Any]


@runtime_checkable
class Scheme(Protocol):
    """What every registered verification scheme provides."""

    name: str
    #: Exact with ``Fraction`` inputs (only field operations and comparisons are used).
    rational: bool
    #: Paper reference, for tables and docs.
    reference: str

    def supports(self, shape: Shape) -> bool:
        """Whether the scheme is exact for drafts of this shape."""
        ...

    def verify(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Verdict:
        """Verify ``tree`` with explicit noise. ``*_probs[n]`` is the distribution after node n."""
        ...

    def verdict_law(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> VerdictLaw:
        """Exact law of :meth:`verify`'s output over the noise, given ``tree``."""
        ...

    def outcomes(
        self, pair: ModelPair, shape: Shape, prefix: Prefix
    ) -> Iterator[tuple[DraftTree, Any, VerdictLaw]]:
        """Every draftable tree with its probability and verdict law."""
        ...

    def sample(
        self, pair: ModelPair, shape: Shape, rng: np.random.Generator, prefix: Prefix
    ) -> tuple[DraftTree, Verdict]:
        """One sampled round: draft, draw noise, verify."""
        ...

    def single_shape(self, num_drafts: int) -> Shape:
        """The scheme's own draft law for ``num_drafts`` candidates at one position."""
        ...

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        """Single-position acceptance in closed form, or ``None`` when there is none."""
        ...


def tables(pair: ModelPair, tree: DraftTree, prefix: Prefix = ()) -> tuple[Probs, Probs]:
    """Stack ``(target_probs, draft_probs)`` of shape ``(num_nodes, vocab_size)`` for ``tree``."""
    prefixes = [prefix + tree.prefix(n) for n in range(tree.num_nodes)]
    target = np.stack([pair.target(p) for p in prefixes])
    draft = np.stack([pair.draft(p) for p in prefixes])
    return target, draft


def check_round(
    tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise | None = None
) -> None:
    """Check that tables and noise fit ``tree``: one row per node, every token id in range.

    Cheap (no pass over the probabilities); :mod:`specsampling.validation` checks the rows when
    pairs are built. Raises :class:`~specsampling.InvalidDistribution` naming the argument.
    """
    num_nodes = tree.num_nodes
    for name, table in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if np.ndim(table) != 2 or len(table) != num_nodes:
            raise InvalidDistribution(
                f"{name}: expected shape ({num_nodes}, vocab_size), got {np.shape(table)}"
            )
    vocab_size = target_probs.shape[1]
    if draft_probs.shape[1] != vocab_size:
        raise InvalidDistribution(
            f"draft_probs: vocabulary mismatch, {draft_probs.shape[1]} vs {vocab_size}"
        )
    if max(tree.tokens) >= vocab_size:
        raise InvalidDistribution(f"tree: token id {max(tree.tokens)} >= vocab_size {vocab_size}")
    if noise is not None:
        Noise.checked(noise.accept, noise.sample, num_nodes)


class SchemeDefaults(ABC):
    """What every concrete scheme shares: metadata, refusal and single-position defaults."""

    name = ""
    rational = True
    reference = ""

    @abstractmethod
    def supports(self, shape: Shape) -> bool:
        """Whether the scheme is exact for drafts of this shape."""

    def check(self, shape: Shape) -> None:
        """Raise :class:`UnsupportedShape` unless the scheme is exact for ``shape``."""
        if not self.supports(shape):
            raise UnsupportedShape(
                f"scheme {self.name!r} is not exact for drafts of shape {shape!r} "
                f"(draft law {shape.law!r})"
            )

    def single_shape(self, num_drafts: int) -> Shape:
        return Shape.star(num_drafts, replacement=True)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return None

    def __repr__(self) -> str:
        return f"<scheme {self.name!r}>"


class TreeScheme(SchemeDefaults):
    """Default drafting, sampling and refusal logic shared by the tree schemes."""

    @abstractmethod
    def verify(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Verdict:
        """Verify ``tree`` with explicit noise. ``*_probs[n]`` is the distribution after node n."""

    @abstractmethod
    def verdict_law(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> VerdictLaw:
        """Exact law of :meth:`verify`'s output over the noise, given ``tree``."""

    def outcomes(
        self, pair: ModelPair, shape: Shape, prefix: Prefix
    ) -> Iterator[tuple[DraftTree, Any, VerdictLaw]]:
        self.check(shape)
        for tree, weight in shape.enumerate(pair, prefix):
            yield tree, weight, self.verdict_law(tree, *tables(pair, tree, prefix))

    def sample(
        self, pair: ModelPair, shape: Shape, rng: np.random.Generator, prefix: Prefix
    ) -> tuple[DraftTree, Verdict]:
        self.check(shape)
        tree = shape.draft(pair, rng, prefix)
        noise = Noise.draw(rng, tree.num_nodes)
        return tree, self.verify(tree, *tables(pair, tree, prefix), noise)


#: Per-node decision of a top-down scheme: the child to descend into, or the token to emit.
Step = tuple[int | None, int | None]


class NodeScheme(TreeScheme):
    """A scheme that decides node by node, top-down: descend into a candidate or stop.

    Subclasses give the per-node rule twice, as a sampled decision (:meth:`node_verify`) and as
    its exact law (:meth:`node_law`). At a node without candidates the bonus token is drawn
    from the target after that node. A token emitted at a node that equals one of its drafted
    children (a residual "hit") descends into that child: the subtree below it was drafted
    given that token alone, so verifying it keeps the output exact and never lowers acceptance.
    """

    @abstractmethod
    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        """Decide at a node with candidates: ``(child, None)`` descends, ``(None, token)`` stops."""

    @abstractmethod
    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        """``([(child, P(descend)), ...], stop)`` with ``stop[t] = P(emit t here)``."""

    def bonus(self, tree: DraftTree, node: int, target_probs: Probs) -> Probs:
        """Distribution of the bonus token at a node without candidates."""
        bonus: Probs = target_probs[node]
        return bonus

    def verify(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Verdict:
        check_round(tree, target_probs, draft_probs, noise)
        node = 0
        while True:
            if not tree.candidates[node]:
                bonus = self.bonus(tree, node, target_probs)
                return Verdict(node, categorical(bonus, noise.sample[node]))
            child, token = self.node_verify(tree, node, target_probs, draft_probs, noise)
            if child is None:
                assert token is not None
                child = tree.child_with_token(node, token)
                if child is None:
                    return Verdict(node, token)
            node = child

    def verdict_law(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> VerdictLaw:
        check_round(tree, target_probs, draft_probs)
        law: VerdictLaw = {}
        pending: list[tuple[int, Any]] = [(0, 1)]
        while pending:
            node, weight = pending.pop()
            if tree.candidates[node]:
                descend, stop = self.node_law(tree, node, target_probs, draft_probs)
            else:
                descend, stop = [], self.bonus(tree, node, target_probs)
            pending.extend((child, weight * prob) for child, prob in descend if prob > 0)
            for token in support(stop):
                hit = tree.child_with_token(node, int(token))
                if hit is not None:
                    pending.append((hit, weight * stop[token]))
                    continue
                verdict = Verdict(node, int(token))
                law[verdict] = law.get(verdict, 0) + weight * stop[token]
        return law
