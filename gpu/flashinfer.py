r"""FlashInfer's ``chain_speculative_sampling``, on our standard chain rule
(:mod:`specsampling.gpu.chain`; reference :mod:`specsampling.schemes.standard`).

Layout as FlashInfer's (``flashinfer/sampling.py``): ``draft_probs [B, K, V]``,
``draft_token_ids [B, K]``, ``target_probs [B, K + 1, V]``. Per row: accept draft :math:`i`
iff :math:`u_{i+1}\,q_i(x_i) < p_i(x_i)`, at the first rejection :math:`k` emit
:math:`y \sim \mathrm{norm}((p_k - q_k)_+)`, else the bonus :math:`y \sim p_K`; the output
``[B, K + 1]`` int32 holds the accepted drafts, :math:`y`, then ``-1``.

Returned counts. ``accepted_num[b]`` is the number of real drafts whose accept test passes when
each is considered independently -- the meaning FlashInfer documents (``flashinfer/sampling.py``),
a draft-quality metric that does not stop at the first rejection: here each draft's test with its
own accept uniform (the chain's uniforms, those after the first rejection otherwise unused), so
given the tables it is a sum of independent Bernoulli(:math:`\min(1, p_i(x_i) / q_i(x_i))`) draws.
FlashInfer's kernel (``ChainSpeculativeSampling`` in ``include/flashinfer/sampling.cuh``) counts
the accepted prefix and then tests every draft from the first rejected one on again with fresh
uniforms, that rejected draft included, so its count is larger on average (one draft of
acceptance :math:`a`: :math:`a + (1 - a)\,a` against :math:`a`). ``emitted_num[b]`` is the
drafts emitted (the accepted prefix, the final token excluded). When the ``maybe_output_*``
tensors are given they are incremented in place and returned.

Differences from FlashInfer's ``chain_speculative_sampling(draft_probs, draft_token_ids,
target_probs, maybe_output_accepted_token_num=None, maybe_output_emitted_draft_token_num=None,
deterministic=True, generator=None, seed=None, offset=None)``:

* it returns ``(output_token_ids, accepted_num, emitted_num)`` (FlashInfer returns the tuple
  through its wrapper too; its counters are int32, ours as well); counters passed in may have
  any integer dtype and are incremented in place in it (FlashInfer increments an int32 copy, so a
  counter of another dtype is silently left unchanged), and both are checked before either is
  written;
* per-row randomness: ``generators`` (one :class:`torch.Generator` or ``None`` per row) draws a
  row's ``2 n_b + 1`` float64 uniforms from its own generator, so its output never depends on
  its batch position or neighbours (FlashInfer's kernel seeds every row's Philox state with
  ``seed[0]``, rows differing only by their subsequence, the batch position; pull request
  flashinfer-ai/flashinfer#4861 proposes per-row seeds);
  ``seed``/``offset`` are not supported (a :class:`ValueError` says to use ``generators``);
* ``-1`` padded draft ids end a row's chain (the bonus is drawn after its last real draft;
  FlashInfer#879 read them as indices); an id ``>= V`` or ``< -1`` raises :class:`ValueError`;
* ``draft_probs=None`` verifies point-mass drafts (n-gram / argmax) with the one-hot rule;
* a rejection whose residual :math:`(p_k - q_k)_+` has no mass (:math:`p_k \le q_k` everywhere:
  probability 0 in exact arithmetic, only rounding puts a row there) draws :math:`y` from
  :math:`p_k`; where :math:`y` is :math:`x_k` itself the draft is emitted and, with
  ``validate=True``, the chain goes on from the next draft, as the reference walk descends on a
  residual hit (with ``validate=False`` the row stops with :math:`x_k` as its last token; the
  same law, see :func:`~specsampling.gpu.chain.verify_chain`), so ``emitted_num`` counts a draft
  whose test failed and may exceed ``accepted_num`` there. FlashInfer's kernel has no defined
  token at such a row (it falls back to a ``last_valid_id`` that kernel never sets);
* with ``validate=True`` a drafted token of zero draft probability is refused (it cannot have
  been sampled from ``draft_probs``: an underflowed low-precision softmax, or drafts that came
  from elsewhere; pass ``draft_probs=None`` for point-mass drafts); FlashInfer accepts it
  whenever its target probability is positive;
* ``draft_token_ids`` must be an integer tensor (FlashInfer's ``.int()`` truncates float ids);
* ``deterministic`` is accepted and ignored: the result is a function of the uniforms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specsampling.errors import InvalidDistribution

from .chain import STANDARD_CHAIN, check_chain_round, draft_lengths, padded_tables
from .noise import Noise, check_generator


def chain_speculative_sampling(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    *,
    generators: Sequence[torch.Generator | None] | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard speculative sampling on ``B`` chains (FlashInfer layout).

    Parameters
    ----------
    draft_probs : Tensor [B, K, V] or None
        Draft distributions (``None``: point-mass drafts).
    draft_token_ids : IntTensor [B, K]
        Drafted tokens, ``-1`` padded at the end of a shorter chain.
    target_probs : Tensor [B, K + 1, V]
        Target distributions after ``0..K`` drafts.
    maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num : integer Tensor [B]
        Incremented in place when given (any integer dtype; both checked before either is
        written), and returned in place of the fresh counts.
    generator : torch.Generator, optional
        Draws the uniforms of the rows without their own generator.
    generators : sequence of torch.Generator or None, length B, optional
        Per-row generators.
    validate : bool
        Check the inputs (host synchronisations).

    Returns
    -------
    (output_token_ids [B, K + 1] int32, accepted_num [B], emitted_num [B])
        The counts are int32, or the given counters themselves.

    Examples
    --------
    >>> draft = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    >>> target = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0],
    ...                         [0.7, 0.1, 0.1, 0.1]]])
    >>> out, accepted, emitted = chain_speculative_sampling(
    ...     draft, torch.tensor([[2, 1]]), target, generator=torch.Generator().manual_seed(0))
    >>> out.tolist(), accepted.tolist(), emitted.tolist()
    ([[2, 0, -1]], [1], [1])
    """
    if seed is not None or offset is not None:
        raise InvalidDistribution(
            "seed/offset: not supported; pass generators=[torch.Generator per row] (a row's "
            "output then never depends on its batch position)"
        )
    if (
        not isinstance(draft_token_ids, torch.Tensor)
        or draft_token_ids.ndim != 2
        or draft_token_ids.is_floating_point()
        or draft_token_ids.is_complex()
        or draft_token_ids.dtype == torch.bool
    ):
        raise InvalidDistribution(
            "draft_token_ids: expected an integer tensor [B, K], got " + _described(draft_token_ids)
        )
    tokens = draft_token_ids.to(torch.long)  # [B, K]
    batch_size, width = tokens.shape
    device = tokens.device
    counters = {
        "maybe_output_accepted_token_num": maybe_output_accepted_token_num,
        "maybe_output_emitted_draft_token_num": maybe_output_emitted_draft_token_num,
    }
    for name, counter in counters.items():
        _check_counter(name, counter, batch_size)
    num_drafts = draft_lengths(tokens)  # [B] the leading non-negative lanes
    if validate:
        lanes = torch.arange(width, device=device)
        below = tokens < -1  # [B, K]
        if bool(below.any()):
            row, lane = (int(i) for i in below.nonzero()[0])
            raise InvalidDistribution(
                f"draft_token_ids[{row}, {lane}]: token id {int(tokens[row, lane])} is "
                "negative (only -1 may pad the end of a chain)"
            )
        after = (lanes[None, :] >= num_drafts[:, None]) & (tokens >= 0)  # [B, K]
        if bool(after.any()):
            row, lane = (int(i) for i in after.nonzero()[0])
            raise InvalidDistribution(
                f"draft_token_ids[{row}, {lane}]: a draft after -1 padding (pad only the end)"
            )
        if generators is not None and len(generators) != batch_size:
            raise InvalidDistribution(f"generators: expected {batch_size} entries")
        check_chain_round(
            tokens, target_probs, draft_probs, None, num_drafts, tokens_name="draft_token_ids"
        )
    noise = row_noise(num_drafts, width, generators, generator, device)
    if width == 0:
        from .chain import verify_chain

        verified = verify_chain("standard", tokens, target_probs, None, noise, validate=False)
        accepted = torch.zeros(batch_size, dtype=torch.long, device=device)
    else:
        tables = padded_tables(tokens, num_drafts, target_probs, draft_probs)
        accepted = STANDARD_CHAIN.tests(tables, noise.accept[:, 1:]).sum(-1)  # [B]
        verified, _ = STANDARD_CHAIN.run(tables, noise, None if validate else 1)
    accepted_num = accepted.to(torch.int32)  # [B]
    emitted_num = verified.node.to(torch.int32)  # [B]
    if maybe_output_accepted_token_num is not None:
        maybe_output_accepted_token_num += accepted_num.to(maybe_output_accepted_token_num)
        accepted_num = maybe_output_accepted_token_num
    if maybe_output_emitted_draft_token_num is not None:
        maybe_output_emitted_draft_token_num += emitted_num.to(maybe_output_emitted_draft_token_num)
        emitted_num = maybe_output_emitted_draft_token_num
    return verified.tokens.to(torch.int32), accepted_num, emitted_num


