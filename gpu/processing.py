r"""Batched lowering of :func:`specsampling.process`: temperature, then top-k, then top-p.

Every row of ``logits [..., V]`` is processed exactly as the reference processes it alone, with
its own parameters when they are given per row:

.. math::

    p = \mathrm{softmax}\big((\ell - \max \ell) / T\big), \qquad
    K = \text{the } k \text{ first tokens of the ranking}, \qquad
    P = \{x_r \in K : \textstyle\sum_{s < r,\, x_s \in K} p(x_s) < \mathrm{top\_p}\,p(K)\}

where the ranking sorts tokens by decreasing :math:`p` with ties to the lower id (a stable sort,
as the reference's ``argsort(kind="stable")``), and the result is :math:`p` restricted to
:math:`P` and renormalised. ``T = 0`` is greedy decoding: a one-hot on the argmax of the logits
(lowest id on ties), which the verifiers then treat as any other target. ``top_p = 1`` (or
``None``) keeps every token, ``top_k >= V`` (or ``None``) keeps every token.

How each step is computed:

* **Temperature.** Float64 mirrors the reference step by step (subtract the row maximum, divide
  by ``T``, ``exp``, divide by the row sum added in numpy's pairwise order, :func:`_row_sum`).
  Below float64 it is one buffer and torch's fused softmax: ``softmax(x)`` for a host-known
  ``T = 1``, ``softmax(x / T)`` for ``T > 1`` (no overflow is possible) and for ``T < 1`` on
  every row whose largest logit is at most half the dtype's largest value times ``T`` (so
  ``x / T`` cannot overflow upwards; one division of the whole table on the CPU when all rows
  are such), and ``(x - max x) / T`` then the softmax on the others (a tiny temperature, or
  logits near the dtype's limit, cannot overflow to ``inf - inf``). ``T = 0`` rows become
  one-hots in place.
* **Top-k below float64, with or without top-p** (a host-known largest ``k < V`` on every
  row): no softmax of the whole row. :func:`~specsampling.gpu.ops.topk_blocks` of the *logits*
  (``torch.topk``'s values from the blocks with the largest maxima) gives the ``k + 1``
  largest; the first ``k`` are kept, each with probability :math:`w / Z`,
  :math:`w = e^{(\ell - \max \ell) / T}`, ``Z`` the kept weights' integer mass in the units of
  the dtype rule times :math:`2^{-s}`, rounded once to float32 (:func:`_kept_divisor`; an
  integer sum does not depend on the order of addition, the batch's largest ``k`` or torch's
  threads, so a row's values on this route are the same bit for bit alone or in any batch),
  every other token 0. With top-p on, the kept ones are the
  first ``r <= k``: top-p inside :math:`K` needs only :math:`p_K = p / p(K)`, the top-``k``
  set's own distribution, which those ``k`` weights give (:func:`_nucleus_count`, in the
  integer units of the dtype rule). A row whose last kept and next logits are equal keeps, of
  the tied tokens, the lowest ids (one host read finds those rows; with ``validate=False`` on an
  accelerator every row is done by that threshold rule, bit for bit the same). Ranking by the
  logits, as the float64 reference's ranking by float64 probabilities does, keeps two distinct
  logits apart where they round to one float32 probability (the other routes rank those as a
  tie, lowest id first, and may keep the other one); the masses of :math:`p_K` differ from those
  of the whole-row softmax of the other routes only by rounding (so the kept tokens only where a
  mass-before lies within float32 rounding of the threshold), and the values by rounding only.
* **Top-k and top-p otherwise, ``validate=True``** (the default; float64, or some row with
  ``k >= V``): a partial sort. ``torch.topk(m)`` (for small ``m`` by
  :func:`~specsampling.gpu.ops.topk_blocks`, the same values) gives the first ``m`` *values* of
  the stable ranking exactly (their order among equal values does not matter: equal values are
  interchangeable in a cumulative sum), so their cumulative masses are
  the full sort's first ``m`` (in float64 bit for bit in the same sequential order; below
  float64 exactly, the masses being integers, see the dtype rule). A row is decided from them
  when its threshold ``top_p * p(K)`` is known and every rank from ``m`` on is dropped
  (:func:`_top_p_prefix` gives the exact conditions); its kept set is then top-k with ``k`` =
  the number of kept ranks: the tokens above the last kept value, and of the tokens equal to it
  the lowest ids. Every row not decided (a nucleus longer than ``m``, or in float64 a rank whose
  mass-before lies within rounding of the threshold, where the reference's pairwise row total
  over its *sorted* row decides) is done again by the full stable sort, so the kept tokens are
  exactly the full sort's. ``m`` is the whole vocabulary up to 4,096 tokens, else
  ``max(4096, V // 8)``, or one more than a host-known largest ``k < V``. Which rows need the
  full sort is learnt by one host read, on top of validation's.
* **Top-p alone below float64, ``validate=True``** (top-k off on every row, known on the host):
  peaked rows first (:func:`_keep_top_p`): where a bound on the mass of any 64 tokens from the
  row's block sums (blocks of 16 tokens, 64 from 16,384 up) reaches ``top_p`` (the nucleus may
  lie in the first 64 ranks) on at least half of the rows, a partial sort of those ranks
  by :func:`~specsampling.gpu.ops.topk_blocks` decides the row exactly by the rules below, the
  row's integer total bounded from the same block sums (:func:`_fixed_total_band`; a rank
  within the band's rounding of the threshold leaves the row undecided). The rows it leaves
  undecided try twice as many ranks, then four times, ... (:func:`_escalate`), while the
  vocabulary holds 64 times as many tokens and the same bound says most of them may be decided
  (nuclei of a hundred tokens or two cost a second small ``topk``). Every other row goes to
  a radix select, exact, with no sort of the nucleus and no fallback (:func:`_keep_nucleus`):
  each row's integer mass per float key (exponent and three mantissa bits) by one
  ``scatter_add``, the key where the mass from the top reaches the threshold, and only that
  key's tokens (tens to hundreds) gathered and sorted to find the last kept value. Host reads:
  whether any row is peaked, the prefix's flags, the widest boundary key, and the rows whose
  tie group at the last kept value is cut.
* **Top-p alone in float64, ``validate=True``**: the partial sort's values come from a radix
  select's first pass instead of ``torch.topk`` (:func:`_nucleus_candidates`): each row's mass
  per float key by one ``scatter_add``, the highest key at which ``top_p`` of the mass is
  reached, and every token at or above that key's smallest value, gathered and sorted (the
  reference's sequential float64 sums need the whole nucleus in order). Those are an exact top
  of the ranking whatever the guess, so the rows are decided exactly as above, and a row whose
  guess fell short goes to the full sort. One more host read: the widest row's count.
* **Top-k and top-p, ``validate=False``**: on the CPU, where reading a value needs no device
  synchronisation (:func:`_reads_are_free`), exactly the routes above, only the value checks
  skipped. On an accelerator no host read at all, so no row can be sent to the fallback: below
  float64 a host-known largest ``k < V`` takes the top-k route above (its sync-free threshold
  rule); anything else with top-p takes the full stable sort of every row (the same tokens as
  above, bit for bit, only slower).
* **Zeroing and the divisor.** Below float64, on the routes over the whole rows' softmax (all but
  the top-k route above, which divides by its own ``Z``), each row's kept probabilities are
  divided by its kept **integer mass** times :math:`2^{-s}` (the dtype rule's units, rounded once
  to float32: :func:`_kept_divisor`), which every route knows from its own integer sums; it is a
  function of the kept set alone, so a row's values are the same bit for bit on every route, in
  any batch and on any device (row-local: a row processed alone equals its row of the table), and
  it is the kept mass to within ``V`` units of :math:`2^{-s}`, closer than a float32 sum. A row
  with top-k and top-p off stays the softmax itself, undivided, beside rows that cut too
  (:func:`_whole_rows`), and each row's temperature picks its own softmax formula
  (:func:`_softmax`), so no row depends on its neighbours' settings either. The
  dropped tokens are zeroed in place, ``p / d * (p >= v)`` chunk by chunk of rows through one
  reused buffer (``v`` the last kept value, ``d`` the divisor), then the rows cut inside a tie
  group by their own masks; where the partial sort decides the rows of a checked table (all but an
  eighth at most, :data:`_MASKED_SHARE`), the table is zeroed and each row's kept tokens are
  written by id instead (the few other rows masked first), with no read of the rest of the rows.
  Float64 divides by the row sums added in numpy's order, as the reference.

In float64 on CPU a row comes out bit for bit equal to the reference whenever torch's ``exp``
rounds like numpy's (99% of the test grid's rows; the two ``exp`` differ by one ulp on about 5%
of inputs). Where they differ, values agree to a few ulps and the kept tokens differ only if the
reference's own choice hangs on that last bit (a tie created or broken by rounding, a cumulative
mass within an ulp of the top-p threshold). On CUDA, ``cumsum`` is a parallel scan: in float64
the same caveat holds for cumulative masses hit exactly (below float64 the masses are integers,
whose sums do not depend on the order).

Dtype rule: float64 logits are processed and returned in float64, with the reference's
arithmetic; float32, float16 and bfloat16 logits are processed and returned in **float32**
(bf16/fp16 are upcast first), with the fused softmax, except top-k (with or without top-p),
computed from the logits as above; integer logits are processed in float64, as the reference
does. Below float64 the top-p masses are **integers**: a token's mass is :math:`\lfloor p\,2^s
\rfloor` with :math:`s = 62 - \mathrm{bit\_length}(V)` (:func:`_fixed`; :math:`2^{-47}` units at
V = 32,000, so no ``int64`` sum can overflow), ``p(K)`` is the integer sum over the top-k set
(the whole row with top-k off), and a rank is kept while its integer mass-before is below
:math:`\lceil \mathrm{top\_p} \cdot p(K) \rceil` (the product in float64). Integer sums are exact
in any order, so every route over the softmax -- the radix select, the partial sort, the full
sort, a parallel scan on an accelerator -- keeps the same tokens; they differ from the float64
reference's only where a mass-before lies within float32 rounding of the threshold, or where
float32 rounds two distinct probabilities to one value (ranked as a tie, lowest id first). The
top-k route counts the integer masses of the weights :math:`w` formed in float32 from the logits
(the largest is :math:`2^s`): its kept tokens may differ from the softmax routes' by that
rounding at the threshold, and its values from theirs by rounding. The route is chosen for the
whole call (every row with a host-known ``k < V``: a number, or a sequence without ``None``), so
a row beside a row without top-k, or with ``k`` given as a tensor, takes a softmax route: its
values below float64 may differ from the same row's on the top-k route by rounding, and its kept
tokens in the same rare places. On one route a row's values are the same bit for bit alone or in
any batch.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, NamedTuple

import numpy as np
import torch

from specsampling.errors import InvalidDistribution
from specsampling.processing import _count, _real
from specsampling.validation import as_real_array

from . import ops

_TEMPERATURE = "a finite number >= 0"
_TOP_P = "a number with 0 < top_p <= 1, or None"


def process(
    logits: Any,
    temperature: Any = 1.0,
    top_k: Any = None,
    top_p: Any = None,
    *,
    validate: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Turn logits ``(..., vocab_size)`` into the probabilities sampled from, row by row.

    Parameters
    ----------
    logits : torch.Tensor or array_like, shape (..., vocab_size)
        A tensor stays on its device; other input is converted like the reference (float64, CPU).
        Tensors that require grad (logits or per-row parameters) are read as their detached
        values: the probabilities sampled from carry no gradient, on every route.
    temperature, top_k, top_p : scalar, or per-row values of shape (...)
        A number (same rules as :func:`specsampling.process`), or a tensor / sequence / numpy
        array broadcastable to the batch dimensions ``logits.shape[:-1]``: each row then uses its
        own value. ``top_k`` and ``top_p`` may be ``None`` (off), also per element of a sequence;
        per row, ``top_k >= vocab_size`` and ``top_p = 1`` are "off" too.
    validate : bool, default True
        Check the values of tensor inputs (NaN / +inf logits, all ``-inf`` rows, per-row tensor
        parameters), raising the reference's errors (the row maxima that check reads are reused
        by the softmax). This costs one host synchronisation, and
        with top-k or top-p on one to four more (two more for each step where top-p alone
        tries more ranks on rows its partial sort left undecided), which let top-p alone below
        float64 run on a partial sort of peaked rows and a radix select, and top-k / top-p on a
        partial sort (rows it cannot decide go to the full sort). With ``validate=False`` the
        call never synchronises with a device (for decoding loops whose inputs are known to be
        valid; invalid values then give undefined rows: NaN, or values that look valid, such as
        a one-hot for a negative temperature or ``k = 2`` for ``k = 2.5``): on an accelerator
        top-p then takes the full sort
        (the same tokens, slower) unless a host-known ``k < V`` bounds it below float64; on the
        CPU, where host reads cost no synchronisation, it keeps the faster routes.
        Python scalars and sequences are always checked, on the host, at no device cost.
    out : torch.Tensor, optional
        Write the probabilities into this contiguous tensor of ``logits``' shape, device and
        the result's dtype (not sharing memory with ``logits``) and return it. A serving loop
        that reuses one buffer per table skips the allocation of a fresh table each call,
        whose page faults are most of a softmax's time on a CPU for tables above glibc's
        32 MiB mmap threshold (and static buffers are what CUDA graphs replay). Every route
        writes its result there; the values are the same as without ``out``.

    Returns
    -------
    torch.Tensor, shape (..., vocab_size)
        ``out`` when given. Float64 for float64 (or integer) logits, float32 for float32 /
        float16 / bfloat16 logits.
        Float64 keeps the reference's tokens; below float64 top-p counts masses in integer
        units of ``2 ** -(62 - bit_length(V))`` (the module docstring's dtype rule), so every
        device keeps the same tokens, which differ from float64's only where a cumulative mass
        lies within float32 rounding of the threshold or float32 rounds two distinct
        probabilities to one (ranked as a tie, lowest id first), and divides each row's kept
        probabilities by their integer mass (so a row's values are the same bit for bit alone
        or in any batch, whatever its neighbours' temperatures and cuts; a row with nothing
        cut stays its softmax). With a host-known ``k < V`` on every row (a number, or a
        sequence without ``None``) the call takes the top-k route, from the logits: a row's
        values there are the same bit for bit alone or in any batch on that route, and differ
        from the other routes' by float32 rounding (a row beside a row without top-k, or with
        ``k`` as a tensor, takes the others); top-p is counted inside the top-``k`` set (the
        same tokens up to that rounding).

    Raises
    ------
    InvalidDistribution
        ``logits:`` a wrong shape, non-real entries, NaN or ``+inf``, a row of only ``-inf``.
    ValueError
        ``temperature:``, ``top_k:`` or ``top_p:`` out of range or of a wrong type, or per-row
        values whose shape does not fit the batch; a per-row error names the row.

    Examples
    --------
    >>> import torch
    >>> process(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), temperature=0).tolist()
    [0.0, 0.0, 1.0]
    >>> process(torch.zeros(2, 4, dtype=torch.float64), top_k=[1, 2]).tolist()
    [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]
    >>> process(torch.zeros(2, 4), temperature=torch.tensor([0.0, 1.0]), top_p=0.5).tolist()
    [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]
    """
    logits, temperature, top_k, top_p = (
        value.detach() if isinstance(value, torch.Tensor) else value
        for value in (logits, temperature, top_k, top_p)
    )  # no gradient: the out= routes cannot carry one, and a sampled token has none
    if not validate and _plain_softmax(logits, temperature, top_k, top_p):
        if out is None:
            return torch.softmax(logits.to(torch.float32), -1)  # what the general route computes
        _check_out(out, logits, torch.float32)
        if logits.dtype == torch.float32:
            return torch._softmax(logits, -1, False, out=out)
        return torch._softmax(out.copy_(logits), -1, False, out=out)  # upcast into `out`
    logits = _as_logits(logits)
    vocab_size = logits.shape[-1]
    batch_shape = tuple(logits.shape[:-1])
    exact = logits.dtype == torch.float64 or not logits.is_floating_point()
    dtype = torch.float64 if exact else torch.float32
    buffer = None if out is None else _check_out(out, logits, dtype).view(-1, vocab_size)
    x = ops.row_major(logits.to(dtype).reshape(-1, vocab_size))  # [R, V]: in-place softmaxes
    temperature = _Parameter.parse(temperature, "temperature", batch_shape, x.device)
    top_k = _Parameter.parse(top_k, "top_k", batch_shape, x.device)
    top_p = _Parameter.parse(top_p, "top_p", batch_shape, x.device)
    row_max = None  # [R, 1]: each row's largest logit, where validation has read it
    if validate:
        row_max = _check_values(logits, batch_shape, (temperature, top_k, top_p))
        row_max = row_max.reshape(-1, 1).to(dtype)  # exact: an upcast, or monotone rounding

    greedy = (temperature.rows == 0)[:, None]  # [R, 1]
    if temperature.host and temperature.host_max == 0:  # greedy on every row
        one_hot = _one_hot_argmax(x, buffer)  # [R, V]
        return one_hot.reshape(logits.shape) if out is None else out
    if not exact and _small_top_k(top_k, vocab_size):
        sync_free = not (validate or _reads_are_free(x.device))
        probs = _top_k_logits(x, temperature, greedy, top_k, top_p, sync_free, buffer)  # [R, V]
    else:
        probs = _softmax(x, temperature, greedy, buffer, row_max)  # [R, V], new or `buffer`
        kept = _keep(probs, top_k, top_p, validate)  # or None: every token kept
        whole = None if exact or kept is None else _whole_rows(top_k, top_p, vocab_size)
        if kept is not None:
            if whole is not None and kept.mass is not None:  # those rows divided by exactly 1
                unit = torch.ones_like(kept.mass) << _fixed_shift(vocab_size)  # [R]
                kept = kept._replace(mass=torch.where(whole, unit, kept.mass))
            _zero_dropped(probs, kept)  # in place; divided by the kept mass where it is known
        if (kept is not None and kept.mass is None) or exact:  # float64: as the reference does
            sums = _row_sum(probs)  # [R, 1]
            probs.div_(sums if whole is None else torch.where(whole[:, None], 1.0, sums))
    if not (temperature.host and temperature.host_min > 0):  # some rows may be T = 0
        top = ops.argmax_blocks(x)[:, None]  # [R, 1]
        probs.masked_fill_(greedy, 0.0)  # [R, V], in place: a one-hot on greedy rows
        probs.scatter_(-1, top, torch.where(greedy, 1.0, probs.gather(-1, top)))
    if out is not None:  # every route above wrote into it
        return out
    return probs.reshape(logits.shape)


