r"""Standard (token-level) speculative sampling on a chain (Leviathan et al.; Chen et al.).

Algorithm. For the drafted chain :math:`x_1..x_\gamma \sim q`, at position :math:`i` accept
:math:`x_i` iff :math:`u_i\,q_i(x_i) < p_i(x_i)`; at the first rejection emit
:math:`y \sim \mathrm{norm}((p_i - q_i)_+)` and stop; if all are accepted emit a bonus
:math:`y \sim p_{\gamma+1}`.

Theorem. Each emitted token is distributed as the target given the tokens before it. Proof idea:
the accepted mass of token :math:`x` is :math:`q(x)\min(1, p(x)/q(x)) = \min(p(x), q(x))` and
the rejection branch adds :math:`(1-\beta)\,\mathrm{norm}((p-q)_+)(x) = (p(x)-q(x))_+`; they sum
to :math:`p(x)`.

Acceptance. :math:`\beta = \sum_x \min(p(x), q(x))` per position; on a chain
:math:`E[\tau] = \sum_{i\le\gamma} \sum_{x_{1:i}} \prod_{j \le i} \min(p_j(x_j), q_j(x_j))`.

Reference: Leviathan, Kalman, Matias, arXiv 2211.17192; Chen et al., arXiv 2302.01318.
Star(1) is the single-step case.
"""

from __future__ import annotations

from typing import Any

from .._types import Probs
from ..noise import Noise
from ..ops import accept_probability, accepts, categorical, residual
from ..shapes import Shape
from ..tree import DraftTree
from .base import NodeScheme, Step


class Standard(NodeScheme):
    """Token-level speculative sampling; exact on sampled chains only.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> pair = ss.pairs.Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> ss.expected_emitted("standard", pair, ss.Shape.chain(2))
    Fraction(19, 9)
    """

    name = "standard"
    reference = "Leviathan et al. 2023 (arXiv 2211.17192); Chen et al. 2023 (arXiv 2302.01318)"

    def supports(self, shape: Shape) -> bool:
        return shape.is_chain

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        from ..calculators import standard_acceptance

        return standard_acceptance(target, draft) if num_drafts == 1 else None

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        (child,) = tree.candidates[node]
        token = tree.tokens[child]
        target, draft = target_probs[node], draft_probs[node]
        if self.accepts(noise.accept[child], target[token], draft[token]):
            return child, None
        return None, categorical(self.residual(target, draft), noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        (child,) = tree.candidates[node]
        token = tree.tokens[child]
        target, draft = target_probs[node], draft_probs[node]
        accept = self.accept_probability(target[token], draft[token])
        return [(child, accept)], (1 - accept) * self.residual(target, draft)

    # Hooks the mutant catalogue overrides, in pairs: the sampled test and its exact probability.
    def residual(self, target: Probs, draft: Probs) -> Probs:
        return residual(target, draft)

    def accepts(self, u: float, target_x: Any, draft_x: Any) -> bool:
        return accepts(u, target_x, draft_x)

    def accept_probability(self, target_x: Any, draft_x: Any) -> Any:
        return accept_probability(target_x, draft_x)


SCHEME = Standard()
