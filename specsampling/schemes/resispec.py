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
this is the sub-target template of specs/residual-diffusion-poisson.md §A.2, not the paper's rule).
"""

from __future__ import annotations

import copy
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .._types import Prefix, Probs, Scalar
from ..noise import LARGEST_BELOW_ONE, Noise
from ..ops import accept_probability, accepts, categorical, remove_token, total
from ..pairs import ModelPair
from ..shapes import Shape
from ..tree import DraftTree
from ..validation import check_pair, check_positive_int
from .base import NodeScheme, Step, Verdict, VerdictLaw
from .greedy import top_tokens
from .spectr import optimal_rho

#: Relative tolerance of the float check :math:`a_k \le t_k` (few-ulp overshoots are clamped).
RTOL = 1e-12
#: The optimiser's damping grid: :math:`s \in \{0, 1/40, \dots, 39/40\}` (:math:`s = 1` is greedy).
GRID_STEPS = 40
#: At most this many thresholds :math:`\tau` (else top-m sets with m on a geometric grid).
MAX_THRESHOLDS = 32
#: Float vocabularies above this are searched on a compressed vocabulary (see :func:`optimise`).
COMPRESS_ABOVE = 4096
#: Ratio bins per octave of :math:`p/q` in the compressed search.
BINS_PER_OCTAVE = 8
#: Damping rules re-evaluated exactly after a compressed search.
FINALISTS = 4
#: Node-level optimisation is memoised for vocabularies up to this size.
_MEMO_VOCAB = 1024


@dataclass(frozen=True, eq=False)
class Stage:
    """What a policy may read at candidate ``index``: never the candidate itself or later ones.

    Attributes
    ----------
    target, draft : ndarray, shape (vocab_size,)
        :math:`p` and :math:`q` at the node (read-only).
    current : ndarray, shape (vocab_size,)
        The shaped target :math:`t_k` (read-only); :math:`t_1 = p`.
    proposal : ndarray, shape (vocab_size,)
        :math:`q_k`, the law candidate ``index`` was drawn from (read-only).
    index, count : int
        :math:`k` (from 1) and the number of candidates :math:`K` at the node.
    earlier : tuple of int
        Tokens :math:`x_1..x_{k-1}`; empty in the closed form (oblivious policies only).
    """

    target: Probs
    draft: Probs
    current: Probs
    proposal: Probs
    index: int
    count: int
    earlier: Prefix


class Policy(ABC):
    """A shaping rule: the sub-target :math:`a_k` of every stage.

    :meth:`at_node` resolves per-node parameters once (from :math:`p, q, K` only); the verifier
    then calls :meth:`sub_target` of the result at every stage.
    """

    #: ``True`` when :meth:`sub_target` never reads ``stage.earlier``; only such policies have
    #: the closed form (their sub-targets are deterministic under i.i.d. drafting).
    oblivious: ClassVar[bool] = False

    def at_node(self, target: Probs, draft: Probs, num_candidates: int) -> Policy:
        """The rule used at a node with these distributions and candidate count."""
        return self

    @abstractmethod
    def sub_target(self, stage: Stage) -> Probs:
        """:math:`a_k`, shape ``(vocab_size,)``, with :math:`0 \\le a_k \\le t_k`."""


@dataclass(frozen=True)
class Greedy(Policy):
    """:math:`a_k = t_k`: SpecInfer with i.i.d. drafts, RSD without replacement."""

    oblivious: ClassVar[bool] = True

    def sub_target(self, stage: Stage) -> Probs:
        return stage.current


@dataclass(frozen=True)
class ConstantRatio(Policy):
    r""":math:`a_k = \min(t_k, q_k, p/\rho)`; ``rho=None`` takes SpecTr's :math:`\rho^*(p, q, K)`.

    With i.i.d. drafts and :math:`\rho^*` the cap :math:`t_k` is inactive (exactly, for
    ``Fraction`` inputs) and the rule is SpecTr K-SEQ; without replacement the cap keeps it valid.
    """

    rho: Scalar | None = None
    oblivious: ClassVar[bool] = True

    def at_node(self, target: Probs, draft: Probs, num_candidates: int) -> Policy:
        if self.rho is not None:
            return self
        return ConstantRatio(_rho(target, draft, num_candidates))

    def sub_target(self, stage: Stage) -> Probs:
        rho = self.rho
        if rho is None:
            rho = _rho(stage.target, stage.draft, stage.count)
        capped: Probs = np.minimum(np.minimum(stage.target / rho, stage.proposal), stage.current)
        return capped


@dataclass(frozen=True)
class ConfidenceDamping(Policy):
    r"""Damp the draft's high-confidence set :math:`H` on every candidate but the last.

    :math:`a_k = s_k t_k` on :math:`H` and :math:`t_k` elsewhere for :math:`k < K`,
    :math:`a_K = t_K`, with :math:`H = \{x : q(x) \ge \tau\}` (``threshold``; the default 0 damps
    every token) or the ``top`` most probable draft tokens. ``scale`` is one :math:`s` or one per
    candidate (the last entry repeats).
    """

    scale: Scalar | tuple[Scalar, ...] = Fraction(1, 2)
    threshold: Scalar = 0
    top: int | None = None
    oblivious: ClassVar[bool] = True

    def __post_init__(self) -> None:
        scales = self.scale if isinstance(self.scale, tuple) else (self.scale,)
        if not scales or not all(0 <= s <= 1 for s in scales):
            raise ValueError(f"scale: every damping factor must lie in [0, 1], got {self.scale}")
        if self.top is not None:
            check_positive_int(self.top, "top")

    def mask(self, draft: Probs) -> Any:
        """Boolean mask of :math:`H`."""
        if self.top is not None:
            return top_tokens(draft, self.top)
        return np.asarray(draft >= self.threshold, dtype=bool)

    def sub_target(self, stage: Stage) -> Probs:
        if stage.index >= stage.count:
            return stage.current
        scales = self.scale if isinstance(self.scale, tuple) else (self.scale,)
        scale = scales[min(stage.index, len(scales)) - 1]
        damped: Probs = np.where(self.mask(stage.draft), scale * stage.current, stage.current)
        return damped


@dataclass(frozen=True)
class Optimised(Policy):
    """Per node, the member of :func:`optimise`'s family with the largest closed-form acceptance.

    The objective is the i.i.d. closed form; without replacement it is a surrogate (exactness is
    unaffected, acceptance is not guaranteed to beat RSD).
    """

    steps: int = GRID_STEPS
    max_thresholds: int = MAX_THRESHOLDS
    oblivious: ClassVar[bool] = True

    def at_node(self, target: Probs, draft: Probs, num_candidates: int) -> Policy:
        return _cached_optimise(target, draft, num_candidates, self.steps, self.max_thresholds)

    def sub_target(self, stage: Stage) -> Probs:
        return self.at_node(stage.target, stage.draft, stage.count).sub_target(stage)


def check_sub_target(values: Any, stage: Stage, policy: Any) -> Probs:
    """Enforce :math:`0 \\le a_k \\le t_k` pointwise; return :math:`a_k` (floats: clamped).

    ``Fraction`` stages compare exactly. Floats allow a relative excess of ``RTOL`` (rounding,
    clamped to the bound); anything more raises :class:`ValueError` naming the policy and stage.

    >>> import numpy as np
    >>> stage = Stage(*[np.array([0.5, 0.5])] * 4, index=1, count=2, earlier=())
    >>> check_sub_target(np.array([0.5, 0.5 * (1 + 1e-15)]), stage, "demo")
    array([0.5, 0.5])
    >>> check_sub_target(np.array([0.6, 0.4]), stage, "demo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: resispec: policy 'demo' broke ... candidate 1 of 2: a_k > t_k at token 0 (0.6 > 0.5)
    """
    current = stage.current
    sub = np.asarray(values)
    where = f"resispec: policy {policy!r} broke the sub-target contract at candidate "
    where += f"{stage.index} of {stage.count}"
    if sub.shape != current.shape:
        raise ValueError(f"{where}: expected shape {current.shape}, got {sub.shape}")
    exact = current.dtype == object
    if exact and sub.dtype != object:
        raise ValueError(f"{where}: Fraction inputs need an exact (object) sub-target")
    if exact:
        low, high = sub < 0, sub > current
    else:
        sub = sub.astype(np.float64)
        slack = RTOL * np.maximum(np.abs(sub), current)
        low, high = ~(sub >= -slack), sub - current > slack
    for bad, relation in ((high, ">"), (low, "<")):
        token = np.flatnonzero(np.asarray(bad, dtype=bool))
        if token.size:
            x = int(token[0])
            bound = current[x] if relation == ">" else 0
            raise ValueError(
                f"{where}: a_k {relation} {'t_k' if relation == '>' else '0'} at "
                f"token {x} ({sub[x]} {relation} {bound})"
            )
    if exact:
        return sub
    clamped: Probs = np.minimum(np.maximum(sub, 0.0), current)
    return clamped


class Choice(NamedTuple):
    """The optimiser's pick: a resolved policy and its closed-form acceptance."""

    policy: Policy
    acceptance: Any


def optimise(
    target: Any,
    draft: Any,
    num_drafts: int,
    *,
    steps: int = GRID_STEPS,
    max_thresholds: int = MAX_THRESHOLDS,
) -> Choice:
    r"""Best member of the family for :math:`K` i.i.d. candidates, by closed-form acceptance.

    Candidates: greedy (SpecInfer), constant ratio at :math:`\rho^*` (SpecTr) and
    :class:`ConfidenceDamping` with one :math:`s \in \{0, 1/\text{steps}, \dots\}` and
    :math:`\tau` among the distinct values of :math:`q` (at most ``max_thresholds``: beyond, the
    :math:`m`-th largest :math:`q` for :math:`m` on a geometric grid). Ties keep the earlier
    member, so the result is never below SpecInfer or SpecTr. ``Fraction`` inputs stay exact
    (:math:`s` and :math:`\tau` rational). Float vocabularies above ``COMPRESS_ABOVE`` are searched
    on a compressed vocabulary (tokens merged by threshold class and :math:`\log_2(p/q)` bin, exact
    for equal ratios) and the best ``FINALISTS`` rules are then evaluated exactly.

    Examples
    --------
    >>> from fractions import Fraction as F
    >>> choice = optimise([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    >>> choice.policy
    ConfidenceDamping(scale=Fraction(13, 20), threshold=Fraction(1, 3), top=None)
    >>> choice.acceptance
    Fraction(679, 720)
    """
    target, draft = check_pair(target, draft)
    k = check_positive_int(num_drafts, "num_drafts")
    steps = check_positive_int(steps, "steps")
    max_thresholds = check_positive_int(max_thresholds, "max_thresholds")
    return _optimise(target, draft, k, steps, max_thresholds)


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
    return _acceptance(rule, target, draft, k)


class ResiSpec(NodeScheme):
    """The sub-target family per node; exact on i.i.d. and without-replacement drafts.

    ``policy`` chooses :math:`a_k` (default :class:`Optimised`). ``replacement`` is the proposal
    law assumed by direct :meth:`verify` / :meth:`verdict_law` calls (``True``: i.i.d.,
    :math:`q_k = q`; ``False``: :math:`q` without earlier candidates). :meth:`outcomes` and
    :meth:`sample` know the shape and use a copy configured from ``shape.law`` instead.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> scheme = ResiSpec(Greedy())
    >>> ss.acceptance(scheme, [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2)
    Fraction(8, 9)
    """

    name = "resispec"
    reference = (
        "ResiSpec (arXiv 2608.24411), as the exact sub-target family of "
        "specs/residual-diffusion-poisson.md §A.2"
    )

    def __init__(self, policy: Policy | None = None, *, replacement: bool = True) -> None:
        self.policy: Policy = Optimised() if policy is None else policy
        self.replacement = bool(replacement)

    def __repr__(self) -> str:
        return f"<scheme {self.name!r} policy={self.policy!r} replacement={self.replacement}>"

    def supports(self, shape: Shape) -> bool:
        return shape.is_chain or shape.law in ("iid", "without")

    def single_shape(self, num_drafts: int) -> Shape:
        return Shape.star(num_drafts, replacement=self.replacement)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        if not self.replacement:
            return None
        rule = self.policy.at_node(target, draft, num_drafts)
        return _acceptance(rule, target, draft, num_drafts) if rule.oblivious else None

    def for_shape(self, shape: Shape) -> ResiSpec:
        """This scheme with the proposal law of ``shape`` (itself when it already matches)."""
        replacement = shape.law != "without"
        if replacement == self.replacement:
            return self
        configured = copy.copy(self)
        configured.replacement = replacement
        return configured

    def outcomes(
        self, pair: ModelPair, shape: Shape, prefix: Prefix
    ) -> Iterator[tuple[DraftTree, Any, VerdictLaw]]:
        scheme = self.for_shape(shape)
        if scheme is not self:
            return scheme.outcomes(pair, shape, prefix)
        return super().outcomes(pair, shape, prefix)

    def sample(
        self, pair: ModelPair, shape: Shape, rng: np.random.Generator, prefix: Prefix
    ) -> tuple[DraftTree, Verdict]:
        scheme = self.for_shape(shape)
        if scheme is not self:
            return scheme.sample(pair, shape, rng, prefix)
        return super().sample(pair, shape, rng, prefix)

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

    def plan(self, target: Probs, draft: Probs, tokens: Prefix) -> tuple[list[Any], Probs]:
        """Per candidate ``(m_k(x_k), q_k(x_k))`` given earlier rejections, and :math:`t_{K+1}`.

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
                # inside the target's support, is the fallback (peer bug B5).
                break
            current = rest / mass
            if not self.replacement:
                proposal = remove_token(proposal, token)
        return result, current

    def node_verify(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Step:
        candidates = tree.candidates[node]
        tokens = tuple(tree.tokens[c] for c in candidates)
        checks, final = self.plan(target_probs[node], draft_probs[node], tokens)
        uniforms: dict[int, float] = {}
        for child, (kept, proposal) in zip(candidates, checks, strict=False):
            u = uniforms.get(child, float(noise.accept[child]))
            if accepts(u, kept, proposal):
                return child, None
            # Rejected, so u is uniform on [a, 1): rescale it for the next copy of this token.
            accept = accept_probability(kept, proposal)
            uniforms[child] = min(max(float((u - accept) / (1 - accept)), 0.0), LARGEST_BELOW_ONE)
        return None, categorical(final, noise.sample[node])

    def node_law(
        self, tree: DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        candidates = tree.candidates[node]
        tokens = tuple(tree.tokens[c] for c in candidates)
        checks, final = self.plan(target_probs[node], draft_probs[node], tokens)
        remaining: Any = 1
        descend: dict[int, Any] = {}
        for child, (kept, proposal) in zip(candidates, checks, strict=False):
            accept = accept_probability(kept, proposal)
            descend[child] = descend.get(child, 0) + remaining * accept
            remaining = remaining * (1 - accept)
        return list(descend.items()), remaining * final


# --------------------------------------------------------------------------- closed form
#: Sub-targets of a batch of rules: ``(stage index, current (rows, V)) -> (rows, V)``.
Shaper = Callable[[int, Probs], Probs]


def _evaluate(target: Probs, draft: Probs, k: int, shaper: Shaper) -> Probs:
    """The closed form for a batch of oblivious rules (one per row), i.i.d. candidates."""
    current: Probs = target[None, :]
    rejected: Any = 1
    missing: Any = 1
    for index in range(1, k + 1):
        kept = np.minimum(shaper(index, current), draft)
        rest = current - kept
        mass = rest.sum(axis=-1)
        sure = ~np.asarray(mass > 0, dtype=bool)
        safe = np.where(sure, 1, mass)[:, None]
        missing = missing * (1 - (draft - kept) / safe)
        rejected = rejected * np.where(sure, 0 * mass, mass)
        current = rest / safe
    hits = (current * (1 - missing)).sum(axis=-1)
    values: Probs = 1 - rejected + rejected * hits
    return values


def _acceptance(rule: Policy, target: Probs, draft: Probs, k: int) -> Any:
    def shaper(index: int, current: Probs) -> Probs:
        stage = Stage(target, draft, current[0], draft, index, k, ())
        return check_sub_target(rule.sub_target(stage), stage, rule)[None, :]

    return _evaluate(target, draft, k, shaper)[0]


# --------------------------------------------------------------------------- optimiser
def _optimise(target: Probs, draft: Probs, k: int, steps: int, max_thresholds: int) -> Choice:
    best = Choice(Greedy(), _acceptance(Greedy(), target, draft, k))
    if k == 1:
        return best
    ratio = ConstantRatio(_rho(target, draft, k))
    best = max(best, Choice(ratio, _acceptance(ratio, target, draft, k)), key=_value)
    exact = target.dtype == object
    thresholds = _thresholds(draft, max_thresholds)
    if exact:
        scales: Probs = np.array([Fraction(i, steps) for i in range(steps)], dtype=object)
    else:
        scales = np.arange(steps) / steps
    classes = np.searchsorted(thresholds, draft, side="right")
    compressed = not exact and target.shape[0] > COMPRESS_ABOVE
    search = _compress(target, draft, classes) if compressed else (target, draft, classes)
    scored: list[tuple[Any, int, int]] = []
    for j in range(len(thresholds)):
        factors = np.where(search[2][None, :] > j, scales[:, None], 1 + 0 * scales[:, None])

        def damp(index: int, current: Probs, factors: Probs = factors) -> Probs:
            return current * factors if index < k else current

        values = _evaluate(search[0], search[1], k, damp)
        scored.extend((value, j, i) for i, value in enumerate(values))
    scored.sort(key=lambda item: item[0], reverse=True)
    for _, j, i in scored[: FINALISTS if compressed else 1]:
        scale = scales[i] if exact else float(scales[i])
        tau = thresholds[j] if exact else float(thresholds[j])
        rule = ConfidenceDamping(scale=scale, threshold=tau)
        best = max(best, Choice(rule, _acceptance(rule, target, draft, k)), key=_value)
    return best


def _value(choice: Choice) -> Any:
    return choice.acceptance


def _thresholds(draft: Probs, max_thresholds: int) -> Probs:
    """Ascending candidate thresholds :math:`\\tau`: distinct positive :math:`q`, capped."""
    positive = draft[np.asarray(draft > 0, dtype=bool)]
    values: Probs = np.unique(positive)
    if len(values) <= max_thresholds:
        return values
    descending = np.sort(positive)[::-1]
    sizes = np.unique(np.geomspace(1, len(descending), max_thresholds).round().astype(int))
    capped: Probs = np.unique(descending[sizes - 1])
    return capped


def _compress(target: Probs, draft: Probs, classes: Any) -> tuple[Probs, Probs, Any]:
    """Merge tokens of one threshold class and one :math:`\\log_2(p/q)` bin (float search)."""
    limit = 64 * BINS_PER_OCTAVE
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log2(target) - np.log2(draft)
    bins = np.clip(np.floor(np.nan_to_num(ratio) * BINS_PER_OCTAVE), -limit, limit)
    bins = np.where(target == 0, -limit - 1, np.where(draft == 0, limit + 1, bins))
    width = 2 * limit + 3
    keys, inverse = np.unique(classes * width + (bins + limit + 1).astype(int), return_inverse=True)
    merged_target = np.bincount(inverse, weights=target)
    merged_draft = np.bincount(inverse, weights=draft)
    return merged_target, merged_draft, keys // width


def _cached_optimise(
    target: Probs, draft: Probs, k: int, steps: int, max_thresholds: int
) -> Policy:
    key = _key(target, draft)
    if key is None:
        return _optimise(target, draft, k, steps, max_thresholds).policy
    return _memo_optimise(*key, k, steps, max_thresholds)


@functools.lru_cache(maxsize=4096)
def _memo_optimise(target: Any, draft: Any, k: int, steps: int, max_thresholds: int) -> Policy:
    return _optimise(_unkey(target), _unkey(draft), k, steps, max_thresholds).policy


def _rho(target: Probs, draft: Probs, k: int) -> Any:
    key = _key(target, draft)
    if key is None:
        return optimal_rho(target, draft, k)
    return _memo_rho(*key, k)


@functools.lru_cache(maxsize=4096)
def _memo_rho(target: Any, draft: Any, k: int) -> Any:
    return optimal_rho(_unkey(target), _unkey(draft), k)


def _key(target: Probs, draft: Probs) -> tuple[Any, Any] | None:
    """Hashable contents for the memo, or ``None`` for large vocabularies."""
    if target.shape[-1] > _MEMO_VOCAB:
        return None
    if target.dtype == object:
        return tuple(target), tuple(draft)
    return np.asarray(target, np.float64).tobytes(), np.asarray(draft, np.float64).tobytes()


def _unkey(key: Any) -> Probs:
    if isinstance(key, bytes):
        return np.frombuffer(key)
    return np.array(key, dtype=object)


def _read_only(probs: Probs) -> Probs:
    view = probs.view()
    view.flags.writeable = False
    return view


SCHEME = ResiSpec()

__all__ = [
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
