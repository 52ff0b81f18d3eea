r"""Speculative decoding of Hugging Face causal LMs with every lowered tree scheme.

A round, for every row of the batch (``B`` rows, left-padded prompts):

1. **Draft** a tree of ``shape`` level by level (:class:`~specsampling.gpu.drafting.TreeDrafter`):
   one draft forward per depth over the new nodes only (the draft's cache holds the committed
   prefix and the tree's upper levels), each with an ancestor-only 4D mask and ``position_ids =
   length + depth - 1``; the logits go through :func:`specsampling.gpu.process`.
2. **Score** the whole tree in **one** target forward over ``[pending token, nodes 1..N-1]`` with
   the same kind of mask: ``target_probs [B, N, V]`` (row ``n`` the distribution after node ``n``).
3. **Verify** with the lowering (:func:`specsampling.gpu.verify`, chains by
   :func:`specsampling.gpu.verify_chain`) on fresh float64 noise from the decoder's generator,
   drawn *after* and independently of the drafting noise.
4. **Commit**: both caches keep only the accepted path (a gather on the sequence axis); the last
   emitted token becomes the target's pending token. Rows stop at ``eos_token_id`` and at
   ``max_new_tokens`` exactly.

Losslessness. Given the context, the tree depends only on the draft and the drafting noise, the
verifier's noise is fresh, and the tables are the processed model distributions at each node's
full prefix (the tree-logits parity test checks that against no-cache forwards); so each
scheme's theorem applies round after round:

.. math:: P(x_{n+1}, \dots, x_{n+k} \mid x_{\le n}) = \prod_i p(x_{n+i} \mid x_{< n+i}).

Draft rows of nodes the drafting never expanded (the deepest level, and a point-mass drafter's
nodes) are **copies of the target row** at that node: the verifiers never read them, and were
one to, :math:`q = p` is the choice that keeps the law.

Keyed rounds (``scheme`` a keyed coupling: ``gumbel``, ``poisson``, ``gls``, ``gls_strong``;
``generate(..., key=K)``, required). Row ``b`` decodes with key ``k_b = (K + b) mod 2**64`` (or
``K[b]``), as :func:`specsampling.gpu.generate`. The noise of the position after a sequence
(prompt included, left padding dropped) is the keyed field at its context word ``t``: its
absolute position, or with ``window=h`` the watermark's hash of its previous ``h`` tokens
(:class:`specsampling.keyed.KeyedNoise`, the row's prompt length as ``start``). A round

1. drafts level by level as above, but every draw step is the keyed race of
   :meth:`KeyedLowering.draft_step <specsampling.gpu.schemes.coupled.KeyedLowering.draft_step>`
   on the processed draft distribution at its parent node
   (:math:`\arg\min_z \log E[t, k_s, z] - \log q(z)`); an :class:`NGramDraft` enters as
   point-mass rows, so the race drafts exactly its proposal;
2. scores the tree in one target forward, as above;
3. walks it with :meth:`KeyedLowering.walk <specsampling.gpu.schemes.coupled.KeyedLowering.walk>`
   (the target's keyed selection :math:`\arg\min_z \min_{k} \log E[t, k, z] - \log p(z)`
   at each node reached), and commits as above.

With ``draft=None`` each token is the target's keyed selection over the shape's ``K`` rows at
its position (:func:`specsampling.keyed.laws.decode`): keyed target-only decoding. The noise
depends on the key and the context alone, never on the round, the batch or the drafter, so for
the strong couplings (``gumbel``, ``poisson``, ``gls_strong``) the tokens **equal** keyed
target-only decoding whatever the draft; with a model draft every keyed scheme's tokens equal
:func:`specsampling.generate` with the same key on the same processed model pair (``gls``
included, whose tokens do depend on the draft); the watermark
(:func:`specsampling.keyed.watermark.detect`, ``rows=K``) detects them. "Equal" is exact in
float64; in float32 a race whose two best scores lie within the rounding of a cached tree
forward against a plain one could flip (never met in the tests). Every drafter is exact for a
keyed coupling: drafting only chooses which exponentials the drafter shares with the target. A
keyed round reads no uniforms (``seed`` is unused); a tree verifier takes no key.

Drafters and their draw laws: a causal LM sharing the vocabulary (or
:class:`LayerSkipDraft`, the target's own first layers) samples from its processed distribution
(the shape's law); :class:`NGramDraft` proposes a deterministic chain (a point mass), exact only
for ``nss`` and for schemes exact on sampled chains verified with the point-mass rule
(``draft_probs=None``); anything else is refused before the first forward.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

import specsampling as ss
from specsampling.errors import InvalidDistribution, UnsupportedShape
from specsampling.keyed import KeyedNoise
from specsampling.shapes import Shape, check_shape
from specsampling.tree import DrawLaw

from .. import keyed as gk
from .. import ops
from ..api import verify
from ..chain import chain_batch, verify_chain
from ..drafting import TreeDrafter
from ..generate import row_keys
from ..processing import process
from ..schemes import SCHEMES, get_lowering, tree_lowering
from ..schemes.base import Verified
from ..schemes.coupled import Drafted, DraftPlan, KeyedLowering
from ..tree import PAD, TreeBatch
from .attention import (
    KVState,
    ancestors_from_parents,
    causal_attend,
    check_causal_lm,
    forward_kwarg,
)


# ----------------------------------------------------------------------------- drafters
class NGramDraft:
    """Prompt-lookup drafting: after the longest suffix of ``n`` down to ``min_n`` tokens that
    occurred earlier in the row's context, propose the tokens that followed its latest earlier
    occurrence. A deterministic chain: a point-mass draft.

    >>> NGramDraft(n=2).propose([5, 6, 7, 5, 6], 3)
    [7, 5, 6]
    >>> NGramDraft(n=2).propose([1, 2, 3], 2)
    []
    """

    law = DrawLaw.DETERMINISTIC

    def __init__(self, n: int = 3, min_n: int = 1) -> None:
        self.n = ss.validation.check_positive_int(n, "n")
        self.min_n = ss.validation.check_positive_int(min_n, "min_n")
        if self.min_n > self.n:
            raise ValueError(f"min_n: expected at most n = {self.n}, got {min_n}")

    def propose(self, context: Sequence[int], length: int) -> list[int]:
        """Up to ``length`` tokens continuing ``context`` (``[]``: no earlier match)."""
        tokens = list(context)
        for size in range(min(self.n, len(tokens) - 1), self.min_n - 1, -1):
            suffix = tokens[-size:]
            for start in range(len(tokens) - size - 1, -1, -1):
                if tokens[start : start + size] == suffix:
                    follow = tokens[start + size : start + size + length]
                    if follow:
                        return follow
        return []

    def __repr__(self) -> str:
        return f"NGramDraft(n={self.n}, min_n={self.min_n})"


class LayerSkipDraft:
    """Self-speculation: the target's embedding, the decoder layers ``layers`` (indices into
    the target's layers, in order), its final norm and head. Its distributions are proper
    softmaxes, so it drafts with the shape's own (sampled) law. Llama / Qwen2-style models
    (``model.model.embed_tokens / rotary_emb / layers / norm``, ``model.lm_head``)."""

    def __init__(self, target: Any, layers: Sequence[int]) -> None:
        inner = getattr(target, "model", None)
        needed = ("embed_tokens", "rotary_emb", "layers", "norm")
        if inner is None or not all(hasattr(inner, a) for a in needed):
            raise TypeError(
                "target: LayerSkipDraft needs a Llama/Qwen2-style model (model.model.embed_tokens,"
                " rotary_emb, layers, norm and model.lm_head)"
            )
        count = len(inner.layers)
        chosen = tuple(int(i) for i in layers)
        if (
            not chosen
            or any(not 0 <= i < count for i in chosen)
            or list(chosen) != sorted(set(chosen))
        ):
            raise ValueError(
                f"layers: expected increasing distinct indices in [0, {count}), got {layers!r}"
            )
        self.target, self.inner, self.layers = target, inner, chosen
        self.config = target.config
        self.layer_kwarg = forward_kwarg(inner.layers[chosen[0]])

    def parameters(self):
        return self.target.parameters()

    def get_output_embeddings(self):
        return self.target.lm_head

    def forward(
        self, input_ids, attention_mask, position_ids, cache, use_cache=True, logits_to_keep=0
    ):
        hidden = self.inner.embed_tokens(input_ids)
        embeddings = self.inner.rotary_emb(hidden, position_ids=position_ids)
        for index in self.layers:
            hidden = self.inner.layers[index](
                hidden,
                attention_mask=attention_mask,
                position_ids=position_ids,
                position_embeddings=embeddings,
                use_cache=True,
                **{self.layer_kwarg: cache},
            )
            if isinstance(hidden, tuple):
                hidden = hidden[0]
        hidden = self.inner.norm(hidden)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.target.lm_head(hidden))

    __call__ = forward

    def __repr__(self) -> str:
        return f"LayerSkipDraft(layers={list(self.layers)})"


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


# ----------------------------------------------------------------------------- the decoder
class SpeculativeDecoder:
    """Speculative decoding of ``target`` with ``draft`` under a lowered tree ``scheme``.

    Parameters
    ----------
    target : transformers causal LM
        Eager or sdpa attention, full-attention layers (``DynamicCache``).
    draft : causal LM, LayerSkipDraft, NGramDraft or None
        ``None``: plain decoding with the target alone.
    scheme : str or lowering
        A tree scheme of :data:`specsampling.gpu.SCHEMES` exact for the drafter's law, or a
        keyed coupling (``gumbel``, ``poisson``, ``gls``, ``gls_strong``: every drafter; run
        with ``generate(..., key=...)``).
    shape : Shape
        How each round drafts (a chain for :class:`NGramDraft`).

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
    ) -> None:
        check_causal_lm(target, "target")
        self.target = target
        self.shape = check_shape(Shape.chain(4) if shape is None else shape)
        lowering = get_lowering(scheme)
        #: The keyed coupling's draw plan (``None`` for a tree verifier): rows ``K`` and steps.
        self.keyed_plan: DraftPlan | None = None
        if isinstance(lowering, KeyedLowering):
            self.lowering: Any = lowering
            self.keyed_plan = lowering.plan(self.shape)  # UnsupportedShape as the reference
        else:
            self.lowering = tree_lowering(lowering)
        self.draft = draft
        self.traces: list[RoundTrace] | None = None
        reference = self.lowering.reference_scheme
        device, dtype = _device_dtype(target)
        if draft is None:
            return
        if isinstance(draft, NGramDraft):
            if not self.shape.is_chain:
                raise UnsupportedShape(
                    f"shape: NGramDraft proposes chains; got {self.shape!r} (use Shape.chain(k))"
                )
            if self.keyed_plan is None and not reference.exact_for(DrawLaw.IID, True):
                raise UnsupportedShape(
                    f"scheme: {self.lowering.name!r} is not exact for NGramDraft's point-mass "
                    "chains (exact: nss and the schemes exact on sampled chains, with the "
                    f"point-mass rule); {self.lowering.name!r} is exact for "
                    f"{reference.support_text()}"
                )
            return
        if not isinstance(draft, LayerSkipDraft):
            check_causal_lm(draft, "draft")
        if self.keyed_plan is None:
            reference.check(self.shape)
        draft_device, draft_dtype = _device_dtype(draft)
        if draft_device != device:
            raise ValueError(f"draft: on {draft_device}, but the target is on {device}")
        if draft_dtype != dtype:
            raise ValueError(f"draft: dtype {draft_dtype}, but the target's is {dtype}")
        target_vocab = _vocab_size(target)
        draft_vocab = _vocab_size(draft)
        if draft_vocab < target_vocab:
            raise ValueError(
                f"draft: vocabulary of {draft_vocab} tokens, smaller than the target's "
                f"{target_vocab}: the models must share the tokenizer"
            )

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
        ``None`` keys by absolute position. See the section "Keyed rounds" of the module doc.

        ``streamer``: a transformers streamer (``TextStreamer``, ``TextIteratorStreamer``, or any
        object with ``put(tokens)`` and ``end()``), batch size 1 as in transformers: it gets the
        prompt, then each round's committed tokens as they are emitted, then ``end()``.
        """
        started = time.perf_counter()
        device, _ = _device_dtype(self.target)
        prompt, mask = _check_prompt(input_ids, attention_mask, device)
        max_new_tokens = ss.validation.check_positive_int(max_new_tokens, "max_new_tokens", 0)
        process(torch.zeros(1, 2), temperature, top_k, top_p)  # the parameters' own checks
        keys = self._check_key(key, window, prompt.shape[0])
        eos = _eos_set(eos_token_id)
        if pad_token_id is None:
            pad_token_id = min(eos) if eos else 0
        settings = (temperature, top_k, top_p)
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        if streamer is not None and prompt.shape[0] != 1:
            raise ValueError(
                f"streamer: streaming takes one row (as in transformers), got {prompt.shape[0]}"
            )
        run = _Run(self, prompt, mask, settings, generator)
        run.streamer = streamer
        if streamer is not None:
            streamer.put(prompt[0].cpu())
        if keys is not None:
            run.keyed = _KeyedRounds(run, self.lowering, self.keyed_plan, keys, window)
        try:
            if max_new_tokens > 0:
                run.prefill()
            while run.active and max_new_tokens > 0:
                run.round(max_new_tokens, eos)
        finally:  # a consumer waiting on the streamer is released even after an error
            if streamer is not None:
                streamer.end()
        return run.output(prompt, pad_token_id, time.perf_counter() - started)

    def _check_key(self, key: Any, window: Any, batch: int) -> tuple[int, ...] | None:
        """The row keys (``None`` for a tree verifier), refusing a missing or useless key."""
        name = self.lowering.name
        if self.keyed_plan is None:
            if key is not None or window is not None:
                keyed = sorted(n for n, low in SCHEMES.items() if isinstance(low, KeyedLowering))
                raise ValueError(
                    f"key: scheme {name!r} verifies from fresh uniforms and takes no key (nor "
                    f"window); key= runs only the keyed couplings {keyed}"
                )
            return None
        if key is None:
            raise ValueError(
                f"key: scheme {name!r} is a keyed coupling (drafter and verifier share one keyed "
                "noise field, it cannot run from uniforms): pass key= (an int, or one per row)"
            )
        if window is not None:
            ss.validation.check_positive_int(window, "window")
        if getattr(key, "ndim", None) == 0:  # a 0-d tensor or array: one key
            key = key.item()
        if not isinstance(key, (int, str)) and hasattr(key, "__len__"):
            if len(key) != batch:
                raise ValueError(f"key: expected one key per row ({batch}), got {len(key)}")
        return row_keys(key, batch)

    # ------------------------------------------------------------------ overridable pieces
    def keyed_walk(
        self,
        drafted: Drafted,
        plan: DraftPlan,
        keys: torch.Tensor,  # [B] int64-held words
        target_probs: torch.Tensor,  # [B, N, V]
    ) -> Verified:
        """The keyed coupling's walk down this round's trees (:meth:`KeyedLowering.walk`)."""
        lowering: KeyedLowering = self.lowering
        return lowering.walk(drafted, plan, keys, target_probs)

    def verify_round(
        self,
        tree: TreeBatch,
        target_probs: torch.Tensor,  # [B, N, V]
        draft_probs: torch.Tensor | None,  # [B, N, V]; None: point-mass chain
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens [B, D + 1], num_emitted [B], node [B])`` of the lowering on this round."""
        depth = tree.max_depth
        if draft_probs is None or (self.shape.is_chain and depth > 0):
            tokens = tree.tokens[:, 1:].contiguous()  # [B, D]
            lengths = tree.num_nodes - 1  # [B]
            chain_draft = None if draft_probs is None else draft_probs[:, :depth]
            out = verify_chain(
                self.lowering,
                tokens,
                target_probs[:, : depth + 1],
                chain_draft,
                generator=generator,
                num_draft_tokens=lengths,
            )
        else:
            out = verify(self.lowering, tree, target_probs, draft_probs, generator=generator)
        return out.tokens, out.num_emitted, out.node


