r"""Drafters: what proposes each round's tree, behind one protocol.

A round of :class:`~specsampling.gpu.hf.SpeculativeDecoder` asks its drafter for a
:class:`Proposal` (the tree, the draft distributions at the nodes it expanded, or ``None`` for a
point mass) and tells it what was accepted. A drafter never draws a token itself: the
verification strategy hands it a :class:`Draw` for the round (fresh drafting uniforms for a tree
verifier, the keyed race for a keyed coupling), and the drafter feeds it distributions level by
level, or a deterministic chain of tokens. That split is what keeps every drafter lossless: the
tokens come from the draw law the verifier is exact for, read only from the draft's
distributions and the drafting noise.

Implement :class:`Drafter` to add one (``propose`` and, when it keeps a cache, ``start``,
``commit``, ``select_rows`` and ``stop``); the implementations here:

* :class:`NoDraft` -- nothing drafted: plain decoding with the target (the root alone);
* :class:`NGramDraft` -- prompt lookup: a deterministic chain, a point-mass draft;
* :class:`~specsampling.gpu.hf.model_draft.ModelDraft` -- a causal LM sharing the vocabulary,
  or :class:`~specsampling.gpu.hf.model_draft.LayerSkipDraft` (the target's own first layers),
  drafted with the shape's law (:mod:`specsampling.gpu.hf.model_draft`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

import specsampling as ss
from specsampling.shapes import Shape
from specsampling.tree import DrawLaw

from ..schemes.base import Verified
from ..tree import PAD, TreeBatch
from .attention import check_causal_lm

if TYPE_CHECKING:
    from .state import DecodeState


class Proposal(NamedTuple):
    """One round's drafted trees.

    ``tree``: the :class:`~specsampling.gpu.TreeBatch`; ``draft_rows``: ``(expanded [B, N]
    bool, probs [E, V])``, the draft distribution after each node drafting expanded (``None``:
    a point-mass draft, verified with ``draft_probs=None``); ``draft_logits [B, N, V]``: the raw
    draft logits at the expanded nodes, ``NaN`` elsewhere (only when tracing); ``drawn``: the
    draw's own bookkeeping (the keyed walk's :class:`~specsampling.gpu.schemes.coupled.Drafted`).
    """

    tree: TreeBatch
    draft_rows: tuple[torch.Tensor, torch.Tensor] | None = None
    draft_logits: torch.Tensor | None = None
    drawn: Any = None


class Draw(Protocol):
    """How one round's tokens are chosen, given by the verification strategy.

    ``levels[d]`` are the draw steps of depth ``d + 1`` (the shape's steps, in step order).
    """

    shape: Shape
    levels: tuple[tuple[int, ...], ...]

    def frontier(self, level: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(paths [B, F, level], exists [B, F])``: the nodes whose children ``level`` draws
        (the root alone at level 0), one slot per step of ``levels[level - 1]``."""
        ...

    def next_level(self, level: int, draft_probs: torch.Tensor) -> torch.Tensor | None:
        """Draw the steps of ``levels[level]`` from ``draft_probs [B, F, V]`` at the frontier;
        the tokens drawn ``[B, S_d]`` where the draw can tell them at once (sampled draws),
        else ``None`` (the keyed race)."""
        ...

    def finish(self) -> tuple[TreeBatch, Any]:
        """The drafted trees and the draw's bookkeeping (for the walk)."""
        ...

    def point_mass(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[TreeBatch, Any]:
        """The chains ``tokens [B, D]`` cut to ``lengths [B]``, proposed deterministically."""
        ...


class Drafter(ABC):
    """Base of the drafters: ``law`` is the law its trees are drawn by (``None``: the shape's
    own law, sampled from the draft's distributions; ``DrawLaw.DETERMINISTIC``: a point mass,
    proposed through :meth:`Draw.point_mass` on chains). The default lifecycle methods do
    nothing, for drafters without state."""

    law: DrawLaw | None = None

    def check(self, target: Any, verification: Any) -> None:
        """Refuse (before any forward) a drafter that cannot run with ``target``, or whose
        draw law ``verification`` is not exact for."""
        verification.check_law(self.law, type(self).__name__)

    def start(self, state: DecodeState) -> None:  # noqa: B027 (no-op default)
        """A ``generate`` call begins (prompts in ``state``): reset and prefill any cache."""

    @abstractmethod
    def propose(self, state: DecodeState, draw: Draw) -> Proposal:
        """This round's trees, one per active row of ``state``."""

    def commit(  # noqa: B027 (no-op default)
        self, state: DecodeState, proposal: Proposal, verified: Verified
    ) -> None:
        """Rows emitted ``verified.tokens [B, D + 1]`` (the accepted path, then the next
        token): keep what the drafter's cache needs. Called before finished rows leave."""

    def select_rows(self, rows: torch.Tensor) -> None:  # noqa: B027 (no-op default)
        """Keep only the batch rows ``rows [B']`` (finished rows leave)."""

    def stop(self) -> None:  # noqa: B027 (no-op default)
        """The ``generate`` call ended (also on an error): release any per-call state."""


class NoDraft(Drafter):
    """Nothing drafted: each round scores the root alone and emits one target token (exact
    for every scheme: no draft law to check)."""

    def check(self, target: Any, verification: Any) -> None:
        """Nothing to refuse."""

    def propose(self, state: DecodeState, draw: Draw) -> Proposal:
        return Proposal(TreeBatch.roots(state.batch_size, state.device))

    def __repr__(self) -> str:
        return "NoDraft()"


class NGramDraft(Drafter):
    """Prompt-lookup drafting: after the longest suffix of ``n`` down to ``min_n`` tokens that
    occurred earlier in the row's context, propose the tokens that followed its latest earlier
    occurrence. A deterministic chain: a point-mass draft.

    >>> NGramDraft(n=2).lookup([5, 6, 7, 5, 6], 3)
    [7, 5, 6]
    >>> NGramDraft(n=2).lookup([1, 2, 3], 2)
    []
    """

    law = DrawLaw.DETERMINISTIC

    def __init__(self, n: int = 3, min_n: int = 1) -> None:
        self.n = ss.validation.check_positive_int(n, "n")
        self.min_n = ss.validation.check_positive_int(min_n, "min_n")
        if self.min_n > self.n:
            raise ValueError(f"min_n: expected at most n = {self.n}, got {min_n}")

    def lookup(self, context: Sequence[int], length: int) -> list[int]:
        """Up to ``length`` tokens continuing ``context`` (``[]``: no earlier match)."""
        tokens = list(context)
        for size in range(min(self.n, len(tokens) - 1), self.min_n - 1, -1):
            suffix = tokens[-size:]
            for start in range(len(tokens) - size - 1, -1, -1):
                if tokens[start : start + size] == suffix:
                    follow = tokens[start + size : start + size + length]
                    if follow:
                        return follow
        return []

    def propose(self, state: DecodeState, draw: Draw) -> Proposal:
        length = len(draw.levels)
        return self.chains(state, draw, [self.lookup(c, length) for c in state.contexts])

    def chains(self, state: DecodeState, draw: Draw, proposals: list[list[int]]) -> Proposal:
        """The point-mass chains ``proposals`` (one token list per row) through ``draw``."""
        length = len(draw.levels)
        tokens = torch.full((state.batch_size, length), PAD, dtype=torch.long)  # [B, D]
        for row, proposal in enumerate(proposals):
            tokens[row, : len(proposal)] = torch.tensor(proposal, dtype=torch.long)
        lengths = torch.tensor([len(p) for p in proposals], dtype=torch.long)  # [B]
        tree, drawn = draw.point_mass(tokens.to(state.device), lengths.to(state.device))
        return Proposal(tree, drawn=drawn)

    def __repr__(self) -> str:
        return f"NGramDraft(n={self.n}, min_n={self.min_n})"


def as_drafter(draft: Any) -> Drafter:
    """The drafter of ``draft``: a :class:`Drafter` as it is, ``None`` as :class:`NoDraft`, a
    causal LM or :class:`~specsampling.gpu.hf.model_draft.LayerSkipDraft` as a
    :class:`~specsampling.gpu.hf.model_draft.ModelDraft`."""
    from .model_draft import LayerSkipDraft, ModelDraft

    if draft is None:
        return NoDraft()
    if isinstance(draft, Drafter):
        return draft
    if not isinstance(draft, LayerSkipDraft):
        check_causal_lm(draft, "draft")
    return ModelDraft(draft)


__all__ = ["Drafter", "Draw", "NGramDraft", "NoDraft", "Proposal", "as_drafter"]
