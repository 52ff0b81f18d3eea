r"""The two verification strategies of a decode round: how tokens are drawn and how they are
verified.

:class:`TreeVerification` runs a lowered tree verifier (:func:`specsampling.gpu.verify`, chains
by :func:`specsampling.gpu.verify_chain`): drafts are drawn by the shape's law from fresh
float64 drafting uniforms (:class:`SampledDraw`), and the verifier reads uniforms drawn after
and apart from them, so each scheme's theorem applies round after round.

:class:`KeyedVerification` runs a keyed coupling (``gumbel``, ``poisson``, ``gls``,
``gls_strong``): row ``b`` decodes with key ``k_b``; the noise of the position after a
sequence is the keyed field at its context word ``t`` (its absolute position, or with
``window=h`` the watermark's hash of its previous ``h`` tokens, as
:class:`specsampling.keyed.KeyedNoise` with the row's prompt length as ``start``). Each draw
step is the keyed race (:meth:`KeyedLowering.draft_step
<specsampling.gpu.schemes.coupled.KeyedLowering.draft_step>`) on the processed draft
distribution at its parent (:math:`\arg\min_z \log E[t, k_s, z] - \log q(z)`, a point-mass
draft entering as one-hot rows), and the walk is :meth:`KeyedLowering.walk
<specsampling.gpu.schemes.coupled.KeyedLowering.walk>`; with nothing drafted each token is the
target's keyed selection over the shape's ``K`` rows (keyed target-only decoding). The noise
depends on the key and the context alone, never on the round, the batch or the drafter.

Both expose ``check_law`` (refuse a drafter's draw law the scheme is not exact for),
``start`` / ``select_rows`` (per-call, per-row state), ``draw`` (the round's
:class:`~specsampling.gpu.hf.drafters.Draw`) and ``verify``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

import specsampling as ss
from specsampling.errors import UnsupportedShape
from specsampling.keyed import KeyedNoise
from specsampling.shapes import Shape
from specsampling.tree import DrawLaw
from specsampling.validation import check_positive_int

from .. import keyed as gk
from .. import ops
from ..api import verify
from ..chain import chain_batch, verify_chain
from ..drafting import TreeDrafter
from ..generate import row_keys
from ..schemes import SCHEMES, get_lowering, tree_lowering
from ..schemes.base import TreeLowering, Verified
from ..schemes.coupled import Drafted, KeyedLowering, keyed_select_root
from ..tree import PAD, TreeBatch
from .drafters import Proposal

if TYPE_CHECKING:
    from .state import DecodeState


def verification_for(scheme: Any, shape: Shape) -> TreeVerification | KeyedVerification:
    """The strategy of ``scheme`` (a registry name, a lowering, or a strategy as it is)."""
    if isinstance(scheme, (TreeVerification, KeyedVerification)):
        return scheme
    lowering = get_lowering(scheme)
    if isinstance(lowering, KeyedLowering):
        return KeyedVerification(lowering, shape)
    return TreeVerification(tree_lowering(lowering), shape)


# ----------------------------------------------------------------------------- tree verifiers
class SampledDraw:
    """A round's draws by the shape's law (:class:`~specsampling.gpu.drafting.TreeDrafter`),
    from ``[B, S]`` float64 drafting uniforms drawn on first use, before the verifier's."""

    def __init__(self, shape: Shape, state: DecodeState) -> None:
        self.shape, self.state = shape, state
        self.drafter = TreeDrafter(shape, state.batch_size, state.device)
        self.levels = self.drafter.levels
        self.uniforms: torch.Tensor | None = None

    def frontier(self, level: int) -> tuple[torch.Tensor, torch.Tensor]:
        frontier = self.drafter.frontier
        return frontier.paths, frontier.exists

    def next_level(self, level: int, draft_probs: torch.Tensor) -> torch.Tensor:
        """Draw ``levels[level]``; returns the tokens drawn, ``[B, S_d]`` (``PAD``: skipped)."""
        if self.uniforms is None:
            self.uniforms = torch.rand(
                (self.state.batch_size, self.drafter.num_steps),
                dtype=torch.float64,
                generator=self.state.generator,
                device=self.state.device,
            )  # [B, S]
        uniforms = self.uniforms[:, list(self.levels[level])]  # torch.rand's: in [0, 1)
        drawn = self.drafter.next_level(draft_probs, uniforms, validate=False)
        return drawn.tokens

    def finish(self) -> tuple[TreeBatch, None]:
        return self.drafter.finish(), None

    def point_mass(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[TreeBatch, None]:
        return chain_batch(tokens, lengths), None


class TreeVerification:
    """A lowered tree verifier (``lowering``) on the trees of ``shape``."""

    def __init__(self, lowering: Any, shape: Shape) -> None:
        self.lowering = lowering
        self.shape = shape
        self.name = lowering.name

    def check_law(self, law: DrawLaw | None, drafter: str = "the drafter") -> None:
        """Refuse ``drafter`` (named in errors) whose trees have ``law`` (``None``: the
        shape's own, sampled; ``DrawLaw.GRAFTED`` / ``DrawLaw.UNKNOWN``: trees mixing laws,
        a lookup branch grafted into i.i.d. trees / into others, exact for the schemes exact
        for that law; else a point-mass chain)."""
        reference = self.lowering.reference_scheme
        if law is None:
            reference.check(self.shape)
            return
        if law in (DrawLaw.GRAFTED, DrawLaw.UNKNOWN):  # a grafted lookup branch
            if not reference.exact_for(law, False):
                exact = sorted(
                    name
                    for name, scheme in ss.SCHEMES.items()
                    if isinstance(SCHEMES.get(name), TreeLowering) and scheme.exact_for(law, False)
                )
                which = (
                    "a lookup branch beside i.i.d. draws"
                    if law is DrawLaw.GRAFTED
                    else f"a lookup branch beside draws of law {self.shape.law.value!r}"
                )
                raise UnsupportedShape(
                    f"scheme: {self.name!r} is not exact for {drafter}'s trees on "
                    f"{self.shape!r}, which mix draw laws ({which}, law {law.value!r}); exact "
                    f"for them: {exact}; {self.name!r} is exact for {reference.support_text()}"
                )
            return
        if not self.shape.is_chain:
            raise UnsupportedShape(
                f"shape: {drafter} proposes chains; got {self.shape!r} (use Shape.chain(k))"
            )
        if not reference.exact_for(DrawLaw.IID, True):
            raise UnsupportedShape(
                f"scheme: {self.name!r} is not exact for {drafter}'s point-mass chains (exact: "
                "nss and the schemes exact on sampled chains, with the point-mass rule); "
                f"{self.name!r} is exact for {reference.support_text()}"
            )

    def check_key(self, key: Any, window: Any, batch: int) -> None:
        """Refuse a key: a tree verifier reads uniforms."""
        if key is not None or window is not None:
            keyed = sorted(n for n, low in SCHEMES.items() if isinstance(low, KeyedLowering))
            raise ValueError(
                f"key: scheme {self.name!r} verifies from fresh uniforms and takes no key (nor "
                f"window); key= runs only the keyed couplings {keyed}"
            )

    def start(
        self, state: DecodeState, keys: Sequence[int] | None = None, window: int | None = None
    ) -> None:
        """Nothing per call: every round reads fresh uniforms from ``state.generator``."""

    def select_rows(self, keep: Sequence[int], rows: torch.Tensor) -> None:
        """No per-row state."""

    def draw(self, state: DecodeState, shape: Shape | None = None) -> SampledDraw:
        """This round's draw: the decoder's shape, or ``shape`` (a chain of another length,
        chosen by a :mod:`~specsampling.gpu.hf.lengths` policy before drawing)."""
        return SampledDraw(self.shape if shape is None else shape, state)

    def verify(
        self, state: DecodeState, proposal: Proposal, target_probs: torch.Tensor
    ) -> Verified:
        """The verdict of every row on ``target_probs [B, N, V]``; the root alone: a draw."""
        tree = proposal.tree
        if tree.max_depth == 0:  # nothing drafted: the target's own categorical draw
            batch = tree.batch_size
            u = torch.rand(
                batch, dtype=torch.float64, generator=state.generator, device=tree.device
            )
            token = ops.categorical(target_probs[:, 0], u)  # [B]
            return Verified(torch.zeros_like(token), token, token[:, None], torch.ones_like(token))
        draft_probs = None
        if proposal.draft_rows is not None and DrawLaw.UNKNOWN not in tree.laws:
            draft_probs = target_probs.clone()  # unexpanded nodes: the target row (never read)
            expanded, values = proposal.draft_rows
            draft_probs[expanded] = values.to(draft_probs.dtype)
        return self.verify_tables(tree, target_probs, draft_probs, state.generator)

    def verify_tables(
        self,
        tree: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor | None,  # [B, N, V]; None: no draft row to read
        generator: torch.Generator,
    ) -> Verified:
        """The lowering on one round's tables (chains through the chain fast path).
        ``draft_probs=None``: point-mass chains, or trees mixing draw laws beside non-i.i.d.
        draws (law ``unknown``, whose one verifier, ``nss``, reads no draft row)."""
        depth = tree.max_depth
        plain = tree.guesses is None  # grafted rows test guesses as point masses: the walk
        if plain and all(tree.chains) and (draft_probs is None or (self.shape.is_chain and depth)):
            chain_draft = None if draft_probs is None else draft_probs[:, :depth]
            return verify_chain(
                self.lowering,
                tree.tokens[:, 1:].contiguous(),  # [B, D]
                target_probs[:, : depth + 1],
                chain_draft,
                generator=generator,
                num_draft_tokens=tree.num_nodes - 1,
            )
        if draft_probs is None:  # trees mixing laws: their verifiers (nss) read no draft row
            draft_probs = target_probs
        return verify(self.lowering, tree, target_probs, draft_probs, generator=generator)

    def __repr__(self) -> str:
        return f"TreeVerification({self.name!r}, {self.shape!r})"


# ----------------------------------------------------------------------------- keyed couplings
class KeyedDraw:
    """A round's draws by the keyed race of ``verification`` (its keys, the state's contexts)."""

    def __init__(self, verification: KeyedVerification, state: DecodeState) -> None:
        self.verification, self.state = verification, state
        self.plan = verification.plan
        self.shape = self.plan.shape
        self.levels = verification.levels
        self.drafted: Drafted | None = None
        self.rows = torch.arange(state.batch_size, device=state.device)  # [B]

    def started(self) -> Drafted:
        if self.drafted is None:
            roots = self.verification.root_contexts(self.state)
            self.drafted = self.verification.lowering.start(self.plan, roots)
        return self.drafted

    def frontier(self, level: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch, device = self.state.batch_size, self.state.device
        if level == 0:
            paths = torch.empty((batch, 1, 0), dtype=torch.long, device=device)  # [B, 1, 0]
            return paths, torch.ones((batch, 1), dtype=torch.bool, device=device)
        drafted = self.started()
        nodes = drafted.step_nodes[:, list(self.levels[level - 1])]  # [B, F]
        index = nodes.clamp_min(0)[..., None].expand(-1, -1, self.plan.depth)  # [B, F, D]
        return drafted.paths.gather(1, index)[:, :, :level], nodes != PAD

    def next_level(self, level: int, draft_probs: torch.Tensor) -> None:
        verification, lowering = self.verification, self.verification.lowering
        drafted = self.started()
        parents = (-1,) if level == 0 else self.levels[level - 1]
        slot = {step: f for f, step in enumerate(parents)}
        for step in self.levels[level]:
            parent_probs = draft_probs[:, slot[self.plan.parents[step]]]  # [B, V]
            drafted, node, created = lowering.draft_step(
                drafted, self.plan, step, verification.keys, parent_probs
            )
            safe = node.clamp_min(0)  # [B]
            contexts = verification.contexts_after(
                self.state, drafted.paths[self.rows, safe], drafted.depth[self.rows, safe]
            )
            drafted = lowering.with_contexts(drafted, node, created, contexts)
        self.drafted = drafted

    def finish(self) -> tuple[TreeBatch, Drafted]:
        drafted = self.started()
        size = int(drafted.num_nodes.max())  # one host synchronisation: the padded tree size
        tree = TreeBatch(
            drafted.parents[:, :size],
            drafted.tokens[:, :size],
            drafted.num_nodes,
            drafted.candidates[:, :size],
            drafted.depth[:, :size],
            (self.shape.law,) * self.state.batch_size,
        )
        return tree, drafted

    def point_mass(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[TreeBatch, Drafted]:
        """The race on one-hot rows drafts exactly ``tokens``; past a row's length, token 0
        (any deterministic filler keeps a keyed coupling exact: it decides which noise is
        shared, not the law)."""
        state = self.state
        filled = torch.where(tokens >= 0, tokens, 0)  # [B, D]
        probs = torch.zeros((*filled.shape, state.vocab_size), dtype=torch.float64)
        probs = probs.to(state.device).scatter_(2, filled[..., None], 1.0)  # [B, D, V]
        for level in range(len(self.levels)):
            self.next_level(level, probs[:, level : level + 1])
        return self.finish()


class KeyedVerification:
    """A lowered keyed coupling (``lowering``) on the draws of ``shape`` (see the module doc)."""

    def __init__(self, lowering: KeyedLowering, shape: Shape) -> None:
        self.lowering = lowering
        self.shape = shape
        self.name = lowering.name
        self.plan = lowering.plan(shape)  # UnsupportedShape as the reference
        self.levels = TreeDrafter(self.plan.shape, 1).levels
        self.keys = torch.empty(0, dtype=torch.long)  # [B] int64-held row keys, per call
        self.window: int | None = None
        self.starts: list[int] = []  # [B] prompt lengths (the keyed noise's start), host

    def check_law(self, law: DrawLaw | None, drafter: str = "the drafter") -> None:
        """Every drafter is exact for a keyed coupling (drafting only chooses which
        exponentials the drafter shares with the target); point masses come as chains. Trees
        mixing draw laws (``DrawLaw.GRAFTED``, ``DrawLaw.UNKNOWN``: a grafted lookup branch)
        are refused: the keyed walk drafts on its plan alone."""
        if law in (DrawLaw.GRAFTED, DrawLaw.UNKNOWN):
            raise UnsupportedShape(
                f"scheme: {self.name!r} is a keyed coupling, which drafts every node by its keyed "
                f"race on the decoder shape's plan; {drafter} adds branches the race did not draw "
                "(use a tree verifier exact for any tree: 'nss')"
            )
        if law is not None and not self.shape.is_chain:
            raise UnsupportedShape(
                f"shape: {drafter} proposes chains; got {self.shape!r} (use Shape.chain(k))"
            )

    def check_key(self, key: Any, window: Any, batch: int) -> tuple[int, ...]:
        """The row keys: ``(key + b) mod 2**64`` for row ``b``, or ``key[b]``."""
        if key is None:
            raise ValueError(
                f"key: scheme {self.name!r} is a keyed coupling (drafter and verifier share one "
                "keyed noise field, it cannot run from uniforms): pass key= (an int, or one per "
                "row)"
            )
        if window is not None:
            check_positive_int(window, "window")
        if getattr(key, "ndim", None) == 0:  # a 0-d tensor or array: one key
            key = key.item()
        if not isinstance(key, (int, str)) and hasattr(key, "__len__"):
            if len(key) != batch:
                raise ValueError(f"key: expected one key per row ({batch}), got {len(key)}")
        return row_keys(key, batch)

    def start(
        self, state: DecodeState, keys: Sequence[int] | None = None, window: int | None = None
    ) -> None:
        """The call's row keys (from :meth:`check_key`) and watermark window."""
        assert keys is not None, "KeyedVerification.start needs the row keys"
        self.keys = gk.as_words(list(keys), state.device)  # [B]
        self.window = window
        self.starts = list(state.prompt_lengths)

    def select_rows(self, keep: Sequence[int], rows: torch.Tensor) -> None:
        self.keys = self.keys[rows]
        self.starts = [self.starts[b] for b in keep]

    def draw(self, state: DecodeState, shape: Shape | None = None) -> KeyedDraw:
        """This round's keyed draw (on the plan of the decoder's shape: ``shape`` must be
        ``None``, adaptive lengths are refused before the first forward)."""
        assert shape is None or shape == self.shape, "keyed rounds draft the decoder's shape"
        return KeyedDraw(self, state)

    def verify(
        self, state: DecodeState, proposal: Proposal, target_probs: torch.Tensor
    ) -> Verified:
        """The keyed walk down the drafted trees; the root alone: the target's selection."""
        if proposal.drawn is None:  # keyed target-only decoding (specsampling.keyed.laws.decode)
            roots = self.root_contexts(state)
            return keyed_select_root(self.lowering, self.plan, self.keys, roots, target_probs[:, 0])
        return self.lowering.walk(proposal.drawn, self.plan, self.keys, target_probs)

    def contexts_after(
        self, state: DecodeState, paths: torch.Tensor, depth: torch.Tensor
    ) -> torch.Tensor:
        """The context word of the position after each row's committed context followed by
        ``paths [B, D]`` cut to ``depth [B]`` (``PAD``: the root): ``[B]`` int64-held, as
        :meth:`specsampling.keyed.KeyedNoise.context` with the row's prompt as ``start``."""
        depth = depth.clamp_min(0)
        if self.window is None:  # the absolute position: committed + pending + path
            return gk.position_context(state.next_position() + depth)
        paths_h, depth_h = paths.tolist(), depth.tolist()
        sequences = [
            context + path[:d]
            for context, path, d in zip(state.contexts, paths_h, depth_h, strict=True)
        ]
        out = torch.zeros(len(sequences), dtype=torch.long, device=state.device)  # [B]
        for start in sorted(set(self.starts)):  # one batched call per distinct prompt length
            rows = [b for b, s in enumerate(self.starts) if s == start]
            noise = KeyedNoise(0, self.window, start=start)  # context words read no key
            chosen = [sequences[b] for b in rows]
            out[rows] = gk.context_words(noise, chosen, device=state.device)
        return out

    def root_contexts(self, state: DecodeState) -> torch.Tensor:
        batch = state.batch_size
        empty = torch.empty((batch, 0), dtype=torch.long, device=state.device)
        zeros = torch.zeros(batch, dtype=torch.long, device=state.device)
        return self.contexts_after(state, empty, zeros)

    def __repr__(self) -> str:
        return f"KeyedVerification({self.name!r}, {self.shape!r})"


__all__ = [
    "KeyedDraw",
    "KeyedVerification",
    "SampledDraw",
    "TreeVerification",
    "verification_for",
]
