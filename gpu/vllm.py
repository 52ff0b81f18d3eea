r"""vLLM V1's ``rejection_sample``, on our standard chain rule (:mod:`specsampling.gpu.chain`).

vLLM flattens the drafts of ``B`` requests into ``T = sum(num_draft_tokens)`` rows: request
:math:`b` owns rows :math:`[c_{b-1}, c_b)` of ``draft_token_ids [T]``, ``draft_probs [T, V]``
and ``target_probs [T, V]`` (``cu_num_draft_tokens = c``), and its bonus token is drawn by the
caller (``bonus_token_ids [B, 1]``). Per request the rule is the standard one
(:mod:`specsampling.schemes.standard`): accept draft :math:`i` iff :math:`u_i\,q_i(x_i) <
p_i(x_i)` (:math:`q_i = \mathbf 1_{x_i}` when ``draft_probs`` is ``None``, n-gram drafts), emit a
residual draw :math:`y \sim \mathrm{norm}((p_k - q_k)_+)` at the first rejection :math:`k`, the
bonus when every draft is accepted. The output is int32 ``[B, max_spec_len + 1]`` padded with
``-1`` (vLLM's ``PLACEHOLDER_TOKEN_ID``).

Differences from vLLM (``vllm/v1/sample/rejection_sampler.py``: ``rejection_sample(draft_token_ids,
num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
sampling_metadata)``; vLLM 0.33 passes target *logits* and its sampling metadata instead):

* ``target_probs`` are processed probabilities (:func:`specsampling.gpu.process`), not logits;
* the eighth argument, ``sampling_metadata``, is replaced by keywords: ``all_greedy`` (the
  target's argmax, lowest id on ties, as a one-hot target through the same rule; greedy rows in a
  mixed batch are one-hot already after ``process(temperature=0)``) and ``generators`` (request
  index -> :class:`torch.Generator`, like ``sampling_metadata.generators``);
* the residual draw is an inverse-CDF draw with a float64 uniform (vLLM: an exponential race with
  float32 exponentials), so a seeded request draws ``2 n_b`` float64 uniforms from its own
  generator and nothing when ``n_b = 0``: its output depends on its own inputs and generator
  only, never on its batch position or its neighbours;
* a draft id outside ``[0, V)`` raises :class:`ValueError` (``InvalidDistribution``), and so
  (with ``validate=True``) does a drafted token of zero draft probability, which vLLM rejects
  (its accept test asks ``draft_prob > 0``); unchecked, such a draft is accepted where the
  target gives it mass (``u * 0 < p``): it cannot have been sampled from that row.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from specsampling.errors import InvalidDistribution

from . import ops
from .api import TOLERANCE, raise_row_defect
from .chain import STANDARD_CHAIN, ChainTables
from .noise import Noise, check_generator
from .tree import PAD


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *,
    all_greedy: bool = False,
    generators: Mapping[int, torch.Generator] | None = None,
    generator: torch.Generator | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Verify ``B`` requests' flattened drafts (vLLM V1 layout).

    Parameters
    ----------
    draft_token_ids : IntTensor [T]
        Every request's drafts, concatenated.
    num_draft_tokens : sequence of int, length B
        Drafts per request (``0`` allowed: the request emits its bonus token).
    max_spec_len : int
        At least ``max(num_draft_tokens)``; the output has ``max_spec_len + 1`` columns.
    cu_num_draft_tokens : IntTensor [B]
        Cumulative ``num_draft_tokens``.
    draft_probs : Tensor [T, V] or None
        The draft distributions; ``None`` for point-mass (n-gram) drafts.
    target_probs : Tensor [T, V]
        The target after each request's first ``i`` drafts.
    bonus_token_ids : IntTensor [B, 1]
        Each request's bonus token, drawn by the caller from the target after all its drafts.
    all_greedy : bool
        Every request is greedy: verify against the one-hot of ``target_probs.argmax(-1)``.
    generators : mapping int -> torch.Generator, optional
        Per-request generators (on the tables' device); the other requests draw from
        ``generator`` (``None``: torch's default generator).
    validate : bool
        Check the inputs (host synchronisations). A checked call also resolves the zero-mass
        residual hit (a rejection where rounding leaves ``p <= q`` on every token: the draw is
        repeated, as the reference does); ``validate=False`` runs one sync-free round and
        leaves that rare row as drawn (the emitted law is the same, its tokens may differ).

    Returns
    -------
    IntTensor [B, max_spec_len + 1]
        The accepted drafts, then the residual or bonus token, then ``-1``.

    Examples
    --------
    >>> target = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    >>> rejection_sample(torch.tensor([1, 0, 0]), [2, 1], 2, torch.tensor([2, 3]), None,
    ...                  target, torch.tensor([[2], [1]])).tolist()
    [[1, 2, -1], [0, 1, -1]]
    """
    counts = [_whole(n, "num_draft_tokens") for n in num_draft_tokens]
    batch_size, width = len(counts), _whole(max_spec_len, "max_spec_len")
    if width < 0:
        raise InvalidDistribution(f"max_spec_len: expected an integer >= 0, got {width}")
    device = target_probs.device if isinstance(target_probs, torch.Tensor) else None
    if validate:
        _check(
            draft_token_ids,
            counts,
            width,
            cu_num_draft_tokens,
            draft_probs,
            target_probs,
            bonus_token_ids,
            generators,
            all_greedy,
        )
    bonus = bonus_token_ids.reshape(batch_size).to(device=device, dtype=torch.long)  # [B]
    num_tokens = int(draft_token_ids.shape[0])
    if num_tokens == 0 or width == 0:
        out = torch.full((batch_size, width + 1), PAD, dtype=torch.int32, device=device)
        out[:, 0] = bonus.to(torch.int32)
        return out
    num_drafts = torch.tensor(counts, dtype=torch.long, device=device)  # [B]
    starts = cu_num_draft_tokens.to(device=device, dtype=torch.long) - num_drafts  # [B]
    lanes = torch.arange(width + 1, device=device)  # [γ + 1]
    index = (starts[:, None] + lanes[None, :]).clamp(0, num_tokens - 1)  # [B, γ + 1]
    real = lanes[None, :width] < num_drafts[:, None]  # [B, γ]
    draft_tokens = torch.where(real, draft_token_ids.to(device).long()[index[:, :width]], 0)
    target = target_probs
    if all_greedy:
        best = ops.argmax_blocks(target_probs)[:, None]  # [T, 1]
        target = torch.zeros_like(target_probs).scatter_(1, best, 1.0)  # [T, V]
        draft_probs = None
    dtype = torch.promote_types(torch.float32, target.dtype)
    if draft_probs is not None:
        dtype = torch.promote_types(dtype, draft_probs.dtype)
    tables = ChainTables(
        target_flat=target,
        target_index=index,
        draft_flat=draft_probs,
        draft_index=None if draft_probs is None else index[:, :width],
        draft_tokens=draft_tokens,
        num_drafts=num_drafts,
        bonus_tokens=bonus,
        dtype=dtype,
    )
    if all_greedy:  # one-hot targets: the verdict does not depend on the uniforms
        zeros = torch.zeros((batch_size, width + 1), dtype=torch.float64, device=device)
        noise = Noise(zeros, zeros)
    else:
        noise = request_noise(counts, width, generators or {}, generator, device)
    verified, _ = STANDARD_CHAIN.run(tables, noise, None if validate else 1)
    return verified.tokens.to(torch.int32)


