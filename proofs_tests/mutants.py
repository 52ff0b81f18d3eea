"""A catalogue of known-buggy scheme variants, each with a case that must expose it.

Every mutant subclasses a real scheme and changes one rule. Where it overrides the sampled
decision it overrides the exact law too, so :meth:`verify`/:meth:`sample` and
:meth:`verdict_law`/:meth:`outcomes` implement the *same* bug (``test_mutants.py`` checks that by
sampling). Mutants are never registered in ``specsampling.SCHEMES``.

Where a peer shipped the bug, its public issue is named (``owner/repo#number``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

import specsampling as ss
from proofs_tests.strategies import table
from specsampling.noise import Noise
from specsampling.ops import (
    accept_probability,
    accepts,
    categorical,
    positive_part,
    remove_token,
    residual,
    total,
)
from specsampling.pairs import ModelPair, Stationary
from specsampling.schemes import tables
from specsampling.schemes.base import Step
from specsampling.schemes.rsd import RSD
from specsampling.schemes.specinfer import SpecInfer
from specsampling.schemes.standard import Standard
from specsampling.tree import DrawLaw

F = Fraction
Probs = Any


#: The draw laws the (d)/(e) mutants claim: both, although each scheme is exact for one.
_WIDENED = frozenset({DrawLaw.IID, DrawLaw.WITHOUT})


# --------------------------------------------------------------------------- standard mutants
class _StandardMutant(Standard):
    """Standard with its accept test, residual and bonus as hooks, in pairs: the sampled rule
    and its exact law (the scheme itself has no hooks; a mutant overrides one pair)."""

    def accepts(self, u: float, target_x: Any, draft_x: Any) -> bool:
        return accepts(u, target_x, draft_x)

    def accept_probability(self, target_x: Any, draft_x: Any) -> Any:
        return accept_probability(target_x, draft_x)

    def residual(self, target: Probs, draft: Probs) -> Probs:
        return residual(target, draft)

    def draw_residual(self, target: Probs, draft: Probs, u: float) -> int:
        return categorical(self.residual(target, draft), u)

    def node_law(
        self, tree: ss.DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        (child,) = tree.candidates[node]
        token = tree.tokens[child]
        target, draft = target_probs[node], draft_probs[node]
        accept = self.accept_probability(target[token], draft[token])
        return [(child, accept)], (1 - accept) * self.residual(target, draft)

    def node_verify(
        self, tree: ss.DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        (child,) = tree.candidates[node]
        token = tree.tokens[child]
        target, draft = target_probs[node], draft_probs[node]
        if self.accepts(noise.accept[child], target[token], draft[token]):
            return child, None
        return None, self.draw_residual(target, draft, noise.sample[node])


class UnnormalisedResidual(_StandardMutant):
    """(a) The residual ``(p - q)_+`` is not normalised and is drawn by inverse CDF against the
    raw uniform; an overrun falls back to the last valid id (as
    SGLang's and FlashInfer's residual fallbacks do)."""

    name = "mutant-unnormalised-residual"

    def draw_residual(self, target: Probs, draft: Probs, u: float) -> int:
        weights = positive_part(target - draft)
        if not total(weights) > 0:
            return categorical(target, u)
        index = int(np.searchsorted(np.cumsum(weights), u, side="right"))
        return min(index, int(np.flatnonzero(np.asarray(weights > 0, dtype=bool))[-1]))

    def residual(self, target: Probs, draft: Probs) -> Probs:
        weights = positive_part(target - draft)
        mass = total(weights)
        if not mass > 0:
            return target
        last = int(np.flatnonzero(np.asarray(weights > 0, dtype=bool))[-1])
        weights[last] = weights[last] + (1 - mass)
        return weights


class InvertedRatio(_StandardMutant):
    """(b) Accept with ``min(1, q(x)/p(x))`` (p and q swapped, as when a port misreads letters)."""

    name = "mutant-inverted-ratio"

    def accepts(self, u: float, target_x: Any, draft_x: Any) -> bool:
        return accepts(u, draft_x, target_x)

    def accept_probability(self, target_x: Any, draft_x: Any) -> Any:
        return accept_probability(draft_x, target_x)


class ParentBonus(_StandardMutant):
    """(f) The bonus token is drawn from the parent's target instead of the leaf's."""

    name = "mutant-parent-bonus"

    def bonus(self, tree: ss.DraftTree, node: int, target_probs: Probs) -> Probs:
        return target_probs[max(tree.parents[node], 0)]


class InclusiveAccept(_StandardMutant):
    """(g) Inclusive accept test ``u q(x) <= p(x)`` (sgl-project/sglang#35771): same law, wrong
    at ``u = 0``."""

    name = "mutant-inclusive-accept"

    def accepts(self, u: float, target_x: Any, draft_x: Any) -> bool:
        return bool(u * draft_x <= target_x)


class AlwaysAccept(_StandardMutant):
    """The uniform hard-coded to 0 (vllm-project/vllm-ascend#13730): every token with
    ``p(x) > 0`` is accepted."""

    name = "mutant-always-accept"

    def accepts(self, u: float, target_x: Any, draft_x: Any) -> bool:
        return accepts(0.0, target_x, draft_x)

    def accept_probability(self, target_x: Any, draft_x: Any) -> Any:
        return 1 if target_x > 0 else 0


class ArgmaxDraftsSoftmaxQ(Standard):
    """(i) Standard claiming deterministic top-1 chains: argmax drafts verified with the softmax
    q they were not drawn from (huggingface/transformers#32867, deepseek-ai/DeepSpec#31)."""

    name = "mutant-argmax-drafts-softmax-q"

    def supports(self, shape: ss.Shape) -> bool:
        return shape.is_chain or (shape.kind == "top" and all(w == 1 for w in shape.params[0]))

    def exact_for(self, law: DrawLaw, chain: bool) -> bool:
        return super().exact_for(law, chain) or (chain and law is DrawLaw.DETERMINISTIC)


def chain_by_inverse_cdf(
    pair: ModelPair, length: int, uniforms: Any, prefix: tuple[int, ...]
) -> ss.DraftTree:
    """Draft a chain token by token, each by inverse CDF from the given uniform."""
    tokens: list[int] = []
    for u in uniforms[:length]:
        tokens.append(categorical(pair.draft(prefix + tuple(tokens)), u))
    return ss.DraftTree.chain(tokens, law=DrawLaw.IID)


def cdf_interval(probs: Probs, token: int) -> tuple[Any, Any]:
    """``[F(token - 1), F(token))``: the uniforms an inverse-CDF draw maps to ``token``."""
    cdf = np.cumsum(probs)
    return (cdf[token - 1] if token > 0 else 0 * cdf[0]), cdf[token]


class SharedUniform(Standard):
    """(h) One uniform drafts a chain token and decides its accept test (vllm-project/vllm#54282).

    Given the drafted ``x``, that uniform is uniform on ``[F(x-1), F(x))`` (``F`` the draft's
    CDF), so ``P(accept | x) = |[F(x-1), F(x)) ∩ [0, p(x)/q(x))| / q(x)``.
    """

    name = "mutant-shared-uniform"

    def sample(
        self, pair: ModelPair, shape: ss.Shape, rng: np.random.Generator, prefix: Any
    ) -> tuple[ss.DraftTree, ss.Verdict]:
        self.check(shape)
        uniforms = rng.random(shape.depth)
        tree = chain_by_inverse_cdf(pair, shape.depth, uniforms, tuple(prefix))
        accept = np.concatenate([[0.0], uniforms])
        noise = Noise.checked(accept, rng.random(tree.num_nodes), tree.num_nodes)
        return tree, self.verify(tree, *tables(pair, tree, tuple(prefix)), noise)

    def node_law(
        self, tree: ss.DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        (child,) = tree.candidates[node]
        token = tree.tokens[child]
        target, draft = target_probs[node], draft_probs[node]
        low, high = cdf_interval(draft, token)
        overlap = min(high, target[token] / draft[token]) - low
        accept = max(overlap, 0 * overlap) / draft[token]
        return [(child, accept)], (1 - accept) * residual(target, draft)


class _TopTwoDraft:
    """The pair whose draft is truncated to its two most likely tokens (top-k = 2)."""

    def __init__(self, pair: ModelPair) -> None:
        self._pair = pair
        self.vocab_size = pair.vocab_size

    def target(self, prefix: Any) -> Probs:
        return self._pair.target(prefix)

    def draft(self, prefix: Any) -> Probs:
        draft = self._pair.draft(prefix)
        keep = np.argsort(-np.asarray(draft, dtype=np.float64), kind="stable")[:2]
        truncated = draft * 0
        truncated[keep] = draft[keep]
        return truncated / total(truncated)


class TruncatedDraftRawQ(Standard):
    """Drafts sampled from a top-2-truncated q, the verifier given the raw q
    (huggingface/transformers#47932, vllm-project/vllm#10198)."""

    name = "mutant-truncated-draft-raw-q"

    def outcomes(
        self, pair: ModelPair, shape: ss.Shape, prefix: Any
    ) -> Iterator[tuple[ss.DraftTree, Any, Any]]:
        self.check(shape)
        for tree, weight in shape.enumerate(_TopTwoDraft(pair), tuple(prefix)):
            yield tree, weight, self.verdict_law(tree, *tables(pair, tree, tuple(prefix)))

    def sample(
        self, pair: ModelPair, shape: ss.Shape, rng: np.random.Generator, prefix: Any
    ) -> tuple[ss.DraftTree, ss.Verdict]:
        self.check(shape)
        tree = shape.draft(_TopTwoDraft(pair), rng, tuple(prefix))
        noise = Noise.draw(rng, tree.num_nodes)
        return tree, self.verify(tree, *tables(pair, tree, tuple(prefix)), noise)


# --------------------------------------------------------------------------- multi-draft mutants
class SpecInferUnnormalisedRecursion(SpecInfer):
    """RRS whose running target ``p' = (p' - q)_+`` is never renormalised: later candidates are
    tested against a deflated ratio (the MCSD-style unguarded recursion)."""

    name = "mutant-specinfer-unnormalised-recursion"

    @staticmethod
    def _step(current: Probs, draft: Probs) -> Probs:
        weights = positive_part(current - draft)
        return weights if total(weights) > 0 else current

    def node_verify(
        self, tree: ss.DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        current, draft = target_probs[node], draft_probs[node]
        for child in tree.candidates[node]:
            token = tree.tokens[child]
            if accepts(noise.accept[child], current[token], draft[token]):
                return child, None
            current = self._step(current, draft)
        return None, categorical(current, noise.sample[node])

    def node_law(
        self, tree: ss.DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        current, draft = target_probs[node], draft_probs[node]
        remaining: Any = 1
        descend = []
        for child in tree.candidates[node]:
            accept = accept_probability(current[tree.tokens[child]], draft[tree.tokens[child]])
            descend.append((child, remaining * accept))
            remaining = remaining * (1 - accept)
            current = self._step(current, draft)
        return descend, remaining * current / total(current)


class RSDKeepsRejectedToken(RSD):
    """(c) RRS without replacement that never removes the rejected token from q'."""

    name = "mutant-rsd-keeps-rejected-token"

    def update(self, target: Probs, draft: Probs, token: int) -> tuple[Probs, Probs]:
        return residual(target, draft), draft


class RSDUnnormalisedDraft(RSD):
    """RRS without replacement that zeroes the rejected token in q' but does not renormalise."""

    name = "mutant-rsd-unnormalised-draft"

    def update(self, target: Probs, draft: Probs, token: int) -> tuple[Probs, Probs]:
        kept = draft.copy()
        kept[token] = 0 * kept[token]
        return residual(target, draft), kept


class RSDWrongUpdateOrder(RSD):
    """RRS without replacement that removes the token from q' before taking the residual."""

    name = "mutant-rsd-wrong-update-order"

    def update(self, target: Probs, draft: Probs, token: int) -> tuple[Probs, Probs]:
        removed = remove_token(draft, token)
        return residual(target, removed), removed


class SpecInferOnWithoutReplacement(SpecInfer):
    """(d) RRS with replacement claiming (and applied to) without-replacement drafts."""

    name = "mutant-specinfer-on-without-replacement"
    laws = _WIDENED


class RSDOnIID(RSD):
    """(e) RRS without replacement claiming (and applied to) i.i.d. drafts."""

    name = "mutant-rsd-on-iid"
    laws = _WIDENED


# --------------------------------------------------------------------------- the catalogue
@dataclass(frozen=True)
class Case:
    """A fixed model pair (exact rows, floats on request) and shape that expose a mutant."""

    rows: tuple[tuple[tuple[Fraction, ...], tuple[Fraction, ...]], ...]
    shape: ss.Shape
    #: The registered scheme that is exact on this case (the mutant's correct twin).
    twin: str
    #: With several rows: a context-dependent table over every prefix up to this length.
    depth: int = 0

    def pair(self, exact: bool = True) -> ModelPair:
        convert = (lambda x: x) if exact else float
        rows = [tuple([convert(x) for x in side] for side in row) for row in self.rows]
        if len(rows) == 1:
            return Stationary(*rows[0])
        return table(rows, len(rows[0][0]), self.depth)


@dataclass(frozen=True)
class Mutant:
    scheme: Any
    bug: str
    case: Case
    #: Shapes of the seeded sweep over random exact pairs.
    sweep: tuple[ss.Shape, ...]
    #: "law": the exact engine flags it; "boundary": only boundary noise does (same law).
    caught_by: str = "law"
    #: The registered scheme it derives from refuses ``case.shape``.
    widens_support: bool = field(default=False)
    #: Vocabulary of the sweep's random pairs.
    sweep_vocab: int = 3


# Golden case A (tests/test_goldens.py).
A = ((F(1, 2), F(1, 3), F(1, 6)), (F(1, 3), F(1, 3), F(1, 3)))
SKEW = ((F(1, 2), F(1, 2)), (F(1, 4), F(3, 4)))
# Worst cases of a brute-force search over weights 0..3 on three tokens (errors 0.27, 0.28).
MIXED_WO = ((F(0), F(2, 5), F(3, 5)), (F(3, 4), F(1, 4), F(0)))
MIXED_IID = ((F(0), F(1, 4), F(3, 4)), (F(3, 4), F(0), F(1, 4)))
CHAIN2, STAR2, STAR2_WO = ss.Shape.chain(2), ss.Shape.star(2), ss.Shape.star(2, replacement=False)

MUTANTS: dict[str, Mutant] = {
    m.scheme.name: m
    for m in (
        Mutant(
            UnnormalisedResidual(),
            "(a) unnormalised residual, raw-u inverse CDF,"
            " last-valid-id fallback (SGLang, FlashInfer)",
            Case((((F(1, 2), F(1, 3), F(1, 6)), (F(1, 6), F(1, 6), F(2, 3))),), CHAIN2, "standard"),
            (CHAIN2, ss.Shape.chain(1)),
        ),
        Mutant(
            SpecInferUnnormalisedRecursion(),
            "(a') RRS with an unnormalised running target",
            Case((((F(1, 2), F(1, 3), F(1, 6)), (F(1, 5), F(1, 5), F(3, 5))),), STAR2, "specinfer"),
            (STAR2, ss.Shape.star(3)),
        ),
        Mutant(InvertedRatio(), "(b) min(1, q/p)", Case((SKEW,), CHAIN2, "standard"), (CHAIN2,)),
        Mutant(
            RSDKeepsRejectedToken(),
            "(c) RRS-w/o without zeroing the rejected token in q'",
            Case((MIXED_WO,), STAR2_WO, "rsd"),
            (STAR2_WO, ss.Shape.branching((2, 1))),
            sweep_vocab=4,
        ),
        Mutant(
            RSDUnnormalisedDraft(),
            "(c'') RRS-w/o zeroing the rejected token in q' without renormalising",
            Case((MIXED_WO,), STAR2_WO, "rsd"),
            (STAR2_WO, ss.Shape.star(3, replacement=False)),
            sweep_vocab=4,
        ),
        Mutant(
            RSDWrongUpdateOrder(),
            "(c') RRS-w/o residual taken with the already-updated q'",
            Case((A,), STAR2_WO, "rsd"),
            (STAR2_WO, ss.Shape.star(3, replacement=False)),
        ),
        Mutant(
            SpecInferOnWithoutReplacement(),
            "(d) RRS-with-replacement applied to without-replacement drafts",
            Case((MIXED_WO,), STAR2_WO, "rsd"),
            (STAR2_WO, ss.Shape.branching((2, 1))),
            widens_support=True,
            sweep_vocab=4,
        ),
        Mutant(
            RSDOnIID(),
            "(e) RRS-without-replacement applied to i.i.d. drafts",
            Case((MIXED_IID,), STAR2, "specinfer"),
            (STAR2, ss.Shape.paths(2, 2)),
            widens_support=True,
            sweep_vocab=4,
        ),
        Mutant(
            ParentBonus(),
            "(f) bonus drawn from the parent's target",
            Case(
                (SKEW, ((F(1, 5), F(4, 5)), (F(1, 4), F(3, 4)))), ss.Shape.chain(1), "standard", 1
            ),
            (ss.Shape.chain(1), CHAIN2),
        ),
        Mutant(
            InclusiveAccept(),
            "(g) inclusive accept test u*q <= p (sgl-project/sglang#35771)",
            Case((((F(1), F(0)), (F(1, 2), F(1, 2))),), ss.Shape.chain(1), "standard"),
            (ss.Shape.chain(1),),
            caught_by="boundary",
        ),
        Mutant(
            SharedUniform(),
            "(h) one uniform for drafting and the accept test (vllm-project/vllm#54282)",
            Case((SKEW,), CHAIN2, "standard"),
            (CHAIN2, ss.Shape.chain(1)),
        ),
        Mutant(
            ArgmaxDraftsSoftmaxQ(),
            "(i) argmax drafts verified with the softmax q (huggingface/transformers#32867)",
            Case((((F(1, 2), F(1, 2)), (F(3, 4), F(1, 4))),), ss.Shape.top((1, 1)), "nss"),
            (ss.Shape.top((1,)), ss.Shape.top((1, 1))),
            widens_support=True,
        ),
        Mutant(
            AlwaysAccept(),
            "u hard-coded to 0 (vllm-project/vllm-ascend#13730)",
            Case((SKEW,), CHAIN2, "standard"),
            (CHAIN2,),
        ),
        Mutant(
            TruncatedDraftRawQ(),
            "drafts from top-2-truncated q, raw q reported (huggingface/transformers#47932)",
            Case((A,), CHAIN2, "standard"),
            (CHAIN2,),
        ),
    )
}
