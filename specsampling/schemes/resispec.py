r"""Residual shaping (ResiSpec style): an exact sub-target family for multi-candidate verification.

Algorithm. At node :math:`v` with candidates :math:`x_1..x_K` in drafting order and proposal
laws :math:`q_k` (:math:`q_k = q` for i.i.d. drafts; without replacement, :math:`q` restricted to
the tokens not yet drafted and renormalised), set :math:`t_1 = p`. For :math:`k = 1..K` a
*shaping policy* chooses a sub-target :math:`0 \le a_k \le t_k` from :math:`p, q, t_k, q_k, k, K`
and :math:`x_{<k}` only (:class:`Stage`); with :math:`m_k = \min(a_k, q_k)` accept :math:`x_k` iff
:math:`u_k\,q_k(x_k) < m_k(x_k)` and descend, otherwise continue with the shaped residual
:math:`t_{k+1} = (t_k - m_k)/(1 - \sum m_k)`. If all are rejected emit :math:`y \sim t_{K+1}`; if
:math:`1 - \sum m_k \le 0` the stage accepts with probability 1.

Theorem. Lossless for every policy that keeps the contract (i.i.d. and without-replacement
drafts, per node on trees). Proof idea: :math:`t_k = m_k + (1 - \sum m_k)\,t_{k+1}` with
:math:`t_{k+1} \ge 0` because :math:`m_k \le a_k \le t_k`; given :math:`x_{<k}` rejected,
:math:`x_k \sim q_k` independently of :math:`a_k`, so stage :math:`k` is one exact accept-or-reject
coupling of :math:`t_k`, and induction over the stages gives :math:`y \sim p`. Both halves of the
contract are enforced: :func:`check_sub_target` raises on :math:`a_k > t_k` (never clamps it
away), and a policy sees a :class:`Stage`, which holds no later candidate.

Acceptance (i.i.d., sub-targets that ignore :math:`x_{<k}`): with :math:`M_k = 1 - \sum m_k`
and rejected-candidate laws :math:`r_k = (q - m_k)/M_k`,

.. math:: \alpha = \sum_k \prod_{j<k} M_j \sum_x m_k(x)
          + \prod_k M_k \sum_y t_{K+1}(y) \Bigl(1 - \prod_k \bigl(1 - r_k(y)\bigr)\Bigr),

the second term counting residual draws that hit a rejected candidate (:func:`resispec_acceptance`).
Greedy :math:`a_k = t_k` is SpecInfer (RSD without replacement), :math:`a_k = \min(q, p/\rho^*)` is
SpecTr K-SEQ; :class:`Optimised` (the default) maximises :math:`\alpha` over both and a grid of
confidence-aligned damping rules, so it is never below either.

Reference: "ResiSpec: Enhancing Multi-Candidate Speculative Sampling via Residual Distribution
Shaping", arXiv 2608.24411 (abstract only; its exactness condition is reported insufficient, so
this is an exact sub-target family derived in this project, ``docs/schemes/resispec.md``, not the
paper's rule).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import Prefix, Probs
from ..noise import Noise
from ..ops import accept_probability, accepts, categorical, remove_token, reuse_uniform, total
from ..tree import DraftTree, DrawLaw
from ..validation import check_pair, check_positive_int
from .base import NodeScheme, Step
from .resispec_optimise import Choice, Optimised, optimise
from .resispec_policy import (
    RTOL,
    ConfidenceDamping,
    ConstantRatio,
    Greedy,
    Policy,
    Stage,
    check_sub_target,
    rule_acceptance,
)


def resispec_acceptance(target: Any, draft: Any, num_drafts: int, policy: Any = None) -> Any:
    r"""Closed-form :math:`P(Y \in \{x_1..x_K\})` with :math:`K` i.i.d. candidates.

    .. math:: \alpha = 1 - \prod_k M_k + \prod_k M_k \sum_y t_{K+1}(y)
              \Bigl(1 - \prod_k \bigl(1 - r_k(y)\bigr)\Bigr),

    :math:`M_k = 1 - \sum m_k`, :math:`r_k = (q - m_k)/M_k`; :math:`1 - \prod_k M_k =
    \sum_k \prod_{j<k} M_j \sum m_k` is acceptance through a candidate, the rest residual hits.
    ``policy`` (default :class:`Optimised`) must be oblivious. Vectorised over the vocabulary;
    exact with ``Fraction`` inputs.

    Examples
    --------
    >>> from fractions import Fraction as F
    >>> target, draft = [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3
    >>> resispec_acceptance(target, draft, 2, Greedy()), resispec_acceptance(target, draft, 2)
    (Fraction(8, 9), Fraction(679, 720))
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    rule = (Optimised() if policy is None else policy).at_node(target, draft, k)
    if not rule.oblivious:
        raise ValueError(f"policy {rule!r} reads earlier candidates: no closed form")
    return rule_acceptance(rule, target, draft, k)


class ResiSpec(NodeScheme):
    """The sub-target family per node; exact on i.i.d. and without-replacement drafts.

    ``policy`` chooses :math:`a_k` (default :class:`Optimised`). The proposal laws follow the
    tree's :attr:`~specsampling.DraftTree.law`: i.i.d. (:math:`q_k = q`) or without replacement
    (:math:`q` without the earlier candidates); other laws are refused.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> scheme = ResiSpec(Greedy())
    >>> ss.acceptance(scheme, [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(8, 9)
    """

    name = "resispec"
    reference = (
        "ResiSpec (arXiv 2608.24411), as an exact sub-target family derived in this project "
        "(docs/schemes/resispec.md)"
    )

    laws = frozenset({DrawLaw.IID, DrawLaw.WITHOUT})

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy: Policy = Optimised() if policy is None else policy

    def __repr__(self) -> str:
        return f"<scheme {self.name!r} policy={self.policy!r}>"

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        rule = self.policy.at_node(target, draft, num_drafts)
        return rule_acceptance(rule, target, draft, num_drafts) if rule.oblivious else None

    def stage(
        self,
        target: Probs,
        draft: Probs,
        current: Probs,
        proposal: Probs,
        index: int,
        tokens: Prefix,
    ) -> Stage:
        """The policy's view of candidate ``index`` of ``tokens``: only ``tokens[:index - 1]``."""
        target, draft, current, proposal = map(_read_only, (target, draft, current, proposal))
        return Stage(target, draft, current, proposal, index, len(tokens), tokens[: index - 1])

    def sub_target(self, rule: Policy, stage: Stage) -> Probs:
        """:math:`a_k` from ``rule``, checked (:func:`check_sub_target`)."""
        return check_sub_target(rule.sub_target(stage), stage, rule)

    def plan(
        self, target: Probs, draft: Probs, tokens: Prefix, replacement: bool
    ) -> tuple[list[Any], Probs]:
        """Per candidate ``(m_k(x_k), q_k(x_k))`` given earlier rejections, and :math:`t_{K+1}`;
        ``replacement=False`` removes each rejected candidate from the proposal.

        Stops after a stage that accepts with probability 1 (:math:`1 - \\sum m_k \\le 0`); its
        check is still the drafted token's own ``(m_k(x_k), q_k(x_k))``.
        """
        rule = self.policy.at_node(target, draft, len(tokens))
        current, proposal = target, draft
        result: list[Any] = []
        for index, token in enumerate(tokens, start=1):
            stage = self.stage(target, draft, current, proposal, index, tokens)
            kept = np.minimum(self.sub_target(rule, stage), proposal)
            rest = current - kept
            mass = total(rest)
            result.append((kept[token], proposal[token]))
            if not mass > 0:
                # Sum m_k = 1, so m_k = q_k: the candidate is accepted surely in exact arithmetic.
                # In float64 a drafted token whose q-mass was lost to rounding (q = 1e-21 next to
                # 1.0) can still have m = 0: it is rejected and the stage's own t_k, a valid law
                # inside the target's support, is the fallback (never a token with p = 0:
                # sgl-project/sglang#35771).
                break
            current = rest / mass
            if not replacement:
                proposal = remove_token(proposal, token)
        return result, current

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        candidates = tree.candidates[node]
        tokens = tuple(tree.tokens[c] for c in candidates)
        replacement = tree.law is not DrawLaw.WITHOUT
        checks, final = self.plan(target_probs[node], draft_probs[node], tokens, replacement)
        uniforms: dict[int, float] = {}
        for child, (kept, proposal) in zip(candidates, checks, strict=False):
            u = uniforms.get(child, float(noise.accept[child]))
            if accepts(u, kept, proposal):
                return child, None
            # Rejected: the next copy of this token reads the rescaled uniform (see Noise).
            uniforms[child] = reuse_uniform(u, accept_probability(kept, proposal))
        return None, categorical(final, noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        candidates = tree.candidates[node]
        tokens = tuple(tree.tokens[c] for c in candidates)
        replacement = tree.law is not DrawLaw.WITHOUT
        checks, final = self.plan(target_probs[node], draft_probs[node], tokens, replacement)
        remaining: Any = 1
        descend: dict[int, Any] = {}
        for child, (kept, proposal) in zip(candidates, checks, strict=False):
            accept = accept_probability(kept, proposal)
            descend[child] = descend.get(child, 0) + remaining * accept
            remaining = remaining * (1 - accept)
        return list(descend.items()), remaining * final


def _read_only(probs: Probs) -> Probs:
    view = probs.view()
    view.flags.writeable = False
    return view


SCHEME = ResiSpec()

__all__ = [
    "RTOL",
    "SCHEME",
    "Choice",
    "ConfidenceDamping",
    "ConstantRatio",
    "Greedy",
    "Optimised",
    "Policy",
    "ResiSpec",
    "Stage",
    "check_sub_target",
    "optimise",
    "resispec_acceptance",
]
