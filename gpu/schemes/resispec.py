r"""ResiSpec residual shaping, lowered for every policy (reference:
:mod:`specsampling.schemes.resispec`, policies in :mod:`~specsampling.schemes.resispec_policy`
and :mod:`~specsampling.schemes.resispec_optimise`).

Per row at a node with candidates :math:`x_1..x_K` (the valid slots, with multiplicity) and
:math:`t_1 = p`, :math:`q_1 = q`: for :math:`k = 1..K` the policy gives :math:`0 \le a_k \le t_k`
(clamped into that range as :func:`~specsampling.schemes.resispec_policy.check_sub_target` does),
:math:`m_k = \min(a_k, q_k)`, and

.. math:: \text{accept } x_k \iff u_k\,q_k(x_k) < m_k(x_k), \qquad
          t_{k+1} = \frac{t_k - m_k}{1 - \sum m_k},

with :math:`q_{k+1} = q_k` for i.i.d. rows and :math:`q_k` without :math:`x_k`, renormalised, for
without-replacement rows (the law is per row). A stage with :math:`1 - \sum m_k \le 0` is the last
one tested; if every tested candidate is rejected the walk stops with :math:`t` of the last stage.
Duplicates reuse the uniform exactly as the reference (:func:`.spectr.reuse_uniform` with the
stage's own :math:`a = \min(1, m_k(x)/q_k(x))`).

Policies (one lowering object per reference policy object, :func:`lower_policy`):

* :class:`Greedy` -- :math:`a_k = t_k`.
* :class:`ConstantRatio` -- :math:`a_k = \min(t_k, q_k, p/\rho)`; ``rho=None`` takes SpecTr's
  :math:`\rho^*(p, q, K)` by the batched bisection of :func:`.spectr.optimal_rho`.
* :class:`ConfidenceDamping` -- :math:`a_k = s_k t_k` on :math:`H` for :math:`k < K`, with
  :math:`H = \{q \ge \tau\}` or the ``top`` most probable draft tokens (ties to the lowest id).
* :class:`Optimised` (the registered default) -- **host-resolved**: the reference optimiser
  (:func:`~specsampling.schemes.resispec_optimise.optimise`, memoised per node) picks greedy,
  a constant ratio or a threshold damping per node by comparing float closed-form acceptances,
  near-ties included (exact ties such as :math:`p = q` are broken by the last bit of a numpy
  pairwise sum). Reproducing that choice bit for bit would need numpy's summation order (and, above
  ``COMPRESS_ABOVE`` tokens, its ``log2`` and ``bincount``) on every device, so
  :meth:`Optimised.rules` runs the reference optimiser per node on the host, level by level
  for the nodes the walk reaches (:class:`~specsampling.gpu.schemes.base.ReachedPlan`: one host
  read per depth holding a node with two or more candidates, none at the root), and hands the
  walk the chosen rule as explicit per-row tensors ``(kind, rho, scale, threshold)``;
  everything after is batched. Only nodes with two or more candidates are planned (the
  optimiser picks greedy for one), so chains have no host step at all. Its cost is the reference
  optimiser's: measured 2026-12-02 at :math:`V = 32{,}000` on a loaded 2-core CPU about 0.27 s
  per planned node (the reference pays the same per node it visits; above ``MEMO_VOCAB`` tokens
  nothing is memoised), far above the batched walk. The explicit policies (``Greedy``,
  ``ConstantRatio``, ``ConfidenceDamping``) have no host step and are the fast,
  ``torch.compile``-able path.

Cost of the batched part: per candidate slot a handful of ``[B, V]`` passes in the input's
precision (float32 stays float32; only the accept test's scalars are float64). A level whose
nodes hold one candidate runs the standard rule (:attr:`ResiSpec.standard_at_one_candidate`:
every policy but a fixed-ratio ``ConstantRatio`` is that rule there, bit for bit). On the CPU
outside ``torch.compile`` (:meth:`ResiSpec.host_step`) each slot's accept test is formed from
the candidates' entries alone and each stage's update for the rows that reject that slot only
(a free host read), written over the walk's own gathered rows, and ``ConstantRatio``'s
:math:`\rho^*` is searched only for the rows whose first verdict depends on it
(:meth:`ResiSpec.searched_rows_only`); accelerators and compiled graphs run the sync-free loop
of every row.
Both routes are path-wise tested.

How per-row data reaches the rule: :meth:`ResiSpec.node_extras` gives the walk ``[B, N, 1 + P]``
(for ``Optimised`` a :class:`~specsampling.gpu.schemes.base.ReachedPlan` of those rows) once per
call (column 0 is 1 for a without-replacement row, the others the policy's per-node
parameters), and :meth:`ResiSpec.step` reads the current node's row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import torch

import specsampling as ss
from specsampling.schemes import resispec as reference
from specsampling.tree import DrawLaw

from .. import ops
from ..tree import PAD, TreeBatch
from .base import NodeLowering, NodeStep, ReachedPlan, standard_step
from .spectr import (
    accept_probability,
    later_copies,
    optimal_rho,
    reuse_uniform,
    rho_ceiling,
    searched_where,
)

#: Resolved-rule kinds of :class:`Optimised` (column 1 of its node parameters).
GREEDY, RATIO, DAMPING = 0, 1, 2
#: The parameters of a node :class:`Optimised` does not plan (fewer than two candidates): greedy.
UNPLANNED = (GREEDY, 1.0, 0.0, 0.0)


def at_least(value: Any) -> float:
    """The smallest float ``f`` with ``x >= f`` iff ``x >= value`` for every float ``x`` (an exact
    threshold given as a ``Fraction``, compared as numpy compares floats with it).

    >>> at_least(Fraction(1, 3)) > 1 / 3, at_least(0.25)
    (True, 0.25)
    """
    rounded = float(value)
    return float(np.nextafter(rounded, np.inf)) if Fraction(rounded) < value else rounded


def top_mask(draft: torch.Tensor, count: int) -> torch.Tensor:
    """Batched :func:`specsampling.schemes.greedy.top_tokens`: the ``count`` most probable tokens
    with positive mass per row, ties to the lowest id (``[B, V]`` bool).

    >>> top_mask(torch.tensor([[0.25, 0.5, 0.25, 0.0]]), 2).tolist()
    [[True, True, False, False]]
    """
    order = torch.sort(-draft, dim=-1, stable=True).indices  # [B, V]
    positive = (draft > 0).sum(-1, keepdim=True)  # [B, 1]
    rank = torch.arange(draft.shape[-1], device=draft.device)  # [V]
    chosen = rank[None, :] < torch.clamp(positive, max=count)  # [B, V] by rank
    return torch.zeros_like(chosen).scatter(-1, order, chosen)  # [B, V]


# --------------------------------------------------------------------------- policies
class Policy(ABC):
    """A lowered shaping policy: per node :meth:`at_node` resolves its parameters, then
    :meth:`sub_target` gives :math:`a_k` at every stage (both sync-free)."""

    #: Per-node parameter columns this policy reads from :meth:`node_parameters`.
    num_parameters: ClassVar[int] = 0
    #: Whether :meth:`sub_target` reads the node's ``target`` / ``draft`` rows (the CPU route of
    #: :meth:`ResiSpec.host_step` passes ``None`` for a table a policy does not read, so that it
    #: gathers no copy of it).
    reads_target: ClassVar[bool] = True
    reads_draft: ClassVar[bool] = True
    #: Whether :meth:`sub_target` is always within :math:`0 \le a_k \le t_k` in every bit (for
    #: non-negative rows), so that the contract's clamp is the identity and
    #: :meth:`ResiSpec.stage` forms :math:`m_k = \min(a_k, q_k)` in one pass instead of three.
    bounded: ClassVar[bool] = False
    #: Whether :meth:`sub_target` is also at most :math:`q_k` in every bit (a minimum with it),
    #: so that :math:`m_k = \min(a_k, q_k)` is :math:`a_k` itself: no pass at all.
    capped: ClassVar[bool] = False
    #: Whether :meth:`at_node` searches each row (passes over ``V``) and :meth:`first_bound`
    #: resolves a rule whose first sub-target is nowhere above it in any bit: the CPU route then
    #: searches only the rows whose first verdict depends on it
    #: (:meth:`ResiSpec.searched_rows_only`).
    searches: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass with its own :meth:`sub_target` declares its own guarantees: ``bounded``
        and ``capped`` are not inherited past a new :math:`a_k` (they default to ``False``)."""
        super().__init_subclass__(**kwargs)
        if "sub_target" in cls.__dict__:
            for flag in ("bounded", "capped"):
                if flag not in cls.__dict__:
                    setattr(cls, flag, False)

    def __init__(self, policy: Any) -> None:
        self.reference = policy

    def __repr__(self) -> str:
        return f"<torch policy {self.reference!r}>"

    def node_parameters(
        self, batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor
    ) -> torch.Tensor:
        """Per-node parameters, ``[B, N, num_parameters]`` (none by default)."""
        return target_probs.new_zeros((*target_probs.shape[:2], self.num_parameters))

    def at_node(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        counts: torch.Tensor,  # [B]
        max_count: int,
        parameters: torch.Tensor,  # [B, num_parameters]
    ) -> Any:
        """What :meth:`sub_target` needs at this node (default: nothing)."""
        return None

    def first_bound(self, target: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """For a policy that :attr:`searches`: a resolved rule, one tensor of rows as its
        :meth:`at_node` returns, whose first sub-target is nowhere above the searched rule's,
        in any bit."""
        raise NotImplementedError(
            f"{type(self).__name__} sets searches = True: it must give first_bound"
        )

    @abstractmethod
    def sub_target(
        self,
        resolved: Any,
        target: torch.Tensor | None,  # [B, V]
        draft: torch.Tensor | None,  # [B, V]
        current: torch.Tensor,  # [B, V]
        proposal: torch.Tensor,  # [B, V]
        index: int,
        counts: torch.Tensor,  # [B]
    ) -> torch.Tensor:
        """:math:`a_k` for candidate ``index`` (from 1) of ``counts`` (``[B, V]``), pointwise:
        every input may also be given at chosen tokens only (``[B, 1]``, ``resolved`` gathered
        by :func:`resolved_at`). ``target`` (``draft``) is ``None`` where
        :attr:`reads_target` (:attr:`reads_draft`) is false."""


class Greedy(Policy):
    """:math:`a_k = t_k` (:class:`specsampling.schemes.resispec.Greedy`)."""

    reads_target = reads_draft = False
    bounded = True

    def sub_target(self, resolved, target, draft, current, proposal, index, counts):
        return current  # [B, V]


class ConstantRatio(Policy):
    r""":math:`a_k = \min(t_k, q_k, p/\rho)`, :math:`\rho^*` batched when ``rho`` is ``None``."""

    reads_draft = False
    bounded = True  # a minimum with t_k of non-negative terms (rho > 0)
    capped = True  # and with q_k

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self.rho = None if policy.rho is None else float(policy.rho)
        self.searches = self.rho is None  # only rho* is searched; a fixed rho costs nothing
        if self.rho is not None and not self.rho > 0:  # the reference's contract check fails
            raise ValueError(f"rho: a positive ratio, or None for rho*, got {policy.rho!r}")

    def first_bound(self, target: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        r""":math:`\rho` = :func:`.spectr.rho_ceiling` per row (``[B]``): no smaller than
        :math:`\rho^*`, so :math:`p/\rho` and the first sub-target are nowhere larger (a correctly
        rounded division is monotone)."""
        return rho_ceiling(counts, target.dtype)  # [B]

    def at_node(self, target, draft, counts, max_count, parameters):
        if self.rho is None and target.dtype == torch.float64:  # static: the reference's rho*
            # of its validated rows, each divided by its (numpy-order) sum, as check_pair does
            target = ops.normalise_in_place(target.clone(), target)  # [B, V]
            draft = ops.normalise_in_place(draft.clone(), draft)  # [B, V]
        if self.rho is None:  # static: the policy object's parameter
            return optimal_rho(target, draft, counts, max_count)  # [B]
        return torch.full_like(target[:, 0], self.rho)  # [B]

    def sub_target(self, resolved, target, draft, current, proposal, index, counts):
        return ratio_sub_target(resolved, target, current, proposal)  # [B, V]


def ratio_sub_target(
    rho: torch.Tensor, target: torch.Tensor, current: torch.Tensor, proposal: torch.Tensor
) -> torch.Tensor:
    r""":math:`\min(\min(p/\rho, q_k), t_k)` in the reference's order (``[B, V]``), in one
    fresh buffer."""
    capped = target / rho[:, None]  # [B, V]
    torch.minimum(capped, proposal, out=capped)
    return torch.minimum(capped, current, out=capped)  # [B, V]


class ConfidenceDamping(Policy):
    """:math:`a_k = s_k t_k` on the draft's high-confidence set for every candidate but the last
    (:class:`specsampling.schemes.resispec.ConfidenceDamping`)."""

    reads_target = reads_draft = False
    bounded = True

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        scales = policy.scale if isinstance(policy.scale, tuple) else (policy.scale,)
        self.scales = tuple(float(s) for s in scales)
        self.threshold = at_least(policy.threshold)
        self.top = policy.top

    def at_node(self, target, draft, counts, max_count, parameters):
        if self.top is not None:  # static: the policy object's parameter
            return top_mask(draft, self.top)  # [B, V]
        return draft >= self.threshold  # [B, V]

    def sub_target(self, resolved, target, draft, current, proposal, index, counts):
        # the last candidate undamped: a factor 1 there (x * 1 == x), one pass over V
        scale = self.scales[min(index, len(self.scales)) - 1]
        damped = torch.full_like(counts, scale, dtype=current.dtype)  # [B]
        factor = torch.where(index >= counts, 1.0, damped)  # [B]
        return torch.where(resolved, factor[:, None] * current, current)  # [B, V]


class Optimised(Policy):
    """The reference optimiser's per-node rule, resolved on the host (see the module docstring);
    the resolved ``(kind, rho, scale, threshold)`` are applied batched."""

    num_parameters = 4
    reads_draft = False
    bounded = True  # the ratio's rule or a damping by a scale in [0, 1]

    def node_parameters(
        self, batch: TreeBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor
    ) -> torch.Tensor:
        """``[B, N, 4]``: the reference ``policy.at_node`` of every node with two or more
        candidates, encoded as ``(kind, rho, scale, threshold)``; greedy elsewhere (the
        reference optimiser returns greedy for one candidate, before any search).

        The whole table at once (the walk plans only the nodes it reaches instead,
        :meth:`ResiSpec.node_extras`). With one candidate slot (chains) nothing is planned: no
        host synchronisation. Otherwise one synchronisation, and one reference optimiser call per
        node with two or more candidates (:meth:`rules`)."""
        greedy = torch.tensor(UNPLANNED, dtype=target_probs.dtype)  # [4]
        out = greedy.to(target_probs.device).expand(*target_probs.shape[:2], 4)  # [B, N, 4]
        if batch.candidates.shape[-1] < 2:  # static: no node has two candidates
            return out
        counts = (batch.candidates != PAD).sum(-1)  # [B, N]
        rows, nodes = (counts >= 2).nonzero(as_tuple=True)  # [M] each (host sync)
        if rows.numel() == 0:
            return out
        rules = self.rules(
            batch, target_probs, draft_probs, list(zip(rows.tolist(), nodes.tolist(), strict=True))
        )
        out = out.clone()
        out[rows, nodes] = rules.to(out.device, out.dtype)  # [M, 4]
        return out

    def rules(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
        pairs: list[tuple[int, int]],
    ) -> torch.Tensor:
        """``[M, 4]`` float64: the encoded reference rule of each ``(row, node)`` (each with two or
        more candidates), on the host. Only those nodes' rows are copied there; rows of
        float32/bf16/fp16 tables are renormalised in float64 first, and float64 rows whose mass
        is off 1 by more than the reference's own tolerance (which ``verify`` let through at the
        caller's ``tolerance``, or unchecked) too: the reference optimiser would refuse them.
        Float64 rows within it go as they are, as to the reference."""
        rows = torch.tensor([row for row, _ in pairs], device=target_probs.device)  # [M]
        nodes = torch.tensor([node for _, node in pairs], device=target_probs.device)  # [M]
        target = target_probs[rows, nodes].detach().cpu().to(torch.float64).numpy()  # [M, V]
        draft = draft_probs[rows, nodes].detach().cpu().to(torch.float64).numpy()  # [M, V]
        low = target_probs.dtype != torch.float64
        # Low-precision rows sum to 1 only roughly; the reference validates float64 masses.
        target, draft = (_renormalised(t, everywhere=low) for t in (target, draft))
        counts = (batch.candidates[rows, nodes] != PAD).sum(-1).tolist()  # [M]
        jobs = [(target[index], draft[index], count) for index, count in enumerate(counts)]
        encoded = [encode(rule) for rule in plan_nodes(self.reference.at_node, jobs)]
        return torch.tensor(encoded, dtype=torch.float64).reshape(len(pairs), 4)  # [M, 4]

    def at_node(self, target, draft, counts, max_count, parameters):
        kind, rho, scale, threshold = parameters.unbind(-1)  # [B] each
        return kind, rho, scale, draft >= threshold[:, None]

    def sub_target(self, resolved, target, draft, current, proposal, index, counts):
        kind, rho, scale, mask = resolved
        ratio = ratio_sub_target(rho, target, current, proposal)  # [B, V]
        damp = mask & ((kind == DAMPING) & (index < counts))[:, None]  # [B, V]
        damped = torch.where(damp, scale[:, None] * current, current)  # [B, V]
        return torch.where((kind == RATIO)[:, None], ratio, damped)  # [B, V]


#: Vocabulary size from which :func:`plan_nodes` plans nodes on several threads.
PLAN_THREADS_FROM = 1024


def plan_nodes(at_node: Callable[..., Any], jobs: list[tuple[Any, ...]]) -> list[Any]:
    """``at_node(*job)`` for every job, in order: the reference optimiser of each planned node,
    spread over torch's intra-op threads (``torch.get_num_threads()``; numpy's array loops
    release the GIL, so nodes plan side by side: about 2x on two cores at 32,000 tokens) from
    :data:`PLAN_THREADS_FROM` tokens. The same rules as one loop (each call is a pure function
    of its node; the memo is thread-safe), only sooner."""
    workers = min(len(jobs), torch.get_num_threads())
    if workers <= 1 or len(jobs[0][0]) < PLAN_THREADS_FROM:  # small nodes: a pool costs more
        return [at_node(*job) for job in jobs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: at_node(*job), jobs))


def encode(rule: Any) -> tuple[float, float, float, float]:
    """A resolved reference rule as ``(kind, rho, scale, threshold)``."""
    if isinstance(rule, reference.Greedy):
        return (GREEDY, 1.0, 1.0, 0.0)
    if isinstance(rule, reference.ConstantRatio) and rule.rho is not None:
        return (RATIO, float(rule.rho), 1.0, 0.0)
    if (
        isinstance(rule, reference.ConfidenceDamping)
        and rule.top is None
        and not isinstance(rule.scale, tuple)
    ):
        return (DAMPING, 1.0, float(rule.scale), at_least(rule.threshold))
    raise NotImplementedError(f"resispec: cannot encode the resolved rule {rule!r}")


#: Lowered policy class of each reference policy class.
POLICIES: dict[type, type[Policy]] = {
    reference.Greedy: Greedy,
    reference.ConstantRatio: ConstantRatio,
    reference.ConfidenceDamping: ConfidenceDamping,
    reference.Optimised: Optimised,
}


def lower_policy(policy: Any) -> Policy:
    """The lowered policy of a reference policy object.

    >>> lower_policy(reference.Greedy())
    <torch policy Greedy()>
    """
    return POLICIES[type(policy)](policy)


# --------------------------------------------------------------------------- the scheme
class ResiSpec(NodeLowering):
    """The sub-target family per node, batched; exact on i.i.d. and without-replacement rows.

    ``policy`` is a reference policy object (default: the registered scheme's, ``Optimised()``),
    as for :class:`specsampling.schemes.resispec.ResiSpec`.
    """

    name = "resispec"

    def __init__(self, policy: Any = None) -> None:
        registered = ss.SCHEMES[self.name].policy
        self.policy = lower_policy(registered if policy is None else policy)

    def __repr__(self) -> str:
        return f"<torch lowering {self.name!r} policy={self.policy.reference!r}>"

    @property
    def reference_scheme(self) -> reference.ResiSpec:
        """The reference object with the same policy (the registered one for its policy)."""
        registered = ss.SCHEMES[self.name]
        assert isinstance(registered, reference.ResiSpec)
        if registered.policy == self.policy.reference:
            return registered
        return reference.ResiSpec(self.policy.reference)

    hot_path: ClassVar[tuple[str, ...]] = (
        "walk",
        "step",
        "decide",
        "stage",
        "kept",
        "reuse",
        "shaped_rest",
    )

    def node_extras(
        self,
        batch: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor,  # [B, N, V]
    ) -> torch.Tensor | ReachedPlan:
        """Each row's law (``1``: without replacement) and the policy's node parameters,
        ``[B, N, 1 + P]``; for :class:`Optimised` a :class:`~.base.ReachedPlan` of the same rows,
        which plans only the nodes the walk reaches."""
        without = [law is DrawLaw.WITHOUT for law in batch.laws]
        law = torch.tensor(without, dtype=draft_probs.dtype, device=draft_probs.device)  # [B]
        if isinstance(self.policy, Optimised):
            policy = self.policy
            unplanned = torch.tensor(UNPLANNED, dtype=law.dtype, device=law.device)  # [4]
            default_rows = torch.cat([law[:, None], unplanned.expand(len(law), 4)], -1)  # [B, 5]

            def default(node: torch.Tensor) -> torch.Tensor:
                return default_rows  # [B, 1 + 4]

            def plan(pairs: list[tuple[int, int]]) -> torch.Tensor:
                rules = policy.rules(batch, target_probs, draft_probs, pairs)  # [M, 4]
                laws = torch.tensor([[without[row]] for row, _ in pairs], dtype=torch.float64)
                return torch.cat([laws, rules], -1)  # [M, 1 + 4]

            return ReachedPlan(batch, default, plan)
        law = law[:, None, None].expand(-1, draft_probs.shape[1], 1)  # [B, N, 1]
        parameters = self.policy.node_parameters(batch, target_probs, draft_probs)  # [B, N, P]
        return torch.cat([law, parameters.to(law.dtype)], -1)  # [B, N, 1 + P]

    @property
    def standard_at_one_candidate(self) -> bool:
        r"""Whether a node with one candidate is verified by the standard rule, bit for bit:
        every policy but ``ConstantRatio`` with a fixed :math:`\rho` gives
        :math:`\min(p, q) \le a_1 \le t_1 = p` there (greedy and damping's undamped last
        candidate :math:`a_1 = p`, SpecTr's :math:`\rho^* = 1` :math:`a_1 = \min(p, q)`, the
        optimiser's greedy), so :math:`m_1 = \min(p, q)`: the rest :math:`p - \min(p, q)` is
        :math:`(p - q)_+` in every bit, normalised the same way, and the test
        :math:`u\,q(x) < \min(p, q)(x)` (:meth:`shaped_accepts`) is the standard
        :math:`u\,q(x) < p(x)` wherever :math:`q(x) > 0`. A level whose nodes hold at most one
        candidate then runs :func:`~.base.standard_step` with that test."""
        policy = self.policy
        return not (isinstance(policy, ConstantRatio) and policy.rho is not None)

    def shaped_accepts(
        self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor
    ) -> torch.Tensor:
        r"""The one-candidate test with :math:`m_1 = \min(p, q)`, :math:`u\,q(x) < m_1(x)`: the
        standard test wherever :math:`q(x) > 0`, and a rejection of a token the draft gives no
        mass (which the standard test would accept)."""
        return self.accepts(u, torch.minimum(target_x, draft_x), draft_x)

    def level_extras(
        self, extras: Any, depth: int, node: torch.Tensor, done: torch.Tensor
    ) -> torch.Tensor:
        """The current nodes' rows: gathered, or planned where the walk reaches them
        (:meth:`~.base.ReachedPlan.at`, host reads, outside the hot path)."""
        if isinstance(extras, ReachedPlan):
            return extras.at(depth, node, done)
        return super().level_extras(extras, depth, node, done)

    def reuse(self, u: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
        """The uniform the next copy of a rejected token reads (``[B]``)."""
        return reuse_uniform(u, accept)

    def shaped_rest(
        self, current: torch.Tensor, kept: torch.Tensor, token: torch.Tensor
    ) -> torch.Tensor:
        """:math:`t_k - m_k` (``[B, V]``; a mutant keeps the rejected token's mass)."""
        return current - kept

    def node_step(
        self,
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> NodeStep:
        """ResiSpec decides in :meth:`step`: it needs its node extras (law and policy)."""
        raise TypeError("ResiSpec.node_step: call step(extras, ...) with node_extras' row")

    def step(
        self,
        extras: torch.Tensor,  # [B, 1 + P]
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
        owned: bool = False,
    ) -> NodeStep:
        num_slots = candidate_tokens.shape[1]
        if num_slots == 1 and self.standard_at_one_candidate:  # static: the level's slots
            return standard_step(
                self.shaped_accepts, target, draft, candidate_tokens, candidate_valid,
                accept_uniforms,
            )  # fmt: skip
        without = extras[:, 0] > 0  # [B]
        parameters = extras[:, 1:]  # [B, P]
        counts = candidate_valid.sum(-1)  # [B]
        if self.rejecting_rows_only(target):  # static: the CPU outside torch.compile
            resolved = self.searched_rows_only(
                parameters, counts, target, draft, candidate_tokens, candidate_valid,
                accept_uniforms,
            )  # fmt: skip
            return self.host_step(
                resolved, without, counts, target, draft, candidate_tokens, candidate_valid,
                accept_uniforms, owned,
            )  # fmt: skip
        resolved = self.policy.at_node(target, draft, counts, num_slots, parameters)
        current, proposal = target, draft  # [B, V] each
        uniforms = accept_uniforms  # [B, C]
        accepted = torch.full_like(counts, PAD)  # [B]
        staging = candidate_valid[:, 0]  # [B] the plan reaches this slot
        for slot in range(num_slots):
            token = candidate_tokens[:, slot]  # [B]
            staging = staging & candidate_valid[:, slot]  # [B]
            kept, rest, mass = self.stage(
                resolved, target, draft, current, proposal, slot + 1, counts, token
            )  # [B, V], [B, V], [B, 1]
            kept_x = ops.gather_tokens(kept, token)  # [B]
            proposal_x = ops.gather_tokens(proposal, token)  # [B]
            accepted, _, uniforms = self.decide(
                slot, kept_x, proposal_x, staging, accepted, uniforms, candidate_tokens
            )  # [B], [B, C]
            goes_on = staging & (mass[:, 0] > 0)  # [B]
            safe_mass = torch.where(mass > 0, mass, torch.ones_like(mass))  # [B, 1]
            current = torch.where(goes_on[:, None], rest / safe_mass, current)  # [B, V]
            removed = ops.remove_token(proposal, token)  # [B, V]
            proposal = torch.where((goes_on & without)[:, None], removed, proposal)  # [B, V]
            staging = goes_on
        return NodeStep(accepted, current)

    def decide(
        self,
        slot: int,
        kept_x: torch.Tensor,  # [B]: m_k(x_k)
        proposal_x: torch.Tensor,  # [B]: q_k(x_k)
        staging: torch.Tensor,  # [B] bool: the row's plan reaches this slot
        accepted: torch.Tensor,  # [B]: the accepted slot so far, or PAD
        uniforms: torch.Tensor,  # [B, C]
        candidate_tokens: torch.Tensor,  # [B, C]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The accept test of slot ``slot`` for the rows still testing, ``u q_k(x) < m_k(x)``:
        ``(accepted, rejected [B] bool, uniforms)``, a rejected token's later copies reading the
        rescaled uniform (:func:`.spectr.reuse_uniform`)."""
        u = uniforms[:, slot]  # [B]
        testing = staging & (accepted == PAD)  # [B]
        passes = self.accepts(u, kept_x, proposal_x)  # [B]
        accepted = torch.where(testing & passes, slot, accepted)
        rejected = testing & ~passes  # [B]
        reused = self.reuse(u, accept_probability(kept_x, proposal_x))  # [B]
        copies = rejected[:, None] & later_copies(candidate_tokens, slot)  # [B, C]
        return accepted, rejected, torch.where(copies, reused[:, None], uniforms)

    def stage(
        self,
        resolved: Any,
        target: torch.Tensor | None,  # [R, V]; None where the policy does not read it
        draft: torch.Tensor | None,  # [R, V]; None where the policy does not read it
        current: torch.Tensor,  # [R, V]: t_k
        proposal: torch.Tensor,  # [R, V]: q_k
        index: int,
        counts: torch.Tensor,  # [R]
        token: torch.Tensor,  # [R]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One stage of the given rows: ``(m_k, t_k - m_k, its mass [R, 1])``, the mass in
        numpy's order in float64."""
        sub = self.policy.sub_target(resolved, target, draft, current, proposal, index, counts)
        kept = self.kept(sub, current, proposal)  # [R, V]
        rest = self.shaped_rest(current, kept, token)  # [R, V]
        return kept, rest, ops.numpy_sum(rest)[:, None]

    def kept(
        self, sub: torch.Tensor, current: torch.Tensor, proposal: torch.Tensor
    ) -> torch.Tensor:
        r""":math:`m_k = \min(a_k, q_k)` with :math:`a_k` clamped into :math:`[0, t_k]` (the
        contract), in one pass for a ``bounded`` policy, whose clamp is exact, and none for a
        ``capped`` one (:math:`a_k` itself)."""
        if self.policy.capped:  # static: the policy's
            return sub
        if self.policy.bounded:  # static: the policy's
            return torch.minimum(sub, proposal)
        return torch.minimum(torch.minimum(sub.clamp_min(0), current), proposal)

    def rejecting_rows_only(self, target: torch.Tensor) -> bool:
        """Whether :meth:`step` forms each stage's update for the rows that reject only
        (:meth:`host_step`): on the CPU outside ``torch.compile``, where reading which rows
        those are is free."""
        return ops.host_reads_free(target)

    def searched_rows_only(
        self,
        parameters: torch.Tensor,  # [B, P]
        counts: torch.Tensor,  # [B]
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
    ) -> Any:
        r"""The policy's :meth:`~Policy.at_node` on the CPU route: for a policy that
        :attr:`~Policy.searches`, resolved only for the rows whose verdict depends on it (a host
        read, free there). A row whose first candidate passes the test of
        :meth:`host_step` under :meth:`~Policy.first_bound`'s rule passes it under the searched
        one too (a first sub-target no larger can only pass more), and reads nothing else of the
        node; those rows, and rows of at most one candidate (:math:`\rho^* = 1 = k`), keep the
        bound's rule without a pass over ``V``: the same verdicts (the accelerators' loop
        resolves every row)."""
        policy, num_slots = self.policy, candidate_tokens.shape[1]
        if not policy.searches:
            return policy.at_node(target, draft, counts, num_slots, parameters)
        bound = policy.first_bound(target, counts)  # [B]
        column = candidate_tokens[:, :1]  # [B, 1]
        target_x, draft_x = target.gather(-1, column), draft.gather(-1, column)  # [B, 1] each
        kept_x = self.kept_at(bound, column, target_x, draft_x, target_x, draft_x, 1, counts)
        first = self.accepts(accept_uniforms[:, 0], kept_x[:, 0], draft_x[:, 0])  # [B]
        searched = (counts > 1) & ~(candidate_valid[:, 0] & first)  # [B]
        return searched_where(
            searched,
            bound,
            lambda rows: policy.at_node(
                ops.take_rows(target, rows),
                ops.take_rows(draft, rows),
                counts[rows],
                num_slots,
                parameters[rows],
            ),
        )  # [B]

    def kept_at(
        self,
        resolved: Any,
        column: torch.Tensor,  # [B, 1]: one token per row
        target_x: torch.Tensor,  # [B, 1]: p there
        draft_x: torch.Tensor,  # [B, 1]: q there
        current_x: torch.Tensor,  # [B, 1]: t_k there
        proposal_x: torch.Tensor,  # [B, 1]: q_k there
        index: int,
        counts: torch.Tensor,  # [B]
    ) -> torch.Tensor:
        """:math:`m_k` at the tokens ``column`` from the rows' entries there (``[B, 1]``; the
        policies are pointwise: the gathered values of the whole rows, bit for bit)."""
        policy = self.policy
        sub_x = policy.sub_target(
            resolved_at(resolved, column),
            target_x if policy.reads_target else None,
            draft_x if policy.reads_draft else None,
            current_x, proposal_x, index, counts,
        )  # fmt: skip
        return self.kept(sub_x, current_x, proposal_x)  # [B, 1]

    def host_step(
        self,
        resolved: Any,
        without: torch.Tensor,  # [B] bool
        counts: torch.Tensor,  # [B]
        target: torch.Tensor,  # [B, V]
        draft: torch.Tensor,  # [B, V]
        candidate_tokens: torch.Tensor,  # [B, C]
        candidate_valid: torch.Tensor,  # [B, C]
        accept_uniforms: torch.Tensor,  # [B, C]
        owned: bool = False,
    ) -> NodeStep:
        """:meth:`step` with each slot's accept test formed from the candidates' entries alone
        (the policy's :math:`a_k` is pointwise: applied to the gathered columns it gives the
        gathered values of the whole rows, bit for bit) and each stage's update
        (:meth:`stage`, the next :math:`t` and a without-replacement row's next :math:`q`)
        formed for the rows that reject that slot only, read on the host.

        The running rows stay **compact** between slots: :math:`t_k`, :math:`q_k` (and
        :math:`p`, :math:`q` for a policy that :attr:`~Policy.reads_target` /
        :attr:`~Policy.reads_draft`) of the rows that rejected the last slot, in row order
        (``live``). A slot's rejecting rows are among them: they are gathered from the compact
        rows only where fewer reject than went on (none at all where every row rejects again),
        and a row's :math:`t` is written into the returned rows once, when it stops rejecting
        (no candidate left, or no mass left: :math:`t_k`), instead of every running row being
        written back at every slot. The returned rows are ``target`` itself when the caller
        ``owned`` it (the walk's gathered rows: ``target`` and ``draft`` two distinct fresh
        buffers), else a copy made at the first write; :math:`p`
        at the candidates is read before anything is written, and a :math:`q_k` is written
        over in place only where it is this step's own (gathered, or an owned ``draft``) and
        the policy does not read ``draft``. A row that accepted, or is not tested, costs no
        pass over ``V``; its returned row goes stale, unread: the walk draws from the
        returned rows only where every candidate was rejected (the sync-free loop of
        :meth:`step` forms every row's update at every slot and selects)."""
        policy = self.policy
        num_rows, num_slots = candidate_tokens.shape
        in_place = not policy.reads_draft  # whether a q_k of our own may be written over
        target_columns = None  # [B, C]: p at the candidates, read before target is written
        if policy.reads_target:  # static: the policy's
            target_columns = target.gather(-1, candidate_tokens)  # [B, C]
        any_without = bool(without.any())  # the host read (free here)
        out, out_owned = target, owned  # [B, V]: the returned rows; whether they are ours

        def stop(ids: torch.Tensor, values: torch.Tensor) -> None:  # the rows ids stop there
            nonlocal out, out_owned
            if not out_owned:  # a caller's rows: copied at the first write
                out, out_owned = target.clone(), True
            out.index_copy_(0, ids, values)

        live: torch.Tensor | None = None  # [R]: the compact rows' ids, sorted (None: all rows)
        current, proposal = target, draft  # [R, V]: t_k and q_k of the live rows
        rows_target = target if policy.reads_target else None  # [R, V]: p there, if read
        rows_draft = draft if policy.reads_draft else None  # [R, V]: q there, if read
        proposal_owned = owned and in_place  # whether proposal may be written over
        uniforms = accept_uniforms  # [B, C]
        accepted = torch.full_like(counts, PAD)  # [B]
        staging = candidate_valid[:, 0]  # [B]: the plan reaches this slot
        for slot in range(num_slots):
            token = candidate_tokens[:, slot]  # [B]
            staging = staging & candidate_valid[:, slot]  # [B]
            column = token[:, None]  # [B, 1]
            if live is None:
                current_x, proposal_x = current.gather(-1, column), proposal.gather(-1, column)
            else:  # the live rows' entries, spread to [B] (zeros elsewhere: not tested)
                current_x = spread_rows(current.gather(-1, column[live]), live, num_rows)
                proposal_x = spread_rows(proposal.gather(-1, column[live]), live, num_rows)
            target_x = None if target_columns is None else target_columns[:, slot : slot + 1]
            draft_x = draft.gather(-1, column) if policy.reads_draft else None  # [B, 1]
            kept_x = self.kept_at(
                resolved, column, target_x, draft_x, current_x, proposal_x, slot + 1, counts
            )  # [B, 1]
            accepted, rejected, uniforms = self.decide(
                slot, kept_x[:, 0], proposal_x[:, 0], staging, accepted, uniforms,
                candidate_tokens,
            )  # fmt: skip
            rows = rejected.nonzero()[:, 0]  # [R'], the host read: among the live rows
            if rows.shape[0] == 0:  # no row tests on: the later slots test nothing
                break
            if rows.shape[0] < (num_rows if live is None else live.shape[0]):  # gather them
                at = rows if live is None else torch.searchsorted(live, rows)  # [R']
                current, proposal = ops.take_rows(current, at), ops.take_rows(proposal, at)
                if rows_target is not None:  # t_1 = p: no second copy
                    rows_target = current if live is None else ops.take_rows(rows_target, at)
                if rows_draft is not None:  # q_1 = q: no second copy
                    rows_draft = proposal if live is None else ops.take_rows(rows_draft, at)
                proposal_owned = in_place
            rows_token = token[rows]  # [R']
            _, rest, mass = self.stage(
                resolved_rows(resolved, rows), rows_target, rows_draft, current, proposal,
                slot + 1, counts[rows], rows_token,
            )  # fmt: skip
            goes_on = mass[:, 0] > 0  # [R']
            if not bool(goes_on.all()):  # rare: no mass left, the row stops with t_k
                if live is not None:  # t_k is a compact row (t_1 = p is the returned row)
                    stops = (~goes_on).nonzero()[:, 0]
                    stop(rows[stops], ops.take_rows(current, stops))
                keep = goes_on.nonzero()[:, 0]  # [R'']
                rows, rows_token, rest, mass = rows[keep], rows_token[keep], rest[keep], mass[keep]
                proposal = ops.take_rows(proposal, keep)
                if rows_target is not None:
                    rows_target = ops.take_rows(rows_target, keep)
                if rows_draft is not None:
                    rows_draft = ops.take_rows(rows_draft, keep)
                proposal_owned = in_place
                if rows.shape[0] == 0:
                    break
            current = rest.div_(mass)  # [R', V]: t_{k+1}
            shrinks = without[rows]  # [R']
            if any_without and bool(shrinks.any()):  # q_{k+1}: q_k without the token
                if bool(shrinks.all()):
                    proposal = ops.remove_token(proposal, rows_token, in_place=proposal_owned)
                else:  # a batch of mixed laws
                    some = shrinks.nonzero()[:, 0]
                    removed = ops.remove_token(
                        ops.take_rows(proposal, some), rows_token[some], in_place=True
                    )  # fmt: skip
                    proposal = proposal if proposal_owned else proposal.clone()
                    proposal.index_copy_(0, some, removed)
                proposal_owned = in_place
            live = rows
            staging = torch.zeros_like(staging)  # [B]: only a rejecting row tests on
            staging[rows] = True
            last = slot + 1 == num_slots  # the rows without a next candidate stop with t_{k+1}
            stops = slice(None) if last else (~candidate_valid[rows, slot + 1]).nonzero()[:, 0]
            if last or stops.shape[0] > 0:
                stop(rows[stops], ops.take_rows(current, stops))
        return NodeStep(accepted, out)


def spread_rows(values: torch.Tensor, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``values [R, ...]`` of the rows ``rows [R]`` placed in a zero ``[num_rows, ...]``.

    >>> spread_rows(torch.tensor([[2.0], [3.0]]), torch.tensor([2, 0]), 3).tolist()
    [[3.0], [0.0], [2.0]]
    """
    return values.new_zeros((num_rows, *values.shape[1:])).index_copy_(0, rows, values)


def resolved_at(resolved: Any, column: torch.Tensor) -> Any:
    """A policy's resolved node data (:meth:`Policy.at_node`: ``None``, a tensor or a tuple of
    them) at one token per row, ``column [B, 1]``: per-token tables ``[B, V]`` gathered to
    ``[B, 1]``, per-row values ``[B]`` kept."""
    if isinstance(resolved, tuple):
        return tuple(resolved_at(part, column) for part in resolved)
    if isinstance(resolved, torch.Tensor) and resolved.dim() == 2:
        return resolved.gather(-1, column)  # [B, 1]
    return resolved


def resolved_rows(resolved: Any, rows: torch.Tensor) -> Any:
    """A policy's resolved node data (:func:`resolved_at`) for the rows ``rows [R]``."""
    if isinstance(resolved, tuple):
        return tuple(resolved_rows(part, rows) for part in resolved)
    if isinstance(resolved, torch.Tensor):
        return resolved[rows]
    return resolved


LOWERING = ResiSpec()
LOWERINGS = (LOWERING,)


def _renormalised(rows: np.ndarray, everywhere: bool) -> np.ndarray:
    """``rows [M, V]`` (float64) divided by their masses: every row (``everywhere``), or only
    those whose mass is off 1 by more than the reference's ``MASS_TOLERANCE``."""
    mass = rows.sum(-1, keepdims=True)  # [M, 1]
    off = np.abs(mass - 1) > ss.validation.MASS_TOLERANCE  # [M, 1]
    return np.where(everywhere | off, rows / np.maximum(mass, 1e-300), rows)
