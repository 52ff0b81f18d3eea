"""The state of one :meth:`~specsampling.gpu.hf.SpeculativeDecoder.generate` call.

:class:`DecodeState` holds every per-row value of the batch still decoding: the original row
indices, the committed contexts and generated tokens (host lists), the target's cache
(:class:`~specsampling.gpu.hf.attention.KVState`) and its pending token (the last emitted
token, not cached yet), the processing settings, the generator of the call's uniforms, the
streamer and the phase timers. Everything is set in ``__init__``. It scores a drafted tree in
one target forward (:meth:`DecodeState.score`), commits a verdict (:meth:`DecodeState.commit`),
drops finished rows (:meth:`DecodeState.select_rows`) and builds the output.

Drafters keep their own per-row state (their cache) and the verification strategies theirs (the
keyed rows' keys); :class:`~specsampling.gpu.hf.decoder.SpeculativeDecoder` selects rows in all
three at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from specsampling.validation import check_token

from ..processing import process
from ..schemes.base import Verified
from ..tree import PAD, TreeBatch, path_nodes
from .attention import KVState, ancestors_from_parents, causal_attend

#: The decode phases timed by :meth:`DecodeState.timed` (the keys of ``times``).
PHASES = ("draft", "target", "verify")


class DecodeState:
    """The batch of one ``generate`` call; rows leave it as they finish.

    Parameters
    ----------
    target : causal LM
        The target model.
    prompt, mask : Tensor [B, L]
        Left-padded prompt ids and their attention mask (``mask[:, -1]`` all true).
    settings : tuple
        ``(temperature, top_k, top_p)`` of :func:`specsampling.gpu.process`.
    generator : torch.Generator
        Every uniform of the call (drafting noise first, then the verifier's, each round).
    vocab_size : int
        The target's vocabulary ``V`` (a head padded beyond it is cut to it).
    max_new_tokens : int
        Tokens per row at most.
    eos : frozenset of int
        Tokens that end a row (kept in its output).
    streamer : optional
        ``put(tokens)`` / ``end()`` (batch 1).
    tracing : bool
        Keep the raw draft logits of each round (for :class:`~.decoder.RoundTrace`).
    """

    #: A cache is compacted once its committed slots exceed twice the longest row plus this.
    compact_slack = 16

    def __init__(
        self,
        target: Any,
        prompt: torch.Tensor,
        mask: torch.Tensor,
        settings: tuple[float, int | None, float | None],
        generator: torch.Generator,
        vocab_size: int,
        max_new_tokens: int,
        eos: frozenset[int],
        streamer: Any = None,
        tracing: bool = False,
    ) -> None:
        batch = prompt.shape[0]
        self.device = prompt.device
        self.prompt, self.mask = prompt, mask  # [B, L] as given
        self.settings = settings
        self.generator = generator
        self.vocab_size = vocab_size
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.streamer = streamer
        #: Whether the round keeps the raw logits (``SpeculativeDecoder.traces``).
        self.tracing = tracing
        #: The original index of each active row.
        self.rows = list(range(batch))
        #: Each active row's committed tokens (prompt without padding, then generated).
        self.contexts = [
            [int(t) for t, m in zip(p, v, strict=True) if m]
            for p, v in zip(prompt.tolist(), mask.tolist(), strict=True)
        ]
        self.prompt_lengths = [len(c) for c in self.contexts]  # [B] host, original rows
        self.generated: list[list[int]] = [[] for _ in range(batch)]  # original rows
        self.emitted: list[list[int]] = [[] for _ in range(batch)]  # per round, original rows
        self.num_rounds = 0
        self.times = dict.fromkeys(PHASES, 0.0)
        self.target = KVState(target, batch, "target")
        #: The tokens the target has not cached yet ``[B, P]`` and which lanes hold one: the
        #: whole prompt before the first round (its prefill rides on the first score), then
        #: the last emitted token. The last lane is always real: the root of the next tree.
        self.pending, self.pending_valid = prompt, mask

    @property
    def batch_size(self) -> int:
        """Active rows ``B``."""
        return len(self.rows)

    @property
    def active(self) -> bool:
        return bool(self.rows)

    def room(self) -> int:
        """The most tokens an active row may still emit."""
        return max(self.max_new_tokens - len(self.generated[r]) for r in self.rows)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to ``times[phase]``. On CUDA the block's kernels are
        waited for at its end (one synchronisation per phase), so a phase is charged its own
        work, not the work it queued for the next: the cost-model length policy and the
        benchmarks read these times."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.times[phase] += time.perf_counter() - started

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed distributions of ``logits [..., V]`` (the one processing of both models)."""
        return process(logits, *self.settings)

    # ------------------------------------------------------------------ target
    def next_position(self) -> torch.Tensor:
        """``[B]``: the position after each row's committed and pending tokens."""
        return self.target.lengths() + self.pending_valid.sum(1)

    def score(self, tree: TreeBatch) -> torch.Tensor:
        """One target forward over ``[pending lanes, nodes 1..N-1]`` (the last pending token
        is the root): raw logits ``[B, N, V]``."""
        pending, valid = self.pending, self.pending_valid  # [B, P]
        lanes = pending.shape[1]
        nodes = tree.parents.shape[1]
        tokens = torch.cat([pending.clamp_min(0), tree.tokens[:, 1:].clamp_min(0)], dim=1)
        query_valid = torch.cat([valid, tree.real_nodes()[:, 1:]], dim=1)  # [B, P + N - 1]
        width = lanes + nodes - 1
        attend = torch.zeros(
            (tree.batch_size, width, width), dtype=torch.bool, device=tokens.device
        )  # [B, Q, Q]
        attend[:, lanes - 1 :, lanes - 1 :] = ancestors_from_parents(tree.parents, tree.max_depth)
        attend[:, lanes:, : lanes - 1] = valid[:, None, :-1]  # every node sees the pending
        attend[:, :lanes, :lanes] = causal_attend(valid)
        before = self.target.lengths()[:, None]  # [B, 1]
        positions = torch.cat(
            [
                before + (valid.long().cumsum(1) - 1).clamp_min(0),  # [B, P]
                before + valid.sum(1, keepdim=True) - 1 + tree.depth[:, 1:].clamp_min(0),
            ],
            dim=1,
        )  # [B, Q]
        logits = self.target.forward(tokens, attend, positions, query_valid, keep=nodes)
        return logits[..., : self.vocab_size]

    # ------------------------------------------------------------------ commit
    def commit(self, tree: TreeBatch, verified: Verified) -> list[int]:
        """Record each row's emitted tokens (cut at ``eos`` and at ``max_new_tokens``), keep
        the accepted path in the target's cache, make the last emitted token pending; returns
        the active rows that go on (indices into the batch)."""
        emitted = verified.tokens.tolist()
        counts = verified.num_emitted.tolist()
        keep = []
        for b, (row_tokens, count) in enumerate(zip(emitted, counts, strict=True)):
            original = self.rows[b]
            room = self.max_new_tokens - len(self.generated[original])
            taken = row_tokens[: min(count, room)]
            stop = room <= count
            for i, token in enumerate(taken):
                if token in self.eos:
                    taken, stop = taken[: i + 1], True
                    break
            self.generated[original].extend(taken)
            self.emitted[original].append(len(taken))
            self.contexts[b].extend(taken)
            if self.streamer is not None and taken:
                self.streamer.put(torch.tensor(taken))
            if not stop:
                keep.append(b)
        self.num_rounds += 1
        lanes = self.pending.shape[1]
        slots = torch.arange(lanes, device=self.device).expand_as(self.pending_valid)
        path = path_nodes(tree, verified.node)  # [B, D] node of depth k + 1 on the accepted path
        path = torch.where(path >= 0, path + lanes - 1, PAD)  # node n is slot P - 1 + n
        self.target.commit(torch.cat([torch.where(self.pending_valid, slots, PAD), path], dim=1))
        accepted = verified.num_emitted - 1  # [B]
        self.pending = verified.tokens.gather(1, accepted[:, None])  # [B, 1]
        self.pending_valid = torch.ones_like(self.pending, dtype=torch.bool)
        return keep

    def select_rows(self, keep: Sequence[int], rows: torch.Tensor) -> None:
        """Keep the active rows ``keep`` (``rows``: the same indices as a tensor)."""
        self.rows = [self.rows[b] for b in keep]
        self.contexts = [self.contexts[b] for b in keep]
        if keep:
            self.pending, self.pending_valid = self.pending[rows], self.pending_valid[rows]
            self.target.select_rows(rows)

    # ------------------------------------------------------------------ output
    def sequences(self, pad_token_id: int) -> torch.Tensor:
        """``[B, L + G]``: each prompt as given, then its generated tokens padded right."""
        prompt = self.prompt
        width = max((len(g) for g in self.generated), default=0)
        new = torch.full((prompt.shape[0], width), pad_token_id, dtype=prompt.dtype)
        for row, tokens in enumerate(self.generated):
            if tokens:
                new[row, : len(tokens)] = torch.tensor(tokens, dtype=prompt.dtype)
        return torch.cat([prompt, new.to(prompt.device)], dim=1)


def check_prompt(
    input_ids: Any, attention_mask: Any, device: torch.device, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, L] long, mask [B, L] bool)`` on ``device``, refusing what is not a non-empty
    left-padded batch of integer ids in ``[0, vocab_size)`` (a masked padding slot may hold any
    id below ``vocab_size``: it is never read)."""
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
    outside = ((ids < 0) & mask) | (ids >= vocab_size)  # [B, L]
    if bool(outside.any()):
        row, column = (int(i) for i in outside.nonzero()[0])
        raise ValueError(
            f"input_ids: token id {int(ids[row, column])} at row {row}, position {column} is out "
            f"of the target's vocabulary [0, {vocab_size})"
        )
    return ids.to(device=device, dtype=torch.long), mask.to(device)


def first_eos(eos_token_id: Any) -> int:
    """The first id of ``eos_token_id`` (an id, a sequence or a tensor of ids, already checked by
    :func:`eos_set`), which transformers pads finished rows with when no pad id is set."""
    if isinstance(eos_token_id, torch.Tensor):
        return int(eos_token_id.flatten()[0])
    if isinstance(eos_token_id, Iterable):
        return int(next(iter(eos_token_id)))
    return int(eos_token_id)


def eos_set(eos_token_id: Any, vocab_size: int) -> frozenset[int]:
    """``eos_token_id`` (``None``, an id, a sequence or a tensor of ids, each in
    ``[0, vocab_size)``) as a set."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    if isinstance(eos_token_id, (str, bytes)) or not isinstance(eos_token_id, Iterable):
        eos_token_id = [eos_token_id]
    ids = []
    for token in eos_token_id:
        if isinstance(token, (str, bytes)):
            raise ValueError(
                f"eos_token_id: expected token ids (an int or a sequence of ints), got "
                f"{token!r}; a tokenizer gives the id (tokenizer.convert_tokens_to_ids)"
            )
        ids.append(check_token(token, "eos_token_id", vocab_size))
    return frozenset(ids)


__all__ = [
    "PHASES",
    "DecodeState",
    "check_prompt",
    "eos_set",
    "first_eos",
]
