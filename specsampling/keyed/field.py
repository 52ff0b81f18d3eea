"""Counter-based keyed noise: uniforms and exponentials indexed by (key, context, row, token).

Coupling schemes (Gumbel, Poisson list, GLS) and the watermark read one exponential per
(position, row, token). Here every value is a pure function of its index, so any party can
regenerate any single value without generating the others, and nothing depends on rounds,
draft steps, batch position or how many values were drawn before (peers got this wrong:
vllm-project/vllm#54282, flashinfer-ai/flashinfer#4861, vllm-project/vllm-ascend#13608).

The field is a vectorised splitmix64 hash. Each index word is absorbed in turn,

.. math::

    h_0 = \\mathrm{mix}(\\mathrm{key} \\oplus s_0), \\quad
    h_{k+1} = \\mathrm{mix}(h_k \\oplus \\mathrm{mix}(w_k + s_{k+1})),

over the words ``w = (context, row, token)`` with distinct odd salts ``s``, where ``mix`` is the
splitmix64 finaliser (a bijection of 64-bit words with full avalanche). The top 53 bits give
``U = (h >> 11) / 2**53`` in ``[0, 1 - 2**-53]``: float64 always, never exactly one
(fp32 draws bottom out at 2^-24: vllm-project/vllm#43150).
Exponentials are ``E = -log1p(-U)``, never ``-log(U)``: ``U = 0`` gives ``E = 0`` and the largest
``U`` gives the finite ``53 ln 2``.
``log1p`` is the field's own portable :func:`log1p` (un-fused fdlibm steps), not ``np.log1p``,
whose last bit depends on the host: the exponentials are the same bits on every host and in the
torch lowering (:mod:`specsampling.gpu.keyed`). :func:`log` is the matching portable ``log``.

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
    """Validate integers in ``[0, 2**64)`` and return them as a uint64 array.

    Python ints (and lists of them) are read exactly, whatever their mix of sizes: numpy would
    turn ``[1, 2**63]`` into float64, so they go through an object array.

    >>> _words([1, 2**63, 2**64 - 1], "words").tolist() == [1, 2**63, 2**64 - 1]
    True
    """
    arr = value if isinstance(value, (np.ndarray, np.generic)) else np.array(value, dtype=object)
    arr = np.asarray(arr)
    if arr.dtype == np.uint64:
        return arr.astype(np.uint64)
    if arr.dtype == object or arr.dtype.kind not in "iub":
        flat = np.ravel(arr)
        if any(isinstance(v, (bool, np.bool_)) for v in flat):
            raise ValueError(f"{name}: expected integers, got booleans")
        if not all(isinstance(v, (int, np.integer)) for v in flat):
            raise ValueError(f"{name}: expected integers, got {value!r}")
        if any(not 0 <= int(v) <= _MASK for v in flat):
            raise ValueError(f"{name}: integers must lie in [0, 2**64)")
        return np.array([int(v) for v in flat], dtype=np.uint64).reshape(arr.shape)
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


# fdlibm / glibc ``s_log1p.c`` constants (hex in comments).
_LN2_HI = 6.93147180369123816490e-01  # 3fe62e42 fee00000
_LN2_LO = 1.90821492927058770002e-10  # 3dea39ef 35793c76
_LP = (
    6.666666666666735130e-01,  # 3FE55555 55555593
    3.999999999940941908e-01,  # 3FD99999 9997FA04
    2.857142874366239149e-01,  # 3FD24924 94229359
    2.222219843214978396e-01,  # 3FCC71C5 1D8E78AF
    1.818357216161805012e-01,  # 3FC74664 96CB03DE
    1.531383769920937332e-01,  # 3FC39A09 D078C69F
    1.479819860511658591e-01,  # 3FC2F112 DF3E5244
)
#: ``(int32) 0xbfd2bec3``: glibc's bound of the ``k = 0`` case for negative ``x``.
_K0_THRESHOLD = 0xBFD2BEC3 - (1 << 32)
_TWO54 = 2.0**54


def _high(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The high 32-bit word of float64 values, as a signed int32 value held in int64."""
    out: npt.NDArray[np.int64] = x.view(np.int64) >> 32
    return out