def _described(value: object) -> str:
    """A value's type, and its dtype and shape if it is a tensor (for error messages)."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _check_counter(name: str, counter: object, batch_size: int) -> None:
    """A ``maybe_output_*`` counter: ``None``, or an integer tensor of shape ``[B]`` (incremented
    in place, so checked before anything is written)."""
    if counter is None:
        return
    if (
        not isinstance(counter, torch.Tensor)
        or counter.is_floating_point()
        or counter.is_complex()
        or counter.dtype == torch.bool
        or tuple(counter.shape) != (batch_size,)
    ):
        raise InvalidDistribution(
            f"{name}: expected an integer tensor of shape ({batch_size},) to increment in place, "
            f"got {_described(counter)}"
        )


def row_noise(
    num_drafts: torch.Tensor,
    width: int,
    generators: Sequence[torch.Generator | None] | None,
    generator: torch.Generator | None,
    device: torch.device,
) -> Noise:
    """Float64 uniforms ``[B, K + 1]``: a row with its own generator and ``n`` drafts draws
    ``2 n + 1`` (accept lanes ``1..n``, then sample lanes ``0..n``); the others share one draw
    from ``generator``. One host read of ``num_drafts`` when ``generators`` is given (each row
    owns a generator object)."""
    batch_size = int(num_drafts.shape[0])
    shape = (batch_size, width + 1)
    generator = check_generator(generator)
    if generators is not None:
        generators = [check_generator(g, f"generators[{i}]") for i, g in enumerate(generators)]
    where = device if generator is None else generator.device
    accept = torch.rand(shape, dtype=torch.float64, generator=generator, device=where).to(device)
    sample = torch.rand(shape, dtype=torch.float64, generator=generator, device=where).to(device)
    if generators is not None:
        counts = num_drafts.tolist()
        for row, own in enumerate(generators):
            if own is None:
                continue
            count = counts[row]
            draws = torch.rand(2 * count + 1, dtype=torch.float64, generator=own, device=own.device)
            accept[row, 1 : count + 1] = draws[:count].to(device)
            sample[row, : count + 1] = draws[count:].to(device)
    return Noise(accept, sample)


__all__ = ["chain_speculative_sampling", "row_noise"]