def _plain_softmax(logits: Any, temperature: Any, top_k: Any, top_p: Any) -> bool:
    """Whether the call is one float32 softmax with nothing to check or cut: unchecked logits
    below float64 with a last axis, temperature the Python number 1, top-k and top-p off. Decoding
    at T = 1 calls this once per model per round; skipping the parameters' parsing saves about
    60 us a call (a fifth of the softmax of 9 x 151,936 rows)."""
    return (
        type(temperature) in (int, float)
        and temperature == 1
        and top_k is None
        and top_p is None
        and isinstance(logits, torch.Tensor)
        and logits.is_floating_point()
        and logits.dtype != torch.float64
        and logits.ndim > 0
        and logits.shape[-1] > 0
    )


def _small_top_k(top_k: _Parameter, vocab_size: int) -> bool:
    """Whether top-k is on with a host-known largest ``k < V`` on every row (top-p anything); an
    empty batch of per-row values (no largest ``k``) is not."""
    return top_k.host and 1 <= top_k.host_max < vocab_size


def _top_k_logits(
    x: torch.Tensor,
    temperature: _Parameter,
    greedy: torch.Tensor,
    top_k: _Parameter,
    top_p: _Parameter,
    sync_free: bool,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-k, then top-p within it, below float64 (``[R, V]``, normalised, in ``out`` when
    given): no softmax of the whole row.

    :func:`~specsampling.gpu.ops.topk_blocks` of the logits gives each row's ``k_max + 1``
    largest values; the kept ones are the first ``k`` (ties to the lower ids), or with top-p on
    the first ``r`` of them (:func:`_nucleus_count`: top-p inside ``K`` only needs ``K``'s own
    probabilities), each with :func:`_kept_probs` of its logit, every other token 0. A row whose
    last kept and next logits are equal has its kept tokens chosen by :func:`_top_k_from_kth`
    (all above the last kept value, then the tied ones by id); only those rows, found by one host
    read, unless ``sync_free``, where every row is done that way.
    """
    vocab_size = x.shape[-1]
    counts = top_k.rows.clamp(max=vocab_size).to(torch.int64)[:, None]  # [R, 1]
    size = int(top_k.host_max) + 1  # <= V
    values, index = ops.topk_blocks(x, size)  # [R, m] each, values decreasing
    ranks = torch.arange(size, device=x.device)  # [m]
    divisor = _divisor(x, temperature, greedy)  # [R, 1]
    highest = values[:, :1]  # [R, 1] the row maximum
    weights = _kept_probs(values, highest, divisor, None)  # [R, m] unnormalised, <= 1
    units = torch.where(ranks < counts, _fixed(weights, vocab_size), 0)  # [R, m] int64
    if not (top_p.host and top_p.host_min == math.inf):  # top-p on some row: r <= k tokens
        masses = _top_p_masses(top_p)  # [R]
        counts = _nucleus_count(units, counts, masses)  # [R, 1]
    kth = values.gather(-1, counts - 1)  # [R, 1]
    mass = torch.where(ranks < counts, units, 0).sum(-1)  # [R]: exact, in any order
    total = _kept_divisor(mass, vocab_size, x.dtype)  # [R, 1]: the row's own, whatever m
    if sync_free:
        keep = _top_k_from_kth(x, counts[:, 0], kth)  # [R, V]
        kept_probs = _kept_probs(x, highest, divisor, total)  # [R, V]
        if out is None:
            return torch.where(keep, kept_probs, 0.0)
        return torch.where(keep, kept_probs, torch.zeros((), dtype=x.dtype), out=out)
    probs = torch.zeros_like(x) if out is None else out.zero_()  # [R, V]
    kept = torch.where(ranks < counts, _kept_probs(values, highest, divisor, total), 0.0)
    probs.scatter_(-1, index, kept)  # [R, V]
    tied = (kth == values.gather(-1, counts.clamp(max=size - 1)))[:, 0] & (counts[:, 0] < size)
    rows = tied.nonzero()[:, 0].tolist()  # the host read: rows with a tie cut at the k-th
    if rows:
        at = torch.tensor(rows, device=x.device)  # [U]
        keep = _top_k_from_kth(x[at], counts[at, 0], kth[at])  # [U, V]
        probs[at] = torch.where(keep, _kept_probs(x[at], highest[at], divisor[at], total[at]), 0.0)
    return probs


def _top_p_masses(top_p: _Parameter) -> torch.Tensor:
    """Each row's ``top_p`` as float64, ``[R]``; ``inf`` where top-p is off (``top_p >= 1``)."""
    return torch.where(top_p.rows >= 1, math.inf, top_p.rows.to(torch.float64))


def _nucleus_count(units: torch.Tensor, counts: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
    r"""How many of the first ``counts [R, 1]`` ranks top-p keeps, ``[R, 1]`` (at least 1).

    ``units [R, m]`` are the ranked top-``k`` tokens' unnormalised probabilities
    :math:`w = e^{(\ell - \max \ell) / T}` (decreasing, :func:`_kept_probs`) in
    :func:`_fixed` units, 0 from rank ``counts`` on; ``masses [R]`` each row's ``top_p``
    (``inf``: off, all ``k`` kept). Top-p keeps a rank while the mass before it is below
    ``top_p`` of :math:`p(K)`, the same as below ``top_p`` of :math:`\sum_K w` (``p`` is ``w``
    over the row's normaliser), which the weights give without the rest of the row: their
    integer sums, exact in any order, and the threshold :func:`_fixed_threshold` of their
    integer total."""
    ranks = torch.arange(units.shape[-1], device=units.device)  # [m]
    in_k = ranks < counts  # [R, m]
    cumulative = units.cumsum(-1)  # [R, m], exact
    threshold = _fixed_threshold(masses, cumulative[:, -1])  # [R]
    kept_ranks = in_k & (cumulative - units < threshold[:, None])  # [R, m], a prefix
    return kept_ranks.sum(-1, keepdim=True).clamp_min(1)  # [R, 1]


def _kept_probs(
    logits: torch.Tensor, highest: torch.Tensor, divisor: torch.Tensor, total: torch.Tensor | None
) -> torch.Tensor:
    """``exp((logits - highest) / divisor) / total`` (no division when ``total`` is None): one
    sequence of operations, so a logit gets the same probability on every route."""
    weights = ((logits - highest) / divisor).exp()
    return weights if total is None else weights / total


def _divisor(x: torch.Tensor, temperature: _Parameter, greedy: torch.Tensor) -> torch.Tensor:
    """Each row's temperature in ``x``'s dtype ``[R, 1]``: 1 on greedy rows, and never below
    the smallest subnormal (a tiny temperature then sends every non-maximum to 0, not NaN)."""
    divisor = torch.where(greedy, 1.0, temperature.rows[:, None].to(torch.float64))  # [R, 1]
    return divisor.clamp_min(_smallest_subnormal(x.dtype)).to(x.dtype)  # [R, 1]


def _softmax(
    x: torch.Tensor,
    temperature: _Parameter,
    greedy: torch.Tensor,
    out: torch.Tensor | None = None,
    row_max: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax((x - max x) / T)`` per row of ``x [R, V]`` (T = 0 rows: divisor 1), a new tensor
    or ``out [R, V]`` (never ``x`` itself). ``row_max [R, 1]``, each row's largest entry in
    ``x``'s dtype (validation's read of it), spares the pass that finds it.

    Float64 mirrors the reference step by step (subtract, divide, ``exp``, divide by the pairwise
    row sum). Below float64 it is one buffer and a fused softmax, each row by its own
    temperature and largest logit alone (so a row's probabilities do not depend on its
    neighbours'): ``softmax(x)`` at ``T = 1``; ``softmax(x / T)`` for ``T > 1`` (``|x / T| <=
    |x|``: no overflow, no loss of precision beyond the input's own; ``x / 1`` is ``x``) and for
    ``T < 1`` where the row's maximum ``m`` has ``|m| <= F T / 2`` (``F`` the dtype's largest
    value; the softmax subtracts ``m / T`` itself, and ``x / T`` is the scaled input to within
    one rounding of its own precision): no entry overflows up (``x <= m``), and one that
    overflows down to ``-inf`` lies more than ``F / 2`` below ``m / T``, a probability of 0 in
    this dtype either way. A row beyond that (a tiny temperature, or logits near ``F``) takes
    ``(x - m) / T``, so nothing overflows to ``inf - inf``. Every row takes the one division on
    the CPU where all rows qualify (one host read); otherwise the rows that do not subtract
    their maximum and the others 0 (exactly ``x``), the same values.
    """
    fixed = temperature.host and temperature.host_min == temperature.host_max
    if x.dtype != torch.float64 and fixed:
        if temperature.host_min == 1:
            return torch.softmax(x, -1) if out is None else torch._softmax(x, -1, False, out=out)
        if temperature.host_min > 1:
            scaled = torch.div(x, temperature.host_min, out=out)  # [R, V]
            return torch._softmax(scaled, -1, False, out=scaled)
    divisor = _divisor(x, temperature, greedy)  # [R, 1]
    if x.dtype != torch.float64 and temperature.host and temperature.host_min >= 1:
        scaled = torch.div(x, divisor, out=out)  # [R, V]: every row T >= 1 (or greedy)
        return torch._softmax(scaled, -1, False, out=scaled)
    top = x.amax(-1, keepdim=True) if row_max is None else row_max  # [R, 1]
    if x.dtype != torch.float64:  # the rows that subtract their max: T < 1 and |m| > F T / 2
        bound = divisor * (torch.finfo(x.dtype).max / 2)  # [R, 1]: F T / 2, finite for T <= 1
        below = (temperature.rows[:, None] < 1) & ~greedy & ~(top.abs() <= bound)  # [R, 1]
        if ops.host_reads_free(x) and not bool(below.any()):  # the usual case: x / T
            scaled = torch.div(x, divisor, out=out)  # [R, V]
            return torch._softmax(scaled, -1, False, out=scaled)
        top = torch.where(below, top, torch.zeros_like(top))  # [R, 1]
    scaled = torch.sub(x, top, out=out).div_(divisor)  # [R, V]
    if x.dtype != torch.float64:
        return torch._softmax(scaled, -1, False, out=scaled)
    probs = scaled.exp_()
    return probs.div_(_row_sum(probs))


class _Kept(NamedTuple):
    """The tokens top-k then top-p keep: in every row those at or above ``threshold [R, 1]``
    (``None``: all), and in the rows ``index [U]`` only those of ``masks [U, V]`` too.

    ``mass [R]`` (below float64; ``None`` in float64 or where a route does not form it): each
    row's kept integer mass (:func:`_fixed` units), whose ``2 ** -s`` multiple divides the kept
    probabilities (:func:`_kept_divisor`); on a row that keeps everything it is not that row's
    mass (:func:`process` divides such rows by exactly 1: :func:`_whole_rows`). ``ids [R, m]``
    with ``count [R]``: where every row's kept tokens are known to be its
    ``ids[r, :count[r]]`` (the peaked rows' partial sort), so that :func:`_zero_dropped` writes
    a zero table and those tokens instead of reading the rows."""

    threshold: torch.Tensor | None
    index: torch.Tensor | None = None
    masks: torch.Tensor | None = None
    mass: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    count: torch.Tensor | None = None


def _kept_divisor(mass: torch.Tensor, vocab_size: int, dtype: torch.dtype) -> torch.Tensor:
    r"""The divisor of each row's kept probabilities below float64, ``[R, 1]`` in ``dtype``: the
    kept integer mass ``mass [R]`` (:func:`_fixed` units) times :math:`2^{-s}`, exact in float64
    (under :math:`2^{53}`), rounded once to ``dtype``. It is a function of the kept set alone
    (integer sums do not depend on the order of addition), so every route, batch size and
    device divides a row by the same number, and it is the kept mass to within the truncations
    (under ``V`` units of :math:`2^{-s}`), closer than a float32 sum of the row."""
    return (mass.to(torch.float64) * 2.0 ** -_fixed_shift(vocab_size)).to(dtype)[:, None]


def _zero_dropped(probs: torch.Tensor, kept: _Kept) -> None:
    """Zero, in place, the tokens of ``probs [R, V]`` that ``kept`` drops and, where ``kept.mass``
    is known, divide the kept ones by :func:`_kept_divisor` (else the caller divides by the row
    sums). With ``kept.ids``: a zero table, then each row's kept tokens written divided (the
    same values: one division of the same two numbers), and the masked rows, formed before the
    zeroing, written back. Otherwise the threshold chunk by chunk of rows (``p / d * (p >= v)``,
    the comparison written as 0.0 / 1.0 into one reused buffer of ``probs``' dtype: ``x * 1 =
    x``, ``x * 0 = 0``, and the chunk is still in the cache for the division and the product;
    on the CPU a whole-table ``where``, or a multiply by a boolean mask, which converts it
    first, costs several times that), then the masked rows."""
    vocab_size = probs.shape[-1]
    divisor = None if kept.mass is None else _kept_divisor(kept.mass, vocab_size, probs.dtype)
    if kept.ids is not None and kept.count is not None and divisor is not None:
        masked = None  # the masked rows, formed before the table is zeroed
        if kept.index is not None and kept.masks is not None:
            masked = probs[kept.index].div_(divisor[kept.index]).mul_(kept.masks)  # [U, V]
        ranks = torch.arange(kept.ids.shape[-1], device=probs.device)  # [m]
        values = probs.gather(-1, kept.ids).div_(divisor)  # [R, m]
        values.masked_fill_(ranks >= kept.count[:, None], 0.0)  # [R, m]: dropped ranks
        probs.zero_().scatter_(-1, kept.ids, values)
        if masked is not None:
            probs[kept.index] = masked
        return
    if kept.threshold is not None:
        step = _row_chunks(probs, _NUCLEUS_CHUNK_ELEMENTS)
        buffer = torch.empty(step, vocab_size, dtype=probs.dtype, device=probs.device)
        for start in range(0, len(probs), step):
            chunk = probs[start : start + step]  # [c, V]
            above = torch.ge(chunk, kept.threshold[start : start + step], out=buffer[: len(chunk)])
            if divisor is not None:
                chunk.div_(divisor[start : start + step])
            chunk.mul_(above)
    elif divisor is not None:  # masks alone: every row is masked, and divided here
        probs.div_(divisor)
    if kept.masks is not None and kept.index is None:  # every row masked (no host read)
        probs.mul_(kept.masks)
    elif kept.masks is not None:
        probs[kept.index] = probs[kept.index] * kept.masks  # [U, V]


def _keep(
    probs: torch.Tensor, top_k: _Parameter, top_p: _Parameter, validate: bool
) -> _Kept | None:
    """The tokens kept by top-k then top-p on the stable ranking, or None (all of them).

    With ``validate=True``, or on the CPU (:func:`_reads_are_free`): top-p alone below float64
    by :func:`_keep_nucleus` (a radix select, exact, no sort of the nucleus); otherwise
    :func:`_top_p_prefix`, a partial sort of ``m`` ranks (:func:`_prefix_size`, or one more than
    a host-known largest ``k < V``; for top-p alone in float64 :func:`_nucleus_candidates`),
    then the full stable sort of :func:`_keep_sorted` on each row the prefix cannot decide
    exactly (one host read says which). With ``validate=False`` on an accelerator (no host read
    allowed): top-k alone with a host-known largest ``k < V`` (float64 here: below it
    :func:`_top_k_logits` takes that case) by the largest values and a threshold, anything else
    with top-p by the full sort of every row. Parameters known on the host to be
    off on every row cost nothing.
    """
    vocab_size = probs.shape[-1]
    use_k = not (top_k.host and top_k.host_min >= vocab_size)
    use_p = not (top_p.host and top_p.host_min == math.inf)
    if not (use_k or use_p):
        return None
    counts = top_k.rows.clamp(max=vocab_size).to(torch.int64)  # [R]
    small_k = top_k.host and top_k.host_max < vocab_size
    masses = _top_p_masses(top_p)  # [R]
    if validate or _reads_are_free(probs.device):
        if use_p and not use_k and probs.dtype != torch.float64:
            return _keep_top_p(probs, counts, masses, by_ids=validate)  # checked: no NaN rows
        if use_p and not use_k:  # float64 top-p alone: the candidates of a radix histogram
            values, valid = _nucleus_candidates(probs, masses)
        else:
            size = _prefix_size(vocab_size)
            if small_k:  # one more than the largest k: shows whether its ties go past it
                size = min(size, int(top_k.host_max) + 1)
            values = ops.topk_blocks(probs, size)[0]  # [R, size], decreasing
            valid = torch.full(counts.shape, size, device=probs.device)  # [R]
        return _top_p_with_fallback(probs, counts, masses, values, valid)
    if not use_p and small_k:
        return _Kept(None, masks=_top_k_by_threshold(probs, counts, int(top_k.host_max)))
    masks, mass = _keep_sorted(probs, counts, masses)
    return _Kept(None, masks=masks, mass=mass)


def _whole_rows(top_k: _Parameter, top_p: _Parameter, vocab_size: int) -> torch.Tensor | None:
    """Below float64, the rows whose top-k and top-p are both off, ``[R]`` bool, or None where
    the host values say there are none: those rows keep every token and stay the softmax as it
    is, undivided, as they are when processed alone (where no row cuts, nothing is divided), so
    a row's probabilities do not depend on its neighbours' settings."""
    if (top_k.host and top_k.host_max < vocab_size) or (top_p.host and top_p.host_max < 1):
        return None
    return (top_k.rows >= vocab_size) & (_top_p_masses(top_p) == math.inf)  # [R]


def _reads_are_free(device: torch.device) -> bool:
    """Whether a host read of a tensor on ``device`` needs no device synchronisation (the CPU):
    there ``validate=False`` keeps the partial sort and its host reads."""
    return device.type == "cpu"


def _keep_sorted(
    probs: torch.Tensor, counts: torch.Tensor, masses: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k then top-p by one stable sort of every row, as the reference: the kept tokens
    (``[R, V]`` bool) and, below float64, each row's kept integer mass (``[R]``, :func:`_fixed`
    units; ``None`` in float64). Float64 with the reference's cumulative masses, below float64
    with :func:`_fixed` ones."""
    vocab_size = probs.shape[-1]
    ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # [R, V] each
    keep = torch.arange(vocab_size, device=probs.device) < counts[:, None]  # [R, V], ranked
    kept = torch.where(keep, ranked, torch.zeros_like(ranked))  # [R, V]
    mass = None
    if probs.dtype == torch.float64:
        cumulative = kept.cumsum(-1)  # [R, V]
        mass_before = cumulative - kept  # [R, V]
        threshold = masses[:, None] * _row_sum(kept)  # [R, 1]: p(K) in numpy's pairwise order
    else:
        units = _fixed(kept, vocab_size)  # [R, V] int64
        cumulative = units.cumsum(-1)  # [R, V], exact
        mass_before = cumulative - units  # [R, V]
        threshold = _fixed_threshold(masses, cumulative[:, -1])[:, None]  # [R, 1]
    keep = keep & (mass_before < threshold)  # [R, V]
    if probs.dtype != torch.float64:
        mass = torch.where(keep, units, 0).sum(-1)  # [R]: the kept ranks' integer mass
    return torch.zeros_like(keep).scatter_(-1, order, keep), mass  # [R, V], in token order


# ``shift = 62 - bit_length(V)``: ``V`` units of at most ``2 ** shift`` each sum below
# ``2 ** 62``, so no ``int64`` sum overflows, and every sum is exact in any order.
def _fixed_shift(vocab_size: int) -> int:
    """The fixed-point scale of :func:`_fixed` for a vocabulary of ``vocab_size`` tokens."""
    return 62 - max(1, vocab_size).bit_length()


def _fixed(values: torch.Tensor, vocab_size: int) -> torch.Tensor:
    r"""Probabilities below float64 as integer masses, :math:`\lfloor p\,2^s \rfloor` ``int64``
    (``s`` the :func:`_fixed_shift` of ``vocab_size``): the scaling is exact in float32, the
    conversion truncates. Their sums are exact and independent of the order of addition (a
    cumulative sum of a sorted row, a histogram, a parallel scan on an accelerator all agree),
    and a token's mass is short of :math:`p` by under :math:`2^{-s}` (:math:`2^{-47}` at
    V = 32,000)."""
    return (values * 2.0 ** _fixed_shift(vocab_size)).to(torch.int64)


def _fixed_threshold(masses: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    r"""The top-p threshold in :func:`_fixed` units, ``int64 [R]``: a rank is kept when its
    integer mass-before is below :math:`\lceil \mathrm{top\_p} \cdot T \rceil` (``T`` the
    integer total of the kept set, the product in float64), which for an integer mass-before
    is the same as being below :math:`\mathrm{top\_p} \cdot T`. Top-p off (``masses = inf``):
    ``2 ** 62``, above every mass."""
    product = torch.ceil(masses.to(torch.float64) * total.to(torch.float64))  # [R]
    return torch.where(masses == math.inf, 2.0**62, product).clamp(max=2.0**62).to(torch.int64)


def _top_p_with_fallback(
    probs: torch.Tensor,
    counts: torch.Tensor,
    masses: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    nucleus: bool = False,
    band: tuple[torch.Tensor, torch.Tensor] | None = None,
    ids: torch.Tensor | None = None,
    sums: torch.Tensor | None = None,
) -> _Kept:
    """:func:`_top_p_prefix` on every row, then the rows it leaves undecided by the full sort,
    or with ``nucleus`` (top-p alone below float64) by :func:`_escalate` (more ranks, or the radix
    select). ``band``: the rows' :func:`_fixed_total_band`, if already formed; ``sums``: their
    :func:`_bound_block` sums, if formed (for :func:`_escalate`'s bound). ``ids [R, m]``: the
    token ids of ``values`` (or None); where every row is decided, none is cut inside a tie
    group and none keeps everything, the result names each row's kept tokens by them
    (``_Kept.ids``). One host read: the rows' flags."""
    vocab_size = probs.shape[-1]
    last_value, num_kept, decided, partial, mass = _top_p_prefix(
        probs, counts, masses, values, valid, band
    )
    keep_all = (masses == math.inf) & (counts >= vocab_size)  # [R]: top-k and top-p off
    flags = torch.stack([~decided, partial & decided, keep_all]).tolist()  # the host read
    tied_rows = [row for row, flag in enumerate(flags[1]) if flag]
    rows = [row for row, flag in enumerate(flags[0]) if flag]
    whole_rows = [row for row, flag in enumerate(flags[2]) if flag]  # decided: they keep all
    prefix = values.shape[-1]
    if nucleus and rows and len(rows) == len(probs):  # none decided: more ranks, or the radix
        return _escalate(probs, counts, masses, band, sums, prefix)
    # the kept tokens by ids: every row but a few (those the prefix does not decide, or cuts
    # inside a tie group) decided, and those few masked before the table is zeroed
    by_ids = ids is not None and not whole_rows
    by_ids = by_ids and len(tied_rows) + len(rows) <= _MASKED_SHARE * len(probs)
    if not (tied_rows or rows):
        if not by_ids:
            return _Kept(last_value, mass=mass)
        return _Kept(last_value, mass=mass, ids=ids, count=num_kept)
    masks, masked = [], list(tied_rows)
    if tied_rows:  # rare: the last kept value's tie group is cut; keep its lowest ids only
        index = torch.tensor(tied_rows, device=probs.device)  # [U]
        masks.append(_top_k_from_kth(probs[index], num_kept[index], last_value[index]))
    if rows and nucleus:  # more ranks or the radix select decide these: thresholds, cut rows
        index = torch.tensor(rows, device=probs.device)  # [U]
        part_band = None if band is None else (band[0][index], band[1][index])
        part_sums = None if sums is None else sums[index]
        kept = _escalate(probs[index], counts[index], masses[index], part_band, part_sums, prefix)
        selected = kept.threshold  # [U, 1]; None: every token kept
        if selected is None:
            selected = last_value.new_full((len(rows), 1), -1.0)
        last_value = last_value.index_copy(0, index, selected)  # [R, 1]
        if mass is not None and kept.mass is not None:
            mass = mass.index_copy(0, index, kept.mass)
        if by_ids:  # all of these rows as masks: their thresholds, and the cut rows' own
            row_masks = probs[index] >= selected  # [U, V]
            if kept.index is not None and kept.masks is not None:
                row_masks[kept.index] = kept.masks
            masked += rows
            masks.append(row_masks)
        elif kept.index is not None and kept.masks is not None:
            masked += [rows[i] for i in kept.index.tolist()]
            masks.append(kept.masks)
    elif rows:  # the full sort decides these alone: no threshold
        index = torch.tensor(rows, device=probs.device)  # [U]
        sorted_masks, sorted_mass = _keep_sorted(probs[index], counts[index], masses[index])
        masks.append(sorted_masks)
        if mass is not None and sorted_mass is not None:
            mass = mass.index_copy(0, index, sorted_mass)
        last_value = last_value.index_fill(0, index, -1.0)  # [R, 1]
        masked += rows
    if not masks:
        return _Kept(last_value, mass=mass)
    index = torch.tensor(masked, device=probs.device)  # [U]
    if by_ids:
        return _Kept(last_value, index, torch.cat(masks), mass, ids, num_kept)
    return _Kept(last_value, index, torch.cat(masks), mass=mass)


#: Top-p alone below float64: the ranks a partial sort tries first on peaked rows
#: (:func:`_keep_top_p`), the block length of the bound that picks those rows (longer blocks from
#: :data:`_LONG_BOUND_VOCAB` tokens up: :func:`_bound_block`), and the share of peaked rows from
#: which the partial sort runs (on every row: a row copy costs more than it).
_PEAKED_PREFIX = 64
_BOUND_BLOCK = 16
_LONG_BOUND_BLOCK = 64
_LONG_BOUND_VOCAB = 16_384
_PEAKED_SHARE = 0.5

#: Top-p alone below float64: the rows a partial sort leaves undecided are tried again with this
#: many times its ranks while the vocabulary holds :data:`_ESCALATION_BLOCKS` times as many
#: tokens (:func:`_escalate`), then by the radix select.
_ESCALATION = 2
_ESCALATION_BLOCKS = 64

#: The largest share of rows a partial sort that decides the others may leave to masks (rows it
#: does not decide, or cuts inside a tie group) and still name its kept tokens by ids
#: (:func:`_top_p_with_fallback`): each such row costs a row copy and a mask.
_MASKED_SHARE = 0.125


def _escalate(
    probs: torch.Tensor,
    counts: torch.Tensor,
    masses: torch.Tensor,
    band: tuple[torch.Tensor, torch.Tensor] | None,
    sums: torch.Tensor | None,
    prefix: int,
) -> _Kept:
    """Top-p alone below float64 on rows ``probs [U, V]`` that a partial sort of ``prefix`` ranks
    left undecided (nuclei longer than it, or a rank within the band's rounding of the
    threshold): a partial sort of :data:`_ESCALATION` times as many ranks decides them by the
    same exact rules (:func:`_top_p_with_fallback`, its own undecided rows escalated again)
    where the vocabulary holds :data:`_ESCALATION_BLOCKS` times as many tokens, so that
    :func:`~specsampling.gpu.ops.topk_blocks` still narrows the rows, and, given the rows' block
    ``sums``, where :func:`_keep_top_p`'s bound for that many ranks reaches ``top_p`` on at
    least :data:`_PEAKED_SHARE` of them (flat rows go on to the radix select at once); past
    that, the radix select. A nucleus of a hundred tokens costs a second ``topk`` of a hundred
    or two ranks, not the radix select's integer passes and histogram. ``band``: the rows'
    :func:`_fixed_total_band`, if formed. One host read with ``sums``: the bound's count."""
    vocab_size = probs.shape[-1]
    size = prefix * _ESCALATION
    if len(probs) == 0 or size * _ESCALATION_BLOCKS > vocab_size:
        return _keep_nucleus(probs, masses)
    if sums is not None and not _mostly_peaked(sums, masses, size):
        return _keep_nucleus(probs, masses)
    values = ops.topk_blocks(probs, size)[0]  # [U, size], decreasing
    valid = torch.full(counts.shape, size, device=probs.device)  # [U]
    return _top_p_with_fallback(
        probs, counts, masses, values, valid, nucleus=True, band=band, sums=sums
    )


def _mostly_peaked(sums: torch.Tensor, masses: torch.Tensor, count: int) -> bool:
    """Whether the rows whose :func:`_top_mass_bound` of ``count`` tokens (from their block
    ``sums``) reaches ``top_p`` (less a margin for the rows' own rounding) are at least
    :data:`_PEAKED_SHARE` of them, and some: then a partial sort of ``count`` ranks may decide
    them. One host read."""
    cap = masses.clamp(max=1.0) / (2 * count)  # [R]: half of top_p from the count
    bound = _top_mass_bound(sums, count, cap).to(torch.float64)  # [R]
    peaked = int((bound >= masses * (1 - 1e-3)).sum())  # top-p off (inf): never
    return peaked > 0 and peaked >= _PEAKED_SHARE * len(sums)


def _bound_block(vocab_size: int) -> int:
    """The block length of :func:`_keep_top_p`'s bound: 16 tokens, 64 from 16,384 tokens up.

    A uniform row's blocks then hold at most 1/256 of its mass (64 / 16,384, as 16 / 4,096),
    under the bound's per-block allowance ``top_p / 128`` for ``top_p >= 1/2``, so flat rows stay
    ruled out; longer blocks make the block sums' reduction cheaper on the CPU (a sum over a
    last axis of 16 costs about twice one of 64 there; the bound on 576 rows of 32,000 tokens
    went from about 8 to 4 % of a top-p call, and the rows it calls peaked are the same on the
    benchmark's flat and peaked tables)."""
    return _LONG_BOUND_BLOCK if vocab_size >= _LONG_BOUND_VOCAB else _BOUND_BLOCK


def _top_mass_bound(sums: torch.Tensor, count: int, cap: torch.Tensor) -> torch.Tensor:
    r"""An upper bound on the mass of any ``count`` tokens of each row, ``[R]``, from the row's
    block sums ``sums [R, nb]`` (:func:`~specsampling.gpu.ops.block_sums`), with no sort:
    ``count`` tokens lie in at most ``count`` blocks, tokens of one block weigh at most its
    sum, and for any ``c >= 0`` the sums of ``count`` blocks are at most
    :math:`\mathrm{count} \cdot c + \sum_b (s_b - c)_+`. ``cap [R]`` is each row's ``c``;
    with ``c = top_p / (2 count)`` a flat row (every block under ``c``) is bounded by
    ``top_p / 2`` and ruled out, and no row is ever bounded below its true mass."""
    return count * cap + (sums - cap[:, None].to(sums.dtype)).clamp_min_(0).sum(-1)  # [R]


def _keep_top_p(
    probs: torch.Tensor, counts: torch.Tensor, masses: torch.Tensor, by_ids: bool = False
) -> _Kept:
    """Top-p alone below float64 (the kept tokens): on **peaked** rows, whose nucleus may lie in
    the first :data:`_PEAKED_PREFIX` ranks (:func:`_top_mass_bound` reaches ``top_p``, less a
    margin for the row's own rounding), a partial sort of those ranks by
    :func:`~specsampling.gpu.ops.topk_blocks` decides the row exactly (:func:`_top_p_prefix`, the
    same integer masses); every other row, and one the prefix cannot decide, by the radix select
    :func:`_keep_nucleus`. The same tokens either way; the prefix costs a block read and two
    small ``topk`` where the radix select costs several integer passes and a histogram, and the
    bound (the block sums and one pass over them, no sort) keeps flat rows (nuclei of thousands
    of tokens) from paying for a prefix that cannot decide them: the prefix runs on every row
    when at least :data:`_PEAKED_SHARE` of them are peaked, else the radix select does. With
    ``by_ids`` (values checked: no NaN row), a table the prefix decides whole comes back as each
    row's kept token ids (``_Kept.ids``), for a zero table and those tokens written. Host
    reads: how many rows are peaked, then the prefix's flags."""
    vocab_size = probs.shape[-1]
    if vocab_size <= 8 * _PEAKED_PREFIX or len(probs) == 0:
        return _keep_nucleus(probs, masses)
    width = _bound_block(vocab_size)
    sums = ops.block_sums(probs, width)  # [R, nb]
    if not _mostly_peaked(sums, masses, _PEAKED_PREFIX):  # mostly flat rows (a host read)
        return _keep_nucleus(probs, masses)
    values, ids = ops.topk_blocks(probs, _PEAKED_PREFIX)  # [R, m] each, decreasing
    valid = torch.full(counts.shape, _PEAKED_PREFIX, device=probs.device)  # [R]
    band = _fixed_total_band(probs, sums, width)  # the row totals, from the same sums
    ids = ids if by_ids else None
    return _top_p_with_fallback(
        probs, counts, masses, values, valid, nucleus=True, band=band, ids=ids, sums=sums
    )


#: The radix keys of :func:`_nucleus_candidates`, per dtype: the signed integer of the same width
#: and the shift that keeps a float's exponent and its 3 highest mantissa bits. A non-negative
#: float's bits order as the float does, so each key holds the values of one interval whose ends
#: are at most a factor 2 ** (1 / 8) apart.
_RADIX = {torch.float32: (torch.int32, 20), torch.float64: (torch.int64, 49)}

#: How far the histogram's guess overshoots ``top_p``, relative: its float sums are only a guess
#: (the exact test is :func:`_top_p_prefix`'s), and a short guess costs a row the full sort.
_CANDIDATE_MARGIN = 1e-3

#: Elements per row chunk on the CPU: an 8 MB int64 key buffer, under glibc's largest mmap
#: threshold (32 MB), so that each chunk's temporaries reuse the heap instead of faulting in
#: fresh pages (a fresh [576, 32,000] buffer costs about twice the softmax that fills it).
_CHUNK_ELEMENTS = 2**20

#: Elements per row chunk of :func:`_keep_nucleus` and :func:`_zero_dropped` on the CPU: their
#: work buffers are faulted in afresh on every call, so smaller chunks cost less there (measured
#: at 2**16 to 2**20 on 9 x 151,936 and 576 x 32,000 rows).
_NUCLEUS_CHUNK_ELEMENTS = 2**18

#: Elements per row chunk on an accelerator: a 512 MB int64 key buffer at most, whatever the batch.
_DEVICE_CHUNK_ELEMENTS = 2**26


def _nucleus_candidates(
    probs: torch.Tensor, masses: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Each row's likely nucleus, sorted: ``(values [R, w], valid [R])``, for
    :func:`_top_p_prefix`.

    A radix select's first pass: each row's mass per key (the float's top bits, :data:`_RADIX`)
    by one ``scatter_add``, then, from the highest key down, the first key where the mass reaches
    ``top_p (1 + margin)`` of the row's (capped at the row's total). The candidates are every
    token at or above that key's smallest value ``tau``: an exact top of the ranking, whatever
    ``tau`` is, so :func:`_top_p_prefix` decides the row exactly from them, or sends it to the full
    sort when the guess fell short. They are gathered in token order, padded with zeros to the
    widest row and sorted: ``valid`` of them per row, ``values[r, valid[r]:] = 0``. Rows with
    top-p off get none. Rows go in chunks of :data:`_CHUNK_ELEMENTS` elements on the CPU
    (:data:`_DEVICE_CHUNK_ELEMENTS` elsewhere, :func:`_row_chunks`). One host read: the widest
    row.
    """
    num_rows, vocab_size = probs.shape
    if num_rows == 0:  # nothing to rank (range() below needs a positive step)
        return probs.new_zeros(0, 1), torch.zeros(0, dtype=torch.int64, device=probs.device)
    int_dtype, shift = _RADIX[probs.dtype]
    num_keys = 1 << (torch.finfo(probs.dtype).bits - 1 - shift)
    step = _row_chunks(probs)
    key_buffer = torch.empty(step, vocab_size, dtype=torch.int64, device=probs.device)
    chosen_buffer = torch.empty(step, vocab_size, dtype=torch.bool, device=probs.device)
    counts, flats = [], []
    for start in range(0, num_rows, step):
        chunk = probs[start : start + step]  # [c, V]
        keys = key_buffer[: len(chunk)]  # [c, V]
        keys.copy_(chunk.view(int_dtype)).bitwise_right_shift_(shift)
        keys.bitwise_and_(num_keys - 1)  # a no-op on probabilities; a NaN's sign bit dropped
        mass = torch.zeros(len(chunk), num_keys, dtype=probs.dtype, device=probs.device)
        mass = mass.scatter_add_(-1, keys, chunk).flip(-1).cumsum(-1)  # [c, K], top keys first
        share = masses[start : start + step, None] * (1 + _CANDIDATE_MARGIN)  # [c, 1]
        need = mass[:, -1:] * share.clamp(max=1.0).to(probs.dtype)  # [c, 1]
        key = num_keys - 1 - (mass < need).sum(-1)  # [c]: the first key reaching it, from the top
        tau = (key << shift).to(int_dtype).view(probs.dtype)  # [c]: that key's smallest value
        tau = torch.where(share[:, 0] == math.inf, math.inf, tau)  # [c]: top-p off, none
        chosen = torch.ge(chunk, tau[:, None], out=chosen_buffer[: len(chunk)])  # [c, V]
        counts.append(chosen.sum(-1))
        flats.append(chunk[chosen])  # row-major: each row's candidates in token order
    valid = torch.cat(counts)  # [R]
    width = max(1, int(valid.max()))  # the host read
    slots = torch.arange(width, device=probs.device) < valid[:, None]  # [R, w]
    table = torch.zeros(num_rows, width, dtype=probs.dtype, device=probs.device)
    table.masked_scatter_(slots, torch.cat(flats))  # [R, w]: row r's candidates, then zeros
    return table.sort(dim=-1, descending=True).values, valid


def _row_chunks(probs: torch.Tensor, elements: int | None = None) -> int:
    """Rows per chunk of ``probs [R, V]`` for the chunked passes: ``elements`` (by default
    :data:`_CHUNK_ELEMENTS`) on the CPU, :data:`_DEVICE_CHUNK_ELEMENTS` elsewhere; at least one
    row."""
    if probs.device.type != "cpu":
        elements = _DEVICE_CHUNK_ELEMENTS
    elif elements is None:
        elements = _CHUNK_ELEMENTS
    return min(max(1, len(probs)), max(1, elements // max(1, probs.shape[-1])))


def _fixed_total_band(
    probs: torch.Tensor, sums: torch.Tensor | None = None, width: int = ops.CDF_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Bounds ``(low, high)``, ``int64 [R]``, on each row's integer total
    :math:`\sum_x \lfloor p(x)\,2^s \rfloor` (:func:`_fixed`) of ``probs [R, V]`` (float32),
    from one read: the sums of ``width``-token blocks
    (:func:`~specsampling.gpu.ops.block_sums`, or ``sums`` already formed), added in float64. A
    sum of non-negative floats errs by at most its number of terms less one units of roundoff
    of itself in any order of addition, so a block sum by ``width`` :math:`\cdot 2^{-24}` and
    the float64 total of ``nb`` blocks by :math:`nb \cdot 2^{-53}` (doubled for the products
    below), and the truncations take off less than ``V`` units. Converting every entry to
    ``int64`` instead (the exact total) costs several softmaxes on the CPU."""
    vocab_size = probs.shape[-1]
    if sums is None:
        sums = ops.block_sums(probs, width)
    sums = sums.to(torch.float64)  # [R, nb]
    slack = 2 * (width * 2.0**-24 + sums.shape[-1] * 2.0**-53)
    scaled = sums.sum(-1) * 2.0 ** _fixed_shift(vocab_size)  # [R]
    high = torch.ceil(scaled * (1 + slack)) + 1  # [R]
    low = torch.floor(scaled * (1 - slack)) - vocab_size - 1  # [R]
    return low.clamp(0, 2.0**62).to(torch.int64), high.clamp(0, 2.0**62).to(torch.int64)


def _histogram_pieces(rows: int, vocab_size: int, device: torch.device) -> int:
    """Pieces each row of a :func:`_keep_nucleus` chunk is cut into for its ``scatter_add``: on
    the CPU, where the scatter runs row by row on torch's threads, halves of halves while the
    chunk has fewer pieces than twice the threads, ``V`` splits evenly and each piece keeps at
    least 16,384 tokens (one row of 151,936 tokens: 4 pieces, about half the scatter's time on
    2 cores); elsewhere 1."""
    if device.type != "cpu":
        return 1
    pieces, threads = 1, torch.get_num_threads()
    while (
        rows * pieces < 2 * threads
        and vocab_size % (2 * pieces) == 0
        and vocab_size // (2 * pieces) >= 16_384
    ):
        pieces *= 2
    return pieces


def _keep_nucleus(probs: torch.Tensor, masses: torch.Tensor) -> _Kept:
    r"""Top-p alone below float64 (the kept tokens), exactly
    :func:`_keep_sorted`'s set, by a radix select instead of a sort.

    Masses are integers (:func:`_fixed`), so the mass before a rank is the same whatever the order
    of addition. One pass per chunk of rows: each row's integer mass per radix key (the float's
    exponent and 3 highest mantissa bits, :data:`_RADIX`; a key's values all rank above every
    lower key's) by one ``scatter_add``, summed from the highest key down. The **boundary key**
    is the first whose running mass reaches the threshold :math:`\lceil \mathrm{top\_p}\,T \rceil`
    (:func:`_fixed_threshold`): every token of a higher key is kept (its mass-before is
    below the mass above the boundary, which is below the threshold), every token of a lower key
    dropped (its mass-before is at least the running mass through the boundary). Only the
    boundary key's tokens (tens to hundreds per row) are gathered and sorted, their exact
    masses-before formed from the mass above, and the last kept value ``v`` read off: the row
    keeps every token above ``v`` and, of those equal to ``v`` (all in the boundary key), the
    lowest ids, as many as the ranking keeps (a row where that is not all of them is flagged,
    and cut by :func:`_top_k_from_kth`). Rows with top-p off keep everything. Host reads: the
    widest boundary, and the flagged rows.
    """
    num_rows, vocab_size = probs.shape
    if num_rows == 0:
        return _Kept(None)
    int_dtype, radix_shift = _RADIX[probs.dtype]
    num_keys = 1 << (torch.finfo(probs.dtype).bits - 2 - radix_shift)  # values <= 1: half of them
    step = _row_chunks(probs, _NUCLEUS_CHUNK_ELEMENTS)
    narrow_buffer = torch.empty(step, vocab_size, dtype=int_dtype, device=probs.device)
    key_buffer = torch.empty(step, vocab_size, dtype=torch.int64, device=probs.device)
    unit_buffer = torch.empty(step, vocab_size, dtype=torch.int64, device=probs.device)
    scaled_buffer = torch.empty(step, vocab_size, dtype=probs.dtype, device=probs.device)
    chosen_buffer = torch.empty(step, vocab_size, dtype=torch.bool, device=probs.device)
    scale = 2.0 ** _fixed_shift(vocab_size)
    counts, flats, aboves, thresholds = [], [], [], []
    for start in range(0, num_rows, step):
        chunk = probs[start : start + step]  # [c, V]
        size = len(chunk)
        # the keys in the float's own width (half an int64 pass each), widened once for scatter
        narrow = torch.bitwise_right_shift(
            chunk.view(int_dtype), radix_shift, out=narrow_buffer[:size]
        )
        narrow.bitwise_and_(num_keys - 1)  # a no-op on probabilities; a NaN's sign bit dropped
        keys = key_buffer[:size].copy_(narrow)  # [c, V] int64
        units = unit_buffer[:size].copy_(torch.mul(chunk, scale, out=scaled_buffer[:size]))
        pieces = _histogram_pieces(size, vocab_size, probs.device)
        mass = torch.zeros(size * pieces, num_keys, dtype=torch.int64, device=probs.device)
        mass.scatter_add_(-1, keys.view(size * pieces, -1), units.view(size * pieces, -1))
        if pieces > 1:  # integer sums: the pieces' histograms add up exactly
            mass = mass.view(size, pieces, num_keys).sum(1)
        below = mass.cumsum_(-1)  # [c, K]: keys <= k, inclusive
        total = below[:, -1:]  # [c, 1]
        threshold = _fixed_threshold(masses[start : start + step], total[:, 0])  # [c]
        # a key's mass at or above it is total - (the mass below it): the boundary is the
        # highest key where that still reaches the threshold (-1, no key, where top-p is off)
        reach = torch.cat([torch.zeros_like(total), below[:, :-1]], 1) <= total - threshold[:, None]
        boundary = reach.sum(-1) - 1  # [c]
        above = total[:, 0] - below.gather(-1, boundary.clamp(min=0)[:, None])[:, 0]  # [c]
        aboves.append(above)  # the mass of the keys above the boundary
        thresholds.append(threshold)
        chosen = torch.eq(narrow, boundary.to(int_dtype)[:, None], out=chosen_buffer[:size])
        where = chosen.nonzero()  # [n, 2], row-major: each row's boundary tokens in token order
        counts.append(torch.bincount(where[:, 0], minlength=size))  # (a bool sum costs more)
        flats.append(chunk[where[:, 0], where[:, 1]])  # [n]
    valid = torch.cat(counts)  # [R]
    width = max(1, int(valid.max()))  # the host read
    slots = torch.arange(width, device=probs.device) < valid[:, None]  # [R, w]
    table = torch.full((num_rows, width), -1.0, dtype=probs.dtype, device=probs.device)
    table = table.masked_scatter_(slots, torch.cat(flats)).sort(-1, descending=True).values
    units = _fixed(table.clamp(min=0), vocab_size)  # [R, w]: padding (-1, last) counts 0
    cumulative = torch.cat(aboves)[:, None] + units.cumsum(-1)  # [R, w]
    mass_before = cumulative - units  # [R, w]
    num_kept = (slots & (mass_before < torch.cat(thresholds)[:, None])).sum(-1)  # [R]
    last_value = table.gather(-1, (num_kept - 1).clamp(min=0)[:, None])  # [R, 1]
    last_value = torch.where(valid[:, None] == 0, -1.0, last_value)  # top-p off: keep all
    mass = cumulative.gather(-1, (num_kept - 1).clamp(min=0)[:, None])[:, 0]  # [R]: kept
    room = num_kept - (table > last_value).sum(-1)  # [R]: the tokens equal to v that are kept
    cut = (valid > 0) & (room < (table == last_value).sum(-1))  # [R]
    rows = cut.nonzero()[:, 0].tolist()  # the host read: rows whose tie group at v is cut
    if not rows:
        return _Kept(last_value, mass=mass)
    index = torch.tensor(rows, device=probs.device)  # [U]
    part = probs[index]  # [U, V]
    counts_kept = (part > last_value[index]).sum(-1) + room[index]  # [U]
    masks = _top_k_from_kth(part, counts_kept, last_value[index])  # [U, V]
    return _Kept(last_value, index, masks, mass=mass)


def _prefix_size(vocab_size: int) -> int:
    """The partial sort's length m: all of a small vocabulary, else an eighth of it (at least
    4096): enough for the nucleus of ``top_p = 0.9`` of 3 x N(0, 1) logits at V = 32,000."""
    return min(vocab_size, max(4096, vocab_size // 8))


def _top_p_prefix(
    probs: torch.Tensor,
    counts: torch.Tensor,
    masses: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    band: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    r"""Top-k then top-p from the first ranks of every row of ``probs [R, V]``.

    ``values [R, m]`` holds, decreasing, the first ``valid [R]`` values of each row's stable
    ranking (a partial sort: ``torch.topk``, or :func:`_nucleus_candidates`), then zeros. Returns
    ``(last_value [R, 1], num_kept [R], decided [R], partial [R], kept_mass)``, ``kept_mass [R]``
    below float64 the integer mass of the ``num_kept`` first ranks (``None`` in float64; on a
    row that keeps everything not its mass).

    Those first values are exact (their order among equal values is unspecified, but equal values
    are interchangeable in a cumulative sum), so the cumulative masses of those ranks are the
    first ``valid`` of :func:`_keep_sorted`'s: in float64 bit for bit in the same sequential
    order, below float64 exactly (integer :func:`_fixed` masses). A row is **decided** when its
    kept ranks are settled by them alone:

    * the threshold ``top_p * p(K)`` is known: below float64 exactly when ``k <= valid``
      (``p(K)`` the prefix's integer sum), and for ``k >= V`` within the thresholds of the
      bounds :func:`_fixed_total_band` puts on the row's integer total (a rank whose
      mass-before lies between them leaves the row undecided); in float64 when
      ``k <= valid``, from the kept prefix padded with zeros, which is the reference's own ranked
      kept row, otherwise (``k >= V``) within a rigorous band around ``top_p`` times the
      token-order pairwise sum: both sums err by at most ``h u`` relative, ``h <= 25 + log2 V``
      the height of numpy's summation tree, and a rank whose mass-before falls inside the band
      leaves the row undecided;
    * every rank at or past ``valid`` is dropped: ``k <= valid``, or the prefix's last cumulative
      mass reaches the threshold (below float64 exactly; in float64 clearing it by a few ulps:
      sequential sums of non-negative numbers never decrease, so every later mass-before is at
      least that, less one rounding);
    * the kept ranks form a prefix ``0 .. r - 1`` (checked, not assumed).

    Then top-p is top-k with ``k = r``: every token above the ``r``-th value ``v`` and, of those
    equal to ``v``, the lowest ids. Where the ranking keeps every token equal to ``v`` that is
    ``probs >= v``; a row where it may not is flagged **partial** (conservatively: also when the
    tie group reaches rank ``valid - 1``), for :func:`_top_k_from_kth`. A row with top-p off and
    ``k >= V`` keeps everything (``v = -1``).
    """
    vocab_size = probs.shape[-1]
    m = values.shape[-1]
    ranks = torch.arange(m, device=probs.device)  # [m]
    in_k = ranks < torch.minimum(counts, valid)[:, None]  # [R, m]
    kept = torch.where(in_k, values, torch.zeros_like(values))  # [R, m]
    k_inside = counts <= valid  # [R]
    off = masses == math.inf  # [R]: top-k only
    if probs.dtype == torch.float64:
        cumulative = kept.cumsum(-1)  # [R, m]: the full sort's first `valid` cumulative masses
        mass_before = cumulative - kept  # [R, m]
        unit = 2.0**-53
        padded = torch.zeros_like(probs)  # [R, V]: the reference's ranked kept row if k <= valid
        padded[:, :m] = kept
        total = torch.where(k_inside, _row_sum(padded)[:, 0], _row_sum(probs)[:, 0])  # [R]
        centre = masses * total  # [R]
        width = 4 * (32 + math.log2(vocab_size)) * unit  # relative half-width of the band
        band = torch.where(k_inside | off, 0.0, width * centre)  # [R]
        low, high = centre - band, centre + band  # [R] each
        sure_in = mass_before < low[:, None]  # [R, m]
        sure_out = mass_before >= high[:, None]  # [R, m]
        reached = cumulative[:, -1]  # [R]
        beyond = k_inside | (reached - 8 * unit * reached.clamp_min(1.0) >= high)  # [R]
    else:  # integer masses: every sum exact; p(K) exact, or banded where it is the row's
        units = _fixed(kept, vocab_size)  # [R, m]
        cumulative = units.cumsum(-1)  # [R, m]: the full sort's first `valid`, exactly
        mass_before = cumulative - units  # [R, m]
        low = high = cumulative[:, -1]  # [R]: p(K) where k <= valid
        # top-k off on some row: p(K) is the row's (with a band given, known to be: no host read)
        if m < vocab_size and (band is not None or not bool(k_inside.all())):
            row_low, row_high = _fixed_total_band(probs) if band is None else band  # [R] each
            low, high = torch.where(k_inside, low, row_low), torch.where(k_inside, high, row_high)
        below, above = _fixed_threshold(masses, low), _fixed_threshold(masses, high)  # [R] each
        sure_in = mass_before < below[:, None]  # [R, m]
        sure_out = mass_before >= above[:, None]  # [R, m]
        beyond = k_inside | (cumulative[:, -1] >= above)  # [R]: rank `valid` is not kept
    keep_rank = in_k & sure_in  # [R, m]
    settled = ~(in_k & ~sure_in & ~sure_out).any(-1)  # [R]
    is_prefix = (keep_rank[:, 1:] <= keep_rank[:, :-1]).all(-1)  # [R]
    known = k_inside | (counts >= vocab_size)  # [R]: p(K) formed from the prefix
    keep_all = off & (counts >= vocab_size)  # [R]
    decided = keep_all | (settled & is_prefix & beyond & known)  # [R]
    num_kept = keep_rank.sum(-1).clamp(1, m)  # [R]
    kept_mass = None  # [R] below float64: the kept ranks' integer mass (keep-all rows: not it)
    if probs.dtype != torch.float64:
        kept_mass = cumulative.gather(-1, (num_kept - 1)[:, None])[:, 0]
    last_value = values.gather(-1, (num_kept - 1)[:, None])  # [R, 1]
    last_value = torch.where(keep_all[:, None], -1.0, last_value)  # [R, 1]
    num_kept = torch.where(keep_all, vocab_size, num_kept)  # [R]
    above = (values > last_value).sum(-1)  # [R]: every token above v is ranked in the prefix
    tied = (values == last_value).sum(-1)  # [R]: those equal to v in the prefix
    end = values.gather(-1, (valid.clamp(1, m) - 1)[:, None])  # [R, 1]: the last exact rank
    reaches_end = (end == last_value)[:, 0] & (valid < vocab_size)  # [R]
    partial = ~keep_all & ((num_kept - above < tied) | reaches_end)  # [R]
    return last_value, num_kept, decided, partial, kept_mass


def _row_sum(values: torch.Tensor) -> torch.Tensor:
    """Row sums ``[R, 1]`` of ``values [R, V]``; in float64 added in numpy's pairwise order
    (:func:`specsampling.gpu.ops.numpy_sum`), so the kept sets match the reference even where a
    top-p threshold is hit exactly (equal probabilities, say)."""
    if values.dtype != torch.float64:
        return values.sum(-1, keepdim=True)  # [R, 1]
    return ops.numpy_sum(values)[:, None]  # [R, 1]


def _top_k_by_threshold(probs: torch.Tensor, counts: torch.Tensor, k_max: int) -> torch.Tensor:
    """Top-k with ties to the lower ids (``[R, V]`` bool), by ``torch.topk`` and a threshold."""
    top_values = ops.topk_blocks(probs, k_max)[0]  # [R, k_max], decreasing
    kth = top_values.gather(-1, (counts.clamp(max=k_max) - 1)[:, None])  # [R, 1]
    return _top_k_from_kth(probs, counts, kth)


def _top_k_from_kth(probs: torch.Tensor, counts: torch.Tensor, kth: torch.Tensor) -> torch.Tensor:
    """The ``counts [R]`` first tokens of the stable ranking (``[R, V]`` bool), given the value
    ``kth [R, 1]`` of the last of them: every token above it, then tied ones by id."""
    above = probs > kth  # [R, V]
    tied = probs == kth  # [R, V]
    room = counts[:, None] - above.sum(-1, keepdim=True)  # [R, 1], >= 1
    return above | (tied & (tied.cumsum(-1, dtype=torch.int32) <= room))  # [R, V]


def _one_hot_argmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One-hot on the first maximum of every row of ``x [R, V]`` (torch.argmax: first maximum),
    new or in ``out``."""
    top = ops.argmax_blocks(x)[:, None]  # [R, 1], read before `out` is written
    zeros = torch.zeros_like(x) if out is None else out.zero_()
    return zeros.scatter_(-1, top, 1.0)  # [R, V]


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The byte range ``[start, end)`` a tensor's elements lie in (any strides)."""
    if tensor.numel() == 0:
        return 0, 0
    low = high = tensor.data_ptr()
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        reach = (size - 1) * stride * tensor.element_size()
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return low, high + tensor.element_size()


def _overlap(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether the byte ranges of two tensors intersect (conservative for interleaved views)."""
    (a, b), (c, d) = _span(first), _span(second)
    return a < d and c < b


def _check_out(out: Any, logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out`` if it can hold :func:`process`'s result for ``logits`` in ``dtype``, else raise
    :class:`ValueError` naming what is wrong."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
    problems = []
    if tuple(out.shape) != tuple(logits.shape):
        problems.append(f"shape {tuple(out.shape)} (logits: {tuple(logits.shape)})")
    if out.dtype != dtype:
        problems.append(f"dtype {out.dtype} (the result's: {dtype})")
    if out.device != logits.device:
        problems.append(f"device {out.device} (logits: {logits.device})")
    if not out.is_contiguous():
        problems.append("not contiguous")
    if out.requires_grad:
        problems.append("requires grad")
    if out.device == logits.device and _overlap(out, logits):
        problems.append("shares memory with logits")
    if problems:
        raise ValueError("out: " + "; ".join(problems))
    return out


def _as_logits(logits: Any) -> torch.Tensor:
    """``logits`` as a tensor of real numbers with a non-empty last axis, or raise."""
    if isinstance(logits, torch.Tensor):
        if logits.dtype == torch.bool or logits.is_complex():
            kind = "booleans" if logits.dtype == torch.bool else "complex numbers"
            raise InvalidDistribution(
                f"logits: entries must be real numbers, got a tensor of {kind} ({logits.dtype})"
            )
    else:
        array = as_real_array(logits, "logits")[0].astype(np.float64, copy=False)
        logits = torch.as_tensor(array)
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise InvalidDistribution(
            f"logits: expected shape (..., vocab_size), got {tuple(logits.shape)}"
        )
    return logits


def _check_scalar(name: str, value: Any) -> float | int | None:
    """A scalar parameter converted as the reference converts it, raising its exact messages."""
    if name == "temperature":
        number = _real(value, name, _TEMPERATURE)
        if not (math.isfinite(number) and number >= 0):
            raise ValueError(f"temperature: expected {_TEMPERATURE}, got {value!r}")
        return number
    if value is None:
        return None
    if name == "top_k":
        return _count(value)
    number = _real(value, name, _TOP_P)
    if not 0 < number <= 1:
        raise ValueError(f"top_p: expected {_TOP_P}, got {value!r}")
    return number


class _Parameter:
    """One sampling parameter as per-row values ``rows [R]`` on the logits' device.

    ``top_k`` rows are int64 counts (off: ``2**62``) or the caller's tensor; ``top_p`` rows are
    float64 (off: ``inf``) or the caller's tensor. ``host`` says the values came from Python or
    numpy and are checked already; then ``host_min`` / ``host_max`` let the call skip work with no
    device read. Tensor rows are checked by :func:`_check_values`.
    """

    def __init__(self, name, rows, host, host_min=math.nan, host_max=math.nan):
        self.name, self.rows, self.host = name, rows, host
        self.host_min, self.host_max = host_min, host_max

    @classmethod
    def parse(cls, value, name, batch_shape, device):
        num_rows = math.prod(batch_shape)
        if isinstance(value, torch.Tensor):
            if value.dtype == torch.bool or value.is_complex():
                raise ValueError(
                    f"{name}: expected real numbers per row, got a {value.dtype} tensor"
                )
            return cls(name, _broadcast_rows(value, name, batch_shape).to(device), host=False)
        if not isinstance(value, (np.ndarray, list, tuple)):
            number = _host_number(name, _check_scalar(name, value))
            dtype = torch.int64 if name == "top_k" else torch.float64
            rows = torch.full((num_rows,), number, dtype=dtype, device=device)
            return cls(name, rows, host=True, host_min=number, host_max=number)
        numbers = _host_rows(value, name)
        rows = _broadcast_rows(torch.from_numpy(numbers), name, batch_shape).to(device)
        low, high = (numbers.min(), numbers.max()) if numbers.size else (math.inf, -math.inf)
        return cls(name, rows, host=True, host_min=float(low), host_max=float(high))


def _host_rows(value: Any, name: str) -> np.ndarray:
    """Per-row host values checked with the reference's rules, in the rows' encoding.

    Numeric arrays are checked at once; other sequences (``None`` entries, mixed types) entry by
    entry. An error names the first bad row.
    """
    dtype = np.int64 if name == "top_k" else np.float64
    try:
        array = np.array(value, dtype=object) if isinstance(value, (list, tuple)) else value
    except ValueError:
        raise ValueError(f"{name}: expected per-row values, got a ragged sequence") from None
    if array.dtype == object and all(type(v) in (int, float) for v in array.flat):
        with contextlib.suppress(OverflowError):  # plain Python numbers: checked at once below
            array = array.astype(np.float64)
    if array.dtype.kind in "fiu":
        numbers = array.astype(np.float64)
        if name == "temperature":
            good = np.isfinite(numbers) & (numbers >= 0)
        elif name == "top_k":
            good = np.isfinite(numbers) & (numbers == np.floor(numbers)) & (numbers >= 1)
        else:
            good = (numbers > 0) & (numbers <= 1)
        if good.all():
            if name == "top_k":
                return np.minimum(numbers, _OFF_COUNT).astype(np.int64)
            return np.where(numbers >= 1, np.inf, numbers) if name == "top_p" else numbers
    array = np.asarray(value, dtype=object)
    numbers = np.empty(array.shape, dtype=dtype)
    for index in np.ndindex(array.shape):  # mixed host entries only: checked one by one
        try:
            numbers[index] = _host_number(name, _check_scalar(name, array[index]))
        except ValueError as error:
            raise ValueError(f"{error} at row {index}") from None
    return numbers


def _host_number(name: str, value: float | int | None) -> float | int:
    """A checked host value in the rows' encoding: top-k off or huge -> 2**62, top-p off -> inf."""
    if name == "top_k":
        return _OFF_COUNT if value is None else min(value, _OFF_COUNT)
    if name == "top_p":
        return math.inf if value is None or value >= 1 else value
    return value


_OFF_COUNT = 2**62


def _smallest_subnormal(dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return info.tiny * info.eps


def _broadcast_rows(value: torch.Tensor, name: str, batch_shape: tuple) -> torch.Tensor:
    """``value`` broadcast to the batch shape and flattened to ``[R]``, or a ValueError."""
    try:
        fits = torch.broadcast_shapes(value.shape, batch_shape) == torch.Size(batch_shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"{name}: expected a number or per-row values broadcastable to the batch shape "
            f"{batch_shape} of logits, got shape {tuple(value.shape)}"
        )
    return value.broadcast_to(batch_shape).reshape(-1)


def _check_values(logits, batch_shape, parameters):
    """Raise the reference's error for bad tensor values, reading one flag vector (one sync);
    return each row's largest logit (``batch_shape``, ``logits``' dtype), which the softmax
    reuses."""
    bad_rows = [_bad_rows(parameter) for parameter in parameters]
    top = logits.amax(-1)  # [...]: NaN if the row has a NaN, else its largest entry
    flags = [
        ~(top < math.inf).all(),  # a NaN or a +inf somewhere
        (top == -math.inf).any(),  # a row of only -inf
        *(bad.any() for bad in bad_rows),
    ]
    found = torch.stack(flags).tolist()  # the one host synchronisation
    if found[0]:
        raise InvalidDistribution("logits: NaN or +inf entries")
    if found[1]:
        raise InvalidDistribution("logits: a row has every entry -inf")
    for parameter, bad, flagged in zip(parameters, bad_rows, found[2:], strict=True):
        if flagged:
            flat = int(bad.nonzero()[0, 0])
            value = parameter.rows[flat].item()
            row = tuple(int(i) for i in np.unravel_index(flat, batch_shape))
            try:
                _check_scalar(parameter.name, value)
            except ValueError as error:
                raise ValueError(f"{error} at row {row}") from None
            raise AssertionError("unreachable: a flagged value passed the scalar check")
    return top


def _bad_rows(parameter: _Parameter) -> torch.Tensor:
    """``[R]`` bool: the per-row tensor values the reference would refuse (host rows: none)."""
    rows = parameter.rows
    if parameter.host:
        return torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
    floating = rows.is_floating_point()
    if parameter.name == "temperature":
        return ~(torch.isfinite(rows) & (rows >= 0)) if floating else rows < 0
    if parameter.name == "top_k":
        if not floating:
            return rows < 1
        return ~(torch.isfinite(rows) & (rows == rows.floor()) & (rows >= 1))
    return ~((rows > 0) & (rows <= 1))
