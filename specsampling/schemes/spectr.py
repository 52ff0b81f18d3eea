r"""SpecTr K-SEQ: sequential candidate tests against a scaled target, one optimal :math:`\rho`.

Algorithm. At node :math:`v` with :math:`k` i.i.d. candidates :math:`x_1..x_k \sim q` (a
multiset, in drafting order), let :math:`\beta(\rho) = \sum_x \min(p(x)/\rho, q(x))`,
:math:`p_\text{acc}(\rho) = 1 - (1 - \beta(\rho))^k` and

.. math:: \gamma(\rho) = \frac{p_\text{acc}(\rho)}{\beta(\rho)}
          = \sum_{i=0}^{k-1} \bigl(1 - \beta(\rho)\bigr)^i .

Take :math:`\rho^*`, the root of :math:`f(\rho) = p_\text{acc}(\rho) - \rho\,\beta(\rho)` on
:math:`[1, k]` (:math:`f` is non-increasing, :math:`f(1) \ge 0 \ge f(k)`), on its **feasible**
side :math:`\gamma(\rho^*) \le \rho^*` (:func:`optimal_rho`). For :math:`i = 1..k` accept
:math:`x_i` iff :math:`u_i\,\rho^* q(x_i) < p(x_i)` and descend. If all are rejected emit
:math:`y \sim \mathrm{norm}((p - \gamma \min(p/\rho^*, q))_+)`. Disjoint supports
(:math:`\beta = 0`) take :math:`\gamma = 0`, so the residual is :math:`p`; :math:`k = 1` gives
:math:`\rho^* = 1` and is standard speculative sampling.

Duplicates. The engine stores a repeated token once, as one child with one uniform
``noise.accept[child]``, while SpecTr tests every copy independently (the same acceptance
probability :math:`a = \min(1, p(x)/(\rho q(x)))` each time, unlike SpecInfer, where the
residual makes a repeat certain to fail). The first copy uses :math:`u`; given its rejection
:math:`u` is uniform on :math:`[a, 1)`, so the next copy uses :math:`(u - a)/(1 - a)`, a fresh
uniform independent of that rejection. The exact law tests every copy with probability :math:`a`.

Theorem. Lossless when the candidates are i.i.d. from :math:`q` and :math:`\gamma(\rho) \le
\rho \le k`. Proof idea: token :math:`x` is accepted with total mass
:math:`\sum_{i<k} (1-\beta)^i \min(q, p/\rho)(x) = \gamma \min(q(x), p(x)/\rho) \le p(x)` (this
is where :math:`\gamma \le \rho` is needed), and all :math:`k` are rejected with probability
:math:`(1-\beta)^k = 1 - \gamma\beta`, exactly the mass of the residual
:math:`p - \gamma\min(p/\rho, q) \ge 0`; the two parts sum to :math:`p`. On a tree, induct
over depth as for SpecInfer (a residual sample equal to a drafted child descends into it).

Acceptance (Thomas et al. 2026, Alg. 8). With :math:`r = (q - p/\rho^*)_+ / (1 - \beta)` the law
of a rejected candidate and :math:`p_\text{res}` the residual,
:math:`\alpha = p_\text{acc} + (1 - p_\text{acc}) \sum_t p_\text{res}(t)(1 - (1 - r(t))^k)`:
see :func:`spectr_acceptance`. At the exact root :math:`\gamma = \rho^*` (when
:math:`\beta > 0`), so the second term is 0 and
:math:`\alpha = \rho^*\beta(\rho^*) = \sum_x \min(p(x), \rho^* q(x))`.

Reference: Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
Transport", NeurIPS 2023, arXiv 2310.15141.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from .._types import Probs, Scalar
from ..noise import Noise
from ..ops import (
    accept_probability,
    accepts,
    categorical,
    clip_probability,
    memo_by_distribution,
    normalise,
    positive_part,
    reuse_uniform,
    total,
)
from ..tree import DraftTree, DrawLaw
from ..validation import check_pair, check_positive_int
from .base import NodeScheme, Step

#: Width of the final bisection bracket: :math:`\rho^*` is returned within this of the root,
#: always on the feasible side (exactly so for ``Fraction`` inputs).
RHO_TOLERANCE = Fraction(1, 2**40)


def optimal_rho(target: Any, draft: Any, num_drafts: int) -> Any:
    r"""K-SEQ's :math:`\rho^*`: the feasible end of the root of :math:`p_\text{acc} - \rho\beta`.

    Bisection on :math:`[1, k]` down to a bracket of width ``RHO_TOLERANCE`` (:math:`2^{-40}`),
    returning the upper end, where :math:`\gamma(\rho) \le \rho` holds. With ``Fraction``
    inputs the bisection runs in exact arithmetic, so the result is a rational number that is
    feasible exactly; with floats it is a float. Returns 1 when :math:`\rho = 1` is already
    feasible (:math:`k = 1`, :math:`p = q`) or the supports are disjoint.

    Parameters
    ----------
    target, draft : array_like, shape (vocab_size,)
        Processed distributions :math:`p` and :math:`q`, both float or both ``Fraction``.
    num_drafts : int
        The number of i.i.d. candidates :math:`k`.

    Examples
    --------
    >>> round(float(optimal_rho([1/2, 1/3, 1/6], [1/3] * 3, 2)), 6)
    1.274292
    >>> optimal_rho([0.7, 0.2, 0.1], [0.7, 0.2, 0.1], 2), optimal_rho([1.0, 0.0], [0.0, 1.0], 2)
    (1.0, 1.0)
    """
    target, draft = check_pair(target, draft)
    return _optimal_rho(target, draft, check_positive_int(num_drafts, "num_drafts"))


def spectr_acceptance(target: Any, draft: Any, num_drafts: int) -> Any:
    r"""K-SEQ with :math:`k` i.i.d. candidates: :math:`P(Y \in \{x_1..x_k\})` at :math:`\rho^*`.

    Thomas et al. (2026, Alg. 8): with :math:`\beta = \sum \min(p/\rho^*, q)`,
    :math:`p_\text{acc} = 1 - (1-\beta)^k`, the law of a rejected candidate
    :math:`r = (q - p/\rho^*)_+ / (1 - \beta)` and the residual :math:`p_\text{res}`,

    .. math:: \alpha = p_\text{acc} + (1 - p_\text{acc})
              \sum_t p_\text{res}(t)\,\bigl(1 - (1 - r(t))^k\bigr).

    The second term counts residual samples equal to a rejected candidate. It vanishes at the
    exact root, where :math:`\gamma = \rho^*` puts the residual on :math:`\{p > \rho^* q\}` and
    the rejected candidates on :math:`\{q > p/\rho^*\}`; at the bisection's :math:`\rho^*`
    (at most :math:`2^{-40}` above the root) it is of that order, so
    :math:`\alpha \approx \sum_x \min(p(x), \rho^* q(x))`. Vectorised over the vocabulary;
    exact (a ``Fraction``) with ``Fraction`` inputs.

    Examples
    --------
    >>> round(float(spectr_acceptance([1/2, 1/3, 1/6], [1/3] * 3, 2)), 6)
    0.924764
    >>> float(spectr_acceptance([1.0, 0.0], [0.0, 1.0], 3))
    0.0
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    rho = _optimal_rho(target, draft, k)
    rejected = _rejection(target, draft, rho)
    all_rejected = rejected**k
    if not all_rejected > 0:
        return 1 - all_rejected
    rejected_law = positive_part(draft - target / rho) / rejected
    hit = total(_residual(target, draft, rho, k) * (1 - (1 - rejected_law) ** k))
    # A probability: a draft summing to 1 + 2**-52 on a disjoint support once gave -2.2e-16.
    return clip_probability(1 - all_rejected + all_rejected * hit)


