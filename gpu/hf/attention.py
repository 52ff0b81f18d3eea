r"""Tree attention and cache surgery for Hugging Face causal LMs (``DynamicCache`` only).

A :class:`KVState` holds one model's ``DynamicCache`` for a batch of ``B`` rows together with
``valid [B, L]``: which of the ``L`` cache slots hold a committed token of the row. Slots that
are not valid are *holes* (left padding, rejected branches of a ragged batch): they stay in the
cache but no query ever attends to them. A row's next position is its number of valid slots, so
``position_ids`` always come from the mask's cumulative sum, whatever the holes.

Every forward appends ``Q`` *tentative* slots after the committed ones, with an additive 4D mask
``[B, 1, Q, L + T + Q]`` in the model dtype (``0`` where a query attends, ``finfo.min``
elsewhere): the valid committed slots, then whichever tentative slots the caller allows (its
ancestors in a draft tree), itself always (a padded query attends to itself only, never to
nothing). :meth:`KVState.commit` keeps, per row, a chosen list of tentative slots (the accepted
path) by one gather on the sequence axis of every layer, turns the rest into nothing, and crops
the columns that are holes in every row (the common tail).

.. math::

    \mathrm{mask}[b, 0, i, j] = \begin{cases} 0 & j < L,\ \mathrm{valid}[b, j],\
    \mathrm{query\_valid}[b, i] \\ 0 & j = L + t,\ \mathrm{attend}[b, i, t] \\
    \min & \text{otherwise} \end{cases}

Exactness. The surgery (:meth:`~KVState.commit`, :meth:`~KVState.select_rows`,
:meth:`~KVState.compact`) only copies cache entries, by index, gather and slice: every valid slot
holds, bit for bit, the key and value its forward computed, and a hole gets weight exactly 0.
A cached tree forward therefore differs from a plain forward of the same prefix only by the
model's own rounding (other reduction orders and matmul shapes), ~1e-13 on float64 logits. But
Hugging Face's Llama / Qwen2 ``RMSNorm`` casts its input to float32 even in a float64 model (and
eager attention takes its softmax in float32): when such a 1e-14 difference straddles a float32
rounding boundary, one element moves by a float32 ulp (6e-8 relative) and the layers after it
grow that to ~1e-6 in the logits. That is rounding, rare and at random nodes, not a wrong value;
float64 parity to 1e-10 needs the norms computed in float64 (``tests/test_hf_parity_ragged.py``).

Refused: flash / flex attention (a tree mask is not expressible there) and every cache layer
that is not a plain ``DynamicLayer`` (sliding-window, static, quantized): their slots cannot be
gathered freely.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from ..tree import PAD

#: Attention implementations that take an arbitrary additive 4D mask.
TREE_ATTENTION = ("eager", "sdpa")


def forward_kwarg(model: Any) -> str:
    """The name the model's forward takes its cache by: ``cache`` (transformers 5.24+) or
    ``past_key_values`` (up to 5.23); a :class:`TypeError` when it takes neither."""
    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    raise TypeError(
        f"model: {type(model).__name__}.forward takes neither `cache` nor `past_key_values`; "
        "expected a Hugging Face causal LM"
    )


def attention_implementation(model: Any) -> str:
    """The model's attention implementation name (``config._attn_implementation``)."""
    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    return str(getattr(config, "_attn_implementation", None) or "eager")


def check_causal_lm(model: Any, name: str) -> None:
    """Raise naming ``name`` unless ``model`` is an HF causal LM this module can drive: tree
    attention (eager / sdpa) and full-attention layers only (no sliding window)."""
    if not hasattr(model, "config") or not callable(model):
        raise TypeError(f"{name}: expected a Hugging Face causal LM, got {type(model).__name__}")
    forward_kwarg(model)
    implementation = attention_implementation(model)
    if implementation not in TREE_ATTENTION:
        raise ValueError(
            f"{name}: attention implementation {implementation!r} cannot express tree masks; load "
            f"the model with attn_implementation in {TREE_ATTENTION}"
        )
    config = model.config.get_text_config(decoder=True)
    layer_types = getattr(config, "layer_types", None) or ()
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise ValueError(
            f"{name}: layer types {other} are not supported (only full attention: the cache "
            "surgery of tree decoding needs plain DynamicLayer caches)"
        )


