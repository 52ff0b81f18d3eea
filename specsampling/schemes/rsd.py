r"""Recursive rejection sampling without replacement (RSD; MCSD without replacement).

Algorithm. At node :math:`v` with distinct candidates :math:`x_1..x_k` drawn sequentially
without replacement from :math:`q`, set :math:`p' = p`, :math:`q' = q`. For :math:`i = 1..k`:
accept :math:`x_i` iff :math:`u_i\,q'(x_i) < p'(x_i)` and descend; otherwise
:math:`p' \leftarrow \mathrm{norm}((p' - q')_+)` (with the **current** :math:`q'`), then
:math:`q' \leftarrow \mathrm{norm}(q' \text{ with } x_i \text{ removed})`. If all are rejected emit
:math:`y \sim p'`; at a leaf emit a bonus from :math:`p`.

Theorem. Lossless when the candidates are drawn without replacement (stars and branching trees
without replacement; Gumbel-top-k gives that law). Proof idea: given the first :math:`i-1`
rejections, :math:`x_i` is distributed as :math:`q'`, so each step is one standard
accept-or-reject coupling of :math:`p'` and :math:`q'`. Applied to i.i.d. candidates (or
RRS-with-replacement applied to these) the output is biased.

Acceptance. No closed form is used; the exact engine enumerates ordered tuples.

Reference: Jeon et al., arXiv 2402.14160; Yang et al., MCSD, arXiv 2401.06706.
"""

from __future__ import annotations

from typing import Any

from .._types import Probs
from ..ops import remove_token, residual
from ..shapes import Shape
from ..tree import DrawLaw
from .specinfer import RecursiveRejection
from .standard import standard_acceptance


class RSD(RecursiveRejection):
    """Recursive rejection sampling without replacement; exact on without-replacement drafts.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> ss.acceptance("rsd", [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, num_drafts=2)
    Fraction(11, 12)
    """

    name = "rsd"
    reference = "Jeon et al. 2024, RSD (arXiv 2402.14160); Yang et al. 2024 (arXiv 2401.06706)"

    laws = frozenset({DrawLaw.WITHOUT})

    def single_shape(self, num_drafts: int) -> Shape:
        return Shape.star(num_drafts, replacement=False)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        """One candidate is a chain of one token: standard acceptance, :math:`\\sum \\min(p, q)`."""
        return standard_acceptance(target, draft) if num_drafts == 1 else None

    def update(self, target: Probs, draft: Probs, token: int) -> tuple[Probs, Probs]:
        """After rejecting ``token``: residual with the current draft, then remove the token."""
        return residual(target, draft), remove_token(draft, token)


SCHEME = RSD()
