r"""The small batched pieces every lowered ratio scheme is assembled from.

Mirrors :mod:`specsampling.ops` row by row: every function takes ``[B, V]`` distributions (one
row per batch row) and ``[B]`` tokens / uniforms, and makes the decision the reference makes on
each row. No host synchronisation, no loop over rows or the vocabulary.

* :func:`accepts` -- the division-free accept test :math:`u\,q(x) < p(x)`, strict.
* :func:`residual` -- :math:`\mathrm{norm}((p - q)_+)`, the target where it has zero mass.
* :func:`categorical` -- inverse CDF, clipped to the last token of positive mass.
* :func:`remove_token` -- one token deleted, the rest renormalised (all zeros if none is left).

Dtype rule: distributions are computed in :func:`compute_dtype` (float64 for float64 input, at
least float32 otherwise); uniforms are float64 and every comparison with them is in float64.
"""

from __future__ import annotations

import torch


def compute_dtype(*tables: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32 (bf16/fp16 are upcast before any ratio).

    >>> compute_dtype(torch.zeros(1, dtype=torch.bfloat16)), compute_dtype(torch.zeros(1).double())
    (torch.float32, torch.float64)
    """
    dtype = torch.float32
    for table in tables:
        dtype = torch.promote_types(dtype, table.dtype)
    return dtype


def gather_tokens(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs[b, tokens[b]]`` for ``probs [B, V]``, ``tokens [B]`` (ids in range) -> ``[B]``."""
    return probs.gather(-1, tokens[:, None]).squeeze(-1)  # [B]


def accepts(u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> torch.Tensor:
    """Accept test without a division, ``u * draft_x < target_x``, in float64 (``[B]`` bool).

    Strict: a token with ``target_x == 0`` is never accepted, even when ``u == 0``.

    >>> accepts(torch.tensor([0.0, 0.999, 0.5], dtype=torch.float64),
    ...         torch.tensor([0.0, 0.5, 0.1]), torch.tensor([0.5, 0.5, 0.0])).tolist()
    [False, True, True]
    """
    return u * draft_x.to(torch.float64) < target_x.to(torch.float64)  # [B]


def residual(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    r"""Per row :math:`\mathrm{norm}((p - q)_+)`, or the target row where that has zero mass.

    >>> residual(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64),
    ...          torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)).tolist()
    [[1.0, 0.0], [0.5, 0.5]]
    """
    weights = (target_probs - draft_probs).clamp_min(0)  # [B, V]
    mass = weights.sum(-1, keepdim=True)  # [B, 1]
    has_mass = mass > 0  # [B, 1]
    normalised = weights / torch.where(has_mass, mass, torch.ones_like(mass))  # [B, V]
    return torch.where(has_mass, normalised, target_probs)  # [B, V]


def remove_token(probs: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Rows of ``probs [B, V]`` with ``token [B]`` set to zero and renormalised; a row with
    nothing left stays all zeros.

    >>> remove_token(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64),
    ...              torch.tensor([0])).tolist()
    [[0.0, 0.5, 0.5]]
    """
    out = probs.scatter(-1, token[:, None], 0.0)  # [B, V]
    mass = out.sum(-1, keepdim=True)  # [B, 1]
    has_mass = mass > 0  # [B, 1]
    return torch.where(has_mass, out / torch.where(has_mass, mass, torch.ones_like(mass)), out)


def last_positive(probs: torch.Tensor) -> torch.Tensor:
    """Index of the last token with positive mass per row (``0`` for a row without any)."""
    vocab = torch.arange(probs.shape[-1], device=probs.device, dtype=torch.int32)  # [V]
    return ((probs > 0) * vocab).amax(-1).to(torch.long)  # [B]; int32: ~15x cheaper than int64


def categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    r"""Draw one token per row by inverse CDF from ``u [B]`` in ``[0, 1)``.

    The first token whose cumulative mass exceeds ``u * sum(probs)`` (``searchsorted`` on the
    right, as the reference), clipped to the last token with positive mass: zero-mass tokens are
    never returned, also when rounding pushes ``u * sum`` past the last cumulative value. The
    cumulative sum is in the compute dtype, the comparison in float64.

    >>> probs = torch.tensor([[0.5, 0.0, 0.5], [0.5, 0.0, 0.5]], dtype=torch.float64)
    >>> categorical(probs, torch.tensor([0.5, 0.0], dtype=torch.float64)).tolist()
    [2, 0]
    """
    cdf = torch.cumsum(probs, dim=-1).to(torch.float64)  # [B, V] (no copy for float64)
    threshold = u[:, None] * cdf[:, -1:]  # [B, 1]
    index = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)  # [B]
    return torch.minimum(index, last_positive(probs))  # [B]