def ancestors_from_parents(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``attend [B, N, N]`` bool: node ``n`` attends to ``m`` iff ``m`` is ``n`` or one of its
    ancestors (``parents [B, N]``, ``-1`` for the root and padding: padding attends to itself).

    >>> ancestors_from_parents(torch.tensor([[-1, 0, 1, 0]]), 2)[0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    """
    batch, num_nodes = parents.shape
    attend = torch.eye(num_nodes, dtype=torch.bool, device=parents.device).repeat(batch, 1, 1)
    nodes = torch.arange(num_nodes, device=parents.device).expand(batch, num_nodes)  # [B, N]
    current = parents  # [B, N] the ancestor d levels up, -1 once past the root
    for _ in range(max_depth):
        real = current >= 0  # [B, N]
        attend.scatter_(2, torch.where(real, current, nodes)[..., None], True)
        current = torch.where(real, parents.gather(1, current.clamp_min(0)), -1)
    return attend


def causal_attend(query_valid: torch.Tensor) -> torch.Tensor:
    """``attend [B, Q, Q]``: causal among the valid queries of ``query_valid [B, Q]``; a padded
    query attends to itself only."""
    q = query_valid.shape[1]
    lower = torch.ones((q, q), dtype=torch.bool, device=query_valid.device).tril()
    eye = torch.eye(q, dtype=torch.bool, device=query_valid.device)
    both = query_valid[:, :, None] & query_valid[:, None, :]  # [B, Q, Q]
    return (lower[None] & both) | eye[None]


class KVState:
    """One model's ``DynamicCache`` for ``batch_size`` rows, with hole-aware slot validity.

    Parameters
    ----------
    model : causal LM
        Called as ``model(input_ids=..., attention_mask=<4D>, position_ids=..., <cache>=...,
        use_cache=True)``.
    batch_size : int
        Rows ``B``.
    name : str
        The argument the model came from (named in errors).
    """

    def __init__(self, model: Any, batch_size: int, name: str) -> None:
        self.model = model
        self.name = name
        self.kwarg = forward_kwarg(model)
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.cache = DynamicCache()
        self.valid = torch.zeros((batch_size, 0), dtype=torch.bool, device=self.device)  # [B, L]
        self.tentative = 0  # slots appended after the committed L since the last commit
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.forwards = 0

    @property
    def committed(self) -> int:
        """``L``: committed slots (holes included)."""
        return int(self.valid.shape[1])

    def lengths(self) -> torch.Tensor:
        """Committed tokens per row ``[B]`` (the next position)."""
        return self.valid.sum(1)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, Q]
        attend: torch.Tensor,  # [B, Q, T + Q] bool over the tentative slots and the new ones
        positions: torch.Tensor,  # [B, Q]
        query_valid: torch.Tensor,  # [B, Q] bool
        keep: int = 0,
    ) -> torch.Tensor:
        """Run the model on ``Q`` new tentative slots; the logits ``[B, Q, V]`` (``[B, keep,
        V]`` of the last ``keep`` queries when ``keep`` is positive)."""
        q = tokens.shape[1]
        past = self.valid[:, None, :] & query_valid[:, :, None]  # [B, Q, L]
        allowed = torch.cat([past, attend], dim=2)  # [B, Q, L + T + Q]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        kwargs: dict[str, Any] = {self.kwarg: self.cache}
        if 0 < keep < q and self.keeps_logits:
            kwargs["logits_to_keep"] = keep
        out = self.model(
            input_ids=tokens,
            attention_mask=mask[:, None],
            position_ids=positions,
            use_cache=True,
            **kwargs,
        )
        self.forwards += 1
        self.tentative += q
        self.check_layers()
        logits = out.logits
        return logits[:, -keep:] if keep else logits

    def forward_causal(
        self, tokens: torch.Tensor, valid: torch.Tensor, last_only: bool = False
    ) -> torch.Tensor | None:
        """Forward ``tokens [B, Q]`` causally among the ``valid [B, Q]`` ones and commit them
        all (the invalid ones as holes); the logits (``None`` when ``Q = 0``)."""
        if tokens.shape[1] == 0:
            return None
        positions = self.lengths()[:, None] + (valid.long().cumsum(1) - 1).clamp_min(0)
        logits = self.forward(
            tokens.clamp_min(0), causal_attend(valid), positions, valid, int(last_only)
        )
        slots = torch.arange(tokens.shape[1], device=tokens.device).expand_as(valid)  # [B, Q]
        self.commit(torch.where(valid, slots, PAD))
        return logits

    def check_layers(self) -> None:
        """Refuse (naming the model) any cache layer that is not a plain ``DynamicLayer``."""
        for index, layer in enumerate(self.cache.layers):
            if type(layer) is not DynamicLayer:
                raise ValueError(
                    f"{self.name}: cache layer {index} is a {type(layer).__name__}; tree decoding "
                    "needs plain DynamicLayer caches (no sliding-window, static or quantized)"
                )

    def commit(self, slots: torch.Tensor) -> None:
        """Keep, per row, the tentative slots ``slots [B, K]`` (indices in ``[0, T)``, in order;
        ``-1``: a hole) after the committed ones, drop every other tentative slot, and crop the
        columns that are holes in every row at the tail."""
        length = self.committed
        keep = slots >= 0  # [B, K]
        valid = torch.cat([self.valid, keep], dim=1)  # [B, L + K]
        used = valid.any(0).nonzero()  # the columns some row still needs
        tail = int(used.max()) + 1 if used.numel() else 0  # one host synchronisation
        self.valid = valid[:, :tail]
        for layer in self.layers():
            layer.keys = _keep_slots(layer.keys, length, slots.clamp_min(0), tail)
            layer.values = _keep_slots(layer.values, length, slots.clamp_min(0), tail)
        self.tentative = 0

    def layers(self) -> list[DynamicLayer]:
        """The initialised cache layers (a layer-skipping draft leaves some empty)."""
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows [B']`` (finished rows leave the batch)."""
        self.valid = self.valid[rows]
        for layer in self.layers():
            layer.keys = layer.keys[rows]
            layer.values = layer.values[rows]

    def compact_if_sparse(self, slack: int) -> None:
        """:meth:`compact` once the committed slots exceed twice the longest row plus ``slack``."""
        if self.committed > 2 * int(self.lengths().max()) + slack:
            self.compact()

    def compact(self) -> None:
        """Move every row's valid slots to the front (stable), dropping the columns no row
        needs any more: the same attention, fewer holes (positions live in the keys)."""
        counts = self.valid.sum(1)  # [B]
        width = int(counts.max()) if counts.numel() else 0
        if width == self.committed:
            return
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :width]
        for layer in self.layers():
            layer.keys = _gather_slots(layer.keys, order)
            layer.values = _gather_slots(layer.values, order)
        self.valid = torch.arange(width, device=self.device)[None, :] < counts[:, None]


def _gather_slots(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``states [B, H, S, D]`` at the per-row slots ``index [B, K]`` -> ``[B, H, K, D]``."""
    batch, heads, _, dim = states.shape
    return states.gather(2, index[:, None, :, None].expand(batch, heads, index.shape[1], dim))


def _keep_slots(states: torch.Tensor, length: int, slots: torch.Tensor, tail: int) -> torch.Tensor:
    """The committed ``length`` slots of ``states [B, H, L + T, D]``, then the tentative
    ``slots [B, K]``, cut to ``tail`` columns."""
    kept = _gather_slots(states[:, :, length:], slots)  # [B, H, K, D]
    return torch.cat([states[:, :, :length], kept], dim=2)[:, :, :tail]


__all__ = [
    "TREE_ATTENTION",
    "KVState",
    "ancestors_from_parents",
    "attention_implementation",
    "causal_attend",
    "check_causal_lm",
    "forward_kwarg",
]
