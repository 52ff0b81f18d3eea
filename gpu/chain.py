r"""Chains in the FlashInfer/vLLM layout, with a fast path for the standard rule
(reference: :mod:`specsampling.schemes.standard`; chains of :class:`~specsampling.DraftTree`).

Layout. Row :math:`b` drafted :math:`x_{b,0..n_b-1}` (``draft_tokens [B, γ]``, ``n_b =
num_draft_tokens[b] <= γ``); ``target_probs[b, i]`` is :math:`p_i`, the target after the first
:math:`i` drafts (``[B, γ + 1, V]``), ``draft_probs[b, i]`` is :math:`q_i` (``[B, γ, V]``), or
``None`` for point-mass drafts (n-gram, prompt lookup, EAGLE argmax): :math:`q_i =
\mathbf 1_{x_i}`. The chain is node-numbered as :meth:`DraftTree.chain
<specsampling.DraftTree.chain>`: node :math:`i + 1` holds draft :math:`i`, so noise lane
:math:`i + 1` of ``accept`` tests draft :math:`i` and lane :math:`k` of ``sample`` draws the stop
token after :math:`k` accepted drafts.

Standard rule, all tests at once. With :math:`a_i = [\,u_{i+1}\,q_i(x_i) < p_i(x_i)\,]` for
every :math:`i` (one gather of :math:`p_i(x_i), q_i(x_i)`: ``[B, γ]``), the number accepted is
:math:`k = \min\{i : \neg a_i\}` (``n_b`` when none fails; a cumulative product), and the row
emits :math:`x_{0..k-1}` then :math:`y \sim \mathrm{norm}((p_k - q_k)_+)` drawn by inverse CDF
with :math:`u^\text{sample}_k` (:math:`p_{n_b}` itself for the bonus when :math:`k = n_b`): one
residual row and one draw per row, roughly one read of the tables. A point-mass residual is
:math:`p_k` with :math:`x_k` removed. The reference's residual *hit* (a stop token equal to the
drafted child descends into it) can only happen on a zero-mass residual, whose fallback is
:math:`p_k` itself; such a row resumes at :math:`k + 1` in one more round (:class:`StandardChain`;
deciding that another round is needed is one host check, skipped with ``validate=False``).

Which schemes take a fast path. Those whose rule on a one-candidate chain *is* the standard
rule, noise lane for noise lane: ``standard``, ``specinfer`` and ``rsd`` (recursive rejection with
one candidate), ``spectr`` (:math:`\rho^* = 1` with one candidate) and ``resispec`` (every policy
but a fixed-ratio ``ConstantRatio``; its test reads :math:`\min(p, q)`, so a drafted token of no
draft mass is rejected: :class:`ShapedChain`), ``spechub``, ``ot_optimal``, ``ot_binned`` and
``khisti`` (their plans start at two candidates; one candidate is ``standard_step``):
:func:`takes_standard_rule`, here; ``nss``, ``block`` and ``traversal`` have their own chain
engines (:mod:`specsampling.gpu.chain_rules`: gathered values, a fused row pass for each of
block/traversal's masses that can decide the verdict, one stop row). ``greedy`` (Hu et al.),
the one other registered scheme exact on sampled chains, is the standard rule at a node whose
draft has more than the drafted token in its support, and NSS's rule (draw :math:`y \sim p`
with the sample uniform, descend when it is the drafted token) where the drafted token covers
it: with point-mass drafts (``draft_probs=None``) it takes NSS's engine, with draft tables
:class:`GreedyChain` (both rules at once, one select per lane by the covering mask). Every
registered scheme exact on sampled chains therefore has a chain engine here; the general walk
on a :class:`~specsampling.gpu.TreeBatch` of chains (law ``iid``) serves subclasses (mutants).

Host routes. A round of one or two rows on the CPU (outside ``torch.compile``) is dominated by
the number of small tensor ops, not by passes over ``V``: there the engines walk each row on the
host (:meth:`StandardChain.host_run`, :meth:`GreedyChain.host_run`,
:meth:`~specsampling.gpu.chain_rules.BlockChain.host_run` up to eight rows): accept tests and
weights as Python floats (the same float64 operations), lanes tested only up to the first
failure, torch only for the rows over ``V`` (on views of the tables), the same functions for
the stop draw. The same tokens as the batched routes (tested bit for bit in float64; float32 may
differ where torch's threads add one long row in another order than a batch of rows).

Precision. float64 tables give the reference's verdicts bit for bit; float32 (bf16/fp16 upcast
to it, row by row on the standard path) is the fast path: accept tests in float64 on gathered
values, residual rows in float32, the stop token by the two-level inverse CDF of
:func:`~specsampling.gpu.ops.categorical_blocks` -- no ``[B, γ, V]`` (or ``[B, V]``) float64
temporary. ``dtype=`` chooses either explicitly. Point-mass drafts are exact for
every such scheme: a deterministic draft is a (degenerate) sample from :math:`\mathbf 1_{x_i}`,
so the chain is a sampled chain of that draft (certified in ``tests/test_gpu_chain.py`` with the
exact engine on a :class:`~specsampling.ModelPair` whose draft is a point mass).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

import torch

from specsampling.errors import InvalidDistribution, UnsupportedShape
from specsampling.schemes.khisti import Khisti
from specsampling.schemes.ot_binned import OTBinned
from specsampling.schemes.ot_optimal import OTOptimal
from specsampling.tree import DrawLaw

from . import ops
from .api import TOLERANCE, check_table_kind, check_tolerance, raise_row_defect
from .chain_rules import BLOCK_CHAIN, NSS_CHAIN, TRAVERSAL_CHAIN, ChainRound, host_verdicts
from .noise import Noise, check_generator
from .schemes import tree_lowering
from .schemes.base import HostPlanned, TreeLowering, Verified
from .schemes.block import Block
from .schemes.greedy import Greedy
from .schemes.nss import NSS
from .schemes.resispec import ResiSpec
from .schemes.rsd import RSD
from .schemes.spechub import SpecHub
from .schemes.specinfer import SpecInfer
from .schemes.spectr import SpecTr
from .schemes.standard import Standard
from .schemes.traversal import Traversal
from .tree import PAD, TreeBatch

#: Lowerings whose rule on a one-candidate chain is the standard accept/residual rule (exact
#: types: a subclass, such as a mutant, runs its own walk).
STANDARD_RULE: tuple[type, ...] = (Standard, SpecInfer, RSD)
#: Reference schemes behind :class:`~specsampling.gpu.schemes.base.HostPlanned` lowerings whose
#: one-candidate nodes are ``standard_step`` (exact types, as above).
HOST_PLANNED_STANDARD: tuple[type, ...] = (OTOptimal, OTBinned, Khisti)


def takes_standard_rule(lowering: Any) -> bool:
    r"""Whether ``lowering`` verifies a chain by the standard rule, noise lane for noise lane:
    :data:`STANDARD_RULE`; SpecTr and ResiSpec, whose rules on one candidate per node reduce
    to it bit for bit (SpecTr's :math:`\rho^* = 1`; ResiSpec's policies all give
    :math:`m_1 = \min(p, q)` there, except ``ConstantRatio`` with a fixed :math:`\rho`, so
    its test is the standard one wherever :math:`q(x) > 0`: :func:`standard_rule_engine`); and
    SpecHub,
    OT-optimal, OT-binned and Khisti et al.'s verifier, whose references run
    ``standard_step`` with the child's accept and the node's sample uniform at every node with
    one candidate (their plans only start at two). Greedy (Hu et al.) is not among them: a
    point-mass draft covers the draft's support, so its node draws from the target instead. The
    path-wise chain tests (``tests/test_gpu_chain.py``) check each against its reference.

    >>> from specsampling.schemes.resispec_policy import ConstantRatio as Ratio
    >>> takes_standard_rule(ResiSpec()), takes_standard_rule(ResiSpec(Ratio(rho=1.25)))
    (True, False)
    >>> takes_standard_rule(tree_lowering("khisti")), takes_standard_rule(tree_lowering("greedy"))
    (True, False)
    """
    kind = type(lowering)
    if kind in STANDARD_RULE or kind is SpecTr or kind is SpecHub:
        return True
    if kind is HostPlanned:
        return type(lowering.scheme) in HOST_PLANNED_STANDARD
    if kind is ResiSpec:
        return bool(lowering.standard_at_one_candidate)
    return False


#: The chain engines of :mod:`specsampling.gpu.chain_rules`, by exact lowering type.
CHAIN_RULES: dict[type, Any] = {NSS: NSS_CHAIN, Block: BLOCK_CHAIN, Traversal: TRAVERSAL_CHAIN}


class ChainTables(NamedTuple):
    r"""Validated chain inputs for :class:`StandardChain`, as flat tables plus row maps.

    ``target_flat [R, V]`` and ``target_index [B, γ + 1]`` (the flat row of :math:`p_i`);
    ``draft_flat [R', V]`` and ``draft_index [B, γ]``, or ``None`` (point mass);
    ``draft_tokens [B, γ]`` with padding lanes set to ``0`` (never used as an index unmasked);
    ``num_drafts [B]``; ``bonus_tokens [B]`` when the caller drew the bonus (vLLM), else ``None``;
    ``draft_mass [R']`` or ``None``: the rule reads ``draft_flat[r] / draft_mass[r]``, divided
    element by element where it is read (greedy's :math:`q' = \mathrm{norm}(q)`, never a
    normalised copy of the table).
    """

    target_flat: torch.Tensor  # [R, V]
    target_index: torch.Tensor  # [B, γ + 1]
    draft_flat: torch.Tensor | None  # [R', V]
    draft_index: torch.Tensor | None  # [B, γ]
    draft_tokens: torch.Tensor  # [B, γ]
    num_drafts: torch.Tensor  # [B]
    bonus_tokens: torch.Tensor | None  # [B]
    dtype: torch.dtype
    draft_mass: torch.Tensor | None = None  # [R']: divide each draft row by it (greedy's q')


def padded_tables(
    draft_tokens: torch.Tensor,  # [B, γ]
    num_drafts: torch.Tensor,  # [B]
    target_probs: torch.Tensor,  # [B, γ + 1, V]
    draft_probs: torch.Tensor | None,  # [B, γ, V]
    dtype: torch.dtype | None = None,
) -> ChainTables:
    """The :class:`ChainTables` of the padded chain layout (views, no copy when each row is
    contiguous), computing in ``dtype`` (by default :func:`~specsampling.gpu.ops.compute_dtype`
    of the tables). Row ``b``, lane ``i`` is flat row ``b (γ + 1) + i`` of the target and
    ``b γ + i`` of the draft: each index table is one ``arange``. A table whose rows are not
    contiguous (a column-major one) is copied to rows first: a float32 sum along a strided row
    adds in another order, and greedy's draft masses and the sync-free routes' block sums would
    move by an ulp with the caller's layout."""
    batch_size, gamma = draft_tokens.shape
    device = draft_tokens.device
    real = torch.arange(gamma, device=device) < num_drafts[:, None]  # [B, γ]
    vocab = target_probs.shape[-1]
    target_probs = ops.row_major(target_probs)
    draft_flat = draft_index = None
    if draft_probs is not None:
        draft_flat = ops.row_major(draft_probs).reshape(batch_size * gamma, vocab)  # [B γ, V]
        draft_index = torch.arange(batch_size * gamma, device=device).view(batch_size, gamma)
    if dtype is None:
        dtype = ops.compute_dtype(target_probs, *(() if draft_probs is None else (draft_probs,)))
    return ChainTables(
        target_flat=target_probs.reshape(batch_size * (gamma + 1), vocab),  # [B (γ+1), V]
        target_index=torch.arange(batch_size * (gamma + 1), device=device).view(
            batch_size, gamma + 1
        ),  # [B, γ + 1]
        draft_flat=draft_flat,
        draft_index=draft_index,  # [B, γ]
        draft_tokens=torch.where(real, draft_tokens, 0),  # [B, γ]
        num_drafts=num_drafts,
        bonus_tokens=None,
        dtype=dtype,
    )


def residual_weights(
    target: torch.Tensor,
    draft: torch.Tensor | None,
    token: torch.Tensor,
    out: torch.Tensor | None = None,
    divisor: torch.Tensor | None = None,
):
    r"""``((p - q)_+ [B, V], mass [B, 1])`` -- for a point-mass draft (``draft=None``) the
    target with the rejected ``token [B]`` removed (:math:`p(x) < 1` on a rejection), the same
    values :func:`specsampling.gpu.ops.residual` computes against a one-hot draft (the mass in
    numpy's order in float64, :func:`~specsampling.gpu.ops.numpy_sum`). A ``draft`` given is
    overwritten with the weights unless ``out`` is (pass rows of your own: no new ``[B, V]``
    buffer); with ``divisor [B, 1]`` the draft read is ``q / divisor`` (greedy's
    :math:`q' = \mathrm{norm}(q)`), in the same pass.

    >>> weights, mass = residual_weights(torch.tensor([[0.5, 0.25, 0.25]]), None,
    ...                                  torch.tensor([0]))
    >>> weights.tolist(), mass.tolist()
    ([[0.0, 0.25, 0.25]], [[0.5]])
    """
    weights = residual_rows(target, draft, token, out, divisor)  # [B, V]
    return weights, ops.numpy_sum(weights)[:, None]  # [B, V], [B, 1]


def residual_rows(
    target: torch.Tensor,
    draft: torch.Tensor | None,
    token: torch.Tensor | None,
    out: torch.Tensor | None = None,
    divisor: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weights of :func:`residual_weights` without their mass, ``[B, V]`` (``token`` is
    read only for a point-mass draft): for a draw that learns whether they have mass from its
    own block sums (:func:`~specsampling.gpu.ops.draw_one_or`). A ``divisor`` is applied by
    ``addcdiv(p, q, divisor, value=-1)``, whose :math:`(-q) / d` is :math:`-(q / d)` exactly:
    the values of dividing the row first and subtracting it, one pass fewer."""
    if draft is None:
        assert token is not None, "a point-mass draft's residual needs the rejected token"
        return target.scatter(-1, token[:, None], 0.0)  # [B, V]
    into = draft if out is None else out
    if divisor is None:
        torch.sub(target, draft, out=into)  # [B, V], in `draft`/`out`
    else:
        divisor = divisor.to(into.dtype)  # in the compute dtype, as q is read
        torch.addcdiv(target, draft, divisor, value=-1, out=into)  # p - q / d
    return into.clamp_min_(0)


def stop_distribution(
    target: torch.Tensor, weights: torch.Tensor, mass: torch.Tensor, bonus: torch.Tensor
) -> torch.Tensor:
    r"""Per row the bonus target (``bonus [B]``), else :math:`\mathrm{norm}(w)`, or the target
    where ``w`` has zero mass: :func:`specsampling.gpu.ops.residual`'s values, in one select.

    >>> stop_distribution(torch.tensor([[0.5, 0.5]] * 3), torch.tensor([[0.2, 0.0], [0.0, 0.0],
    ...                   [0.2, 0.0]]), torch.tensor([[0.2], [0.0], [0.2]]),
    ...                   torch.tensor([False, False, True])).tolist()
    [[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]]
    """
    has_mass = mass > 0  # [B, 1]
    normalised = weights / torch.where(has_mass, mass, torch.ones_like(mass))  # [B, V]
    return torch.where(bonus[:, None] | ~has_mass, target, normalised)  # [B, V]


class GreedyLane(NamedTuple):
    """One lane's values on :class:`GreedyChain`'s host route."""

    mass: torch.Tensor  # [1]: the draft row's mass, as :meth:`GreedyChain.sparse_lanes`
    draft_x: float  # q'(x) in float64
    covers: bool  # x holds all of q
    drawn: int  # the NSS draw y ~ p where it covers, else PAD


class HostChain(NamedTuple):
    """A chain round's small values as host lists (:meth:`StandardChain.host_read`), and
    ``lanes``: what :class:`GreedyChain` has formed per ``(row, lane)`` so far."""

    drafted: list[list[int]]  # [B][γ]
    ends: list[int]  # [B]
    accept: list[list[float]]  # [B][γ + 1]
    sample: list[list[float]]  # [B][γ + 1]
    target_index: list[list[int]]  # [B][γ + 1]
    draft_index: list[list[int]] | None  # [B][γ]
    bonus: list[int] | None  # [B]
    gathered: list[list[list[float]]]  # [B][2][γ]: p_i(x_i), q_i(x_i) in float64
    lanes: dict[tuple[int, int], GreedyLane]  # greedy's lanes formed so far


#: The most rows :class:`StandardChain` and :class:`GreedyChain` verify on the host (CPU,
#: eager): each row's walk costs a dozen small ops, the batched route ~60 for the batch
#: (2026-12-05, 2 cores: 0.13 against 0.18 ms for standard at one row of 152k tokens, 0.18
#: against 0.29 for greedy; level at two rows of 32k, behind from four).
HOST_STANDARD_ROWS = 2


def on_host(tables: ChainTables, rows: int = HOST_STANDARD_ROWS) -> bool:
    """Whether a chain engine takes its host route: a CPU round outside ``torch.compile`` of
    up to ``rows`` rows with at least one lane."""
    batch_size, gamma = tables.draft_tokens.shape
    return gamma > 0 and 0 < batch_size <= rows and ops.host_reads_free(tables.target_flat)


class StandardChain:
    """The standard rule on a batch of chains: all accept tests at once, then one stop round.

    A round finds, per row, the first failed test at or after ``start`` and draws the stop token
    there; a row whose stop token equals its drafted token (a residual hit, zero-mass residuals
    only) resumes after it in the next round, exactly as the reference walk descends. Rows
    without a hit give the same verdict again, so rounds can be repeated blindly (``rounds``,
    sync-free) or until no row hits (``rounds=None``, one host check per round).
    """

    hot_path: ClassVar[tuple[str, ...]] = ("tests", "passes", "stop_round", "pack")

    def tests(self, tables: ChainTables, accept_uniforms: torch.Tensor) -> torch.Tensor:
        """The accept test of every real draft, ``[B, γ]`` bool (``accept_uniforms [B, γ]``)."""
        gamma = tables.draft_tokens.shape[1]
        tokens = tables.draft_tokens  # [B, γ]
        lanes = torch.arange(gamma, device=tokens.device)  # [γ]
        real = lanes[None, :] < tables.num_drafts[:, None]  # [B, γ]
        target_x = tables.target_flat[tables.target_index[:, :gamma], tokens]  # [B, γ]
        draft_x = self.drafted_mass(tables, accept_uniforms)  # [B, γ]
        return real & self.passes(accept_uniforms, target_x, draft_x)  # [B, γ]

    def passes(
        self, accept_uniforms: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor
    ) -> torch.Tensor:
        r"""The lanes' test :math:`u\,q(x) < p(x)` (:func:`~specsampling.gpu.ops.accepts`)."""
        return ops.accepts(accept_uniforms, target_x, draft_x)

    # ---------------------------------------------------------- host dispatch (no tensor values)
    def drafted_mass(self, tables: ChainTables, like: torch.Tensor) -> torch.Tensor:
        """:math:`q_i(x_i)` of every lane, ``[B, γ]`` (``1`` for point-mass drafts)."""
        if tables.draft_flat is None:
            return torch.ones_like(like)  # [B, γ]
        drafted = tables.draft_flat[tables.draft_index, tables.draft_tokens]  # [B, γ]
        if tables.draft_mass is None:
            return drafted
        return drafted / tables.draft_mass[tables.draft_index]  # [B, γ]

    def residual(
        self, tables: ChainTables, target: torch.Tensor, lane: torch.Tensor, token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual weights and mass at the stop lane (``target [B, V]``, ``lane, token [B]``)."""
        if tables.draft_flat is None:
            return residual_weights(target, None, token)
        draft_row = tables.draft_index.gather(1, lane[:, None]).squeeze(-1)  # [B]
        draft = tables.draft_flat.index_select(0, draft_row)  # [B, V] (faster than [draft_row])
        draft = draft.to(tables.dtype)  # our own copy: worked on in place from here
        divisor = None  # q read as q / draft_mass where the tables carry one
        if tables.draft_mass is not None:
            divisor = tables.draft_mass.index_select(0, draft_row)[:, None]  # [B, 1]
        return residual_weights(target, draft, token, divisor=divisor)

    def draw(
        self,
        target: torch.Tensor,  # [B, V]
        weights: torch.Tensor,  # [B, V]
        mass: torch.Tensor,  # [B, 1]
        bonus: torch.Tensor,  # [B] bool
        u: torch.Tensor,  # [B] float64
    ) -> torch.Tensor:
        """The stop token, ``[B]``: float64 normalises and draws by
        :func:`~specsampling.gpu.ops.categorical` (the reference's roundings); below float64
        :func:`~specsampling.gpu.ops.categorical_blocks_or` draws from the unnormalised weights
        or the target (the bonus, a zero-mass residual), reading each row about once."""
        if weights.dtype == torch.float64:
            return ops.categorical(stop_distribution(target, weights, mass, bonus), u)
        use_target = bonus | ~(mass.squeeze(-1) > 0)  # [B]
        return ops.categorical_blocks_or(weights, target, use_target, u)

    def given_bonus(
        self, tables: ChainTables, bonus: torch.Tensor, drawn: torch.Tensor
    ) -> torch.Tensor:
        """The caller's bonus token where a row accepted every draft (vLLM layout), ``[B]``."""
        if tables.bonus_tokens is None:
            return drawn  # [B]
        return torch.where(bonus, tables.bonus_tokens, drawn)  # [B]

    # ---------------------------------------------------------- the hot path
    def stop_round(
        self,
        tables: ChainTables,
        accepted: torch.Tensor,  # [B, γ] bool
        sample_uniforms: torch.Tensor,  # [B, γ + 1] float64
        start: torch.Tensor,  # [B]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(num_accepted [B], token [B], hit [B])`` for the first failure at or after
        ``start``."""
        batch_size, gamma = accepted.shape
        device = accepted.device
        rows = torch.arange(batch_size, device=device)  # [B]
        lanes = torch.arange(gamma, device=device)  # [γ]
        passes = accepted | (lanes[None, :] < start[:, None])  # [B, γ]
        num_accepted = passes.to(torch.long).cumprod(-1).sum(-1)  # [B]
        num_accepted = torch.minimum(num_accepted, tables.num_drafts)  # [B]
        bonus = num_accepted >= tables.num_drafts  # [B]
        lane = num_accepted.clamp_max(gamma - 1)  # [B] a real draft lane (γ >= 1)
        token = tables.draft_tokens.gather(1, lane[:, None]).squeeze(-1)  # [B]
        target_row = tables.target_index.gather(1, num_accepted[:, None]).squeeze(-1)  # [B]
        target = tables.target_flat.index_select(0, target_row).to(tables.dtype)  # [B, V]
        weights, mass = self.residual(tables, target, lane, token)  # [B, V], [B, 1]
        u = sample_uniforms[rows, num_accepted]  # [B]
        drawn = self.draw(target, weights, mass, bonus, u)  # [B]
        drawn = self.given_bonus(tables, bonus, drawn)  # [B]
        hit = ~bonus & (drawn == token)  # [B]
        return num_accepted, drawn, hit

    def pack(
        self, tables: ChainTables, num_accepted: torch.Tensor, token: torch.Tensor
    ) -> Verified:
        """The accepted drafts, then ``token``, ``PAD`` after: ``[B, γ + 1]``."""
        gamma = tables.draft_tokens.shape[1]
        device = token.device
        lanes = torch.arange(gamma + 1, device=device)[None, :]  # [1, γ + 1]
        drafts = torch.cat(
            [tables.draft_tokens, torch.zeros_like(tables.draft_tokens[:, :1])], dim=1
        )  # [B, γ + 1]
        tokens = torch.where(lanes < num_accepted[:, None], drafts, PAD)  # [B, γ + 1]
        tokens = torch.where(lanes == num_accepted[:, None], token[:, None], tokens)
        return Verified(num_accepted, token, tokens, num_accepted + 1)

    def run(
        self, tables: ChainTables, noise: Noise, rounds: int | None = None
    ) -> tuple[Verified, torch.Tensor]:
        """Verify every row; returns the verdicts and the rows still unresolved (``[B]`` bool,
        all ``False`` unless ``rounds`` was too small). ``rounds=None`` repeats until no row
        hits (one host check per round, at most ``γ + 1`` rounds). On the CPU outside
        ``torch.compile``, up to :data:`HOST_STANDARD_ROWS` rows take :meth:`host_run`."""
        if on_host(tables):
            return self.host_run(tables, noise, rounds)
        return self.batched_run(tables, noise, rounds)

    def batched_run(
        self, tables: ChainTables, noise: Noise, rounds: int | None = None
    ) -> tuple[Verified, torch.Tensor]:
        """:meth:`run` on the batch at once: every accept test, then the stop rounds."""
        accepted = self.tests(tables, noise.accept[:, 1:])  # [B, γ]
        return self.resolve(tables, accepted, noise.sample, rounds)

    # ---------------------------------------------------------- the host route (CPU, few rows)
    def host_run(
        self, tables: ChainTables, noise: Noise, rounds: int | None = None
    ) -> tuple[Verified, torch.Tensor]:
        """:meth:`run` row by row on the host: each lane's accept test as Python floats (the
        same float64 product and comparison as :func:`~specsampling.gpu.ops.accepts`), tested
        from ``start`` up to the first failure only, then the stop row's residual and draw on
        views of the tables (:meth:`draw`, the batched route's own functions on one row) and,
        after a residual hit, the next round from the lane after it. The same tokens as the
        batched route (float64 bit for bit; float32 up to the order torch adds a long row);
        a few host reads instead of ~60 small tensor ops per call."""
        batch_size, gamma = tables.draft_tokens.shape
        host = self.host_read(tables, noise)
        total = max(gamma + 1 if rounds is None else rounds, 1)
        nodes, drawn, hits = [], [], []
        for row in range(batch_size):
            end, start = host.ends[row], 0
            for index in range(total):
                accepted = start
                while accepted < end and self.host_passes(tables, host, row, accepted):
                    accepted += 1
                token, hit = self.host_stop(tables, host, row, accepted)
                if not hit or index + 1 == total:
                    break
                start = accepted + 1
            nodes.append(accepted)
            drawn.append(token)
            hits.append(hit)
        device = tables.draft_tokens.device
        verified = host_verdicts(nodes, drawn, host.drafted, device)
        return verified, torch.tensor(hits, dtype=torch.bool, device=device)

    def host_read(self, tables: ChainTables, noise: Noise) -> HostChain:
        """The round's small values as host lists (one read each): tokens, lengths, uniforms,
        table rows and the gathered :math:`p_i(x_i), q_i(x_i)` in float64."""
        return HostChain(
            drafted=tables.draft_tokens.tolist(),
            ends=tables.num_drafts.tolist(),
            accept=noise.accept.tolist(),
            sample=noise.sample.tolist(),
            target_index=tables.target_index.tolist(),
            draft_index=None if tables.draft_index is None else tables.draft_index.tolist(),
            bonus=None if tables.bonus_tokens is None else tables.bonus_tokens.tolist(),
            gathered=self.host_gathered(tables, noise),
            lanes={},
        )

    def host_gathered(self, tables: ChainTables, noise: Noise) -> list[list[list[float]]]:
        """:math:`p_i(x_i), q_i(x_i)` of every lane in float64, ``[B][2][γ]`` (one read)."""
        gamma = tables.draft_tokens.shape[1]
        target_x = tables.target_flat[tables.target_index[:, :gamma], tables.draft_tokens]
        draft_x = self.host_drafted_mass(tables, noise)  # [B, γ] float64
        pair = torch.stack([target_x.to(torch.float64), draft_x], 1)  # [B, 2, γ]
        return pair.tolist()

    def host_drafted_mass(self, tables: ChainTables, noise: Noise) -> torch.Tensor:
        """:meth:`drafted_mass` in float64, ``[B, γ]``, for :meth:`host_passes`."""
        return self.drafted_mass(tables, noise.accept[:, 1:]).to(torch.float64)

    def host_passes(self, tables: ChainTables, host: HostChain, row: int, lane: int) -> bool:
        """The accept test of a real ``lane``: ``u q(x) < p(x)`` in float64."""
        target_x, draft_x = self.host_pair(tables, host, row, lane)
        return host.accept[row][lane + 1] * draft_x < target_x

    def host_pair(
        self, tables: ChainTables, host: HostChain, row: int, lane: int
    ) -> tuple[float, float]:
        """:math:`(p_i(x_i), q_i(x_i))` of a real ``lane`` in float64."""
        return host.gathered[row][0][lane], host.gathered[row][1][lane]

    def host_target_row(self, tables: ChainTables, host: HostChain, flat: int) -> torch.Tensor:
        """Flat target row ``flat`` in the compute dtype, ``[1, V]``, contiguous as the batched
        route's gathered rows (a row's sums depend on its layout)."""
        return tables.target_flat[flat : flat + 1].to(tables.dtype).contiguous()

    def host_draft(
        self, tables: ChainTables, host: HostChain, row: int, lane: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(q, divisor)`` at ``lane`` as the residual reads them: the table's row ``[1, V]``
        (a view, in the compute dtype) and ``tables.draft_mass``'s entry ``[1, 1]`` where the
        tables carry one, else ``None``."""
        assert tables.draft_flat is not None and host.draft_index is not None
        flat = host.draft_index[row][lane]
        draft = self.host_draft_row(tables, host, flat).to(tables.dtype)  # [1, V]
        if tables.draft_mass is None:
            return draft, None
        return draft, tables.draft_mass[flat : flat + 1, None]  # [1, V], [1, 1]

    def host_draft_row(self, tables: ChainTables, host: HostChain, flat: int) -> torch.Tensor:
        """Flat draft row ``flat`` as the table holds it, ``[1, V]`` (a view)."""
        assert tables.draft_flat is not None
        return tables.draft_flat[flat : flat + 1]

    def host_stop(
        self, tables: ChainTables, host: HostChain, row: int, accepted: int
    ) -> tuple[int, bool]:
        """``(token, hit)`` of :meth:`stop_round` for one row after ``accepted`` drafts."""
        gamma = tables.draft_tokens.shape[1]
        bonus = accepted >= host.ends[row]
        lane = min(accepted, gamma - 1)
        token = host.drafted[row][lane]
        flat = host.target_index[row][accepted]
        target = self.host_target_row(tables, host, flat)  # [1, V]
        weights = None  # the bonus draws from the target itself: no residual to form
        if not bonus and tables.draft_flat is None:
            weights = residual_rows(target, None, torch.tensor([token]))  # [1, V]
        elif not bonus:
            draft, divisor = self.host_draft(tables, host, row, lane)  # [1, V], [1, 1]
            weights = residual_rows(target, draft, None, torch.empty_like(target), divisor)
        u = host.sample[row][accepted]
        if tables.dtype == torch.float64:  # normalised as the batched route does (bit for bit)
            if weights is None:
                weights, mass = target, torch.ones_like(target[:, :1])  # [1, V], [1, 1]
            else:
                mass = ops.numpy_sum(weights)[:, None]  # [1, 1]
            uniform = torch.tensor([u], dtype=torch.float64)
            drawn = int(self.draw(target, weights, mass, torch.tensor([bonus]), uniform)[0])
        elif weights is None:
            drawn = ops.draw_one(target[0], u)
        else:  # :meth:`draw`'s choice and draw on host values: the target where no mass is left
            drawn = ops.draw_one_or(weights[0], target[0], u)
        if bonus and host.bonus is not None:
            drawn = host.bonus[row]
        return drawn, not bonus and drawn == token

    def resolve(
        self,
        tables: ChainTables,
        accepted: torch.Tensor,  # [B, γ] bool
        sample_uniforms: torch.Tensor,  # [B, γ + 1] float64
        rounds: int | None,
        settle: Any = None,
    ) -> tuple[Verified, torch.Tensor]:
        """The stop rounds of :meth:`run` from the accept tests; ``settle(num_accepted, token,
        hit) -> (token, hit)`` (optional) revises each round's stop before the hit check."""
        gamma = tables.draft_tokens.shape[1]
        start = torch.zeros_like(tables.num_drafts)  # [B]
        total = gamma + 1 if rounds is None else rounds
        for index in range(max(total, 1)):
            num_accepted, token, hit = self.stop_round(tables, accepted, sample_uniforms, start)
            if settle is not None:
                token, hit = settle(num_accepted, token, hit)
            if rounds is None and not bool(hit.any()):
                break
            if index + 1 < total:
                start = torch.where(hit, num_accepted + 1, start)  # [B]
        return self.pack(tables, num_accepted, token), hit


#: The engine :func:`verify_chain` uses for :data:`STANDARD_RULE` schemes.
STANDARD_CHAIN = StandardChain()


class ShapedChain(StandardChain):
    r"""The standard engine with ResiSpec's one-candidate test, :math:`u\,q(x) < m_1(x)`,
    :math:`m_1 = \min(p, q)` (:meth:`ResiSpec.shaped_accepts
    <specsampling.gpu.schemes.resispec.ResiSpec.shaped_accepts>`): the standard test wherever
    :math:`q(x) > 0`, a rejection where the draft gives its token no mass (which the standard
    test accepts); the residual :math:`(p - q)_+` is the same."""

    def passes(
        self, accept_uniforms: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor
    ) -> torch.Tensor:
        return ops.accepts(accept_uniforms, torch.minimum(target_x, draft_x), draft_x)

    def host_passes(self, tables: ChainTables, host: HostChain, row: int, lane: int) -> bool:
        target_x, draft_x = self.host_pair(tables, host, row, lane)
        return host.accept[row][lane + 1] * draft_x < min(target_x, draft_x)


#: The engine :func:`verify_chain` uses for ResiSpec where :func:`takes_standard_rule`.
SHAPED_CHAIN = ShapedChain()


def standard_rule_engine(lowering: Any) -> StandardChain:
    r"""The engine of a lowering that :func:`takes_standard_rule`: :data:`SHAPED_CHAIN` for
    ResiSpec (a drafted token of no draft mass is rejected), :data:`STANDARD_CHAIN` for the
    others (their references accept it: :math:`u \cdot 0 < p(x)`)."""
    return SHAPED_CHAIN if type(lowering) is ResiSpec else STANDARD_CHAIN


class GreedyChain(StandardChain):
    r"""Hu et al.'s greedy verifier on chains with draft tables, lane by lane as its reference.

    A chain node has one candidate :math:`x`, so :math:`T = \varnothing` and
    :math:`q' = \mathrm{norm}(q)`. Where :math:`q` has mass off :math:`x` the node is the
    standard rule with :math:`q'` (accept iff :math:`u\,q'(x) < p(x)`, else the residual
    :math:`\mathrm{norm}((p - q')_+)`); where :math:`x` covers :math:`\mathrm{supp}\,q` it is
    NSS's (draw :math:`y \sim p` with the node's sample uniform, descend iff :math:`y = x`).
    Both kinds are decided at once: the standard tests on the normalised draft rows, NSS's draw
    on every real lane's target row, one select by the covering mask; the stop token at the first
    failure is that lane's NSS draw where it covers, else the standard residual draw.
    """

    hot_path: ClassVar[tuple[str, ...]] = (
        "covering_lanes",
        "nss_draws",
        "greedy_tests",
        "nss_stop",
        "tests",
        "stop_round",
        "pack",
    )

    def lanes(
        self, tables: ChainTables, noise: Noise
    ) -> tuple[ChainTables, torch.Tensor, torch.Tensor]:
        """``(tables reading q', covers [B, γ], drawn [B, γ])``: :meth:`covering_lanes` and
        :meth:`nss_draws` (sync-free), or on the CPU outside ``torch.compile``, where host reads
        are free, :meth:`sparse_lanes` (the same values wherever they are read)."""
        if ops.host_reads_free(tables.target_flat):
            return self.sparse_lanes(tables, noise)
        own, covers = self.covering_lanes(tables)
        return own, covers, self.nss_draws(own, noise)

    def sparse_lanes(
        self, tables: ChainTables, noise: Noise
    ) -> tuple[ChainTables, torch.Tensor, torch.Tensor]:
        r""":meth:`lanes` reading only the lanes that can cover :math:`\mathrm{supp}\,q`.

        A row whose other entries are all 0 sums to exactly its drafted entry, in any order of
        addition, so a lane whose mass differs from :math:`q(x)` has mass off :math:`x` and does
        not cover: only the others (none, for drafts sampled from a softmax) are tested by
        :func:`~specsampling.gpu.ops.max_off_token` and get their NSS draw, on their rows alone.
        ``drawn`` is ``-1`` on every other lane (read only where a lane covers)."""
        batch_size, gamma = tables.draft_tokens.shape
        draft = tables.draft_flat  # [B γ, V], lane order
        tokens = tables.draft_tokens.reshape(-1)  # [B γ]
        mass = ops.numpy_sum(draft.to(tables.dtype))  # [B γ], as covering_lanes
        drafted = draft.gather(1, tokens[:, None])[:, 0].to(tables.dtype)  # [B γ]
        lanes = (drafted == mass).nonzero()[:, 0]  # [N]: the lanes that may cover (host read)
        covers = torch.zeros(batch_size * gamma, dtype=torch.bool, device=draft.device)
        drawn = torch.full_like(tokens, -1)  # [B γ]
        if len(lanes):
            others = ops.max_off_token(draft.index_select(0, lanes), tokens[lanes])  # [N]
            covers[lanes] = ~(others > 0)
            rows = lanes + lanes // gamma  # [N]: lane i of row b is target row b (γ + 1) + i
            target = tables.target_flat.index_select(0, rows).to(tables.dtype)  # [N, V]
            sample = noise.sample[:, :gamma].reshape(-1)[lanes]  # [N]
            drawn[lanes] = ops.draw_rows(target, sample)
        own = tables._replace(draft_mass=mass)
        return own, covers.view(batch_size, gamma), drawn.view(batch_size, gamma)

    def nss_draws(self, tables: ChainTables, noise: Noise) -> torch.Tensor:
        """``y [B, γ]``: the target's own draw (with each node's sample uniform) at every draft
        lane, from every target row at once."""
        batch_size, gamma = tables.draft_tokens.shape
        target = tables.target_flat.to(tables.dtype)  # [B (γ + 1), V], lane order
        drawn = ops.draw_rows(target, noise.sample.reshape(-1)).view(batch_size, gamma + 1)
        return drawn[:, :gamma]  # [B, γ]

    def covering_lanes(self, tables: ChainTables) -> tuple[ChainTables, torch.Tensor]:
        """``(tables reading q', covers [B, γ])`` of padded tables (:func:`padded_tables`):
        each draft row's mass (numpy's summation order in float64, as the reference
        normalises), and whether the drafted token holds all of :math:`q` (no other positive
        entry: :func:`~specsampling.gpu.ops.max_off_token`, no ``[B γ, V]`` temporary)."""
        batch_size, gamma = tables.draft_tokens.shape
        draft = tables.draft_flat  # [B γ, V], lane order
        others = ops.max_off_token(draft, tables.draft_tokens.reshape(-1))  # [B γ]
        covers = ~(others > 0).view(batch_size, gamma)  # [B, γ]
        mass = ops.numpy_sum(draft.to(tables.dtype))  # [B γ]
        return tables._replace(draft_mass=mass), covers

    def greedy_tests(
        self, tables: ChainTables, covers: torch.Tensor, drawn: torch.Tensor, accept: torch.Tensor
    ) -> torch.Tensor:
        """Every lane's test, ``[B, γ]``: NSS's (``drawn [B, γ]`` is the drafted token) where
        ``covers``, the standard one with :math:`q'` elsewhere (``accept [B, γ]`` uniforms)."""
        gamma = covers.shape[1]
        real = torch.arange(gamma, device=covers.device)[None, :] < tables.num_drafts[:, None]
        standard = self.tests(tables, accept)  # [B, γ]
        return torch.where(covers, real & (drawn == tables.draft_tokens), standard)

    def nss_stop(
        self,
        tables: ChainTables,
        covers: torch.Tensor,  # [B, γ]
        drawn: torch.Tensor,  # [B, γ]
        num_accepted: torch.Tensor,  # [B]
        token: torch.Tensor,  # [B]
        hit: torch.Tensor,  # [B]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stop token and hit flag: a covering stop lane emits its NSS draw (never its
        drafted token, or the lane would have passed), the others keep the standard draw."""
        gamma = covers.shape[1]
        lane = num_accepted.clamp_max(gamma - 1)[:, None]  # [B, 1]
        nss = (num_accepted < tables.num_drafts) & covers.gather(1, lane).squeeze(-1)  # [B]
        return torch.where(nss, drawn.gather(1, lane).squeeze(-1), token), hit & ~nss

    # run: StandardChain's dispatch, to this class's host_run (each lane's q' and covering test
    # formed when the walk reaches it) or batched_run

    def batched_run(
        self, tables: ChainTables, noise: Noise, rounds: int | None = None
    ) -> tuple[Verified, torch.Tensor]:
        """As :meth:`StandardChain.batched_run`, with NSS's rule on covering lanes: the lanes,
        every test, then the stop rounds."""
        own, covers, drawn = self.lanes(tables, noise)  # drawn: y ~ p where a lane covers
        accepted = self.greedy_tests(own, covers, drawn, noise.accept[:, 1:])  # [B, γ]
        settle = functools.partial(self.nss_stop, own, covers, drawn)
        return self.resolve(own, accepted, noise.sample, rounds, settle)

    # ---------------------------------------------------------- the host route (CPU, few rows)
    def host_drafted_mass(self, tables: ChainTables, noise: Noise) -> torch.Tensor:
        """Unread placeholders: :math:`q'(x)` needs the lane's draft mass, formed by
        :meth:`host_lane` only for the lanes the walk tests."""
        return torch.zeros_like(noise.accept[:, 1:])  # [B, γ]

    def host_lane(self, tables: ChainTables, host: HostChain, row: int, lane: int) -> GreedyLane:
        """A lane's draft mass, :math:`q'(x)`, whether it covers the draft's support and then
        its NSS draw -- :meth:`sparse_lanes`' values for one lane (cached in ``host.lanes``)."""
        key = (row, lane)
        if key not in host.lanes:
            assert tables.draft_flat is not None and host.draft_index is not None
            flat, token = host.draft_index[row][lane], host.drafted[row][lane]
            draft = self.host_draft_row(tables, host, flat).contiguous()  # [1, V], table's dtype
            mass = ops.numpy_sum(draft.to(tables.dtype))  # [1]
            drafted = draft[:, token]  # [1]
            covers, drawn = False, PAD
            if bool(drafted.to(tables.dtype) == mass):  # else mass off x: cannot cover
                covers = not bool(ops.max_off_token(draft, torch.tensor([token]))[0] > 0)
            if covers:
                target = self.host_target_row(tables, host, host.target_index[row][lane])
                u = torch.tensor([host.sample[row][lane]], dtype=torch.float64)
                drawn = int(ops.draw_rows(target, u)[0])
            draft_x = float((drafted / mass).to(torch.float64)[0])  # q'(x), as drafted_mass
            host.lanes[key] = GreedyLane(mass, draft_x, covers, drawn)
        return host.lanes[key]

    def host_passes(self, tables: ChainTables, host: HostChain, row: int, lane: int) -> bool:
        """NSS's test where the lane covers, else the standard test with :math:`q'`."""
        values = self.host_lane(tables, host, row, lane)
        if values.covers:
            return values.drawn == host.drafted[row][lane]
        target_x, _ = self.host_pair(tables, host, row, lane)
        return host.accept[row][lane + 1] * values.draft_x < target_x

    def host_draft(
        self, tables: ChainTables, host: HostChain, row: int, lane: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""The row of ``q`` at ``lane`` and its mass: the residual reads
        :math:`q' = q / \sum q`."""
        values = self.host_lane(tables, host, row, lane)
        raw = tables._replace(draft_mass=None)  # q' replaces any draft_mass given
        draft, _ = super().host_draft(raw, host, row, lane)  # [1, V], the table's row
        return draft, values.mass[:, None]  # [1, V], [1, 1]

    def host_stop(
        self, tables: ChainTables, host: HostChain, row: int, accepted: int
    ) -> tuple[int, bool]:
        """A covering stop lane emits its NSS draw (never a hit), others the standard stop."""
        if accepted < host.ends[row]:
            values = self.host_lane(tables, host, row, accepted)
            if values.covers:
                return values.drawn, False
        return super().host_stop(tables, host, row, accepted)


#: The engine :func:`verify_chain` uses for ``greedy`` with draft tables.
GREEDY_CHAIN = GreedyChain()


# --------------------------------------------------------------------------- validation
def draft_lengths(
    draft_tokens: torch.Tensor, num_draft_tokens: Any = None, name: str = "num_draft_tokens"
) -> torch.Tensor:
    """``num_draft_tokens`` as a long tensor ``[B]`` on the tokens' device; ``None``: the
    leading non-negative lanes of each row (``-1`` padding marks the end of a chain)."""
    batch_size = draft_tokens.shape[0]
    device = draft_tokens.device
    if num_draft_tokens is None:
        return (draft_tokens >= 0).cumprod(-1).sum(-1)  # [B] long (bool's cumprod is long)
    lengths = torch.as_tensor(num_draft_tokens, device=device)
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise InvalidDistribution(f"{name}: expected integer lengths, got {lengths.dtype}")
    if tuple(lengths.shape) != (batch_size,):
        raise InvalidDistribution(
            f"{name}: expected shape ({batch_size},), got {tuple(lengths.shape)}"
        )
    return lengths.to(torch.long)


def check_chain_round(
    draft_tokens: Any,
    target_probs: Any,
    draft_probs: Any,
    noise: Noise | None,
    num_drafts: torch.Tensor,
    tolerance: float | None = None,
    tokens_name: str = "draft_tokens",
) -> None:
    """The chain ``check_round``: raise :class:`~specsampling.InvalidDistribution` naming the
    argument for the first defect (shapes, vocab, NaN/inf/negative/mass of the real rows, draft
    ids in ``[0, V)`` on real lanes and ``>= -1`` on padding, noise in ``[0, 1)`` on real lanes,
    and -- stricter than the reference -- a positive draft probability of every drafted token).
    One host synchronisation when the inputs are sound: every value check is reduced to one
    flag (:func:`chain_is_sound`); only a defect pays for locating it. ``tokens_name`` is the
    caller's name for the draft ids (an adapter's own argument name)."""
    check_chain_shapes(draft_tokens, target_probs, draft_probs, noise)
    if bool(chain_is_sound(draft_tokens, target_probs, draft_probs, noise, num_drafts, tolerance)):
        return
    locate_chain_defect(
        draft_tokens, target_probs, draft_probs, noise, num_drafts, tolerance, tokens_name
    )
    raise AssertionError("chain_is_sound found a defect that could not be located")


def check_chain_shapes(
    draft_tokens: torch.Tensor, target_probs: Any, draft_probs: Any, noise: Noise | None
) -> None:
    """The host-side checks (types, shapes, vocabulary): no synchronisation."""
    batch_size, gamma = draft_tokens.shape
    tables = [("target_probs", target_probs, gamma + 1)]
    if draft_probs is not None:
        tables.append(("draft_probs", draft_probs, gamma))
    for name, table, rows in tables:
        check_table_kind(name, table, f"({batch_size}, {rows}, vocab_size)")
        if table.ndim != 3 or tuple(table.shape[:2]) != (batch_size, rows) or not table.shape[2]:
            raise InvalidDistribution(
                f"{name}: expected shape ({batch_size}, {rows}, vocab_size), got "
                f"{tuple(table.shape)}"
            )
    vocab_size = int(target_probs.shape[2])
    if draft_probs is not None and draft_probs.shape[2] != vocab_size:
        raise InvalidDistribution(
            f"draft_probs: vocabulary mismatch, {draft_probs.shape[2]} columns but vocab_size "
            f"is {vocab_size}"
        )
    if noise is not None:
        noise.check_shapes((batch_size, gamma + 1))


def chain_is_sound(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    noise: Noise | None,
    num_drafts: torch.Tensor,
    tolerance: float | None = None,
) -> torch.Tensor:
    """Every value check of :func:`check_chain_round` as one bool tensor (no synchronisation;
    shapes already checked): lengths, token ids, noise lanes, row masses and signs, positive
    drafted mass."""
    gamma = draft_tokens.shape[1]
    device = draft_tokens.device
    vocab_size = int(target_probs.shape[2])
    lanes = torch.arange(gamma + 1, device=device)  # [γ + 1]
    real_nodes = lanes[None, :] <= num_drafts[:, None]  # [B, γ + 1]
    real = real_nodes[:, 1:]  # [B, γ]
    flags = [((num_drafts >= 0) & (num_drafts <= gamma)).all()]
    bad_real = real & ((draft_tokens < 0) | (draft_tokens >= vocab_size))  # [B, γ]
    bad_pad = ~real & ((draft_tokens < PAD) | (draft_tokens >= vocab_size))  # [B, γ]
    flags.append(~(bad_real | bad_pad).any())
    if noise is not None:
        for values in (noise.accept, noise.sample):
            values = values.to(device)
            flags.append((((values >= 0) & (values < 1)) | ~real_nodes).all())
    tables = [(target_probs, real_nodes)]
    if draft_probs is not None:
        tables.append((draft_probs, real))
    for table, mask in tables:
        tol = TOLERANCE.get(table.dtype, 1e-4) if tolerance is None else tolerance
        values = table.to(device=device, dtype=ops.compute_dtype(table))  # [B, rows, V]
        mass = values.sum(-1)  # [B, rows]; NaN/inf rows have a NaN/inf mass
        ok = ((mass - 1).abs() <= tol) & (values.amin(-1) >= 0)  # [B, rows]
        flags.append((ok | ~mask).all())
    if draft_probs is not None:
        safe = torch.where(real, draft_tokens, 0).clamp(0, vocab_size - 1)  # [B, γ]
        drafted = draft_probs.to(device).gather(2, safe[..., None]).squeeze(-1)  # [B, γ]
        flags.append(~(real & ~(drafted > 0)).any())
    return torch.stack(flags).all()


def locate_chain_defect(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    noise: Noise | None,
    num_drafts: torch.Tensor,
    tolerance: float | None = None,
    tokens_name: str = "draft_tokens",
) -> None:
    """Raise :class:`~specsampling.InvalidDistribution` for the first defect, naming the
    argument (``tokens_name`` for the draft ids; several host synchronisations: only run once a
    defect is known)."""
    gamma = draft_tokens.shape[1]
    device = draft_tokens.device
    check_chain_shapes(draft_tokens, target_probs, draft_probs, noise)  # types, shapes, V
    tables = [("target_probs", target_probs, gamma + 1)]  # real rows: lanes <= n_b
    if draft_probs is not None:
        tables.append(("draft_probs", draft_probs, gamma))  # real rows: lanes < n_b
    vocab_size = int(target_probs.shape[2])
    lanes = torch.arange(gamma + 1, device=device)  # [γ + 1]
    real_nodes = lanes[None, :] <= num_drafts[:, None]  # [B, γ + 1]
    real = real_nodes[:, 1:]  # [B, γ]
    if bool(((num_drafts < 0) | (num_drafts > gamma)).any()):
        raise InvalidDistribution(f"num_draft_tokens: every length must lie in [0, {gamma}]")
    bad_real = real & ((draft_tokens < 0) | (draft_tokens >= vocab_size))  # [B, γ]
    bad_pad = ~real & ((draft_tokens < PAD) | (draft_tokens >= vocab_size))  # [B, γ]
    if bool((bad_real | bad_pad).any()):
        row, lane = (int(i) for i in (bad_real | bad_pad).nonzero()[0])
        value = int(draft_tokens[row, lane])
        where = "a drafted" if bool(bad_real[row, lane]) else "a padding"
        raise InvalidDistribution(
            f"{tokens_name}[{row}, {lane}]: token id {value} outside [0, {vocab_size}) in "
            f"{where} lane" + ("" if where == "a drafted" else " (padding must be -1 or a token)")
        )
    if noise is not None:
        noise.check_lanes(real_nodes)
    for name, table, rows in tables:
        mask = real_nodes[:, :rows] if rows > gamma else real  # [B, rows]
        tol = TOLERANCE.get(table.dtype, 1e-4) if tolerance is None else tolerance
        values = table.to(device=device, dtype=ops.compute_dtype(table))  # [B, rows, V]
        mass = values.sum(-1)  # [B, rows]
        ok = (((mass - 1).abs() <= tol) & ~(values < 0).any(-1)) | ~mask  # [B, rows]
        if not bool(ok.all()):
            raise_row_defect(name, values, mass, ok, tol)
    # A sampled draft has positive draft mass (fp16 underflow to 0: lablup/mlxcel#992).
    if draft_probs is not None:
        safe = torch.where(real, draft_tokens, 0)  # [B, γ]
        drafted = draft_probs.to(device).gather(2, safe[..., None]).squeeze(-1)  # [B, γ]
        impossible = real & ~(drafted > 0)  # [B, γ]
        if bool(impossible.any()):
            row, lane = (int(i) for i in impossible.nonzero()[0])
            raise InvalidDistribution(
                f"draft_probs[{row}, {lane}]: the drafted token {int(draft_tokens[row, lane])} "
                "has zero draft probability, so it cannot have been sampled (underflow in a low "
                "precision softmax? pass draft_probs=None for deterministic drafts)"
            )


def chain_noise(
    batch_size: int,
    gamma: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Noise:
    """Fresh float64 uniforms ``[B, γ + 1]`` (accept, then sample) -- never float32, whose
    draws bottom out at 2^-24 (vllm-project/vllm#43150)."""
    generator = check_generator(generator)
    where = device if generator is None else generator.device
    shape = (batch_size, gamma + 1)
    accept = torch.rand(shape, dtype=torch.float64, generator=generator, device=where)
    sample = torch.rand(shape, dtype=torch.float64, generator=generator, device=where)
    return Noise(accept.to(device), sample.to(device))


def round_noise(
    noise: Noise | None,
    batch_size: int,
    gamma: int,
    generator: torch.Generator | None,
    device: torch.device,
) -> Noise:
    """A round's uniforms as the engines read them: ``noise`` as float64 on ``device``, or
    fresh ones (:func:`chain_noise`) where it is ``None``."""
    if noise is None:
        noise = chain_noise(batch_size, gamma, generator, device)
    return Noise(
        noise.accept.to(device=device, dtype=torch.float64),
        noise.sample.to(device=device, dtype=torch.float64),
    )


# --------------------------------------------------------------------------- the general path
def chain_batch(draft_tokens: torch.Tensor, num_drafts: torch.Tensor) -> TreeBatch:
    """The :class:`TreeBatch` of the chains (law ``iid``), built on device without a host
    synchronisation; ``max_depth`` is ``γ``, so the emitted tokens are ``[B, γ + 1]``."""
    batch_size, gamma = draft_tokens.shape
    device = draft_tokens.device
    nodes = torch.arange(gamma + 1, device=device)[None, :].expand(batch_size, -1)  # [B, γ+1]
    real = nodes <= num_drafts[:, None]  # [B, γ + 1]
    drafted = real & (nodes > 0)  # [B, γ + 1]
    shifted = torch.cat([torch.full_like(draft_tokens[:, :1], PAD), draft_tokens], 1)
    has_child = nodes < num_drafts[:, None]  # [B, γ + 1]
    return TreeBatch(
        parents=torch.where(drafted, nodes - 1, PAD),
        tokens=torch.where(drafted, shifted, PAD),
        num_nodes=num_drafts + 1,
        candidates=torch.where(has_child, nodes + 1, PAD)[..., None],  # [B, γ + 1, 1]
        depth=torch.where(real, nodes, PAD),
        laws=(DrawLaw.IID,) * batch_size,
        chains=(True,) * batch_size,
        max_depth=gamma,
        level_slots=(1,) * (gamma + 1),
    )


def general_chain(
    lowering: TreeLowering,
    draft_tokens: torch.Tensor,  # [B, γ]
    num_drafts: torch.Tensor,  # [B]
    target_probs: torch.Tensor,  # [B, γ + 1, V]
    draft_probs: torch.Tensor | None,  # [B, γ, V]
    noise: Noise,
    dtype: torch.dtype | None = None,
) -> Verified:
    """Any chain scheme through its own lowering: the chains as a :class:`TreeBatch`, the
    draft tables padded to ``γ + 1`` rows (one-hot rows for point-mass drafts)."""
    gamma = draft_tokens.shape[1]
    if dtype is None:
        dtype = ops.compute_dtype(target_probs, *(() if draft_probs is None else (draft_probs,)))
    target = target_probs.to(dtype)  # [B, γ + 1, V]
    if draft_probs is None:
        real = torch.arange(gamma, device=draft_tokens.device)[None, :] < num_drafts[:, None]
        safe = torch.where(real, draft_tokens, 0)  # [B, γ]
        draft = torch.zeros_like(target).scatter_(2, safe[..., None], 1.0)[:, :gamma]
    else:
        draft = draft_probs.to(dtype)  # [B, γ, V]
    draft = torch.cat([draft, torch.zeros_like(target[:, :1])], dim=1)  # [B, γ + 1, V]
    return lowering.walk(chain_batch(draft_tokens, num_drafts), target, draft, noise)


# --------------------------------------------------------------------------- the entry point
def verify_chain(
    scheme: Any,
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    noise: Noise | None = None,
    *,
    generator: torch.Generator | None = None,
    validate: bool = True,
    num_draft_tokens: Any = None,
    tolerance: float | None = None,
    dtype: torch.dtype | None = None,
) -> Verified:
    """Verify a batch of drafted chains; row ``b`` gets the reference verdict of
    ``DraftTree.chain(draft_tokens[b, :n_b], law="iid")``.

    Parameters
    ----------
    scheme : str or lowering object
        A scheme of :data:`specsampling.gpu.SCHEMES` exact on sampled chains.
    draft_tokens : LongTensor [B, γ]
        The drafted tokens; lanes from ``n_b`` on are padding (``-1`` or any token id).
    target_probs : Tensor [B, γ + 1, V]
        ``target_probs[b, i]``: the target after ``i`` drafts (float64/32, bf16, fp16).
    draft_probs : Tensor [B, γ, V] or None
        The draft distribution each token was sampled from; ``None`` for point-mass
        (deterministic) drafts, verified with the one-hot of the drafted token. Tables that
        require grad are read as their detached values (a verdict has no gradient).
    noise : Noise, optional
        Uniforms ``[B, γ + 1]`` (lane ``i + 1`` of ``accept`` tests draft ``i``, lane ``k`` of
        ``sample`` draws the token after ``k`` accepted); ``None`` draws fresh float64 ones.
    generator : torch.Generator, optional
        Seeds the fresh noise.
    validate : bool, default True
        Check the inputs; ``False`` trusts them and never synchronises with the host. With
        ``True`` the checks cost one host synchronisation when the inputs are sound (all
        checks reduced to one flag; only a defect pays for locating it), and the
        ``standard``/``specinfer``/``rsd`` fast path adds one more: a row whose stop token
        lands on a zero-mass residual (``p_k <= q_k`` everywhere, a probability-0 event in
        exact arithmetic) *and* equals its drafted token is resolved by another round (the
        reference's residual hit descends); with ``validate=False`` that row stops there,
        emitting the drafted token as its last token (same tokens so far, same law; see
        :class:`StandardChain`). The cost of ``validate=True`` (a read of every real table
        row for its mass) is measured in ``benchmarks/torch_chains.py``.
    num_draft_tokens : int sequence or LongTensor [B], optional
        Drafts per row; by default the leading non-negative lanes (``-1`` padding ends a chain).
    tolerance : float, optional
        Row-mass tolerance; by default that of the input dtype.
    dtype : torch.float32 or torch.float64, optional
        The compute precision. By default float64 when a table is float64, else float32
        (bf16/fp16 tables are upcast once, row by row on the standard path). float64 gives the
        reference's verdict bit for bit (path-wise equality); float32 is the fast path, equal
        to it except where a uniform lies within float32 rounding of an accept or inverse-CDF
        boundary (measured in ``tests/test_gpu_chain_float32.py``). Asking for a dtype other
        than the tables' converts them (a copy).

    Returns
    -------
    Verified
        ``node [B]`` (accepted drafts), ``token [B]``, ``tokens [B, γ + 1]`` (``-1`` padded),
        ``num_emitted [B]``.

    Examples
    --------
    >>> import specsampling.gpu as ssg
    >>> target = torch.tensor([[[0.5, 0.5], [0.0, 1.0]]], dtype=torch.float64)
    >>> out = ssg.verify_chain("standard", torch.tensor([[1]]), target, None,
    ...                        ssg.Noise(torch.full((1, 2), 0.25).double(),
    ...                                  torch.full((1, 2), 0.5).double()))
    >>> out.tokens.tolist(), out.num_emitted.tolist()
    ([[1, 1]], [2])
    """
    lowering = tree_lowering(scheme)
    if not lowering.reference_scheme.exact_for(DrawLaw.IID, True):
        raise UnsupportedShape(
            f"scheme: {lowering.name!r} is not exact for sampled chains; it is exact for "
            f"{lowering.reference_scheme.support_text()}"
        )
    if (
        not isinstance(draft_tokens, torch.Tensor)
        or draft_tokens.ndim != 2
        or draft_tokens.is_floating_point()
        or draft_tokens.dtype == torch.bool
    ):
        raise InvalidDistribution(
            "draft_tokens: expected an integer tensor of shape (batch_size, num_drafts), got "
            f"{type(draft_tokens).__name__}"
            + (f" of shape {tuple(draft_tokens.shape)}" if hasattr(draft_tokens, "shape") else "")
        )
    draft_tokens = draft_tokens.to(torch.long)
    batch_size, gamma = draft_tokens.shape
    num_drafts = draft_lengths(draft_tokens, num_draft_tokens)
    if noise is not None and not isinstance(noise, Noise):
        raise TypeError(
            f"noise: expected a specsampling.gpu.Noise (Noise(accept, sample) of [B, γ + 1] "
            f"uniforms), got {type(noise).__name__}"
        )
    tolerance = check_tolerance(tolerance)
    if validate:
        check_chain_round(draft_tokens, target_probs, draft_probs, noise, num_drafts, tolerance)
    device = draft_tokens.device
    noise = round_noise(noise, batch_size, gamma, generator, device)
    # detached: a verdict has no gradient, and the engines write into buffers (out=)
    target_probs = target_probs.detach().to(device)
    draft_probs = None if draft_probs is None else draft_probs.detach().to(device)
    dtype = check_dtype(dtype, target_probs, draft_probs)
    if batch_size == 0:  # no rows: empty verdicts of the documented shapes
        empty = draft_tokens.new_zeros((0,))  # [0] long
        return Verified(empty, empty.clone(), draft_tokens.new_zeros((0, gamma + 1)), empty + 1)
    if gamma == 0:  # no drafts at all (a serving step without speculation): one padding lane
        verified = verify_chain(
            lowering,
            draft_tokens.new_zeros(batch_size, 1),
            target_probs.expand(-1, 2, -1),
            None if draft_probs is None else target_probs[:, :1],
            Noise(noise.accept.expand(-1, 2), noise.sample.expand(-1, 2)),
            validate=False,
            num_draft_tokens=torch.zeros_like(num_drafts),
            dtype=dtype,
        )
        return verified._replace(tokens=verified.tokens[:, :1])
    greedy_tables = type(lowering) is Greedy and draft_probs is not None
    if (takes_standard_rule(lowering) or greedy_tables) and gamma > 0:
        tables = padded_tables(draft_tokens, num_drafts, target_probs, draft_probs, dtype)
        engine = GREEDY_CHAIN if greedy_tables else standard_rule_engine(lowering)
        verified, _ = engine.run(tables, noise, None if validate else 1)
        return verified
    engine = CHAIN_RULES.get(type(lowering))
    if type(lowering) is Greedy and draft_probs is None:
        engine = NSS_CHAIN  # point masses cover supp q: Greedy draws y ~ p, descends on a hit
    if engine is not None and gamma > 0:
        return engine.run(
            chain_round(draft_tokens, num_drafts, target_probs, draft_probs, dtype), noise
        )
    return general_chain(
        lowering, draft_tokens, num_drafts, target_probs, draft_probs, noise, dtype
    )


def check_dtype(
    dtype: Any, target_probs: torch.Tensor, draft_probs: torch.Tensor | None
) -> torch.dtype:
    """The compute dtype: ``dtype`` (float32 or float64), by default
    :func:`~specsampling.gpu.ops.compute_dtype` of the tables.

    >>> check_dtype(None, torch.zeros(1, dtype=torch.bfloat16), None)
    torch.float32
    >>> check_dtype(torch.float16, torch.zeros(1), None)
    Traceback (most recent call last):
    ...
    ValueError: dtype: expected None, torch.float32 or torch.float64, got torch.float16
    """
    if dtype is None:
        return ops.compute_dtype(target_probs, *(() if draft_probs is None else (draft_probs,)))
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype: expected None, torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def chain_round(
    draft_tokens: torch.Tensor,  # [B, γ]
    num_drafts: torch.Tensor,  # [B]
    target_probs: torch.Tensor,  # [B, γ + 1, V]
    draft_probs: torch.Tensor | None,  # [B, γ, V]
    dtype: torch.dtype,
) -> ChainRound:
    """The :class:`~specsampling.gpu.chain_rules.ChainRound` of validated inputs: padding
    lanes' tokens set to 0, the tables contiguous in ``dtype`` (no copy when they already
    are)."""
    gamma = draft_tokens.shape[1]
    real = torch.arange(gamma, device=draft_tokens.device)[None, :] < num_drafts[:, None]
    return ChainRound(
        draft_tokens=torch.where(real, draft_tokens, 0),  # [B, γ]
        num_drafts=num_drafts,
        target=target_probs.to(dtype).contiguous(),  # [B, γ + 1, V]
        draft=None if draft_probs is None else draft_probs.to(dtype).contiguous(),  # [B, γ, V]
    )


__all__ = [
    "CHAIN_RULES",
    "GREEDY_CHAIN",
    "HOST_PLANNED_STANDARD",
    "SHAPED_CHAIN",
    "STANDARD_CHAIN",
    "STANDARD_RULE",
    "ChainTables",
    "GreedyChain",
    "ShapedChain",
    "StandardChain",
    "chain_batch",
    "chain_noise",
    "chain_round",
    "check_chain_round",
    "check_dtype",
    "general_chain",
    "padded_tables",
    "residual_weights",
    "standard_rule_engine",
    "stop_distribution",
    "verify_chain",
]
