"""The scheme contract (three protocols), the verdict type and the node-by-node base class.

Every registered scheme is a round-level :class:`Scheme`; it is also exactly one of

* a :class:`TreeVerifier`: verifies a drafted tree with per-node :class:`~specsampling.Noise`
  (the ratio schemes, ``nss``, block, traversal, ...), refusing trees whose
  :class:`~specsampling.tree.DrawLaw` it is not exact for;
* a :class:`KeyedCoupling`: drafter and verifier read one keyed noise field
  (:class:`~specsampling.keyed.KeyedNoise`), so there is no tree to verify on its own
  (``gumbel``, ``poisson``, ``gls``, ``gls_strong``).

Consumers dispatch on these two types once, at their edge.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeAlias, runtime_checkable

import numpy as np

from .._types import Prefix, Probs
from ..errors import InvalidDistribution, UnsupportedShape
from ..noise import Noise
from ..ops import categorical, support, total
from ..pairs import ModelPair
from ..shapes import Shape
from ..tree import SAMPLED_LAWS, DraftTree, DrawLaw
from ..validation import check_rows

if TYPE_CHECKING:
    from ..keyed import KeyedNoise


class Verdict(NamedTuple):
    """Outcome of verifying one tree: the deepest accepted node and the next token.

    The round emits ``tree.prefix(node) + (token,)``; ``node == 0`` means no draft was accepted.
    """

    node: int
    token: int


#: Exact law of a verdict given the drafted tree.
VerdictLaw = dict[Verdict, Any]
#: Law of the verdict's node: ``{node: probability}``.
NodeLaw = dict[int, Any]


@runtime_checkable
class Scheme(Protocol):
    """What every registered scheme provides: a whole round, drafted and verified."""

    name: str
    #: Exact with ``Fraction`` inputs (only field operations and comparisons are used).
    rational: bool
    #: Paper reference, for tables and docs.
    reference: str

    def supports(self, shape: Shape) -> bool:
        """Whether the scheme is exact for rounds drafted with this shape."""
        ...

    def check(self, shape: Shape) -> None:
        """Raise :class:`~specsampling.UnsupportedShape` unless :meth:`supports` holds."""
        ...

    def outcomes(
        self, pair: ModelPair, shape: Shape, prefix: Prefix
    ) -> Iterator[tuple[DraftTree, Any, VerdictLaw]]:
        """Every draftable tree with its probability and verdict law (the exact engine's input)."""
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


@runtime_checkable
class TreeVerifier(Scheme, Protocol):
    """A scheme that verifies a given tree with per-node :class:`~specsampling.Noise`."""

    #: Draw laws the scheme is exact for on any tree (sampled chains aside, see
    #: :meth:`exact_for`).
    laws: frozenset[DrawLaw]

    def exact_for(self, law: DrawLaw, chain: bool) -> bool:
        """Whether verifying trees drawn by ``law`` (``chain``: one candidate per node) is exact."""
        ...

    def verify(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Verdict:
        """Verify ``tree`` with explicit noise. ``*_probs[n]`` is the distribution after node n.

        Refuses (:class:`~specsampling.UnsupportedShape`) a tree whose law it is not exact for.
        """
        ...

    def verdict_law(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> VerdictLaw:
        """Exact law of :meth:`verify`'s output over the noise, given ``tree`` (same refusals)."""
        ...


@runtime_checkable
class KeyedCoupling(Scheme, Protocol):
    """A list coupling: drafter and verifier read the same keyed noise field."""

    #: ``True``: the output is seeded target-only decoding whatever the drafter; ``False``:
    #: it depends on the draft tokens, never on the draft probabilities.
    strong_invariance: bool

    def rows(self, shape: Shape) -> int:
        """Rows of keyed exponentials per position (``K`` for GLS, else one)."""
        ...

    def sample_keyed(
        self, pair: ModelPair, shape: Shape, noise: KeyedNoise, prefix: Prefix = ()
    ) -> tuple[DraftTree, Verdict]:
        """One round with the given keyed noise: draft from it, then walk the target's path."""
        ...


#: A registered scheme name or a scheme object, as every public entry point accepts.
SchemeLike: TypeAlias = "str | Scheme"


def tables(pair: ModelPair, tree: DraftTree, prefix: Prefix = ()) -> tuple[Probs, Probs]:
    """Stack ``(target_probs, draft_probs)`` of shape ``(num_nodes, vocab_size)`` for ``tree``."""
    prefixes = [prefix + tree.prefix(n) for n in range(tree.num_nodes)]
    target = np.stack([pair.target(p) for p in prefixes])
    draft = np.stack([pair.draft(p) for p in prefixes])
    return target, draft


def check_round(
    tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise | None = None
) -> None:
    """Check that tables and noise fit ``tree``: one row per node, each row a distribution
    (:func:`~specsampling.validation.check_rows`: no NaN, no negative entry, mass one), every
    token id in range. Vectorised over the tables; raises
    :class:`~specsampling.InvalidDistribution` naming the argument.
    """
    num_nodes = tree.num_nodes
    for name, table in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if not isinstance(table, np.ndarray) or table.ndim != 2 or len(table) != num_nodes:
            raise InvalidDistribution(
                f"{name}: expected an array of shape ({num_nodes}, vocab_size), got "
                f"{type(table).__name__} of shape {np.shape(table)}"
            )
    vocab_size = target_probs.shape[1]
    check_rows(target_probs, "target_probs")
    check_rows(draft_probs, "draft_probs", vocab_size)
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

    def support_text(self) -> str:
        """What the scheme is exact for, in words (for refusals)."""
        return "see its documentation page"

    def check(self, shape: Shape) -> None:
        """Raise :class:`UnsupportedShape` unless the scheme is exact for ``shape``."""
        if not self.supports(shape):
            raise UnsupportedShape(
                f"scheme {self.name!r} is not exact for drafts of shape {shape!r} "
                f"(draft law {shape.law.value!r}); it is exact for {self.support_text()}"
            )

    def single_shape(self, num_drafts: int) -> Shape:
        return Shape.star(num_drafts, replacement=True)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return None

    def __repr__(self) -> str:
        return f"<scheme {self.name!r}>"


class TreeScheme(SchemeDefaults):
    """The :class:`TreeVerifier` base: law-based support, drafting, sampling and refusals.

    A subclass declares the draw laws it is exact for in :attr:`laws` (and whether it verifies
    sampled chains, :attr:`chains`); :meth:`supports` (shapes) and :meth:`check_tree` (trees given
    to :meth:`verify` and :meth:`verdict_law`) both follow from :meth:`exact_for`.
    """

    laws: ClassVar[frozenset[DrawLaw]] = frozenset()
    #: Exact on sampled chains (one candidate per node, a plain draw from the draft).
    chains: ClassVar[bool] = True

    def exact_for(self, law: DrawLaw, chain: bool) -> bool:
        return law in self.laws or (self.chains and chain and law in SAMPLED_LAWS)

    def supports(self, shape: Shape) -> bool:
        return self.exact_for(shape.law, shape.is_chain)

    def support_text(self) -> str:
        parts = ["sampled chains"] if self.chains else []
        if self.laws:
            names = ", ".join(sorted(law.value for law in self.laws))
            parts.append(f"trees drawn by law {names}")
        return " and ".join(parts) or "no draft law"

    def check_tree(self, tree: DraftTree) -> None:
        """Raise :class:`UnsupportedShape` unless the scheme is exact for ``tree.law``."""
        if not self.exact_for(tree.law, tree.is_chain):
            shape = "chain" if tree.is_chain else "tree"
            raise UnsupportedShape(
                f"scheme {self.name!r} is not exact for a {shape} drawn by law "
                f"{tree.law.value!r}; it is exact for {self.support_text()} (state the law of a "
                "hand-built tree: DraftTree(..., law=...))"
            )

    def check_round(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise | None = None
    ) -> None:
        """What :meth:`verify` and :meth:`verdict_law` check first: the law, then the tables."""
        self.check_tree(tree)
        check_round(tree, target_probs, draft_probs, noise)

    @abstractmethod
    def verify(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Verdict:
        """Verify ``tree`` with explicit noise. ``*_probs[n]`` is the distribution after node n."""

    @abstractmethod
    def verdict_law(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> VerdictLaw:
        """Exact law of :meth:`verify`'s output over the noise, given ``tree``."""

    def verdict_nodes(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> NodeLaw:
        """Exact law of the verdict's *node* (the deepest accepted node), given ``tree``.

        The marginal of :meth:`verdict_law` over the emitted token, without listing tokens:
        what a Rao-Blackwellised estimate of the block efficiency needs,
        ``E[tau + 1 | tree] = sum_v P(v) (depth(v) + 1)``. This default sums
        :meth:`verdict_law`; top-down schemes and traversal compute it directly.
        """
        law: NodeLaw = {}
        for verdict, prob in self.verdict_law(tree, target_probs, draft_probs).items():
            law[verdict.node] = law.get(verdict.node, 0) + prob
        return law

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
        self.check_round(tree, target_probs, draft_probs, noise)
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
        self.check_round(tree, target_probs, draft_probs)
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

    def verdict_nodes(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> NodeLaw:
        self.check_round(tree, target_probs, draft_probs)
        law: NodeLaw = {}
        pending: list[tuple[int, Any]] = [(0, 1)]
        while pending:
            node, weight = pending.pop()
            if not tree.candidates[node]:
                law[node] = law.get(node, 0) + weight
                continue
            descend, stop = self.node_law(tree, node, target_probs, draft_probs)
            pending.extend((child, weight * prob) for child, prob in descend if prob > 0)
            staying = total(stop)
            for token in dict.fromkeys(tree.tokens[c] for c in tree.candidates[node]):
                mass = stop[token]
                if mass > 0:  # a residual hit descends into the child holding the token
                    hit = tree.child_with_token(node, int(token))
                    assert hit is not None
                    pending.append((hit, weight * mass))
                    staying = staying - mass
            law[node] = law.get(node, 0) + weight * staying
        return law
