"""Counter-based keyed noise: uniforms and exponentials indexed by (key, context, row, token).

Coupling schemes (Gumbel, Poisson list, GLS) and the watermark read one exponential per
(position, row, token). Here every value is a pure function of its index, so any party can
regenerate any single value without generating the others, and nothing depends on rounds,
draft steps, batch position or how many values were drawn before (peer bugs B3, B8, B11).

The field is a vectorised splitmix64 hash. Each index word is absorbed in turn,

.. math::

    h_0 = \\mathrm{mix}(\\mathrm{key} \\oplus s_0), \\quad
    h_{k+1} = \\mathrm{mix}(h_k \\oplus \\mathrm{mix}(w_k + s_{k+1})),

over the words ``w = (context, row, token)`` with distinct odd salts ``s``, where ``mix`` is the
splitmix64 finaliser (a bijection of 64-bit words with full avalanche). The top 53 bits give
``U = (h >> 11) / 2**53`` in ``[0, 1 - 2**-53]``: float64 always, never exactly one (peer bug B9).
Exponentials are ``E = -log1p(-U)``, never ``-log(U)``: ``U = 0`` gives ``E = 0`` and the largest
``U`` gives the finite ``53 ln 2``.

The hash is statistically strong (the tests check uniformity and independence) but it is not a
cryptographic PRF: a watermark meant to resist an adversary who studies outputs should swap in a
keyed cryptographic hash with the same signature.

A *context* is a 64-bit word naming where the noise is used: :func:`position_context` for
absolute positions and :func:`context_hash` for the previous ``window`` tokens (watermark). The
two are salted apart, so a position never collides with a context hash by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..validation import check_positive_int

U64: type[np.uint64] = np.uint64
Words = npt.NDArray[np.uint64]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_SALTS = (0x243F6A8885A308D3, 0x13198A2E03707345, 0xA4093822299F31D1, 0x082EFA98EC4E6C89)
_POSITION_SALT = 0x452821E638D01377
_CONTEXT_SALT = 0xBE5466CF34E90C6D
#: Marks an absent token in a context shorter than the window (token ids are < 2**63).
_ABSENT = _MASK
#: Resolution of the uniforms: ``U`` is a multiple of ``2**-53``.
RESOLUTION = 2.0**-53
#: The largest uniform the field can produce, ``1 - 2**-53``.
LARGEST_UNIFORM = 1.0 - RESOLUTION


def _mix(x: Words) -> Words:
    """The splitmix64 finaliser, elementwise on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> U64(30))
        x = x * U64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> U64(27))
        x = x * U64(0x94D049BB133111EB)
    out: Words = x ^ (x >> U64(31))
    return out


def _words(value: Any, name: str) -> Words:
    """Validate integers in ``[0, 2**64)`` and return them as a uint64 array."""
    arr = np.asarray(value)
    if arr.dtype == np.uint64:
        return arr.astype(np.uint64)
    if arr.dtype == object or arr.dtype.kind not in "iub":
        if not all(isinstance(v, (int, np.integer)) for v in np.ravel(arr)):
            raise ValueError(f"{name}: expected integers, got {value!r}")
        if any(not 0 <= int(v) <= _MASK for v in np.ravel(arr)):
            raise ValueError(f"{name}: integers must lie in [0, 2**64)")
        return np.array([int(v) for v in np.ravel(arr)], dtype=np.uint64).reshape(arr.shape)
    if arr.dtype.kind == "b":
        raise ValueError(f"{name}: expected integers, got booleans")
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{name}: integers must lie in [0, 2**64), got a negative value")
    return arr.astype(np.uint64)


def _absorb(state: Words, word: Words, salt: int) -> Words:
    with np.errstate(over="ignore"):
        return _mix(state ^ _mix(word + U64(salt)))


def hash_bits(key: int, context: Any, row: Any, tokens: Any) -> Words:
    """The raw 64-bit hash of each index; ``context``, ``row`` and ``tokens`` broadcast."""
    state = _mix(_words(key, "key").reshape(()) ^ U64(_SALTS[0]))
    state = _absorb(state, _words(context, "context"), _SALTS[1])
    state = _absorb(state, _words(row, "row"), _SALTS[2])
    return _absorb(state, _words(tokens, "tokens"), _SALTS[3])


def to_unit(bits: Words) -> npt.NDArray[np.float64]:
    """Map 64-bit words to float64 uniforms ``(bits >> 11) * 2**-53`` in ``[0, 1 - 2**-53]``.

    >>> to_unit(np.array([0, 2**64 - 1], dtype=np.uint64)).tolist() == [0.0, LARGEST_UNIFORM]
    True
    """
    out: npt.NDArray[np.float64] = (bits >> U64(11)).astype(np.float64) * RESOLUTION
    return out