class _Run:
    """The state of one :meth:`SpeculativeDecoder.generate` call (active rows only)."""

    #: A cache is compacted once its committed slots exceed twice the longest row plus this.
    compact_slack = 16

    def __init__(self, decoder, prompt, mask, settings, generator):
        self.dec = decoder
        self.settings = settings
        self.generator = generator
        self.device = prompt.device
        batch = prompt.shape[0]
        self.rows = list(range(batch))  # original index of each active row
        self.active = batch > 0
        self.contexts = [
            [int(t) for t, m in zip(p, v, strict=True) if m]
            for p, v in zip(prompt.tolist(), mask.tolist(), strict=True)
        ]
        self.generated: list[list[int]] = [[] for _ in range(batch)]
        self.emitted: list[list[int]] = [[] for _ in range(batch)]
        self.num_rounds = 0
        self.times = {"draft": 0.0, "target": 0.0, "verify": 0.0}
        self.prompt, self.mask = prompt, mask
        self.target = KVState(decoder.target, batch, "target")
        draft = decoder.draft
        self.model_draft = draft is not None and not isinstance(draft, NGramDraft)
        self.draft = KVState(draft, batch, "draft") if self.model_draft else None
        self.vocab = _vocab_size(decoder.target)
        self.pending = prompt[:, -1]  # [B] the target's pending token
        self.draft_pending = prompt[:, -1:]  # [B, P] the draft's uncached tokens (left padded)
        self.draft_pending_valid = torch.ones_like(self.draft_pending, dtype=torch.bool)
        if self.draft is not None:
            self.plan = _DraftPlan(decoder.shape, self.device)
        self.keyed: _KeyedRounds | None = None  # set by generate(key=...)
        self.streamer: Any = None  # set by generate(streamer=...)

    # ------------------------------------------------------------------ phases
    def prefill(self) -> None:
        tokens, valid = self.prompt[:, :-1], self.mask[:, :-1]  # [B, L - 1]
        if tokens.shape[1] == 0:
            return
        for state in (self.target, self.draft):
            if state is None:
                continue
            started = time.perf_counter()
            self.forward_committed(state, tokens, valid, last_only=True)
            self.times["target" if state is self.target else "draft"] += _elapsed(started)

    def forward_committed(self, state, tokens, valid, last_only=False) -> torch.Tensor:
        """Forward ``tokens [B, Q]`` (causal among the ``valid`` ones) and commit them all."""
        positions = state.lengths()[:, None] + (valid.long().cumsum(1) - 1).clamp_min(0)
        logits = state.forward(
            tokens.clamp_min(0), causal_attend(valid), positions, valid, last_only
        )
        q = tokens.shape[1]
        slots = torch.arange(q, device=self.device).expand_as(valid)
        state.commit(torch.where(valid, slots, PAD))
        return logits

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return process(logits, *self.settings)

    def round(self, max_new_tokens: int, eos: frozenset[int]) -> None:
        if self.keyed is not None:
            self.keyed.round(max_new_tokens, eos)
            return
        dec = self.dec
        batch = len(self.rows)
        draft_logits_trace = None
        started = time.perf_counter()
        if self.draft is not None:
            tree, draft_rows, draft_logits_trace = self.draft_tree(batch)
        elif isinstance(dec.draft, NGramDraft):
            tree, draft_rows = self.ngram_tree(batch), None
        else:
            tree, draft_rows = self.root_tree(batch), None
        self.times["draft"] += _elapsed(started)

        started = time.perf_counter()
        target_logits = self.score(tree)  # [B, N, V]
        target_probs = self.probs(target_logits)  # [B, N, V]
        self.times["target"] += _elapsed(started)

        started = time.perf_counter()
        draft_probs = None
        if draft_rows is not None:
            draft_probs = target_probs.clone()  # unexpanded nodes: the target row (never read)
            expanded, values = draft_rows
            draft_probs[expanded] = values.to(draft_probs.dtype)
        if self.draft is None and dec.draft is None:
            u = torch.rand(batch, dtype=torch.float64, generator=self.generator, device=self.device)
            token = ops.categorical(target_probs[:, 0], u)  # [B]
            tokens, counts, node = token[:, None], torch.ones_like(token), torch.zeros_like(token)
        else:
            tokens, counts, node = dec.verify_round(tree, target_probs, draft_probs, self.generator)
        self.times["verify"] += _elapsed(started)

        if dec.traces is not None:
            dec.traces.append(
                RoundTrace(
                    [list(c) for c in self.contexts],
                    tree,
                    target_logits.detach().clone(),
                    draft_logits_trace,
                )
            )
        self.commit(tree, tokens, counts, node, max_new_tokens, eos)

    # ------------------------------------------------------------------ drafting
    def root_tree(self, batch: int) -> TreeBatch:
        """The root alone (plain decoding): one node per row."""
        pad = torch.full((batch, 1), PAD, dtype=torch.long, device=self.device)  # [B, 1]
        return TreeBatch(
            parents=pad,
            tokens=pad,
            num_nodes=torch.ones(batch, dtype=torch.long, device=self.device),
            candidates=pad[..., None],
            depth=torch.zeros_like(pad),
            laws=(DrawLaw.IID,) * batch,
            chains=(True,) * batch,
            max_depth=0,
        )

    def ngram_tree(self, batch: int) -> TreeBatch:
        length = self.dec.shape.depth
        drafts = [self.dec.draft.propose(c, length) for c in self.contexts]
        tokens = torch.full((batch, length), PAD, dtype=torch.long)
        for row, proposal in enumerate(drafts):
            if proposal:
                tokens[row, : len(proposal)] = torch.tensor(proposal)
        tokens = tokens.to(self.device)
        lengths = torch.tensor([len(p) for p in drafts], device=self.device)
        return chain_batch(tokens, lengths)

    def draft_tree(self, batch: int):
        """Draft one tree per row; returns the tree, ``(expanded [B, N] bool, probs [E, V])``
        (the draft rows of the nodes drafting expanded) and the raw draft logits for traces."""
        plan, state = self.plan, self.draft
        drafter = TreeDrafter(self.dec.shape, batch, self.device)
        uniforms = torch.rand(
            (batch, drafter.num_steps),
            dtype=torch.float64,
            generator=self.generator,
            device=self.device,
        )  # [B, S] drafting noise, drawn before (and apart from) the verifier's
        root_logits = self.forward_committed(
            state, self.draft_pending, self.draft_pending_valid, last_only=True
        )  # [B, 1, V]
        level_logits = [root_logits]
        level_probs = []
        level_paths = [torch.empty((batch, 1, 0), dtype=torch.long, device=self.device)]
        level_exists = [torch.ones((batch, 1), dtype=torch.bool, device=self.device)]
        self.pad_flag = torch.zeros((), dtype=torch.bool, device=self.device)
        probs = self.draft_probs(root_logits)
        for level in range(len(drafter.levels)):
            if level > 0:
                frontier = drafter.frontier
                tokens = frontier.paths[:, :, -1].clamp_min(0)  # [B, F]
                attend = plan.attend[level][None].expand(batch, -1, -1)  # [B, F, T + F]
                eye = plan.eye[level][None]
                attend = (attend & frontier.exists[:, :, None]) | eye
                positions = state.lengths()[:, None] + (level - 1)  # depth level -> + level - 1
                logits = state.forward(tokens, attend, positions.expand_as(tokens), frontier.exists)
                level_logits.append(logits)
                level_paths.append(frontier.paths)
                level_exists.append(frontier.exists)
                probs = self.draft_probs(logits)
            level_probs.append(probs)
            columns = list(drafter.levels[level])
            drafter.next_level(probs, uniforms[:, columns])
        if bool(self.pad_flag):
            raise InvalidDistribution(
                f"draft: its vocabulary is padded beyond the target's {self.vocab} tokens, and "
                "the padded ids get positive draft probability (they must get none)"
            )
        tree = drafter.finish()
        self.level_paths, self.level_exists = level_paths, level_exists
        slot_of = self.node_slots(tree, level_paths, level_exists)  # [B, N]
        expanded = slot_of >= 0  # [B, N]
        values = _gather_rows(torch.cat(level_probs, dim=1), slot_of)[expanded]  # [E, V]
        raw = None
        if self.dec.traces is not None:
            raw = _gather_rows(torch.cat(level_logits, dim=1), slot_of).detach()
            raw = raw.masked_fill(~expanded[..., None], float("nan"))
        return tree, (expanded, values), raw

    def draft_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed draft distributions, the padded ids (beyond the target's vocabulary)
        dropped after checking they carry no mass (flagged, raised once per round)."""
        probs = self.probs(logits)
        if probs.shape[-1] > self.vocab:
            self.pad_flag = self.pad_flag | (probs[..., self.vocab :] > 0).any()
            probs = probs[..., : self.vocab]
        return probs

    def node_slots(self, tree, level_paths, level_exists) -> torch.Tensor:
        """The drafted slot (flat over the levels: root, then each level's frontier) whose path
        is each tree node's, ``[B, N]``; ``PAD`` for nodes drafting never expanded."""
        paths = node_paths(tree)  # [B, N, D]
        batch, num_nodes = tree.parents.shape
        slot_of = torch.full((batch, num_nodes), PAD, dtype=torch.long, device=self.device)
        offset = 0
        for depth, (slot_paths, exists) in enumerate(zip(level_paths, level_exists, strict=True)):
            same = (paths[:, :, None, :depth] == slot_paths[:, None, :, :]).all(-1)  # [B, N, F]
            same &= (tree.depth == depth)[:, :, None] & exists[:, None, :]
            slot = same.int().argmax(-1) + offset  # [B, N]
            slot_of = torch.where(same.any(-1), slot, slot_of)
            offset += slot_paths.shape[1]
        return slot_of

    # ------------------------------------------------------------------ scoring
    def score(self, tree: TreeBatch) -> torch.Tensor:
        """One target forward over ``[pending, nodes 1..N-1]``: raw logits ``[B, N, V]``."""
        real = tree.real_nodes()  # [B, N]
        tokens = torch.cat([self.pending[:, None], tree.tokens[:, 1:].clamp_min(0)], dim=1)
        attend = ancestors_from_parents(tree.parents, tree.max_depth)  # [B, N, N]
        positions = self.target.lengths()[:, None] + tree.depth.clamp_min(0)  # [B, N]
        logits = self.target.forward(tokens, attend, positions, real)
        return logits[..., : self.vocab]

    # ------------------------------------------------------------------ commit
    def commit(self, tree, tokens, counts, node, max_new_tokens, eos) -> None:
        """Record the emitted tokens, keep the accepted path in both caches, drop finished rows."""
        emitted = tokens.tolist()
        counts_host = counts.tolist()
        keep_rows = []
        for b, (row_tokens, count) in enumerate(zip(emitted, counts_host, strict=True)):
            original = self.rows[b]
            room = max_new_tokens - len(self.generated[original])
            taken = row_tokens[: min(count, room)]
            stop = room <= count
            for i, token in enumerate(taken):
                if token in eos:
                    taken, stop = taken[: i + 1], True
                    break
            self.generated[original].extend(taken)
            self.emitted[original].append(len(taken))
            if self.streamer is not None and taken:
                self.streamer.put(torch.tensor(taken))
            self.contexts[b].extend(taken)
            if not stop:
                keep_rows.append(b)
        if self.dec.traces is not None:
            self.dec.traces[-1].emitted = [
                list(e[:c]) for e, c in zip(emitted, counts_host, strict=True)
            ]
        self.num_rounds += 1
        accepted = counts - 1  # [B] accepted drafted nodes
        path = path_nodes(tree, node)  # [B, D] node of depth k + 1 on the accepted path
        slots = torch.cat([torch.zeros_like(node[:, None]), path], dim=1)  # [B, 1 + D]
        self.target.commit(slots)
        self.pending = tokens.gather(1, accepted[:, None]).squeeze(1)  # [B] the last emitted
        if self.draft is not None:
            self.commit_draft(tokens, accepted)
        if len(keep_rows) < len(self.rows):
            self.select_rows(keep_rows)
        for state in (self.target, self.draft):
            if self.active and state is not None:
                if state.committed > 2 * int(state.lengths().max()) + self.compact_slack:
                    state.compact()

    def commit_draft(self, tokens: torch.Tensor, accepted: torch.Tensor) -> None:
        """Keep the drafted slots of the accepted path (depths ``1..D-1`` were forwarded); the
        emitted tokens not cached yet (1 or 2) become the draft's pending tokens."""
        batch = tokens.shape[0]
        slots = []
        offset = 0
        for depth in range(1, len(self.level_paths)):
            paths, exists = self.level_paths[depth], self.level_exists[depth]  # [B, F, depth]
            same = (paths == tokens[:, None, :depth]).all(-1) & exists  # [B, F]
            use = same.any(-1) & (accepted >= depth)  # [B]
            slots.append(torch.where(use, same.int().argmax(-1) + offset, PAD))
            offset += paths.shape[1]
        if slots:
            self.draft.commit(torch.stack(slots, dim=1))  # [B, D - 1]
        else:
            self.draft.commit(torch.empty((batch, 0), dtype=torch.long, device=self.device))
        cached = accepted.clamp_max(len(self.level_paths) - 1)  # [B] emitted tokens now cached
        lanes = torch.arange(2, device=self.device)[None, :]  # [1, 2]: the last two emitted
        index = accepted[:, None] - 1 + lanes  # [B, 2]
        valid = index >= cached[:, None]  # [B, 2]
        pending = tokens.gather(1, index.clamp_min(0))
        if not bool(valid[:, 0].any()):  # nobody has two: one lane
            pending, valid = pending[:, 1:], valid[:, 1:]
        self.draft_pending, self.draft_pending_valid = pending, valid

    def select_rows(self, keep: list[int]) -> None:
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.rows = [self.rows[b] for b in keep]
        self.contexts = [self.contexts[b] for b in keep]
        self.active = bool(keep)
        if not keep:
            return
        self.pending = self.pending[rows]
        if self.keyed is not None:
            self.keyed.select_rows(keep, rows)
        self.target.select_rows(rows)
        if self.draft is not None:
            self.draft.select_rows(rows)
            self.draft_pending = self.draft_pending[rows]
            self.draft_pending_valid = self.draft_pending_valid[rows]

    # ------------------------------------------------------------------ output
    def output(self, prompt, pad_token_id, wall_time) -> DecodeOutput:
        width = max((len(g) for g in self.generated), default=0)
        batch = prompt.shape[0]
        new = torch.full((batch, width), pad_token_id, dtype=prompt.dtype)
        for row, tokens in enumerate(self.generated):
            if tokens:
                new[row, : len(tokens)] = torch.tensor(tokens, dtype=prompt.dtype)
        sequences = torch.cat([prompt, new.to(prompt.device)], dim=1)
        stats = DecodeStats(
            rounds=self.num_rounds,
            emitted=tuple(tuple(e) for e in self.emitted),
            target_forwards=self.target.forwards,
            draft_forwards=0 if self.draft is None else self.draft.forwards,
            wall_time=wall_time,
            draft_time=self.times["draft"],
            target_time=self.times["target"],
            verify_time=self.times["verify"],
        )
        return DecodeOutput(sequences, tuple(len(g) for g in self.generated), stats)


class _KeyedRounds:
    """The keyed rounds of one :meth:`SpeculativeDecoder.generate` call (``key=`` given).

    Holds the row keys ``keys [B]`` (int64-held words), the watermark window and each row's
    prompt length (the keyed noise's ``start``); drafts from the keyed race, scores with the
    target, walks with :meth:`KeyedLowering.walk`, and commits through the ``_Run``.
    """

    def __init__(
        self,
        run: _Run,
        lowering: KeyedLowering,
        plan: DraftPlan,
        keys: Sequence[int],
        window: int | None,
    ) -> None:
        self.run, self.lowering, self.plan, self.window = run, lowering, plan, window
        self.keys = gk.as_words(list(keys), run.device)  # [B]
        self.starts = [len(context) for context in run.contexts]  # prompt lengths, host

    def select_rows(self, keep: list[int], rows: torch.Tensor) -> None:
        self.keys = self.keys[rows]
        self.starts = [self.starts[b] for b in keep]

    # ------------------------------------------------------------------ contexts
    def contexts_after(self, paths: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """The context word of the position after each row's committed context followed by
        ``paths [B, D]`` cut to ``depth [B]`` (``PAD``: the root): ``[B]`` int64-held, as
        :meth:`specsampling.keyed.KeyedNoise.context` with the row's prompt as ``start``."""
        run = self.run
        depth = depth.clamp_min(0)
        if self.window is None:  # the absolute position: committed + pending + path
            return gk.position_context(run.target.lengths() + 1 + depth)
        paths_h, depth_h = paths.tolist(), depth.tolist()
        sequences = [
            context + path[:d]
            for context, path, d in zip(run.contexts, paths_h, depth_h, strict=True)
        ]
        out = torch.zeros(len(sequences), dtype=torch.long, device=run.device)  # [B]
        for start in sorted(set(self.starts)):  # one batched call per distinct prompt length
            rows = [b for b, s in enumerate(self.starts) if s == start]
            noise = KeyedNoise(0, self.window, start=start)  # context words read no key
            chosen = [sequences[b] for b in rows]
            out[rows] = gk.context_words(noise, chosen, device=run.device)
        return out

    def root_contexts(self, batch: int) -> torch.Tensor:
        empty = torch.empty((batch, 0), dtype=torch.long, device=self.run.device)
        return self.contexts_after(empty, torch.zeros(batch, dtype=torch.long, device=empty.device))

    # ------------------------------------------------------------------ a round
    def round(self, max_new_tokens: int, eos: frozenset[int]) -> None:
        run, dec = self.run, self.run.dec
        batch = len(run.rows)
        started = time.perf_counter()
        raw = None
        if dec.draft is None:
            tree, drafted = run.root_tree(batch), None
        else:
            tree, drafted, raw = self.draft_tree(batch)
        run.times["draft"] += _elapsed(started)

        started = time.perf_counter()
        target_logits = run.score(tree)  # [B, N, V]
        target_probs = run.probs(target_logits)  # [B, N, V]
        run.times["target"] += _elapsed(started)

        started = time.perf_counter()
        if drafted is None:
            out = self.select_root(target_probs[:, 0])
        else:
            out = dec.keyed_walk(drafted, self.plan, self.keys, target_probs)
        run.times["verify"] += _elapsed(started)
        if dec.traces is not None:
            dec.traces.append(
                RoundTrace(
                    [list(c) for c in run.contexts], tree, target_logits.detach().clone(), raw
                )
            )
        run.commit(tree, out.tokens, out.num_emitted, out.node, max_new_tokens, eos)

    def select_root(self, target_probs: torch.Tensor) -> Verified:
        """Keyed target-only decoding: the target's keyed selection over all ``K`` rows at
        the root (:func:`specsampling.keyed.laws.decode`), ``target_probs [B, V]``."""
        batch, vocab = target_probs.shape
        exps = self.lowering.node_exponentials(
            self.keys, self.root_contexts(batch), self.plan.num_rows, vocab
        )  # [B, K, V]
        raced = torch.ones(exps.shape[:2], dtype=torch.bool, device=exps.device)  # [B, K]
        token = self.lowering.select(target_probs, exps, raced)  # [B]
        node = torch.zeros_like(token)
        return Verified(node, token, token[:, None], torch.ones_like(token))

    def draft_tree(self, batch: int) -> tuple[TreeBatch, Drafted, torch.Tensor | None]:
        """Draft every row's tree from the keyed race (:meth:`KeyedLowering.draft_step`),
        level by level: one draft forward per depth over the nodes of the level above (as
        :meth:`_Run.draft_tree`), an :class:`NGramDraft`'s proposal as one-hot draft rows.
        Returns the tree (trimmed to the largest row), the :class:`Drafted` bookkeeping of
        the walk, and the raw draft logits at the expanded nodes when tracing."""
        run, lowering, plan = self.run, self.lowering, self.plan
        device = run.device
        rows = torch.arange(batch, device=device)  # [B]
        drafted = lowering.start(plan, self.root_contexts(batch))
        state = run.draft  # None for an NGramDraft
        levels = TreeDrafter(plan.shape, 1, device).levels if state is None else run.plan.levels
        proposals = None if state is not None else self.ngram_probs(batch)  # [B, D, V]
        level_logits: list[torch.Tensor] = []
        level_paths = [torch.empty((batch, 1, 0), dtype=torch.long, device=device)]
        level_exists = [torch.ones((batch, 1), dtype=torch.bool, device=device)]
        run.pad_flag = torch.zeros((), dtype=torch.bool, device=device)
        for level, steps in enumerate(levels):
            frontier = (-1,) if level == 0 else levels[level - 1]
            if level > 0:
                nodes = drafted.step_nodes[:, list(frontier)]  # [B, F]
                exists = nodes != PAD  # [B, F]
                index = nodes.clamp_min(0)[..., None].expand(-1, -1, plan.depth)  # [B, F, D]
                paths = drafted.paths.gather(1, index)[:, :, :level]  # [B, F, level]
                level_paths.append(paths)
                level_exists.append(exists)
            if proposals is not None:
                probs = proposals[:, level : level + 1]  # [B, 1, V] (a chain)
            elif level == 0:
                logits = run.forward_committed(
                    state, run.draft_pending, run.draft_pending_valid, last_only=True
                )  # [B, 1, V]
                probs = run.draft_probs(logits)
            else:
                attend = run.plan.attend[level][None].expand(batch, -1, -1)  # [B, F, T + F]
                attend = (attend & exists[:, :, None]) | run.plan.eye[level][None]
                positions = state.lengths()[:, None] + (level - 1)  # [B, 1]
                tokens = paths[:, :, -1].clamp_min(0)  # [B, F]
                logits = state.forward(tokens, attend, positions.expand_as(tokens), exists)
                probs = run.draft_probs(logits)
            if proposals is None:
                level_logits.append(logits)
            slot = {step: f for f, step in enumerate(frontier)}
            for step in steps:
                parent_probs = probs[:, slot[plan.parents[step]]]  # [B, V]
                drafted, node, created = lowering.draft_step(
                    drafted, plan, step, self.keys, parent_probs
                )
                safe = node.clamp_min(0)  # [B]
                contexts = self.contexts_after(drafted.paths[rows, safe], drafted.depth[rows, safe])
                drafted = lowering.with_contexts(drafted, node, created, contexts)
        if bool(run.pad_flag):
            raise InvalidDistribution(
                f"draft: its vocabulary is padded beyond the target's {run.vocab} tokens, and "
                "the padded ids get positive draft probability (they must get none)"
            )
        size = int(drafted.num_nodes.max())  # one host synchronisation: the padded tree size
        tree = TreeBatch(
            drafted.parents[:, :size],
            drafted.tokens[:, :size],
            drafted.num_nodes,
            drafted.candidates[:, :size],
            drafted.depth[:, :size],
            (plan.shape.law,) * batch,
        )
        raw = None
        if state is not None:
            run.level_paths, run.level_exists = level_paths, level_exists
            if run.dec.traces is not None:
                slot_of = run.node_slots(tree, level_paths, level_exists)  # [B, N]
                raw = _gather_rows(torch.cat(level_logits, dim=1), slot_of).detach()
                raw = raw.masked_fill(~(slot_of >= 0)[..., None], float("nan"))
        return tree, drafted, raw

    def ngram_probs(self, batch: int) -> torch.Tensor:
        """An :class:`NGramDraft`'s chain as point-mass draft rows ``[B, D, V]`` (the race
        then drafts exactly the proposal); past a short proposal, token 0 (any deterministic
        filler keeps a keyed coupling exact: it decides which noise is shared, not the law)."""
        run = self.run
        depth = self.plan.depth
        tokens = torch.zeros((batch, depth), dtype=torch.long)  # [B, D]
        for row, context in enumerate(run.contexts):
            proposal = run.dec.draft.propose(context, depth)
            if proposal:
                tokens[row, : len(proposal)] = torch.tensor(proposal)
        probs = torch.zeros((batch, depth, run.vocab), dtype=torch.float64)
        probs.scatter_(2, tokens[..., None], 1.0)
        return probs.to(run.device)


class _DraftPlan:
    """Static masks of a shape's level-by-level draft forwards: the query slots of level
    ``d >= 1`` are the steps of ``levels[d - 1]``; ``attend[d] [F_d, T_d + F_d]`` lets each
    attend to its ancestor steps among the earlier tentative slots and itself."""

    def __init__(self, shape: Shape, device: torch.device) -> None:
        drafter = TreeDrafter(shape, 1, device)
        parents = drafter.parent_steps
        #: The draw steps of each depth, in step order (``levels[d]``: the steps at depth d+1).
        self.levels = drafter.levels
        slot: dict[int, int] = {}
        self.attend: dict[int, torch.Tensor] = {}
        self.eye: dict[int, torch.Tensor] = {}
        for level in range(1, len(drafter.levels)):
            steps = drafter.levels[level - 1]
            before = len(slot)
            for step in steps:
                slot[step] = len(slot)
            allowed = torch.zeros((len(steps), len(slot)), dtype=torch.bool)
            for row, step in enumerate(steps):
                current = step
                while current >= 0:
                    allowed[row, slot[current]] = True
                    current = parents[current]
            eye = torch.zeros_like(allowed)
            eye[:, before:] = torch.eye(len(steps), dtype=torch.bool)
            self.attend[level] = allowed.to(device)
            self.eye[level] = eye.to(device)


# ----------------------------------------------------------------------------- tree helpers
def node_paths(tree: TreeBatch) -> torch.Tensor:
    """``paths [B, N, D]``: the tokens from the root to each node (``PAD`` past its depth)."""
    batch, num_nodes = tree.parents.shape
    depth_max = max(tree.max_depth, 0)
    paths = torch.full((batch, num_nodes, depth_max + 1), PAD, dtype=torch.long, device=tree.device)
    current = torch.arange(num_nodes, device=tree.device).expand(batch, num_nodes)  # [B, N]
    alive = tree.real_nodes()
    for _ in range(depth_max):
        depth = tree.depth.gather(1, current.clamp_min(0))  # [B, N]
        here = alive & (depth > 0)
        column = torch.where(here, depth - 1, depth_max)  # the extra column is a dump
        paths.scatter_(2, column[..., None], tree.tokens.gather(1, current.clamp_min(0))[..., None])
        current = torch.where(here, tree.parents.gather(1, current.clamp_min(0)), current)
        alive = here
    return paths[:, :, :depth_max]


def path_nodes(tree: TreeBatch, node: torch.Tensor) -> torch.Tensor:
    """``[B, D]``: column ``k`` holds the node of depth ``k + 1`` on the root path to
    ``node [B]`` (``PAD`` past its depth)."""
    batch = node.shape[0]
    depth_max = tree.max_depth
    out = torch.full((batch, depth_max + 1), PAD, dtype=torch.long, device=node.device)
    current = node
    for _ in range(depth_max):
        depth = tree.depth.gather(1, current[:, None]).squeeze(1)  # [B]
        here = depth > 0
        out.scatter_(1, torch.where(here, depth - 1, depth_max)[:, None], current[:, None])
        current = torch.where(here, tree.parents.gather(1, current[:, None]).squeeze(1), current)
    return out[:, :depth_max]


# ----------------------------------------------------------------------------- custom_generate
#: The logits processors ``generate`` maps onto :func:`specsampling.gpu.process` (by class name).
_PROCESSORS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
#: The stopping criteria ``generate`` honours itself (max length, EOS).
_CRITERIA = {"MaxLengthCriteria", "EosTokenCriteria", "MaxNewTokensCriteria"}


def generate(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    draft_model: Any = None,
    scheme: Any = "standard",
    shape: Shape | None = None,
    seed: int | None = None,
    key: Any = None,
    window: int | None = None,
    **model_kwargs: Any,
) -> torch.Tensor:
    """Speculative decoding inside ``model.generate(custom_generate=generate, ...)``.

    transformers (5.17+) calls this with the model, the prompt, its prepared logits processors,
    stopping criteria and generation config, plus our own keywords: ``draft_model`` (the draft:
    a model, :class:`LayerSkipDraft`, :class:`NGramDraft` or ``None``; ``assistant_model`` is not
    passed to a callable), ``scheme``, ``shape``, ``seed``, and ``key`` / ``window`` for the
    keyed couplings (:meth:`SpeculativeDecoder.generate`). ``do_sample=False`` is greedy
    (``temperature = 0``); ``temperature`` / ``top_k`` / ``top_p`` go through
    :func:`specsampling.gpu.process`. Any other logits processor or stopping criterion is refused
    (it cannot be applied exactly to tree rows here) rather than silently dropped. Returns the
    sequences ``[B, L]`` (prompt, then the generated tokens padded with ``pad_token_id``).
    """
    if synced_gpus or streamer is not None:
        raise ValueError("generate: synced_gpus and streamer are not supported")
    config = generation_config if generation_config is not None else model.generation_config
    unsupported = sorted(
        {type(p).__name__ for p in (logits_processor or ())} - _PROCESSORS
        | {type(c).__name__ for c in (stopping_criteria or ())} - _CRITERIA
    )
    if unsupported:
        raise ValueError(
            f"generate: {unsupported} are not supported by speculative decoding here (only "
            "temperature, top_k, top_p, max length and EOS)"
        )
    length = input_ids.shape[1]
    max_new = config.max_new_tokens
    if max_new is None:
        max_new = max(0, int(config.max_length) - length)
    sample = bool(config.do_sample)
    temperature = float(config.temperature if config.temperature is not None else 1.0)
    top_k = config.top_k if sample and config.top_k else None
    top_p = config.top_p if sample and config.top_p is not None and config.top_p < 1 else None
    decoder = SpeculativeDecoder(model, draft_model, scheme, shape)
    out = decoder.generate(
        input_ids,
        max_new_tokens=max_new,
        temperature=temperature if sample else 0.0,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        eos_token_id=config.eos_token_id,
        attention_mask=model_kwargs.get("attention_mask"),
        pad_token_id=config.pad_token_id,
        key=key,
        window=window,
    )
    return out.sequences


def _gather_rows(table: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``table [B, F, V]`` at ``slots [B, N]`` (``PAD`` read as slot 0) -> ``[B, N, V]``."""
    index = slots.clamp_min(0)[..., None].expand(-1, -1, table.shape[-1])
    return table.gather(1, index)


def _device_dtype(model: Any) -> tuple[torch.device, torch.dtype]:
    parameter = next(model.parameters())
    return parameter.device, parameter.dtype


def _vocab_size(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.get_text_config(decoder=True).vocab_size)


def _check_prompt(input_ids, attention_mask, device):
    ids = torch.as_tensor(input_ids)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"input_ids: expected integer token ids, got {ids.dtype}")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
        raise ValueError(
            f"input_ids: expected a non-empty prompt of shape (batch, length), got "
            f"{tuple(ids.shape)}"
        )
    if attention_mask is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
    else:
        mask = torch.as_tensor(attention_mask)
        if mask.ndim == 1:
            mask = mask[None]
        if tuple(mask.shape) != tuple(ids.shape):
            raise ValueError(
                f"attention_mask: expected shape {tuple(ids.shape)}, got {tuple(mask.shape)}"
            )
        mask = mask.bool()
    if not bool(mask[:, -1].all()):
        raise ValueError("attention_mask: prompts must be left-padded (last column all ones)")
    return ids.to(device=device, dtype=torch.long), mask.to(device)


def _eos_set(eos_token_id) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    if isinstance(eos_token_id, int):
        return frozenset({eos_token_id})
    return frozenset(int(t) for t in eos_token_id)


def _elapsed(started: float) -> float:
    return time.perf_counter() - started


__all__ = [
    "DecodeOutput",
    "DecodeStats",
    "LayerSkipDraft",
    "NGramDraft",
    "RoundTrace",
    "SpeculativeDecoder",
    "generate",
    "node_paths",
    "path_nodes",
]
