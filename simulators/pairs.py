r"""LLM-like synthetic model pairs at real vocabulary sizes: :class:`Synthetic`.

A synthetic pair stands in for a (target, draft) pair of language models when what matters is
the *shape* of their distributions, not their text: a Zipf-like rank profile, a context-dependent
ranking and sharpness, a draft that is the target seen through logit noise, and a divergence that
grows with depth in the drafted tree (the observation of DDTE, Thomas et al., arXiv 2602.16994).
Every value is a pure function of ``(seed, prefix)`` through the counter-based hash of
:mod:`specsampling.gpu.keyed`, so a pair is reproducible on any host and any batch size.

**The model.** A prefix ``c`` of length ``n`` has a 64-bit hash :math:`h(c)`, absorbed token by
token. From :math:`h` come a ranking of the vocabulary :math:`\pi_c(i) = \rho_{k}((i + o) \bmod V)`
(one of :data:`NUM_RANKINGS` fixed random permutations :math:`\rho_k`, read from an offset
:math:`o`), a second one :math:`\sigma_c` for the draft's noise, and a standard normal
:math:`g_c`. With the rank profile :math:`z_r = -\mathrm{zipf}\cdot\ln(r + 1)` and a fixed table
of standard normals :math:`\varepsilon`,

.. math::

    \ell^{p}_c(i) = e^{\mathrm{spread}\cdot g_c}\, z_{\pi_c(i)}, \qquad
    \ell^{q}_c(i) = \ell^{p}_c(i) + s(d)\, \varepsilon_{\sigma_c(i)}, \qquad
    s(d) = \mathrm{divergence}\,(1 + \mathrm{depth\_growth}\cdot d),

where :math:`d = \max(0, n - \mathrm{context\_length})` is the depth below a root context. Both
logit vectors then go through the one processing function (:func:`specsampling.gpu.process`:
``temperature``, ``top_k``, ``top_p``), target and draft alike. So ``divergence = 0`` gives
``draft == target``, ``spread`` varies the entropy from context to context, ``zipf`` sets how
heavy the head is, and ``temperature = 0`` makes both greedy (one-hot).

**Two faces.** The pair is a :class:`specsampling.pairs.ModelPair` (``target(prefix)`` and
``draft(prefix)`` as float64 numpy arrays), so the exact engine, ``certify`` and the reference
samplers take it at small vocabularies; and it evaluates whole batches of tree nodes at once on
torch (:meth:`Synthetic.node_probs`), which is what the Monte-Carlo estimators use at
``V = 32k`` to ``152k``. Both faces run the same code, so they agree bit for bit.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from specsampling.gpu import keyed
from specsampling.gpu.processing import process
from specsampling.validation import check_positive_int

_ROOT_SALT = keyed._signed(0x3C6EF372FE94F82B)
_TOKEN_SALT = keyed._signed(0xA54FF53A5F1D36F1)
#: Salts of the per-context words: ranking (a, b), draft noise ranking (a, b), sharpness (2).
_WORD_SALTS = tuple(
    keyed._signed(s)
    for s in (
        0x510E527FADE682D1,
        0x9B05688C2B3E6C1F,
        0x1F83D9ABFB41BD6B,
        0x5BE0CD19137E2179,
        0xCBBB9D5DC1059ED8,
        0x629A292A367CD507,
    )
)
_TABLE_SALT = keyed._signed(0x9159015A3070DD17)
#: Random rankings of the vocabulary a pair draws contexts from (each read at any offset).
NUM_RANKINGS = 16
#: Most elements one torch evaluation holds at once (nodes x vocabulary), to bound memory.
_CHUNK_ELEMENTS = 1 << 23


def _normal(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Standard normals from two independent words (Box-Muller on their uniforms)."""
    u1, u2 = keyed.to_unit(first), keyed.to_unit(second)
    return torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2.0 * math.pi * u2)