def request_noise(
    counts: Sequence[int],
    width: int,
    generators: Mapping[int, torch.Generator],
    generator: torch.Generator | None,
    device: Any,
) -> Noise:
    """Float64 uniforms ``[B, max_spec_len + 1]`` per request: a seeded request with ``n``
    drafts draws ``2 n`` from its generator (``n`` accept lanes ``1..n``, then ``n`` sample
    lanes ``0..n-1``) and nothing when ``n = 0``; the others share one draw from
    ``generator``. One loop over the *seeded* requests (each owns a generator object)."""
    batch_size = len(counts)
    shape = (batch_size, width + 1)
    generator = check_generator(generator)
    generators = {row: check_generator(g, f"generators[{row}]") for row, g in generators.items()}
    where = device if generator is None else generator.device
    accept = torch.rand(shape, dtype=torch.float64, generator=generator, device=where).to(device)
    sample = torch.rand(shape, dtype=torch.float64, generator=generator, device=where).to(device)
    for row, own in generators.items():
        count = counts[row]
        if count == 0:
            continue
        draws = torch.rand(2 * count, dtype=torch.float64, generator=own, device=own.device)
        accept[row, 1 : count + 1] = draws[:count].to(device)
        sample[row, :count] = draws[count:].to(device)
    return Noise(accept, sample)