def _with_high(x: npt.NDArray[np.float64], high: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """``x`` with its high 32-bit word replaced by ``high`` (low word kept)."""
    out: npt.NDArray[np.float64] = ((high << 32) | (x.view(np.int64) & 0xFFFFFFFF)).view(np.float64)
    return out


def log1p(x: Any) -> npt.NDArray[np.float64]:
    """``log(1 + x)`` in float64 for ``-1 < x < 2**53``, the same bits on every host.

    The fdlibm algorithm of ``s_log1p.c`` with glibc's order of the polynomial, vectorised
    (every branch is computed and the right one selected) and evaluated *without* fused
    multiply-adds: each step is one correctly rounded IEEE-754 operation, so the result does not
    depend on the host, its SIMD width, its C library or FMA contraction. ``np.log1p`` does:
    numpy's AVX512 loop, glibc with and without FMA differ in the last bit for a few percent of
    the field's uniforms. The torch lowering (:func:`specsampling.gpu.keyed.log1p`) runs the same
    steps and gets the same bits on CPU and CUDA. Error below one ulp.

    Parameters
    ----------
    x : array_like of float
        Values in ``(-1, 2**53)``; the field uses ``x = -U`` in ``(-1, 0]``.

    Returns
    -------
    ndarray of float64, the shape of ``x``

    Examples
    --------
    >>> xs = [-0.0, -2.0**-53, -0.25, -0.5, -(1 - 2.0**-53)]
    >>> [float(v).hex() for v in log1p(xs)]  # doctest: +NORMALIZE_WHITESPACE
    ['-0x0.0p+0', '-0x1.0000000000000p-53', '-0x1.269621134db92p-2', '-0x1.62e42fefa39efp-1',
     '-0x1.25e4f7b2737fap+5']
    """
    shape = np.shape(x)
    x = np.atleast_1d(np.array(x, dtype=np.float64))
    with np.errstate(all="ignore"):
        hx = _high(x)  # signed: negative for x < 0 (and for -0.0)
        ax = hx & 0x7FFFFFFF
        # -0.2929 < x < 0.41422: k = 0 and f = x; otherwise reduce u = 1 + x = 2**k (1 + f).
        reduce = (hx >= 0x3FDA827A) | ((hx <= 0) & (hx > _K0_THRESHOLD))
        u = 1.0 + x
        hu = _high(u)
        k = (hu >> 20) - 1023
        c = np.where(k > 0, 1.0 - (u - x), x - (u - 1.0)) / u
        hu = hu & 0x000FFFFF
        low_half = hu < 0x6A09E
        u = np.where(low_half, _with_high(u, hu | 0x3FF00000), _with_high(u, hu | 0x3FE00000))
        k = np.where(low_half, k, k + 1)
        hu = np.where(low_half, hu, (0x00100000 - hu) >> 2)
        f = np.where(reduce, u - 1.0, x)
        kf = np.where(reduce, k, 0).astype(np.float64)
        c = np.where(reduce, c, 0.0)
        hu = np.where(reduce, hu, 1)
        hfsq = 0.5 * f * f
        # |f| < 2**-20 after the reduction (hu == 0).
        tiny_zero = np.where(kf == 0, 0.0, kf * _LN2_HI + (c + kf * _LN2_LO))
        r_tiny = hfsq * (1.0 - 0.66666666666666666 * f)
        tiny = np.where(kf == 0, f - r_tiny, kf * _LN2_HI - ((r_tiny - (kf * _LN2_LO + c)) - f))
        tiny = np.where(f == 0, tiny_zero, tiny)
        # The general case.
        s = f / (2.0 + f)
        z = s * s
        r1 = z * _LP[0]
        z2 = z * z
        r2 = _LP[1] + z * _LP[2]
        z4 = z2 * z2
        r3 = _LP[3] + z * _LP[4]
        z6 = z4 * z2
        r4 = _LP[5] + z * _LP[6]
        r = r1 + z2 * r2 + z4 * r3 + z6 * r4
        general = np.where(
            kf == 0,
            f - (hfsq - s * (hfsq + r)),
            kf * _LN2_HI - ((hfsq - (s * (hfsq + r) + (kf * _LN2_LO + c))) - f),
        )
        out = np.where(hu == 0, tiny, general)
        # |x| < 2**-29: x - x*x/2; |x| < 2**-54: x itself (signed zero kept).
        out = np.where(ax < 0x3E200000, x - x * x * 0.5, out)
        result: npt.NDArray[np.float64] = np.where(ax < 0x3C900000, x, out).reshape(shape)
    return result


def log(x: Any) -> npt.NDArray[np.float64]:
    """``log(x)`` in float64 for ``x >= 0``, the same bits on every host (``log(0) = -inf``).

    ``x = 2**k m`` with ``m`` in ``[sqrt(2)/2, sqrt(2))`` read from the bits (subnormals scaled
    by ``2**54`` first), then ``log x = k ln2_hi + (log1p(m - 1) + k ln2_lo)`` with the portable
    :func:`log1p`; ``m - 1`` is exact (Sterbenz) and ``k ln2_hi`` is exact, so the error stays
    near one ulp. Only correctly rounded operations and bit moves: the torch lowering
    (:func:`specsampling.gpu.keyed.log`) runs the same steps and gets the same bits. Negative
    inputs and NaN give NaN; ``inf`` gives ``inf``.

    >>> [float(v) for v in log([1.0, 2.0, 0.0, 5e-324])] == [0.0, float(np.log(2.0)),
    ...     -np.inf, float(np.log(5e-324))]
    True
    """
    shape = np.shape(x)
    x = np.atleast_1d(np.array(x, dtype=np.float64))
    with np.errstate(all="ignore"):
        subnormal = x < 2.0**-1022
        scaled = np.where(subnormal, x * _TWO54, x)
        hx = _high(scaled)
        k = (hx >> 20) - 1023
        hm = hx & 0x000FFFFF
        low_half = hm < 0x6A09E
        m = np.where(
            low_half, _with_high(scaled, hm | 0x3FF00000), _with_high(scaled, hm | 0x3FE00000)
        )
        k = np.where(low_half, k, k + 1)
        k = np.where(subnormal, k - 54, k)
        kf = k.astype(np.float64)
        out = kf * _LN2_HI + (log1p(m - 1.0) + kf * _LN2_LO)
        out = np.where(x == np.inf, np.inf, out)
        out = np.where(x == 0, -np.inf, out)
        result: npt.NDArray[np.float64] = np.where((x < 0) | np.isnan(x), np.nan, out)
    return result.reshape(shape)


def exponentials(key: int, context: Any, row: Any, tokens: Any) -> npt.NDArray[np.float64]:
    """Keyed Exp(1) values ``E = -log1p(-U)`` with ``U`` from :func:`uniforms`.

    .. math:: E = -\\log(1 - U), \\quad U \\in [0, 1 - 2^{-53}]

    so ``E`` lies in ``[0, 53 \\ln 2]`` and is never infinite. ``log1p`` is the portable
    :func:`log1p` (never ``np.log1p``, whose last bit depends on the host), so the values are the
    same on every host and in the torch lowering.

    >>> float(exponentials(0, position_context(0), 0, 0)) >= 0.0
    True
    """
    out: npt.NDArray[np.float64] = -log1p(-uniforms(key, context, row, tokens))
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
    ``docs/watermark.md``). The context depends on the sequence alone, never on rounds or draft
    steps, so drafter, verifier and plain decoding that reach the same sequence read the same
    values.

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