class SpecTr(NodeScheme):
    """SpecTr K-SEQ per node with the optimal :math:`\\rho^*`; exact on i.i.d. drafts.

    >>> import specsampling as ss
    >>> from specsampling.schemes.spectr import SCHEME
    >>> round(float(ss.acceptance(SCHEME, [1/2, 1/3, 1/6], [1/3] * 3, 3)), 6)
    0.969682
    """

    name = "spectr"
    reference = (
        "Sun et al. 2023, SpecTr: Fast Speculative Decoding via Optimal Transport "
        "(arXiv 2310.15141)"
    )

    laws = frozenset({DrawLaw.IID})

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return spectr_acceptance(target, draft, num_drafts)

    def rho(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        """The :math:`\\rho` used at a node (the hook an infeasible-side mutant overrides)."""
        return _node_rho(target, draft, num_drafts)

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        target, draft = target_probs[node], draft_probs[node]
        candidates = tree.candidates[node]
        rho = self.rho(target, draft, len(candidates))
        uniforms: dict[int, float] = {}
        for child in candidates:
            token = tree.tokens[child]
            scaled = rho * draft[token]
            u = uniforms.get(child, float(noise.accept[child]))
            if accepts(u, target[token], scaled):
                return child, None
            # Rejected: the next copy of this token reads the rescaled uniform (see Noise).
            uniforms[child] = reuse_uniform(u, accept_probability(target[token], scaled))
        residual = _residual(target, draft, rho, len(candidates))
        return None, categorical(residual, noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        target, draft = target_probs[node], draft_probs[node]
        candidates = tree.candidates[node]
        rho = self.rho(target, draft, len(candidates))
        remaining: Any = 1
        descend: dict[int, Any] = {}
        for child in candidates:
            token = tree.tokens[child]
            accept = accept_probability(target[token], rho * draft[token])
            descend[child] = descend.get(child, 0) + remaining * accept
            remaining = remaining * (1 - accept)
        stop = remaining * _residual(target, draft, rho, len(candidates))
        return list(descend.items()), stop


def _rejection(target: Probs, draft: Probs, rho: Scalar) -> Any:
    r""":math:`1 - \beta(\rho) = \sum_x (q(x) - p(x)/\rho)_+`: exactly 0 when :math:`p = q`."""
    return total(positive_part(draft - target / rho))


def _gamma(rejected: Any, num_drafts: int) -> Any:
    r""":math:`\gamma = p_\text{acc}/\beta = \sum_{i<k} (1-\beta)^i` (Horner; no division)."""
    gamma: Any = 1
    for _ in range(num_drafts - 1):
        gamma = 1 + rejected * gamma
    return gamma


def _feasible(target: Probs, draft: Probs, rho: Scalar, num_drafts: int) -> bool:
    return bool(_gamma(_rejection(target, draft, rho), num_drafts) <= rho)


def _optimal_rho(target: Probs, draft: Probs, num_drafts: int) -> Any:
    exact = target.dtype == object
    low: Any = Fraction(1) if exact else 1.0
    if not total(np.minimum(target, draft)) > 0 or _feasible(target, draft, low, num_drafts):
        return low
    high: Any = Fraction(num_drafts) if exact else float(num_drafts)
    tolerance = RHO_TOLERANCE if exact else float(RHO_TOLERANCE)
    # Invariant: low infeasible, high feasible (gamma <= k always, since 1 - beta <= 1).
    while high - low > tolerance:
        middle = (low + high) / 2
        if _feasible(target, draft, middle, num_drafts):
            high = middle
        else:
            low = middle
    return high


#: :func:`_optimal_rho`, memoised: exact enumeration revisits the same node distributions.
_node_rho = memo_by_distribution(_optimal_rho)


def _residual(target: Probs, draft: Probs, rho: Scalar, num_drafts: int) -> Probs:
    r""":math:`\mathrm{norm}((p - \gamma\min(p/\rho, q))_+)`; :math:`p` for a zero residual."""
    capped = np.minimum(target / rho, draft)
    overlap = total(capped) > 0
    gamma = _gamma(_rejection(target, draft, rho), num_drafts) if overlap else 0
    # The clip at 0 changes nothing on the feasible side (gamma(rho) <= rho): there
    # gamma * min(p / rho, q) <= p everywhere, so the weights are already non-negative (a mutant
    # without the clip is equivalent there); it guards rounding at the bisection's bracket.
    weights = positive_part(target - gamma * capped)
    if not total(weights) > 0:
        return target
    return normalise(weights)


SCHEME = SpecTr()
