r"""Speculative decoding of Hugging Face causal LMs: the facade and the round loop.

A round, for every row of the batch (``B`` rows, left-padded prompts), reads top to bottom in
:meth:`SpeculativeDecoder.round`:

1. **Draft**: the drafter (:mod:`specsampling.gpu.hf.drafters`) proposes a tree per row, its
   tokens chosen by the verification strategy's draw (:mod:`specsampling.gpu.hf.verification`):
   the shape's law from fresh drafting uniforms, or the keyed race of a keyed coupling. A model
   draft forwards once per depth over the new nodes only (:mod:`specsampling.gpu.hf.model_draft`).
2. **Score** the whole tree in **one** target forward over ``[pending token, nodes 1..N-1]``
   with an ancestor-only 4D mask (:meth:`DecodeState.score
   <specsampling.gpu.hf.state.DecodeState.score>`): ``target_probs [B, N, V]`` after
   :func:`specsampling.gpu.process`, row ``n`` the distribution after node ``n``.
3. **Verify** with the strategy: a lowered tree verifier (:func:`specsampling.gpu.verify`,
   chains by :func:`specsampling.gpu.verify_chain`) on float64 uniforms drawn after and apart
   from the drafting noise, or the keyed walk.
4. **Commit**: the target's and the drafter's caches keep only the accepted path (a gather on
   the sequence axis); the last emitted token becomes the target's pending token. Rows stop at
   ``eos_token_id`` and at ``max_new_tokens`` exactly, and leave the batch.

Losslessness. Given the context, the tree depends only on the draft and the drafting noise, the
verifier's noise is fresh, and the tables are the processed model distributions at each node's
full prefix (the tree-logits parity tests check that against no-cache forwards); so each
scheme's theorem applies round after round:

.. math:: P(x_{n+1}, \dots, x_{n+k} \mid x_{\le n}) = \prod_i p(x_{n+i} \mid x_{< n+i}).

Draft rows of nodes the drafting never expanded (the deepest level, and a point-mass drafter's
nodes) are **copies of the target row** at that node: the verifiers never read them, and were
one to, :math:`q = p` is the choice that keeps the law.

Keyed rounds (``scheme`` a keyed coupling: ``gumbel``, ``poisson``, ``gls``, ``gls_strong``;
``generate(..., key=K)``, required): row ``b`` decodes with key ``k_b = (K + b) mod 2**64`` (or
``K[b]``), as :func:`specsampling.gpu.generate`, on the keyed field at each position's context
(:class:`~specsampling.gpu.hf.verification.KeyedVerification`). With ``draft=None`` each token
is the target's keyed selection (keyed target-only decoding). For the strong couplings
(``gumbel``, ``poisson``, ``gls_strong``) the tokens **equal** keyed target-only decoding
whatever the draft; with a model draft every keyed scheme's tokens equal
:func:`specsampling.generate` with the same key on the same processed model pair; the watermark
(:func:`specsampling.keyed.watermark.detect`, ``rows=K``) detects them. "Equal" is exact in
float64; in float32 a race whose two best scores lie within the rounding of a cached tree
forward against a plain one could flip (never met in the tests). A keyed round reads no
uniforms (``seed`` is unused); a tree verifier takes no key.

Drafters and their draw laws: a causal LM sharing the vocabulary (or :class:`LayerSkipDraft`,
the target's own first layers) samples from its processed distribution (the shape's law);
:class:`NGramDraft` proposes a deterministic chain (a point mass), exact only for ``nss`` and
for schemes exact on sampled chains verified with the point-mass rule (``draft_probs=None``);
every drafter is exact for a keyed coupling. :class:`MixedDraft` with ``graft=True`` proposes
trees mixing both laws (a lookup branch grafted beside the model's): law ``grafted`` beside
i.i.d. shapes and chains, exact for ``specinfer`` (the guess tested as a point mass) and
``nss``; beside other shapes, ``nss`` alone.
Anything else is refused before the first forward.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import specsampling as ss
from specsampling.shapes import Shape, check_shape

from ..processing import process
from ..tree import TreeBatch
from .attention import check_causal_lm
from .drafters import Drafter, NGramDraft, Proposal, as_drafter
from .lengths import DraftLength, check_adaptive
from .model_draft import LayerSkipDraft, vocab_size
from .state import DecodeState, check_prompt, eos_set, first_eos
from .verification import KeyedVerification, TreeVerification, verification_for


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class DecodeStats:
    """Counters of one :meth:`SpeculativeDecoder.generate` call.

    ``emitted[b]`` lists the tokens row ``b`` committed in each round it took part in;
    ``draft_time`` / ``target_time`` / ``verify_time`` split the wall time (seconds)."""

    rounds: int
    emitted: tuple[tuple[int, ...], ...]
    target_forwards: int
    draft_forwards: int
    wall_time: float
    draft_time: float = 0.0
    target_time: float = 0.0
    verify_time: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(sum(row) for row in self.emitted)

    @property
    def block_efficiency(self) -> float:
        """Mean tokens committed per row and round."""
        row_rounds = sum(len(row) for row in self.emitted)
        return self.num_tokens / row_rounds if row_rounds else math.nan

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.wall_time if self.wall_time > 0 else math.nan


@dataclass(frozen=True)
class DecodeOutput:
    """``sequences [B, L]``: each prompt (as given, left padding kept) then its generated
    tokens, right-padded with ``pad_token_id``; ``num_generated [B]``; :class:`DecodeStats`."""

    sequences: torch.Tensor
    num_generated: tuple[int, ...]
    stats: DecodeStats


@dataclass
class RoundTrace:
    """What one round used (recorded when :attr:`SpeculativeDecoder.traces` is a list): the
    committed context of each active row (pending token last), the tree, the raw target
    logits ``[B, N, V]`` and the raw draft logits at the expanded nodes (``NaN`` elsewhere)."""

    contexts: list[list[int]]
    tree: TreeBatch
    target_logits: torch.Tensor
    draft_logits: torch.Tensor | None
    emitted: list[list[int]] = field(default_factory=list)

    @classmethod
    def of(
        cls, state: DecodeState, proposal: Proposal, target_logits: torch.Tensor, verified: Any
    ) -> RoundTrace:
        """The trace of the round ``state`` is in (before its commit)."""
        counts = verified.num_emitted.tolist()
        emitted = [row[:c] for row, c in zip(verified.tokens.tolist(), counts, strict=True)]
        contexts = [list(c) for c in state.contexts]
        return cls(
            contexts, proposal.tree, target_logits.detach().clone(), proposal.draft_logits, emitted
        )


# ----------------------------------------------------------------------------- the decoder
class SpeculativeDecoder:
    """Speculative decoding of ``target`` with ``draft`` under a lowered tree ``scheme``.

    A chain is never drafted past the budget: a round that can emit only ``r`` more tokens
    drafts at most ``r - 1`` (as transformers' assisted generation does), and a round where
    every row has one token left drafts nothing, whatever the shape (the target's own draw).
    That length is a function of the past, so every scheme stays exact (the argument of the
    module :mod:`~specsampling.gpu.hf.lengths`); keyed couplings draft on their fixed plan.

    Parameters
    ----------
    target : transformers causal LM
        Eager or sdpa attention, full-attention layers (``DynamicCache``).
    draft : causal LM, LayerSkipDraft, NGramDraft, a Drafter, or None
        ``None``: plain decoding with the target alone. Any
        :class:`~specsampling.gpu.hf.drafters.Drafter` plugs in as it is.
    scheme : str, lowering, TreeVerification or KeyedVerification
        A tree scheme of :data:`specsampling.gpu.SCHEMES` exact for the drafter's law, or a
        keyed coupling (``gumbel``, ``poisson``, ``gls``, ``gls_strong``: every drafter; run
        with ``generate(..., key=...)``).
    shape : Shape
        How each round drafts (a chain for :class:`NGramDraft`).
    length : DraftLength, optional
        An adaptive draft length (:mod:`specsampling.gpu.hf.lengths`: transformers' heuristic
        schedule, :class:`~specsampling.gpu.hf.lengths.HeuristicLength`, or the cost-model
        choice, :class:`~specsampling.gpu.hf.lengths.CostModelLength`): each round drafts
        ``Shape.chain(k)``, ``k`` picked before the round draws (chain shapes and tree
        verifiers only; ``shape``'s length is the first round's).

    A decoder holds the per-call state of its drafter and strategy: run one ``generate`` at a
    time on it.

    Examples
    --------
    >>> import torch, transformers
    >>> import specsampling as ss
    >>> config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
    ...     attn_implementation="eager")
    >>> _ = torch.manual_seed(0)
    >>> target, draft = transformers.LlamaForCausalLM(config), transformers.LlamaForCausalLM(config)
    >>> dec = SpeculativeDecoder(target, draft, "specinfer", ss.Shape.paths(2, 2))
    >>> out = dec.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, seed=0)
    >>> out.sequences.shape, out.num_generated
    (torch.Size([1, 8]), (5,))

    Keyed decoding: ``gumbel`` emits keyed target-only decoding, whatever the draft.

    >>> keyed = SpeculativeDecoder(target, draft, "gumbel", ss.Shape.chain(3))
    >>> alone = SpeculativeDecoder(target, None, "gumbel", ss.Shape.chain(3))
    >>> prompt = torch.tensor([[1, 2, 3]])
    >>> a, b = (d.generate(prompt, 6, key=7).sequences for d in (keyed, alone))
    >>> torch.equal(a, b)
    True
    """

    def __init__(
        self,
        target: Any,
        draft: Any = None,
        scheme: Any = "standard",
        shape: Shape | None = None,
        length: DraftLength | None = None,
    ) -> None:
        check_causal_lm(target, "target")
        self.target = target
        self.shape = check_shape(Shape.chain(4) if shape is None else shape)
        self.verification = verification_for(scheme, self.shape)
        self.lowering = self.verification.lowering
        self.draft = draft
        self.drafter: Drafter = as_drafter(draft)
        self.drafter.check(target, self.verification)
        if length is not None:
            if not isinstance(length, DraftLength):
                raise ValueError(
                    "length: expected a DraftLength policy (HeuristicLength, CostModelLength) "
                    f"or None, got {type(length).__name__}"
                )
            check_adaptive(self.verification, "length")
        #: The adaptive draft length policy (``None``: every round drafts ``shape``).
        self.length = length
        #: Whether a round near the budget drafts a shorter chain (a chain shape, verified by
        #: a tree verifier: keyed couplings draft on their fixed plan).
        self.cuts_chains = self.shape.is_chain and isinstance(self.verification, TreeVerification)
        #: Set to a list to record a :class:`RoundTrace` of every round.
        self.traces: list[RoundTrace] | None = None

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 32,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        attention_mask: Any = None,
        pad_token_id: int | None = None,
        key: Any = None,
        window: int | None = None,
        streamer: Any = None,
    ) -> DecodeOutput:
        """Generate up to ``max_new_tokens`` tokens per row (see the module doc).

        ``input_ids [B, L]`` (or ``[L]``), left-padded where ``attention_mask [B, L]`` has
        zeros; ``temperature`` / ``top_k`` / ``top_p`` as :func:`specsampling.gpu.process`
        (``temperature=0``: greedy); ``seed`` seeds every uniform of the call.

        ``key`` (keyed couplings only, and required by them): row ``b`` decodes with key
        ``(key + b) mod 2**64``, or ``key[b]`` for a sequence of ``B`` keys, as
        :func:`specsampling.gpu.generate`; a keyed round reads no other randomness, so ``seed``
        is unused and a row's tokens do not depend on the batch it is in. ``window``: the
        watermark window (noise keyed by the hash of the previous ``window`` tokens, the
        prompt's length the row's ``start``), as :class:`specsampling.keyed.KeyedNoise`;
        ``None`` keys by absolute position.

        ``streamer``: a transformers streamer (``TextStreamer``, ``TextIteratorStreamer``, or any
        object with ``put(tokens)`` and ``end()``), batch size 1 as in transformers: it gets the
        prompt, then each round's committed tokens as they are emitted, then ``end()``.
        """
        started = time.perf_counter()
        device = next(self.target.parameters()).device
        vocab = vocab_size(self.target)
        prompt, mask = check_prompt(input_ids, attention_mask, device, vocab)
        max_new_tokens = ss.validation.check_positive_int(max_new_tokens, "max_new_tokens", 0)
        process(torch.zeros(1, 2), temperature, top_k, top_p)  # the parameters' own checks
        keys = self.verification.check_key(key, window, prompt.shape[0])
        eos = eos_set(eos_token_id, vocab)
        if pad_token_id is None:  # transformers' default: the first EOS id given
            pad_token_id = first_eos(eos_token_id) if eos else 0
        elif isinstance(pad_token_id, bool) or not isinstance(pad_token_id, numbers.Integral):
            raise ValueError(f"pad_token_id: expected an integer id, got {pad_token_id!r}")
        pad_token_id = int(pad_token_id)  # a numpy integer too, as max_new_tokens and EOS ids
        if streamer is not None and prompt.shape[0] != 1:
            raise ValueError(
                f"streamer: streaming takes one row (as in transformers), got {prompt.shape[0]}"
            )
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            seed = ss.validation.check_positive_int(seed, "seed", 0)
            if seed >= 2**64:  # torch's generators take 64 bits
                raise ValueError(f"seed: expected an integer in [0, 2**64), got {seed}")
            generator.manual_seed(seed)
        settings = (temperature, top_k, top_p)
        state = DecodeState(
            self.target,
            prompt,
            mask,
            settings,
            generator,
            vocab,
            max_new_tokens,
            eos,
            streamer,
            tracing=self.traces is not None,
        )
        if streamer is not None:
            streamer.put(prompt[0].cpu())
        try:
            if max_new_tokens > 0:
                if self.length is not None:
                    self.length.start(self.shape.depth)
                self.verification.start(state, keys, window)
                self.drafter.start(state)
                while state.active:
                    self.round(state)
        finally:  # a consumer waiting on the streamer is released even after an error
            self.drafter.stop()  # its cache is not kept past the call
            if streamer is not None:
                streamer.end()
        return self.output(state, pad_token_id, time.perf_counter() - started)

    # ------------------------------------------------------------------ one round
    def round(self, state: DecodeState) -> None:
        """Draft, score, verify, commit; finished rows leave the batch."""
        if state.room() == 1 and isinstance(self.verification, TreeVerification):
            self.last_round(state)
            return
        shape = None  # this round's chain, chosen before anything is drawn
        room = state.room()  # >= 2: a round emits at most its length + 1 tokens
        if self.length is not None:
            shape = Shape.chain(min(self.length.length(state.batch_size), room - 1))
            before, forwards = dict(state.times), getattr(self.drafter, "forwards", 0)
        elif self.cuts_chains and self.shape.depth > room - 1:  # no draft past the budget
            shape = Shape.chain(room - 1)
        with state.timed("draft"):
            proposal = self.drafter.propose(state, self.verification.draw(state, shape))
        with state.timed("target"):
            target_logits = state.score(proposal.tree)  # [B, N, V]
            target_probs = state.process(target_logits)  # [B, N, V]
        with state.timed("verify"):
            verified = self.verification.verify(state, proposal, target_probs)
        if self.length is not None:
            self.length.update(
                proposal.tree.depth.amax(1).tolist(),  # the deepest path (chains: all nodes)
                (verified.num_emitted - 1).tolist(),
                {phase: state.times[phase] - before[phase] for phase in before},
                getattr(self.drafter, "forwards", 0) - forwards,
                state.batch_size,
            )
        if self.traces is not None:
            self.traces.append(RoundTrace.of(state, proposal, target_logits, verified))
        self.drafter.commit(state, proposal, verified)
        keep = state.commit(proposal.tree, verified)
        if len(keep) < state.batch_size:
            rows = torch.tensor(keep, dtype=torch.long, device=state.device)
            for part in (self.verification, state):
                part.select_rows(keep, rows)
            if keep:
                self.drafter.select_rows(rows)
        if state.active:
            state.target.compact_if_sparse(state.compact_slack)

    def last_round(self, state: DecodeState) -> None:
        """Every active row may emit one more token: nothing is drafted (as transformers'
        assisted generation drafts nothing there), the target scores the roots and its own
        categorical draw is the token, exact for every tree verifier. Every row then finishes,
        so the drafter's cache is not brought up to date (its ``stop`` follows)."""
        proposal = Proposal(TreeBatch.roots(state.batch_size, state.device))
        with state.timed("target"):
            target_logits = state.score(proposal.tree)  # [B, 1, V]
            target_probs = state.process(target_logits)  # [B, 1, V]
        with state.timed("verify"):
            verified = self.verification.verify(state, proposal, target_probs)
        if self.traces is not None:
            self.traces.append(RoundTrace.of(state, proposal, target_logits, verified))
        keep = state.commit(proposal.tree, verified)
        assert not keep, "a row had room for one token and did not finish"
        none = torch.zeros(0, dtype=torch.long, device=state.device)
        for part in (self.verification, state):
            part.select_rows(keep, none)

    def output(self, state: DecodeState, pad_token_id: int, wall_time: float) -> DecodeOutput:
        stats = DecodeStats(
            rounds=state.num_rounds,
            emitted=tuple(tuple(e) for e in state.emitted),
            target_forwards=state.target.forwards,
            draft_forwards=getattr(self.drafter, "forwards", 0),
            wall_time=wall_time,
            draft_time=state.times["draft"],
            target_time=state.times["target"],
            verify_time=state.times["verify"],
        )
        lengths = tuple(len(g) for g in state.generated)
        return DecodeOutput(state.sequences(pad_token_id), lengths, stats)


__all__ = [
    "DecodeOutput",
    "DecodeStats",
    "KeyedVerification",
    "LayerSkipDraft",
    "NGramDraft",
    "RoundTrace",
    "SpeculativeDecoder",
    "TreeVerification",
]