def uniforms(key: int, context: Any, row: Any, tokens: Any) -> npt.NDArray[np.float64]:
    """Keyed uniforms in ``[0, 1)``, one per broadcast index ``(context, row, token)``.

    Parameters
    ----------
    key : int
        Secret or seed, in ``[0, 2**64)``.
    context : int or array_like of int
        Absolute position (via :func:`position_context`) or a context hash, in ``[0, 2**64)``.
    row : int or array_like of int
        Row (independent process index, e.g. the draft index of GLS).
    tokens : int or array_like of int, shape (...)
        Token ids.

    Returns
    -------
    ndarray of float64, the broadcast shape
        Multiples of ``2**-53`` in ``[0, 1 - 2**-53]``.

    Examples
    --------
    >>> batch = uniforms(7, position_context(3), 0, np.arange(5))
    >>> bool(batch[4] == uniforms(7, position_context(3), 0, 4))
    True
    >>> batch.dtype, bool(np.all((batch >= 0) & (batch < 1)))
    (dtype('float64'), True)
    """
    return to_unit(hash_bits(key, context, row, tokens))


def exponentials(key: int, context: Any, row: Any, tokens: Any) -> npt.NDArray[np.float64]:
    """Keyed Exp(1) values ``E = -log1p(-U)`` with ``U`` from :func:`uniforms`.

    .. math:: E = -\\log(1 - U), \\quad U \\in [0, 1 - 2^{-53}]

    so ``E`` lies in ``[0, 53 \\ln 2]`` and is never infinite.

    >>> float(exponentials(0, position_context(0), 0, 0)) >= 0.0
    True
    """
    out: npt.NDArray[np.float64] = -np.log1p(-uniforms(key, context, row, tokens))
    return out


def position_context(position: Any) -> Any:
    """The context word of an absolute position (salted apart from context hashes).

    >>> position_context(0) != position_context(1)
    True
    """
    words = _mix(_words(position, "position") ^ U64(_POSITION_SALT))
    return int(words) if words.ndim == 0 else words


def context_hashes(tokens: Any, window: int) -> Words:
    """``out[t]`` = :func:`context_hash` of ``tokens[:t]`` for every ``t`` in ``0..len(tokens)``.

    Vectorised over positions: ``window`` absorb steps of ``len(tokens) + 1`` words each.
    """
    check_positive_int(window, "window")
    seq = _words(np.asarray(tokens, dtype=np.int64).ravel(), "tokens")
    n = seq.shape[0]
    state = np.full(n + 1, _mix(np.array(window ^ _CONTEXT_SALT, dtype=np.uint64)))
    ends = np.arange(n + 1)
    for offset in range(window, 0, -1):
        index = ends - offset
        word = np.where(index >= 0, seq[np.clip(index, 0, None)] if n else U64(0), U64(_ABSENT))
        state = _absorb(state, word.astype(np.uint64), _GOLDEN)
    return state


def context_hash(tokens: Any, window: int) -> int:
    """Hash of the previous ``window`` tokens (fewer at the start of a text), as a context word.

    >>> context_hash([5, 1, 2], 2) == context_hash([9, 1, 2], 2)
    True
    >>> context_hash([1, 2], 2) == context_hash([2], 2)
    False
    """
    return int(context_hashes(tokens, window)[-1])


@dataclass(frozen=True)
class KeyedNoise:
    """The keyed noise of one decode: a key, an optional watermark window and the prompt length.

    :meth:`context` names the noise of the position after a sequence: its absolute position
    when ``window`` is ``None``; otherwise the hash of its previous ``window`` tokens, falling
    back to the absolute position when that hash already named an earlier position at or after
    ``start`` (a repeated context is not watermarked, and every position still gets fresh noise;
    specs §C.5). The context depends on the sequence alone, never on rounds or draft steps, so
    drafter, verifier and plain decoding that reach the same sequence read the same values.

    Parameters
    ----------
    key : int
        Seed and watermark key, in ``[0, 2**64)``.
    window : int, optional
        Context length ``h`` of the watermark; ``None`` keys by absolute position.
    start : int
        Length of the prompt: contexts before it never count as seen.

    Examples
    --------
    >>> noise = KeyedNoise(5, window=1)
    >>> noise.context((3, 1)) == noise.context((2, 1))  # same previous token
    True
    >>> noise.context((1, 1)) == noise.context((1,))  # seen at position 1: falls back
    False
    >>> noise.exponentials((3,), rows=2, vocab_size=4).shape
    (2, 4)
    """

    key: int
    window: int | None = None
    start: int = 0

    def __post_init__(self) -> None:
        _words(self.key, "key")
        if self.window is not None:
            check_positive_int(self.window, "window")
        check_positive_int(self.start, "start", minimum=0)

    def context(self, sequence: Any) -> int:
        """The context word of the position right after ``sequence`` (prompt included)."""
        length = len(sequence)
        if self.window is None:
            return int(position_context(length))
        hashes = context_hashes(sequence, self.window)
        word = hashes[-1]
        if np.any(hashes[self.start : length] == word):
            return int(position_context(length))
        return int(word)

    def exponentials(self, sequence: Any, rows: int, vocab_size: int) -> npt.NDArray[np.float64]:
        """``E[k, z]`` for rows ``k < rows`` and tokens ``z < vocab_size`` after ``sequence``."""
        grid = np.arange(rows)[:, None], np.arange(vocab_size)[None, :]
        return exponentials(self.key, self.context(sequence), *grid)
