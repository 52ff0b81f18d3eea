"""Drafting with a model: a causal LM sharing the target's vocabulary, or the target's own first
layers (:class:`LayerSkipDraft`).

:class:`ModelDraft` keeps the draft model's cache of the committed prefix and drafts each
round's tree **level by level**: one draft forward per depth over the nodes of the level above
(the cache holds the committed prefix and the tree's upper levels as tentative slots), each
with an ancestor-only mask (:class:`LevelMasks`) and ``position_ids = length + depth - 1``;
the logits go through the state's processing, and the round's :class:`~.drafters.Draw` picks the
children from them. After the verdict the cache keeps the drafted slots of the accepted path;
the emitted tokens it has not cached (one or two; more after a path through a branch it never
drafted, :func:`graft`) wait as its pending tokens.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from specsampling.errors import InvalidDistribution
from specsampling.shapes import Shape
from specsampling.tree import DrawLaw, grafted_law

from ..chain import chain_batch
from ..drafting import TreeDrafter
from ..schemes.base import Verified
from ..tree import PAD, TreeBatch, node_paths
from .attention import KVState, check_causal_lm, forward_kwarg
from .drafters import Drafter, Draw, NGramDraft, Proposal
from .lengths import check_adaptive, check_confidence

if TYPE_CHECKING:
    from .state import DecodeState


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
        try:
            chosen = tuple(operator.index(i) for i in layers)  # 0.5 refused, not layer 0
        except TypeError:
            raise ValueError(
                f"layers: expected increasing distinct integer indices in [0, {count}), got "
                f"{layers!r}"
            ) from None
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


class LevelMasks:
    """Static masks of a shape's level-by-level draft forwards: the query slots of level
    ``d >= 1`` are the steps of ``levels[d - 1]``; ``attend[d] [F_d, T_d + F_d]`` lets each
    attend to its ancestor steps among the earlier tentative slots and to itself, ``eye[d]``
    to itself alone (what a padded query keeps)."""

    def __init__(self, shape: Shape, device: torch.device) -> None:
        self.shape = shape
        drafter = TreeDrafter(shape, 1, device)
        parents = drafter.parent_steps
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

    def covers(self, shape: Shape) -> bool:
        """Whether these masks serve ``shape`` too: both chains, ``shape`` no longer."""
        return self.shape.is_chain and shape.is_chain and shape.depth <= self.shape.depth

    def level(self, level: int, exists: torch.Tensor) -> torch.Tensor:
        """``attend [B, F, T + F]`` of ``level`` for the frontier slots ``exists [B, F]``."""
        return (self.attend[level][None] & exists[:, :, None]) | self.eye[level][None]


class ModelDraft(Drafter):
    r"""Drafts with ``model`` (a causal LM sharing the tokenizer, or a :class:`LayerSkipDraft`),
    on its own cache, with the shape's law (see the module doc).

    ``confidence`` (chains only; ``None``: off): **early stopping**, transformers'
    ``assistant_confidence_threshold`` rule (its ``ConfidenceCriteria``): a row's chain ends
    after the first drafted token whose probability under the draft's softmax (of its raw
    logits: temperature 1, no top-k/top-p cut, as transformers reads greedy scores; at
    temperature 0 the draft's top probability) is under ``confidence``. The token is kept,
    no draft forward is spent past it, and the round's drafting stops once every row has
    stopped (one host synchronisation per level).

    Why the law is kept: whether a token is drafted at depth :math:`d + 1` is a function of
    the path :math:`x_{\le d}` already drafted (and of the draft's distributions on it), never
    of the target or of the verifier's uniforms, so the chain length is a *stopping time* of
    the drafting process, and each drafted token is still a fresh sample from its known
    :math:`q(\cdot \mid x_{<d})`, given its prefix. For a top-down chain verifier
    (``standard``: accept :math:`x_d` with :math:`\min(1, p/q)`, else the residual) the
    emitted token at depth :math:`d` is then :math:`p`-distributed given the prefix whether or
    not a draft exists there, which is all its proof uses. The exact engine confirms it for
    every chain scheme (``standard``, ``nss``, ``block``, ``traversal``, ``specinfer``,
    ``rsd``, ``spectr``, ``resispec``, ``greedy``, ``spechub``, ``ot_optimal``, ``ot_binned``,
    ``khisti``): with Fractions their stream law under such a rule equals the target's
    exactly, while *dropping* the low-probability token (a decision that depends on the token
    being dropped) is biased (``tests/test_hf_adaptive.py``). Keyed couplings and tree shapes
    are refused (not built: a keyed walk drafts on its fixed plan).
    """

    def __init__(self, model: Any, confidence: float | None = None) -> None:
        if isinstance(model, ModelDraft):
            model = model.model
        if not isinstance(model, LayerSkipDraft):
            check_causal_lm(model, "model")
        self.model = model
        self.confidence = check_confidence(confidence)
        self.kv: KVState | None = None
        self.masks: LevelMasks | None = None
        self.pending = self.pending_valid = torch.empty(0)  # [B, P] uncached emitted tokens
        self.level_paths: list[torch.Tensor] = []  # [B, F, d] per depth d of the last round
        self.level_exists: list[torch.Tensor] = []  # [B, F]
        self._forwards = 0  # of the last call, once its cache is dropped

    def check(self, target: Any, verification: Any) -> None:
        verification.check_law(None, type(self.model).__name__)
        if self.confidence is not None:
            check_adaptive(verification, "confidence")
        device, dtype = _device_dtype(target)
        draft_device, draft_dtype = _device_dtype(self.model)
        if draft_device != device:
            raise ValueError(f"draft: on {draft_device}, but the target is on {device}")
        if draft_dtype != dtype:
            raise ValueError(f"draft: dtype {draft_dtype}, but the target's is {dtype}")
        target_vocab, draft_vocab = vocab_size(target), vocab_size(self.model)
        if draft_vocab < target_vocab:
            raise ValueError(
                f"draft: vocabulary of {draft_vocab} tokens, smaller than the target's "
                f"{target_vocab}: the models must share the tokenizer"
            )

    def start(self, state: DecodeState) -> None:
        self.kv = KVState(self.model, state.batch_size, "draft")
        self.masks = None
        # the whole prompt is pending: its prefill is the first round's first forward
        self.pending, self.pending_valid = state.prompt, state.mask  # [B, L]
        self.level_paths, self.level_exists = [], []

    @property
    def forwards(self) -> int:
        """Draft forwards of the current (or last) ``generate`` call."""
        return self._forwards if self.kv is None else self.kv.forwards

    def propose(self, state: DecodeState, draw: Draw) -> Proposal:
        kv = self.kv
        assert kv is not None, "ModelDraft.start was not called"
        masks = self.masks_for(draw.shape, state.device)
        stopping = self.confidence is not None and draw.shape.is_chain
        pad_mass = torch.zeros((), dtype=torch.bool, device=state.device)
        level_logits, level_probs, self.level_paths, self.level_exists = [], [], [], []
        drawn_tokens: list[torch.Tensor] = []  # [B] per level (chains with early stopping)
        lengths = torch.full((state.batch_size,), len(draw.levels), device=state.device)  # [B]
        stopped = torch.zeros(state.batch_size, dtype=torch.bool, device=state.device)  # [B]
        for level in range(len(draw.levels)):
            paths, exists = draw.frontier(level)  # [B, F, level], [B, F]
            if level == 0:
                logits = kv.forward_causal(self.pending, self.pending_valid, last_only=True)
            else:
                tokens = paths[:, :, -1].clamp_min(0)  # [B, F]
                attend = masks.level(level, exists)  # [B, F, T + F]
                positions = (kv.lengths()[:, None] + level - 1).expand_as(tokens)  # [B, F]
                logits = kv.forward(tokens, attend, positions, exists)
            probs = state.process(logits)  # [B, F, V']
            if probs.shape[-1] > state.vocab_size:  # a padded head: the padding must be empty
                pad_mass = pad_mass | (probs[..., state.vocab_size :] > 0).any()
                probs = probs[..., : state.vocab_size]
            level_logits.append(logits)
            level_probs.append(probs)
            self.level_paths.append(paths)
            self.level_exists.append(exists)
            drawn = draw.next_level(level, probs)  # [B, 1] on a chain
            if stopping:
                assert drawn is not None, "early stopping needs the drawn tokens"
                token = drawn[:, 0]  # [B]
                drawn_tokens.append(token)
                raw = logits[:, 0, : state.vocab_size].float().softmax(-1)  # [B, V]
                confident = raw.gather(1, token.clamp_min(0)[:, None])[:, 0]  # [B]
                low = (confident < self.confidence) & ~stopped  # [B]: stop after this token
                lengths = torch.where(low, level + 1, lengths)
                stopped |= low
                if level + 1 < len(draw.levels) and bool(stopped.all()):  # one sync a level
                    break
        if bool(pad_mass):  # one host synchronisation per round
            raise InvalidDistribution(
                f"draft: its vocabulary is padded beyond the target's {state.vocab_size} "
                "tokens, and the padded ids get positive draft probability (they must get none)"
            )
        if stopping:
            return self.stopped_chain(state, drawn_tokens, lengths, level_probs, level_logits)
        tree, drawn_by = draw.finish()
        slot_of = self.node_slots(tree)  # [B, N]
        expanded = slot_of >= 0  # [B, N]
        values = _gather_rows(torch.cat(level_probs, dim=1), slot_of)[expanded]  # [E, V]
        raw = None
        if state.tracing:
            raw = _gather_rows(torch.cat(level_logits, dim=1), slot_of).detach()
            raw = raw.masked_fill(~expanded[..., None], float("nan"))
        return Proposal(tree, (expanded, values), raw, drawn_by)

    def stopped_chain(
        self,
        state: DecodeState,
        drawn: list[torch.Tensor],  # [B] per drafted level
        lengths: torch.Tensor,  # [B]
        level_probs: list[torch.Tensor],  # [B, 1, V] per level
        level_logits: list[torch.Tensor],  # [B, 1, V'] per level
    ) -> Proposal:
        """The chains drawn, each cut after its first token of draft probability under
        ``confidence``: node ``n < length`` has the draft row of level ``n``."""
        tokens = torch.stack(drawn, dim=1)  # [B, K]
        depth = tokens.shape[1]
        tree = chain_batch(tokens, lengths)
        nodes = torch.arange(depth + 1, device=tokens.device)[None, :]  # [1, K + 1]
        expanded = nodes < lengths[:, None]  # [B, K + 1]
        table = torch.cat(level_probs, dim=1)  # [B, K, V]
        values = table[expanded[:, :depth]]  # [E, V]
        raw = None
        if state.tracing:
            logits = torch.cat(level_logits, dim=1)[..., : table.shape[-1]]  # [B, K, V]
            raw = torch.cat([logits, torch.full_like(logits[:, :1], float("nan"))], dim=1)
            raw = raw.masked_fill(~expanded[..., None], float("nan")).detach()
        return Proposal(tree, (expanded, values), raw)

    def masks_for(self, shape: Shape, device: torch.device) -> LevelMasks:
        """The level masks of ``shape`` (a chain's serve every shorter chain)."""
        masks = self.masks
        if masks is not None and (masks.shape == shape or masks.covers(shape)):
            return masks
        self.masks = LevelMasks(shape, device)
        return self.masks

    def skip(self, state: DecodeState, verified: Verified) -> None:
        """The round was drafted by someone else (:class:`MixedDraft`): every emitted token is
        still to be cached, after the pending ones (right-aligned, holes before)."""
        tokens = verified.tokens  # [B, D + 1]
        lanes = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
        valid = torch.cat([self.pending_valid, lanes < verified.num_emitted[:, None]], dim=1)
        tokens = torch.cat([self.pending, tokens], dim=1)
        self.pending, self.pending_valid = _right_aligned(tokens, valid)

    def node_slots(self, tree: TreeBatch) -> torch.Tensor:
        """The drafted slot (flat over the levels: root, then each level's frontier) whose path
        is each tree node's, ``[B, N]``; ``PAD`` for nodes drafting never expanded."""
        paths = node_paths(tree)  # [B, N, D]
        slot_of = torch.full(tree.parents.shape, PAD, dtype=torch.long, device=tree.device)
        offset = 0
        for depth, (slot_paths, exists) in enumerate(
            zip(self.level_paths, self.level_exists, strict=True)
        ):
            same = (paths[:, :, None, :depth] == slot_paths[:, None, :, :]).all(-1)  # [B, N, F]
            same &= (tree.depth == depth)[:, :, None] & exists[:, None, :]
            slot = same.int().argmax(-1) + offset  # [B, N]
            slot_of = torch.where(same.any(-1), slot, slot_of)
            offset += slot_paths.shape[1]
        return slot_of

    def commit(self, state: DecodeState, proposal: Proposal, verified: Verified) -> None:
        """Keep the drafted slots of the accepted path (depths ``1..D-1`` were forwarded); the
        emitted tokens not cached yet become the pending tokens: one or two, or more where the
        path left the drafted nodes (a branch grafted by :class:`MixedDraft`)."""
        kv = self.kv
        assert kv is not None
        tokens = verified.tokens  # [B, D + 1]
        accepted = verified.num_emitted - 1  # [B] accepted drafted nodes
        slots = []
        cached = torch.zeros_like(accepted)  # [B] emitted tokens the draft has forwarded
        offset = 0
        for depth in range(1, len(self.level_paths)):
            paths, exists = self.level_paths[depth], self.level_exists[depth]  # [B, F, depth]
            same = (paths == tokens[:, None, :depth]).all(-1) & exists  # [B, F]
            use = same.any(-1) & (accepted >= depth)  # [B]: once False, False at every depth
            slots.append(torch.where(use, same.int().argmax(-1) + offset, PAD))
            cached += use
            offset += paths.shape[1]
        empty = torch.empty((tokens.shape[0], 0), dtype=torch.long, device=tokens.device)
        kv.commit(torch.stack(slots, dim=1) if slots else empty)  # [B, D - 1]
        lanes = torch.arange(tokens.shape[1], device=tokens.device)[None, :]  # [1, D + 1]
        valid = (lanes >= cached[:, None]) & (lanes < verified.num_emitted[:, None])  # [B, D + 1]
        self.pending, self.pending_valid = _right_aligned(tokens, valid)
        kv.compact_if_sparse(state.compact_slack)

    def select_rows(self, rows: torch.Tensor) -> None:
        assert self.kv is not None
        self.kv.select_rows(rows)
        self.pending, self.pending_valid = self.pending[rows], self.pending_valid[rows]

    def stop(self) -> None:
        """Drop the draft cache and the last round's paths (a decoder outlives its calls)."""
        forwards = self.forwards
        self.kv, self.level_paths, self.level_exists = None, [], []
        self.pending = self.pending_valid = torch.empty(0)
        self._forwards = forwards

    def __repr__(self) -> str:
        extra = "" if self.confidence is None else f", confidence={self.confidence}"
        return f"ModelDraft({type(self.model).__name__}{extra})"


class MixedDraft(Drafter):
    """Prompt lookup combined with a model draft: by rounds, or in one tree (``graft=True``).

    Each round, **before anything is drawn**, :class:`~.drafters.NGramDraft` looks every
    active row's context up (up to the round's depth). The choice of what to propose is a
    function of the committed contexts alone, so each round's draw law is known when it is
    verified.

    * ``graft=False`` (default), **by rounds**: when the lookup finds a continuation for every
      row, the round proposes those point-mass chains (no draft forward; the model's cache
      catches up on the emitted tokens in its next forward); otherwise ``model`` drafts the
      round with the shape's law. Exact for the schemes exact for both laws
      (:class:`~.drafters.NGramDraft`'s condition: ``nss`` and the schemes exact on sampled
      chains with the point-mass rule, e.g. ``standard``, ``block``, ``traversal``; and every
      keyed coupling); the rest are refused before the first forward. Chains only.
    * ``graft=True``, **in one tree**: ``model`` drafts every round (the shape's law, any
      shape), and each row's lookup continuation is grafted into the row's tree as one more
      branch: it follows the drafted children while they carry its tokens and hangs the rest
      below as a chain (:func:`graft`), so the tree gains at most the round's depth in nodes
      and the target scores both drafters' guesses in its one forward. Such a tree mixes draw
      laws (sampled branches beside a deterministic one; the drafted part's law depends on the
      context alone), and is drawn apart from the verifier's noise: ``nss`` is exact for it,
      as for every such tree. Beside i.i.d. shapes and chains (law ``grafted``, each new node
      a guess of :attr:`~specsampling.DraftTree.guesses`) ``specinfer`` is exact too: it tests
      a node's guess as a point mass after the drawn candidates, and accepts as ``standard``
      on the model's chain plus the guess where that fails. The other tree verifiers need
      their candidates drawn by one sampled law (i.i.d. or without replacement from ``q``, or
      their own drafting law), which a lookup branch is not (the exact engine finds each
      biased on such trees), and keyed couplings draft by their race on a fixed plan: all are
      refused before the first forward. At temperature 0 every scheme verifies the same way
      (accept while the token is the target's argmax).

    ``model``: a causal LM, :class:`LayerSkipDraft` or :class:`ModelDraft` (e.g. with
    ``confidence``); ``ngram``: the lookup (default ``NGramDraft(n=3, min_n=2)``).
    """

    def __init__(self, model: Any, ngram: NGramDraft | None = None, graft: bool = False) -> None:
        if not isinstance(model, ModelDraft):
            from .drafters import as_drafter

            model = as_drafter(model)
        if not isinstance(model, ModelDraft):
            raise ValueError(f"model: expected a draft model, got {type(model).__name__}")
        if ngram is not None and not isinstance(ngram, NGramDraft):
            raise ValueError(f"ngram: expected an NGramDraft, got {type(ngram).__name__}")
        if not isinstance(graft, bool):
            raise ValueError(f"graft: expected True or False, got {graft!r}")
        self.model = model
        self.ngram = NGramDraft(n=3, min_n=2) if ngram is None else ngram
        self.graft = graft
        self.looked_up = False  # whether the current round is the lookup's
        #: Rounds of the current (or last) call drafted by the lookup (``graft=True``: rounds
        #: with a lookup branch grafted into some row's tree).
        self.lookup_rounds = 0

    def check(self, target: Any, verification: Any) -> None:
        self.model.check(target, verification)
        if self.graft:
            shape = verification.shape
            law = grafted_law(shape.law, shape.is_chain)
            verification.check_law(law, "MixedDraft(graft=True)")
        else:
            verification.check_law(DrawLaw.DETERMINISTIC, "MixedDraft (its prompt-lookup rounds)")

    def start(self, state: DecodeState) -> None:
        self.model.start(state)
        self.lookup_rounds = 0

    @property
    def forwards(self) -> int:
        return self.model.forwards

    def propose(self, state: DecodeState, draw: Draw) -> Proposal:
        length = len(draw.levels)
        found = [self.ngram.lookup(context, length) for context in state.contexts]
        if self.graft:
            self.looked_up = False
            proposal = self.model.propose(state, draw)
            if not any(found):
                return proposal
            self.lookup_rounds += 1
            return graft(proposal, found)
        self.looked_up = all(found)
        if self.looked_up:
            self.lookup_rounds += 1
            return self.ngram.chains(state, draw, found)
        return self.model.propose(state, draw)

    def commit(self, state: DecodeState, proposal: Proposal, verified: Verified) -> None:
        if self.looked_up:
            self.model.skip(state, verified)
        else:
            self.model.commit(state, proposal, verified)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.model.select_rows(rows)

    def stop(self) -> None:
        self.model.stop()

    def __repr__(self) -> str:
        extra = ", graft=True" if self.graft else ""
        return f"MixedDraft({self.model!r}, {self.ngram!r}{extra})"


def graft(proposal: Proposal, chains: Sequence[Sequence[int]]) -> Proposal:
    """``proposal`` with ``chains[b]`` (token ids; empty: nothing) grafted into row ``b``'s
    tree by :meth:`specsampling.DraftTree.graft`: from the root, follow the child carrying the
    chain's next token while there is one, then hang the chain's remaining tokens below as new
    nodes (numbered after the existing ones, so node indices, draft rows and the draw's
    bookkeeping stay valid). A row that gains nodes has law ``DrawLaw.GRAFTED`` (the new
    nodes its guesses) where its tree was drawn i.i.d. or is a sampled chain, else
    ``DrawLaw.UNKNOWN``; the others keep theirs. Built on the host (the lookup is host work
    anyway): one read of the tree.

    >>> import specsampling as ss
    >>> from specsampling.gpu import TreeBatch
    >>> trees = [ss.DraftTree.from_draws([(0, 5), (1, 6)], law="iid")] * 2
    >>> grown = graft(Proposal(TreeBatch.from_trees(trees)), [[5, 7, 8], []]).tree
    >>> grown.tokens.tolist(), grown.parents[0].tolist(), [str(law) for law in grown.laws]
    ([[-1, 5, 6, 7, 8], [-1, 5, 6, -1, -1]], [-1, 0, 1, 1, 3], ['grafted', 'iid'])
    >>> grown.guesses.tolist()
    [[-1, 3, -1, 4, -1], [-1, -1, -1, -1, -1]]
    """
    tree = proposal.tree
    if len(chains) != tree.batch_size:
        raise ValueError(f"chains: expected one per row ({tree.batch_size}), got {len(chains)}")
    rows = [
        reference.graft(chain) for reference, chain in zip(tree.to_trees(), chains, strict=True)
    ]
    grafted = TreeBatch.from_trees(rows, tree.device)
    # new node columns; negative where the drafter padded past every row's nodes (a trie merged
    # repeated draws): padding F.pad then crops, never an expanded node
    size = grafted.parents.shape[1] - tree.parents.shape[1]
    draft_rows, raw = proposal.draft_rows, proposal.draft_logits
    if draft_rows is not None and size:
        expanded, values = draft_rows
        draft_rows = (torch.nn.functional.pad(expanded, (0, size), value=False), values)
    if raw is not None and size:
        raw = torch.nn.functional.pad(raw, (0, 0, 0, size), value=float("nan"))
    return Proposal(grafted, draft_rows, raw, proposal.drawn)


def _right_aligned(tokens: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``valid`` lanes of ``tokens [B, W]`` moved right (in order, holes before) and the
    lanes that are holes in every row dropped (one host synchronisation)."""
    order = valid.int().argsort(dim=1, stable=True)  # the valid lanes last, in order
    tokens, valid = tokens.clamp_min(0).gather(1, order), valid.gather(1, order)
    width = int(valid.sum(1).max())
    return tokens[:, tokens.shape[1] - width :], valid[:, valid.shape[1] - width :]


def _gather_rows(table: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``table [B, F, V]`` at ``slots [B, N]`` (``PAD`` read as slot 0) -> ``[B, N, V]``."""
    index = slots.clamp_min(0)[..., None].expand(-1, -1, table.shape[-1])
    return table.gather(1, index)


def _device_dtype(model: Any) -> tuple[torch.device, torch.dtype]:
    parameter = next(model.parameters())
    return parameter.device, parameter.dtype


def vocab_size(model: Any) -> int:
    """The size of ``model``'s output head (its config's vocabulary without one)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.get_text_config(decoder=True).vocab_size)


__all__ = ["LayerSkipDraft", "LevelMasks", "MixedDraft", "ModelDraft", "graft", "vocab_size"]
