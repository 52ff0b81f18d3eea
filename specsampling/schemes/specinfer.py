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

Grafted trees (law ``grafted``, :meth:`specsampling.DraftTree.graft`). A node may hold, after
its i.i.d. candidates, one candidate :math:`d` guessed from the context alone (prompt lookup).
Its draw law is the point mass :math:`\delta_d`, independent of the drawn candidates, so the
same step applies with :math:`\delta_d` for :math:`q`: accept iff :math:`u_d < p'(d)`, else
:math:`p' \leftarrow \mathrm{norm}((p' - \delta_d)_+)`, :math:`p'` with :math:`d` removed (the
multi-draft recursion of SpecInfer, one law per candidate). Testing the guess last loses
nothing: with one drawn candidate the node accepts some candidate with probability
:math:`p(d) + \sum_{x \ne d} \min(p(x), q(x))`, the most any exact rule accepts there
(:math:`d` is emitted only through a candidate, and :math:`x \ne d` at most
:math:`\min(p(x), q(x))`), against :math:`p(d) + \sum_{x \ne d} \min(p(x), (1 - p(d))\,q(x))`
with the guess first; a guess equal to a drawn token would be rejected surely after it, so
:meth:`~specsampling.DraftTree.graft` lists none.

Reference: Miao et al., arXiv 2305.09781; Yang et al., MCSD, arXiv 2401.06706.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import Probs
from ..noise import Noise
from ..ops import (
    accept_probability,
    accepts,
    categorical,
    positive_part,
    remove_token,
    residual,
    total,
)
from ..tree import DraftTree, DrawLaw
from ..validation import check_pair, check_positive_int
from .base import NodeScheme, Step


class RecursiveRejection(NodeScheme):
    """Recursive rejection sampling per node: test the candidates in drafting order against a
    running target, updating it (and, without replacement, the draft) after each rejection.

    Subclasses choose the update (:meth:`update`) and the draw laws; the sampled rule and its
    exact law are written once, here. A guessed candidate (:meth:`DraftTree.guess
    <specsampling.DraftTree.guess>`, law ``grafted``) is tested as a point mass at its token:
    accepted iff ``u < p'(x)``, else ``x`` is removed from ``p'`` (renormalised).
    """

    def update(self, target: Probs, draft: Probs, token: int) -> tuple[Probs, Probs]:
        """``(target, draft)`` for the next candidate after rejecting ``token``."""
        return residual(target, draft), draft

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        current, draft = target_probs[node], draft_probs[node]
        guess = tree.guess(node)
        for child in tree.candidates[node]:
            token = tree.tokens[child]
            if child == guess:  # a point mass at its token, tested last
                if accepts(noise.accept[child], current[token], 1):
                    return child, None
                current = remove_token(current, token)
                continue
            if accepts(noise.accept[child], current[token], draft[token]):
                return child, None
            current, draft = self.update(current, draft, token)
        return None, categorical(current, noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        current, draft = target_probs[node], draft_probs[node]
        guess = tree.guess(node)
        remaining: Any = 1
        descend = []
        for child in tree.candidates[node]:
            token = tree.tokens[child]
            accept = accept_probability(current[token], 1 if child == guess else draft[token])
            descend.append((child, remaining * accept))
            remaining = remaining * (1 - accept)
            if child == guess:
                current = remove_token(current, token)
            else:
                current, draft = self.update(current, draft, token)
        return descend, remaining * current


class SpecInfer(RecursiveRejection):
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

    laws = frozenset({DrawLaw.IID, DrawLaw.GRAFTED})

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return specinfer_acceptance(target, draft, num_drafts)


def specinfer_acceptance(target: Any, draft: Any, num_drafts: int) -> Any:
    r"""Recursive rejection sampling with replacement, :math:`k` i.i.d. candidates.

    The recursion of Thomas et al. (2026, Alg. 9): with :math:`p_0 = p`,
    :math:`r_i = \sum \min(p_{i-1}, q)`, :math:`P_\text{rej} = \prod_i (1 - r_i)`,
    :math:`m = \prod_i \bigl(1 - (q - p_{i-1})_+ / (1 - r_i)\bigr)` and
    :math:`p_i = \mathrm{norm}((p_{i-1} - q)_+)`,

    .. math:: \alpha = (1 - P_\text{rej}) + P_\text{rej} \sum_t p_k(t)\,(1 - m(t)),

    using the **final** residual :math:`p_k` (the original :math:`p` is wrong by up to 0.25).

    >>> from fractions import Fraction as F
    >>> specinfer_acceptance([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(8, 9)
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    current = target
    rejected: Any = 1
    missing: Any = np.ones_like(target) if target.dtype != object else target * 0 + 1
    for _ in range(k):
        step = total(np.minimum(current, draft))
        if not step < 1:
            return 1 - rejected + rejected * step
        rejected = rejected * (1 - step)
        missing = missing * (1 - positive_part(draft - current) / (1 - step))
        current = residual(current, draft)
    return 1 - rejected + rejected * total(current * (1 - missing))


SCHEME = SpecInfer()
