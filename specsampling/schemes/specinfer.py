r"""SpecInfer multi-step speculative sampling: recursive rejection sampling with replacement.

Algorithm. At node :math:`v` with i.i.d. candidates :math:`x_1..x_k \sim q` (a multiset, in
drafting order), set :math:`p' = p`. For :math:`i = 1..k`: accept :math:`x_i` iff
:math:`u_i\,q(x_i) < p'(x_i)` and descend; otherwise :math:`p' \leftarrow \mathrm{norm}((p'-q)_+)`
(:math:`q` unchanged). If all are rejected emit :math:`y \sim p'`. At a leaf emit a bonus from
:math:`p`.

Theorem. Lossless when the candidates are i.i.d. from :math:`q` (chains, stars with replacement,
i.i.d. path tries, delayed trees). Proof idea: one accept-or-reject step maps a target
:math:`p'` and a fresh :math:`x \sim q` to an exact coupling whose rejection branch leaves
:math:`\mathrm{norm}((p'-q)_+)`; by induction over the candidates the output is :math:`p`.
A duplicate of a rejected token has :math:`p'(x) = 0` and is rejected automatically, so one
uniform per child node suffices.

Acceptance. The recursion of Thomas et al. (2026, Alg. 9), with the **final** residual:
see :func:`specsampling.calculators.specinfer_acceptance`.

Reference: Miao et al., arXiv 2305.09781; Yang et al., MCSD, arXiv 2401.06706.
"""

from __future__ import annotations

from typing import Any

from .._types import Probs
from ..noise import Noise
from ..ops import accept_probability, accepts, categorical, residual
from ..shapes import Shape
from ..tree import DraftTree
from .base import NodeScheme, Step


class SpecInfer(NodeScheme):
    """Recursive rejection sampling with replacement per node; exact on i.i.d. drafts.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> ss.acceptance("specinfer", [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, num_drafts=2)
    Fraction(8, 9)
    """

    name = "specinfer"
    reference = (
        "Miao et al. 2024, SpecInfer (arXiv 2305.09781); Yang et al. 2024 (arXiv 2401.06706)"
    )

    def supports(self, shape: Shape) -> bool:
        return shape.is_chain or shape.law == "iid"

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        from ..calculators import specinfer_acceptance

        return specinfer_acceptance(target, draft, num_drafts)

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        current, draft = target_probs[node], draft_probs[node]
        for child in tree.candidates[node]:
            token = tree.tokens[child]
            if accepts(noise.accept[child], current[token], draft[token]):
                return child, None
            current = residual(current, draft)
        return None, categorical(current, noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        current, draft = target_probs[node], draft_probs[node]
        remaining: Any = 1
        descend = []
        for child in tree.candidates[node]:
            token = tree.tokens[child]
            accept = accept_probability(current[token], draft[token])
            descend.append((child, remaining * accept))
            remaining = remaining * (1 - accept)
            current = residual(current, draft)
        return descend, remaining * current


SCHEME = SpecInfer()
