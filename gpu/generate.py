r"""Keyed decoding on a model pair, batched: ``generate(scheme, pair, shape, length, key=...)``.

Lowers :func:`specsampling.generate` for the keyed couplings (``gumbel``, ``poisson``, ``gls``,
``gls_strong``). Every round drafts a tree for each unfinished stream from the keyed
exponentials (:meth:`~specsampling.gpu.schemes.coupled.KeyedLowering.draft`), scores every
drafted node with the target (one table ``[B, M, V]``, as one target pass over the tree would)
and walks the target's path (:meth:`~specsampling.gpu.schemes.coupled.KeyedLowering.walk`);
the emitted tokens extend each stream until it holds ``length`` tokens.

Streams. ``B`` streams run side by side; stream ``b`` is decoded with key

.. math:: k_b = (\mathrm{key} + b) \bmod 2^{64}

for an integer ``key``, or ``key[b]`` for a sequence of keys. Stream ``b``'s tokens equal
``ss.generate(scheme, pair, shape, length, rng, key=k_b, prefix=prefix, window=window)`` token
for token (any ``rng``: a keyed round reads no other randomness), whatever the other streams.

The model pair is read through its numpy methods, one call per row and node (unavoidable for a
:class:`~specsampling.pairs.ModelPair`); the race, the trie, the contexts and the walk are
batched tensors. The target is read at every drafted node, not only on the walked path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

import specsampling as ss
from specsampling.keyed import KeyedNoise
from specsampling.keyed.laws import as_floats
from specsampling.pairs import check_model_pair
from specsampling.shapes import check_shape
from specsampling.validation import check_positive_int, check_prefix

from . import keyed as gk
from .schemes import SCHEMES, get_lowering
from .schemes.base import Verified
from .schemes.coupled import Drafted, DraftPlan, KeyedLowering

_TWO64 = 1 << 64


class KeyedGeneration(NamedTuple):
    """The streams of :func:`generate`.

    ``tokens [B, length]`` holds stream ``b`` in row ``b``; ``num_rounds [B]`` the rounds each
    stream took (the reference ``len(generation.rounds)``); ``keys`` the key of every stream.
    """

    tokens: torch.Tensor  # [B, length]
    num_rounds: torch.Tensor  # [B]
    keys: tuple[int, ...]

    def tolist(self) -> list[list[int]]:
        """The streams as lists of token ids, row ``b`` first (``tokens.tolist()``)."""
        out: list[list[int]] = self.tokens.tolist()
        return out


def row_keys(key: Any, batch_size: int | None = None) -> tuple[int, ...]:
    """The key of every stream: ``(key + b) mod 2**64`` for an int, or the given sequence.

    >>> row_keys(2**64 - 1, 3)
    (18446744073709551615, 0, 1)
    >>> row_keys([5, 9])
    (5, 9)
    """
    if isinstance(key, (str, bytes, bytearray)):
        raise ValueError(
            f"key: expected an integer in [0, 2**64) or a sequence of them, got {key!r}"
        )
    if isinstance(key, (np.ndarray, torch.Tensor)):
        if key.ndim == 0:
            key = key.item()  # one key, as the reference takes it
        elif key.ndim != 1:
            raise ValueError(
                f"key: expected one key per stream (a 1-D sequence), got shape {tuple(key.shape)}"
            )
    if isinstance(key, (Sequence, np.ndarray, torch.Tensor)):
        keys = tuple(key.tolist() if isinstance(key, (np.ndarray, torch.Tensor)) else key)
        if not keys:
            raise ValueError("key: expected at least one key")
        if batch_size is not None and check_positive_int(batch_size, "batch_size") != len(keys):
            raise ValueError(f"batch_size: {batch_size} rows but {len(keys)} keys were given")
    else:
        size = 1 if batch_size is None else check_positive_int(batch_size, "batch_size")
        KeyedNoise(key)  # validates: an integer in [0, 2**64)
        keys = tuple((int(key) + b) % _TWO64 for b in range(size))
    for index, value in enumerate(keys):
        if isinstance(value, (Sequence, np.ndarray, torch.Tensor, bytes, bytearray)):
            raise ValueError(f"key[{index}]: expected an integer in [0, 2**64), got {value!r}")
        try:
            KeyedNoise(value)
        except ValueError as error:
            reason = str(error).removeprefix("key: ")
            raise ValueError(f"key[{index}]: {reason}") from None
    return tuple(int(k) for k in keys)


def _keyed_lowering(scheme: Any) -> KeyedLowering:
    lowering = get_lowering(scheme)
    if not isinstance(lowering, KeyedLowering):
        keyed = sorted(name for name, obj in SCHEMES.items() if isinstance(obj, KeyedLowering))
        raise ValueError(
            f"scheme: {lowering.name!r} does not use keyed noise; generate runs the keyed "
            f"couplings {keyed} (tree verifiers: specsampling.gpu.verify)"
        )
    return lowering


def keyed_round(
    lowering: KeyedLowering,
    plan: DraftPlan,
    pair: Any,
    sequences: Sequence[Sequence[int]],
    keys: torch.Tensor,  # [B] int64-held words
    noise: KeyedNoise,
) -> tuple[Drafted, Verified]:
    """One keyed round after each of ``sequences`` (prompt included), row ``b`` with
    ``keys[b]``: the drafted trees and the verdicts, as the reference ``sample_keyed`` with
    ``KeyedNoise(keys[b], noise.window, noise.start)`` (``noise`` gives window and start only).

    >>> import specsampling as ss
    >>> from specsampling.gpu.schemes.gumbel import POISSON
    >>> pair, shape = ss.pairs.Random(5, seed=0), ss.Shape.star(2, replacement=False)
    >>> drafted, out = keyed_round(POISSON, POISSON.plan(shape), pair, [(1,), (2, 3)],
    ...                            gk.as_words([7, 7]), KeyedNoise(7, start=1))
    >>> [tuple(ss.SCHEMES["poisson"].sample_keyed(pair, shape, KeyedNoise(7, start=1), p)[1])
    ...  for p in [(1,), (2, 3)]] == list(zip(out.node.tolist(), out.token.tolist()))
    True
    """
    vocab_size = int(pair.vocab_size)
    seqs = [list(seq) for seq in sequences]
    device = keys.device

    def node_sequences(paths: torch.Tensor, depth: torch.Tensor) -> list[list[int]]:
        paths_h, depth_h = paths.tolist(), depth.tolist()
        return [s + p[: max(d, 0)] for s, p, d in zip(seqs, paths_h, depth_h, strict=True)]

    def draft_probs_of(paths: torch.Tensor, depth: torch.Tensor, alive: torch.Tensor) -> Any:
        out = np.zeros((len(seqs), vocab_size))  # [B, V]
        contexts = node_sequences(paths, depth)
        for row, (context, ok) in enumerate(zip(contexts, alive.tolist(), strict=True)):
            if ok:  # raced as the pair gives it (validated, not renormalised: the reference's)
                probs = pair.draft(tuple(context))
                as_floats(probs, "draft", vocab_size)
                out[row] = np.asarray(probs, dtype=np.float64)
        return torch.from_numpy(out).to(device)

    def contexts_of(paths: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        return gk.context_words(noise, node_sequences(paths, depth), device=device)

    roots = gk.context_words(noise, seqs, device=device)  # [B]
    drafted = lowering.draft(plan, keys, roots, draft_probs_of, contexts_of)
    table = np.zeros((len(seqs), plan.num_nodes, vocab_size))  # [B, M, V]
    sizes = drafted.num_nodes.tolist()
    paths_h, depth_h = drafted.paths.tolist(), drafted.depth.tolist()
    for row, seq in enumerate(seqs):
        for n in range(sizes[row]):
            context = tuple(seq + paths_h[row][n][: depth_h[row][n]])
            table[row, n] = as_floats(pair.target(context), "target", vocab_size)
    target = torch.from_numpy(table).to(device)  # [B, M, V]
    return drafted, lowering.walk(drafted, plan, keys, target)


def generate(
    scheme: Any,
    pair: Any,
    shape: ss.Shape,
    length: int,
    *,
    key: Any,
    batch_size: int | None = None,
    prefix: Sequence[int] = (),
    window: int | None = None,
    device: torch.device | str | None = None,
) -> KeyedGeneration:
    """Decode ``batch_size`` keyed streams of ``length`` tokens after ``prefix``.

    Parameters
    ----------
    scheme : str or lowering object
        A keyed coupling: ``"gumbel"``, ``"poisson"``, ``"gls"`` or ``"gls_strong"``.
    pair : ModelPair
        ``vocab_size``, ``target(prefix)``, ``draft(prefix)`` (numpy).
    shape : Shape
        The drafting shape; refused (``UnsupportedShape``) where the reference refuses it.
    length : int
        Tokens per stream, ``>= 1``.
    key : int or sequence of int
        Stream ``b`` uses ``(key + b) mod 2**64``, or ``key[b]`` for a sequence.
    batch_size : int, optional
        Streams; default 1 for an int key, ``len(key)`` for a sequence.
    prefix : sequence of int
        The prompt, shared by every stream (its length is the keyed noise's ``start``).
    window : int, optional
        Watermark window: noise keyed by the hash of the previous ``window`` tokens.
    device : torch.device or str, optional

    Returns
    -------
    KeyedGeneration
        ``tokens [B, length]``, ``num_rounds [B]``, ``keys``.

    Examples
    --------
    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Random(6, seed=2)
    >>> out = generate("gls", pair, ss.Shape.paths(2, 2), 8, key=4, batch_size=2)
    >>> want = [ss.generate("gls", pair, ss.Shape.paths(2, 2), 8, np.random.default_rng(0),
    ...                     key=k) for k in (4, 5)]
    >>> out.tokens.tolist() == [list(w) for w in want], out.keys
    (True, (4, 5))
    """
    lowering = _keyed_lowering(scheme)
    check_model_pair(pair)
    check_shape(shape)
    count = check_positive_int(length, "length")
    keys = row_keys(key, batch_size)
    start = check_prefix(prefix, pair.vocab_size)
    # Validates the window; context_words reads only the window and the start from it.
    noise = KeyedNoise(keys[0], window, start=len(start))
    plan = lowering.plan(shape)
    sequences = [list(start) for _ in keys]
    rounds = [0] * len(keys)
    while True:
        live = [b for b, seq in enumerate(sequences) if len(seq) - len(start) < count]
        if not live:
            break
        seqs = [sequences[b] for b in live]
        keys_t = gk.as_words([keys[b] for b in live], device)  # [B']
        _, out = keyed_round(lowering, plan, pair, seqs, keys_t, noise)
        emitted, counts = out.tokens.tolist(), out.num_emitted.tolist()
        for row, b in enumerate(live):
            sequences[b].extend(emitted[row][: counts[row]])
            rounds[b] += 1
    tokens = torch.tensor(
        [seq[len(start) : len(start) + count] for seq in sequences], dtype=torch.long
    )
    return KeyedGeneration(
        tokens.to(device), torch.tensor(rounds, dtype=torch.long, device=device), keys
    )


__all__ = ["KeyedGeneration", "generate", "keyed_round", "row_keys"]