def _whole(value: Any, name: str) -> int:
    """``value`` as an int (a Python or numpy integer, or an integer 0-d tensor), else a
    ``TypeError`` naming ``name``: a float count is refused, never truncated."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected integers, got {value!r}") from None


def _check(
    draft_token_ids: Any,
    counts: list[int],
    width: int,
    cu_num_draft_tokens: Any,
    draft_probs: Any,
    target_probs: Any,
    bonus_token_ids: Any,
    generators: Mapping[int, torch.Generator] | None,
    all_greedy: bool = False,
) -> None:
    """The layout checks; every failure is a :class:`ValueError` naming the argument."""
    batch_size = len(counts)
    if not isinstance(target_probs, torch.Tensor) or target_probs.ndim != 2:
        raise InvalidDistribution("target_probs: expected a tensor of shape (num_tokens, V)")
    num_tokens, vocab_size = (int(n) for n in target_probs.shape)
    if any(n < 0 for n in counts) or sum(counts) != num_tokens:
        raise InvalidDistribution(
            f"num_draft_tokens: expected non-negative counts summing to num_tokens "
            f"{num_tokens}, got {counts}"
        )
    if counts and max(counts) > width:
        raise InvalidDistribution(f"max_spec_len: {width} < the longest draft {max(counts)}")
    if not isinstance(draft_token_ids, torch.Tensor):
        raise InvalidDistribution(
            f"draft_token_ids: expected a torch.Tensor of shape ({num_tokens},) (as vLLM passes "
            f"it), got {type(draft_token_ids).__name__}"
        )
    if tuple(draft_token_ids.shape) != (num_tokens,):
        raise InvalidDistribution(
            f"draft_token_ids: expected shape ({num_tokens},), got {tuple(draft_token_ids.shape)}"
        )
    cumulative = torch.tensor(counts, dtype=torch.long).cumsum(0)
    if not isinstance(cu_num_draft_tokens, torch.Tensor):
        raise InvalidDistribution(
            f"cu_num_draft_tokens: expected a torch.Tensor of shape ({batch_size},) (as vLLM "
            f"passes it), got {type(cu_num_draft_tokens).__name__}"
        )
    if tuple(cu_num_draft_tokens.shape) != (batch_size,) or not torch.equal(
        cu_num_draft_tokens.cpu().long(), cumulative
    ):
        raise InvalidDistribution("cu_num_draft_tokens: expected the cumulative num_draft_tokens")
    if not isinstance(bonus_token_ids, torch.Tensor):
        raise InvalidDistribution(
            f"bonus_token_ids: expected a torch.Tensor of shape ({batch_size}, 1) (as vLLM "
            f"passes it), got {type(bonus_token_ids).__name__}"
        )
    if tuple(bonus_token_ids.shape) not in ((batch_size, 1), (batch_size,)):
        raise InvalidDistribution(
            f"bonus_token_ids: expected shape ({batch_size}, 1), got {tuple(bonus_token_ids.shape)}"
        )
    for name, ids in (
        ("draft_token_ids", draft_token_ids),
        ("cu_num_draft_tokens", cu_num_draft_tokens),
        ("bonus_token_ids", bonus_token_ids),
    ):
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise InvalidDistribution(
                f"{name}: expected an integer tensor, got dtype {ids.dtype} (ids and counts are "
                "never truncated)"
            )
    for name, ids in (("draft_token_ids", draft_token_ids), ("bonus_token_ids", bonus_token_ids)):
        bad = (ids < 0) | (ids >= vocab_size)
        if bool(bad.any()):
            index = int(bad.reshape(-1).nonzero()[0, 0])
            raise InvalidDistribution(
                f"{name}[{index}]: token id {int(ids.reshape(-1)[index])} outside [0, {vocab_size})"
            )
    for row in generators or {}:
        if not 0 <= row < batch_size:
            raise InvalidDistribution(f"generators: request index {row} outside [0, {batch_size})")
    if all_greedy:  # any real scores (logits or probabilities): only the argmax is read
        if not bool(torch.isfinite(target_probs).all()):
            raise InvalidDistribution("target_probs: NaN or inf in a greedy batch")
        return
    check_rows("target_probs", target_probs)
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (
            num_tokens,
            vocab_size,
        ):
            raise InvalidDistribution(f"draft_probs: expected shape ({num_tokens}, {vocab_size})")
        check_rows("draft_probs", draft_probs)
        drafted = draft_probs.gather(1, draft_token_ids.long()[:, None].to(draft_probs.device))
        if num_tokens and not bool((drafted > 0).all()):  # it cannot have been sampled
            index = int((drafted[:, 0] <= 0).nonzero()[0, 0])
            raise InvalidDistribution(
                f"draft_probs[{index}]: the drafted token {int(draft_token_ids[index])} has zero "
                "draft probability, so it cannot have been sampled from this row"
            )


def check_rows(name: str, probs: torch.Tensor) -> None:
    """Every row of ``probs [T, V]`` a distribution (finite, non-negative, mass 1 to
    the input dtype's ``TOLERANCE``), else the first bad row named as ``name[t]``."""
    tol = TOLERANCE.get(probs.dtype, TOLERANCE[torch.float32])
    values = probs.to(torch.promote_types(torch.float32, probs.dtype))
    mass = values.sum(-1)  # [T]
    ok = torch.isfinite(values).all(-1) & (values >= 0).all(-1) & ((mass - 1).abs() <= tol)
    if not bool(ok.all()):
        raise_row_defect(
            name, values[:, None], mass[:, None], ok[:, None], tol, flat=True, tolerance_hint=None
        )


__all__ = ["rejection_sample", "request_noise"]