class Synthetic:
    """A context-dependent, LLM-like (target, draft) pair, deterministic in ``(seed, prefix)``.

    Parameters
    ----------
    vocab_size : int, default 32000
        ``V >= 2`` (real vocabularies: 32,000 for Llama 2, 151,936 for Qwen2.5).
    seed : int, default 0
        Selects the pair; every distribution is a pure function of ``(seed, prefix)``.
    temperature : float, default 1.0
        Applied to target and draft alike; ``0`` is greedy (one-hot on the argmax).
    divergence : float, default 0.5
        Scale of the draft's logit noise at depth 0 (``0``: the draft equals the target).
    zipf : float, default 1.5
        Exponent of the rank profile ``-zipf * ln(rank + 1)`` (larger: a heavier head, lower
        entropy; at the defaults and ``V = 32000`` the target's entropy averages about 3.5 nats
        over contexts and its top token about 0.45).
    spread : float, default 0.5
        Standard deviation of the log-sharpness across contexts (``0``: every context has the
        same entropy).
    depth_growth : float, default 0.0
        The draft noise at depth ``d`` below the root context is ``divergence * (1 +
        depth_growth * d)``.
    context_length : int, default 4
        Length of the root contexts :meth:`roots` draws; depth is counted below it (a prefix
        of length ``n`` is at depth ``max(0, n - context_length)``, also when the estimators
        are given their own ``prefix``).
    top_k, top_p : optional
        Processing applied after the temperature, to both models (:func:`specsampling.process`).
    device : torch.device or str, optional
        Where :meth:`node_probs` computes (default CPU).

    Examples
    --------
    >>> import specsampling as ss
    >>> from specsampling.simulators import pairs
    >>> pair = pairs.Synthetic(vocab_size=4, seed=0, divergence=0.5)
    >>> p = pair.target((1, 2, 3, 0))
    >>> p.shape, round(float(p.sum()), 12)
    ((4,), 1.0)
    >>> bool((pair.draft((1, 2, 3, 0)) != p).any())  # the draft sees the target through noise
    True
    >>> float(ss.expected_emitted("standard", pair, ss.Shape.chain(2), prefix=(1, 2, 3, 0))) > 1
    True
    """

    def __init__(
        self,
        vocab_size: int = 32000,
        *,
        seed: int = 0,
        temperature: float = 1.0,
        divergence: float = 0.5,
        zipf: float = 1.5,
        spread: float = 0.5,
        depth_growth: float = 0.0,
        context_length: int = 4,
        top_k: int | None = None,
        top_p: float | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self._vocab_size = check_positive_int(vocab_size, "vocab_size", minimum=2)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
        self.seed = int(seed)
        for name, value in (
            ("temperature", temperature),
            ("divergence", divergence),
            ("zipf", zipf),
            ("spread", spread),
            ("depth_growth", depth_growth),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
                raise TypeError(f"{name}: expected a number >= 0, got {value!r}")
            if not (math.isfinite(float(value)) and float(value) >= 0):
                raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        self.temperature = float(temperature)
        self.divergence = float(divergence)
        self.zipf = float(zipf)
        self.spread = float(spread)
        self.depth_growth = float(depth_growth)
        self.context_length = check_positive_int(context_length, "context_length", minimum=0)
        self.top_k, self.top_p = top_k, top_p
        # Check the processing parameters once, on a tiny row (the reference's errors).
        process(torch.zeros(1, 2, dtype=torch.float64), self.temperature, top_k, top_p)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        vocab = self._vocab_size
        # Rankings: NUM_RANKINGS random permutations of the vocabulary, each read cyclically
        # from a context's offset; the profile and the noise table are stored already permuted
        # and doubled, so a context's row is one contiguous slice (no per-token arithmetic).
        seed_word = self._seed_hash()
        ids = torch.arange(vocab, dtype=torch.long)
        profile = -self.zipf * torch.log1p(ids.to(torch.float64))
        noise = _normal(
            keyed.mix(seed_word ^ _TABLE_SALT ^ keyed.mix(2 * ids)),
            keyed.mix(seed_word ^ _TABLE_SALT ^ keyed.mix(2 * ids + 1)),
        )
        rankings = [
            torch.argsort(keyed.to_unit(keyed.mix(seed_word ^ keyed.mix(ids + vocab * (k + 1)))))
            for k in range(2 * NUM_RANKINGS)
        ]
        self._profiles = torch.stack([profile[r].repeat(2) for r in rankings[:NUM_RANKINGS]]).to(
            self.device, torch.float32
        )  # [R, 2V]
        self._noises = torch.stack([noise[r].repeat(2) for r in rankings[NUM_RANKINGS:]]).to(
            self.device, torch.float32
        )  # [R, 2V]
        self._cache: OrderedDict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._cache_size = max(8, (1 << 24) // vocab)

    # -- the ModelPair face -------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """``V``."""
        return self._vocab_size

    def target(self, prefix: Sequence[int]) -> npt.NDArray[np.float64]:
        """The processed target distribution after ``prefix`` (float64, sums to 1)."""
        return self._both(prefix)[0]

    def draft(self, prefix: Sequence[int]) -> npt.NDArray[np.float64]:
        """The processed draft distribution after ``prefix`` (float64, sums to 1)."""
        return self._both(prefix)[1]

    def _both(self, prefix: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        key = tuple(int(t) for t in prefix)
        if any(not 0 <= t < self._vocab_size for t in key):
            raise ValueError(f"prefix: token ids must lie in [0, {self._vocab_size}), got {key}")
        hit = self._cache.get(key)
        if hit is None:
            hashes = self.hash_prefixes([key])
            depth = torch.tensor([len(key)], device=self.device)
            target, draft = self.node_probs(hashes, depth)
            hit = (target[0].cpu().numpy(), draft[0].cpu().numpy())
            self._cache[key] = hit
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return hit

    def __repr__(self) -> str:
        extra = "".join(
            f", {name}={getattr(self, name)!r}"
            for name, default in (
                ("zipf", 1.5),
                ("spread", 0.5),
                ("depth_growth", 0.0),
                ("context_length", 4),
                ("top_k", None),
                ("top_p", None),
            )
            if getattr(self, name) != default
        )
        return (
            f"Synthetic(vocab_size={self._vocab_size}, seed={self.seed}, "
            f"temperature={self.temperature!r}, divergence={self.divergence!r}{extra})"
        )

    # -- the batched face ---------------------------------------------------------------------

    def roots(self, num: int, generator: Any) -> list[tuple[int, ...]]:
        """``num`` root contexts of ``context_length`` uniform tokens, drawn from ``generator``.

        ``generator`` is what the estimators take: ``None`` (fresh entropy), an integer seed or
        a ``numpy.random.Generator``.

        >>> Synthetic(vocab_size=8).roots(2, 0) == Synthetic(vocab_size=8).roots(2, 0)
        True
        """
        from .sources import as_generator  # sources drafts from this module's pairs

        count = check_positive_int(num, "num", minimum=1)
        rng = as_generator(generator)
        drawn = rng.integers(0, self._vocab_size, size=(count, self.context_length))
        return [tuple(int(t) for t in row) for row in drawn]

    def _seed_hash(self) -> torch.Tensor:
        return keyed.mix(keyed.as_words(self.seed, self.device) ^ _ROOT_SALT)

    def extend(self, hashes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The hashes of the prefixes ``hashes`` each extended by one token (int64 words)."""
        return keyed.mix(hashes ^ keyed.mix(tokens.to(torch.long) + _TOKEN_SALT))

    def hash_prefixes(self, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        """The 64-bit hash of every prefix, as int64 words ``[len(prefixes)]``."""
        lengths = [len(p) for p in prefixes]
        width = max(lengths, default=0)
        padded = torch.zeros(len(prefixes), width, dtype=torch.long)
        for row, prefix in enumerate(prefixes):
            if prefix:
                padded[row, : len(prefix)] = torch.as_tensor(list(prefix), dtype=torch.long)
        padded = padded.to(self.device)
        size = torch.tensor(lengths, dtype=torch.long, device=self.device)
        out = self._seed_hash().expand(len(prefixes)).clone()
        for column in range(width):
            more = column < size
            out = torch.where(more, self.extend(out, padded[:, column]), out)
        return out

    def node_probs(
        self, hashes: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype = torch.float64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Target and draft distributions ``[M, V]`` of the prefixes with these hashes and lengths.

        Parameters
        ----------
        hashes : LongTensor [M]
            Prefix hashes (:meth:`hash_prefixes`, :meth:`extend`).
        lengths : LongTensor [M]
            Prefix lengths (the depth is ``max(0, length - context_length)``).
        dtype : torch.dtype, default float64
            float64, or float32 for speed (processed in float32).
        """
        target, draft = self._evaluate(hashes, lengths, dtype, with_target=True)
        assert target is not None
        return target, draft

    def draft_probs(
        self, hashes: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """The draft distributions ``[M, V]`` alone (what drafting reads), as :meth:`node_probs`."""
        return self._evaluate(hashes, lengths, dtype, with_target=False)[1]

    def _evaluate(
        self, hashes: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype, with_target: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        rows = int(hashes.shape[0])
        vocab = self._vocab_size
        draft = torch.empty(rows, vocab, dtype=dtype, device=self.device)
        target = torch.empty_like(draft) if with_target else None
        step = max(1, _CHUNK_ELEMENTS // vocab)
        for start in range(0, rows, step):
            part = slice(start, min(rows, start + step))
            t_logits, d_logits = self._logits(hashes[part], lengths[part], dtype)
            if target is not None:
                target[part] = self._process(t_logits)
            draft[part] = self._process(d_logits)
        return target, draft

    def _logits(
        self, hashes: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        words = [keyed.mix(hashes ^ salt) for salt in _WORD_SALTS]
        vocab = self._vocab_size

        def pick(word: torch.Tensor, count: int) -> torch.Tensor:
            return (keyed.to_unit(word) * count).long().clamp_max(count - 1)

        def rows(tables: torch.Tensor, which: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
            windows = tables.unfold(1, vocab, 1)  # [R, V + 1, V]: every cyclic slice, a view
            return windows[which, offset].to(torch.float64)  # [M, V]: one contiguous copy a row

        sharp = torch.exp(self.spread * _normal(words[4], words[5]))  # [M]
        target = sharp[:, None] * rows(
            self._profiles, pick(words[0], NUM_RANKINGS), pick(words[1], vocab)
        )
        depth = (lengths.to(torch.float64) - self.context_length).clamp_min(0)
        scale = self.divergence * (1 + self.depth_growth * depth)
        noise = rows(self._noises, pick(words[2], NUM_RANKINGS), pick(words[3], vocab))
        draft = target + scale[:, None] * noise
        return target.to(dtype), draft.to(dtype)

    def _process(self, logits: torch.Tensor) -> torch.Tensor:
        if self.temperature > 0 and self.top_k is None and self.top_p in (None, 1, 1.0):
            return torch.softmax(logits / self.temperature, dim=-1)
        return process(logits, self.temperature, self.top_k, self.top_p, validate=False)


__all__ = ["Synthetic"]
