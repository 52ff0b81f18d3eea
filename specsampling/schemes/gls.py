r"""Gumbel-max list sampling (GLS): K keyed rows, one draft path per row.

Algorithm (Rowan, Phan, Khisti, arXiv 2506.05632, Alg. 1-2). Each position ``j`` has ``K``
rows of keyed exponentials ``S[j, k, i]``. Draft ``k`` is drafted autoregressively from its own
row, ``X^k_j = argmin_i S[j, k, i] / q(i | X^k_{<j})``. With the active set
``A = {1..K}``, for ``j = 1..L``: ``Y_j = argmin_i min_{k in R} S[j, k, i] / p(i | Y_{<j})``
with ``R = A`` (``gls``, the paper's verifier) or ``R`` = all rows (``gls_strong``); drop every
``k`` with ``X^k_j != Y_j``; stop with ``Y_{1:j}`` when ``A`` is empty. If drafts survive all
``L`` positions the bonus ``Y_{L+1}`` is selected the same way.

Theorem. Every ``Y_j`` is an exact draw from ``p(. | Y_{<j})``: ``min_{k in R} S[j, k, i]`` is
``Exp(|R|)`` and fresh (rows at position ``j`` were only used by drafts at position ``j``, whose
outcome decides ``R`` only through earlier positions' noise). ``gls_strong`` emits seeded
target-only decoding with ``K`` rows for any drafter (strong invariance); ``gls`` depends on the
draft tokens but never on draft probabilities (conditional invariance, GLS Definition 1).

Acceptance at one position: ``sum_j sum_{m>=1} P(Y = j, M = m)`` (:func:`.gls.match_law`),
above the list-matching bound ``sum_j p_j / [1 - 1/K + (1/K) sum_i max(p_i, q_i p_j / q_j)]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._types import Prefix, Probs
from ..keyed import KeyedNoise
from ..keyed.gls_law import gls_acceptance, match_law
from ..keyed.laws import keyed_select
from ..ops import support
from ..pairs import ModelPair
from ..shapes import Shape
from ..tree import DraftTree
from .base import Verdict
from .coupled import KeyedScheme, Transition, race_pick


class GLS(KeyedScheme):
    """GLS on ``paths(K, L)``, ``star(K)`` and chains: row ``k`` drafts path ``k``.

    ``strong=False`` races the active rows (the paper); ``strong=True`` races all ``K`` rows.

    >>> import specsampling as ss
    >>> round(ss.acceptance("gls", [0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2), 6)
    0.773999
    """

    reference = "Rowan, Phan, Khisti, arXiv 2506.05632"

    def __init__(self, strong: bool) -> None:
        self.strong = bool(strong)
        self.name = "gls_strong" if self.strong else "gls"
        self.strong_invariance = self.strong

    def supports(self, shape: Shape) -> bool:
        paths = shape.root_paths
        return shape.is_chain or (paths is not None and len(set(paths)) == 1)

    def support_text(self) -> str:
        return "sampled chains and i.i.d. paths of one length from the root (star, paths)"

    def rows(self, shape: Shape) -> int:
        return sum(1 for parent, _ in shape.steps if parent < 0)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return gls_acceptance(target, draft, num_drafts)

    def initial_state(self, shape: Shape) -> Any:
        return self.rows(shape)

    def transitions(
        self, target: Probs, draft: Probs, shape: Shape, depth: int, state: Any
    ) -> Iterable[Transition]:
        law = match_law(target, draft, state, self.rows(shape) if self.strong else state)
        for token in support(target):
            yield int(token), law[token, 0], None
            for matched in range(1, state + 1):
                yield int(token), law[token, matched], matched

    def sample_keyed(
        self, pair: ModelPair, shape: Shape, noise: KeyedNoise, prefix: Prefix = ()
    ) -> tuple[DraftTree, Verdict]:
        self.check(shape)
        prefix = tuple(prefix)
        vocab, rows, depth = pair.vocab_size, self.rows(shape), shape.depth
        drafts: list[list[int]] = [[] for _ in range(rows)]
        pick = race_pick(noise, prefix, vocab, lambda step: step // depth)

        def record(proposal: Probs, path: Prefix, step: int) -> int:
            token = int(pick(proposal, path, step))
            drafts[step // depth].append(token)
            return token

        tree = shape.draft_with(pair, record, prefix)
        active = list(range(rows))
        node = 0
        for position in range(depth + 1):
            context = prefix + tree.prefix(node)
            exps = noise.exponentials(context, rows, vocab)
            raced = exps if self.strong else exps[active]
            token = keyed_select(pair.target(context), raced)
            if position == depth:
                return tree, Verdict(node, token)
            active = [k for k in active if drafts[k][position] == token]
            if not active:
                return tree, Verdict(node, token)
            child = tree.child_with_token(node, token)
            assert child is not None
            node = child
        raise AssertionError("unreachable")


GLS_ACTIVE = GLS(strong=False)
GLS_STRONG = GLS(strong=True)
