"""The keyed noise field in torch, bit for bit with :mod:`specsampling.keyed.field`.

Every function mirrors the reference of the same name and returns the same bits on any device:

* :func:`hash_bits` is splitmix64 written in *wrapping int64* arithmetic. A 64-bit word ``w`` is
  held as the int64 with the same two's-complement bits (``w - 2**64`` when ``w >= 2**63``).
  XOR, addition and multiplication modulo ``2**64`` act identically on both readings; the one
  operation that does not is the right shift (int64 shifts are arithmetic, sign-extending), so
  every ``x >> k`` of the reference is the masked logical shift
  ``(x >> k) & (2**(64 - k) - 1)`` (:func:`logical_shift`). Constants above ``2**63`` are
  written as their int64 two's-complement values. No uint64 tensor op is used (torch's uint64
  support is partial), so the bits do not depend on the device.
* :func:`to_unit` keeps the top 53 bits, converts them to float64 (exact: they are below
  ``2**53``) and scales by ``2**-53`` (exact: a power of two).
* :func:`exponentials` is ``E = -log1p(-U)`` in float64 on every device, with ``log1p``
  evaluated by :func:`log1p`: the fdlibm ``s_log1p.c`` algorithm (glibc's polynomial order),
  made only of IEEE-754 operations that every backend rounds correctly (``+ - * /`` and bit
  moves), one torch op each, so nothing is fused into an FMA and the bits are the same on CPU
  and CUDA. ``torch.log1p`` is not used: it is Sleef on CPU and CUDA's own on GPU, and each
  differs from numpy in the last bit for a few percent of the uniforms.

  The reference (:func:`specsampling.keyed.field.exponentials`) computes ``E`` with its own
  portable :func:`specsampling.keyed.field.log1p`, the same steps in numpy: the exponentials
  are bit-identical in both backends (``np.log1p`` would not be: numpy's AVX512 loop, glibc
  with and without FMA differ in the last bit for about 7 % of the field's uniforms).
* :func:`race_winner` is the reference's log-domain race ``log E - log p``, with ``log`` the
  portable :func:`log` (the twin of :func:`specsampling.keyed.field.log`): the same bits on CPU
  and CUDA. The reference race (:mod:`specsampling.keyed.laws`) takes the same portable log, so
  on the same proposal the winners agree bit for bit, near-ties included; exact ties (equal
  ``(E, p)`` pairs, or ``E = 0``) and ``p = 0`` behave exactly as in the reference. (The one
  place the proposals themselves can differ: a ``without`` step of an exact, ``Fraction`` pair,
  whose renormalisation the reference does in exact arithmetic and the lowering in float64.)

Design choice: there is no second ``KeyedNoise`` class. :func:`context_words` and
:func:`exponentials_after` take the reference :class:`specsampling.keyed.KeyedNoise` (one
validated source of key, window and prompt start) and a *batch* of sequences, padded or ragged,
and return one context word, or one ``[rows, vocab_size]`` grid of exponentials, per sequence.

>>> import specsampling as ss
>>> noise = ss.keyed.KeyedNoise(5, window=2)
>>> seq = (3, 1, 4)
>>> ref = noise.exponentials(seq, rows=2, vocab_size=6)
>>> out = exponentials_after(noise, [seq], rows=2, vocab_size=6)
>>> out.shape, out.dtype
(torch.Size([1, 2, 6]), torch.float64)
>>> bool((out[0].numpy().view(np.int64) == ref.view(np.int64)).all())  # bit for bit
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specsampling.keyed import field as _ref
from specsampling.validation import check_positive_int

__all__ = [
    "LARGEST_UNIFORM",
    "RESOLUTION",
    "as_uint64",
    "as_words",
    "context_hash",
    "context_hashes",
    "context_words",
    "exponentials",
    "exponentials_after",
    "hash_bits",
    "log",
    "log1p",
    "logical_shift",
    "mix",
    "position_context",
    "race_winner",
    "to_unit",
    "uniforms",
]

RESOLUTION = _ref.RESOLUTION
LARGEST_UNIFORM = _ref.LARGEST_UNIFORM

_TWO64 = 1 << 64


def _signed(word: int) -> int:
    """The int64 with the two's-complement bits of the 64-bit word ``word``."""
    return word - _TWO64 if word >= 1 << 63 else word


_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)
_GOLDEN = _signed(_ref._GOLDEN)
_SALTS = tuple(_signed(s) for s in _ref._SALTS)
_POSITION_SALT = _signed(_ref._POSITION_SALT)
_CONTEXT_SALT = _signed(_ref._CONTEXT_SALT)
_ABSENT = _signed(_ref._ABSENT)  # -1


def logical_shift(x: torch.Tensor, k: int) -> torch.Tensor:
    """Unsigned right shift of 64-bit words held in int64: ``(x >> k) & (2**(64 - k) - 1)``.

    Parameters
    ----------
    x : Tensor of int64
        Words in two's-complement int64 form.
    k : int
        Shift, ``1 <= k <= 63``.

    Returns
    -------
    Tensor of int64
        The words ``x >> k`` read as unsigned (the top ``k`` bits are zero).

    Examples
    --------
    >>> int(logical_shift(torch.tensor([-1]), 60)[0])
    15
    >>> int((torch.tensor([-1]) >> 60)[0])  # the arithmetic shift sign-extends
    -1
    """
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser on int64-held words (wrapping multiply, logical shifts).

    Parameters
    ----------
    x : Tensor of int64

    Returns
    -------
    Tensor of int64
        Same bits as the reference ``_mix`` on the uint64 reading.

    Examples
    --------
    >>> ref = _ref._mix(np.array([2**64 - 1], dtype=np.uint64))
    >>> bool((as_uint64(mix(as_words(2**64 - 1))) == ref).all())
    True
    """
    x = x ^ logical_shift(x, 30)
    x = x * _M1
    x = x ^ logical_shift(x, 27)
    x = x * _M2
    return x ^ logical_shift(x, 31)


def _absorb(state: torch.Tensor, word: torch.Tensor, salt: int) -> torch.Tensor:
    return mix(state ^ mix(word + salt))


def as_words(value: Any, device: Any = None, name: str = "words") -> torch.Tensor:
    """64-bit words as an int64 tensor (two's-complement form) on ``device``.

    Parameters
    ----------
    value : int, array_like of int, or Tensor
        Python ints and numpy arrays are validated as the reference does (integers in
        ``[0, 2**64)``). An int64 tensor is taken as words in two's-complement form as it is
        (negative entries are words ``>= 2**63``); a uint64 tensor is reinterpreted bit for bit;
        other integer tensors must be non-negative.
    device : torch.device or str, optional
        Target device; a tensor input keeps its own device when ``None``.
    name : str
        The argument named in error messages.

    Returns
    -------
    Tensor of int64

    Examples
    --------
    >>> as_words([0, 2**63, 2**64 - 1]).tolist()
    [0, -9223372036854775808, -1]
    """
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.int64:
            out = value
        elif value.dtype == torch.uint64:
            out = value.view(torch.int64)
        elif value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise ValueError(f"{name}: expected an integer tensor, got {value.dtype}")
        else:
            if value.dtype.is_signed and bool((value < 0).any()):
                raise ValueError(f"{name}: integers must lie in [0, 2**64), got a negative value")
            out = value.to(torch.int64)
        return out if device is None else out.to(device)
    if not isinstance(value, (np.ndarray, np.generic)):
        # Python ints via an object array: numpy would turn ``[0, 2**64 - 1]`` into float64.
        value = np.array(value, dtype=object)
        if any(isinstance(v, (bool, np.bool_)) for v in value.ravel()):
            raise ValueError(f"{name}: expected integers, got booleans")
    words = _ref._words(value, name)
    flat = np.array(words, dtype=np.uint64).reshape(-1).view(np.int64)
    return torch.from_numpy(flat.copy()).reshape(words.shape).to(device)


def as_uint64(words: torch.Tensor) -> np.ndarray:
    """An int64-held word tensor as the numpy uint64 array the reference uses (same bits).

    Examples
    --------
    >>> as_uint64(torch.tensor([-1, 5])).tolist() == [2**64 - 1, 5]
    True
    """
    arr = words.detach().cpu().numpy()
    return arr.reshape(-1).view(np.uint64).reshape(arr.shape)


def hash_bits(key: Any, context: Any, row: Any, tokens: Any) -> torch.Tensor:
    """The raw 64-bit hash of each index, as int64 bits; ``context``, ``row``, ``tokens`` broadcast.

    Parameters
    ----------
    key : int or Tensor
        Seed in ``[0, 2**64)``; a tensor key broadcasts like the other indices.
    context, row, tokens : int, array_like of int, or Tensor
        Index words (see :func:`as_words`). Non-tensor arguments are placed on the device of
        the first tensor argument (CPU when there is none).

    Returns
    -------
    Tensor of int64, the broadcast shape
        The reference :func:`specsampling.keyed.field.hash_bits` bits
        (``as_uint64(out) == reference``).

    Examples
    --------
    >>> ref = _ref.hash_bits(2**64 - 1, 7, [0, 1], [[5], [9]])
    >>> out = hash_bits(2**64 - 1, 7, [0, 1], [[5], [9]])
    >>> out.shape, bool((as_uint64(out) == ref).all())
    (torch.Size([2, 2]), True)
    """
    device = next(
        (v.device for v in (key, context, row, tokens) if isinstance(v, torch.Tensor)), None
    )
    state = mix(as_words(key, device, "key") ^ _SALTS[0])
    state = _absorb(state, as_words(context, device, "context"), _SALTS[1])
    state = _absorb(state, as_words(row, device, "row"), _SALTS[2])
    return _absorb(state, as_words(tokens, device, "tokens"), _SALTS[3])


def to_unit(bits: torch.Tensor) -> torch.Tensor:
    """Map 64-bit words to float64 uniforms ``(bits >> 11) * 2**-53`` in ``[0, 1 - 2**-53]``.

    Parameters
    ----------
    bits : Tensor of int64

    Returns
    -------
    Tensor of float64
        Exactly the reference values (the conversion and the scaling are exact).

    Examples
    --------
    >>> to_unit(as_words([0, 2**64 - 1])).tolist() == [0.0, LARGEST_UNIFORM]
    True
    """
    return logical_shift(bits, 11).to(torch.float64) * RESOLUTION


def uniforms(key: Any, context: Any, row: Any, tokens: Any) -> torch.Tensor:
    """Keyed uniforms in ``[0, 1)``, one per broadcast index ``(context, row, token)``.

    Parameters
    ----------
    key, context, row, tokens
        As for :func:`hash_bits`.

    Returns
    -------
    Tensor of float64, the broadcast shape
        Multiples of ``2**-53`` in ``[0, 1 - 2**-53]``, equal to the reference.

    Examples
    --------
    >>> ctx = position_context(3)
    >>> out = uniforms(7, ctx, 0, torch.arange(5))
    >>> bool((out.numpy() == _ref.uniforms(7, _ref.position_context(3), 0, np.arange(5))).all())
    True
    """
    return to_unit(hash_bits(key, context, row, tokens))


# fdlibm / glibc s_log1p.c constants: the reference field's, so both backends share them.
_LN2_HI = _ref._LN2_HI
_LN2_LO = _ref._LN2_LO
_LP = _ref._LP
_K0_THRESHOLD = _ref._K0_THRESHOLD


def _high(x: torch.Tensor) -> torch.Tensor:
    """The high 32-bit word of float64 values, as a signed int32 value held in int64."""
    return x.view(torch.int64) >> 32


def _with_high(x: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``x`` with its high 32-bit word replaced by ``high`` (low word kept)."""
    bits = (high << 32) | (x.view(torch.int64) & 0xFFFFFFFF)
    return bits.view(torch.float64)


def log1p(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + x)`` in float64 for ``-1 < x < 2**53``, the same bits on every device.

    The fdlibm algorithm of ``s_log1p.c`` with glibc's order of the polynomial, vectorised
    (every branch is computed and the right one selected) and evaluated *without* fused
    multiply-adds: each step is one correctly rounded IEEE-754 operation (one torch op), so the
    result does not depend on the device, the SIMD width or FMA contraction, and a numpy
    evaluation of the same steps gives the same bits. Error below one ulp.

    Parameters
    ----------
    x : Tensor of float64
        Values in ``(-1, 2**53)``; the field uses ``x = -U`` in ``(-1, 0]``.

    Returns
    -------
    Tensor of float64

    Examples
    --------
    >>> xs = torch.tensor([-0.0, -2.0**-53, -0.25, -0.5, -(1 - 2.0**-53)], dtype=torch.float64)
    >>> [v.hex() for v in log1p(xs).tolist()]  # doctest: +NORMALIZE_WHITESPACE
    ['-0x0.0p+0', '-0x1.0000000000000p-53', '-0x1.269621134db92p-2', '-0x1.62e42fefa39efp-1',
     '-0x1.25e4f7b2737fap+5']
    """
    x = x.to(torch.float64)
    hx = _high(x)  # signed: negative for x < 0 (and for -0.0)
    ax = hx & 0x7FFFFFFF
    # -0.2929 < x < 0.41422: k = 0 and f = x; otherwise reduce u = 1 + x = 2**k * (1 + f).
    reduce = (hx >= 0x3FDA827A) | ((hx <= 0) & (hx > _K0_THRESHOLD))
    u = 1.0 + x
    hu = _high(u)
    k = (hu >> 20) - 1023
    c = torch.where(k > 0, 1.0 - (u - x), x - (u - 1.0)) / u
    hu = hu & 0x000FFFFF
    low_half = hu < 0x6A09E
    u = torch.where(low_half, _with_high(u, hu | 0x3FF00000), _with_high(u, hu | 0x3FE00000))
    k = torch.where(low_half, k, k + 1)
    hu = torch.where(low_half, hu, (0x00100000 - hu) >> 2)
    f_red = u - 1.0
    f = torch.where(reduce, f_red, x)
    k = torch.where(reduce, k, torch.zeros_like(k))
    c = torch.where(reduce, c, torch.zeros_like(c))
    hu = torch.where(reduce, hu, torch.ones_like(hu))
    kf = k.to(torch.float64)
    hfsq = 0.5 * f * f
    # |f| < 2**-20 after the reduction (hu == 0).
    tiny_zero = torch.where(kf == 0, torch.zeros_like(f), kf * _LN2_HI + (c + kf * _LN2_LO))
    r_tiny = hfsq * (1.0 - 0.66666666666666666 * f)
    tiny = torch.where(kf == 0, f - r_tiny, kf * _LN2_HI - ((r_tiny - (kf * _LN2_LO + c)) - f))
    tiny = torch.where(f == 0, tiny_zero, tiny)
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
    general = torch.where(
        kf == 0,
        f - (hfsq - s * (hfsq + r)),
        kf * _LN2_HI - ((hfsq - (s * (hfsq + r) + (kf * _LN2_LO + c))) - f),
    )
    out = torch.where(hu == 0, tiny, general)
    # |x| < 2**-29: x - x*x/2; |x| < 2**-54: x itself (signed zero kept).
    out = torch.where(ax < 0x3E200000, x - x * x * 0.5, out)
    return torch.where(ax < 0x3C900000, x, out)


def log(x: torch.Tensor) -> torch.Tensor:
    """``log(x)`` in float64 for ``x >= 0``, bit for bit with :func:`specsampling.keyed.field.log`.

    ``x = 2**k m`` with ``m`` in ``[sqrt(2)/2, sqrt(2))`` from the bits (subnormals scaled by
    ``2**54``), ``log x = k ln2_hi + (log1p(m - 1) + k ln2_lo)`` with :func:`log1p`: correctly
    rounded operations and bit moves only, the same bits on every device. ``log(0) = -inf``,
    ``log(inf) = inf``, negative or NaN inputs give NaN.

    Examples
    --------
    >>> xs = torch.tensor([1.0, 2.0, 0.0, 5e-324, 0.3], dtype=torch.float64)
    >>> log(xs).numpy().tolist() == _ref.log(xs.numpy()).tolist()
    True
    """
    x = x.to(torch.float64)
    subnormal = x < 2.0**-1022
    scaled = torch.where(subnormal, x * _ref._TWO54, x)
    hx = _high(scaled)
    k = (hx >> 20) - 1023
    hm = hx & 0x000FFFFF
    low_half = hm < 0x6A09E
    m = torch.where(
        low_half, _with_high(scaled, hm | 0x3FF00000), _with_high(scaled, hm | 0x3FE00000)
    )
    k = torch.where(low_half, k, k + 1)
    k = torch.where(subnormal, k - 54, k)
    kf = k.to(torch.float64)
    out = kf * _LN2_HI + (log1p(m - 1.0) + kf * _LN2_LO)
    out = torch.where(x == float("inf"), torch.full_like(out, float("inf")), out)
    out = torch.where(x == 0, torch.full_like(out, float("-inf")), out)
    return torch.where((x < 0) | torch.isnan(x), torch.full_like(out, float("nan")), out)


def exponentials(key: Any, context: Any, row: Any, tokens: Any) -> torch.Tensor:
    """Keyed Exp(1) values ``E = -log1p(-U)`` with ``U`` from :func:`uniforms`, float64.

    Parameters
    ----------
    key, context, row, tokens
        As for :func:`hash_bits`.

    Returns
    -------
    Tensor of float64, the broadcast shape
        Values in ``[0, 53 ln 2]``, never infinite; ``log1p`` is :func:`log1p`.

    Examples
    --------
    >>> import math
    >>> u = uniforms(0, position_context(0), 0, torch.arange(4))
    >>> e = exponentials(0, position_context(0), 0, torch.arange(4))
    >>> e.tolist() == [-math.log1p(-v) for v in u.tolist()]
    True
    """
    return -log1p(-uniforms(key, context, row, tokens))


def position_context(position: Any) -> torch.Tensor:
    """The context word of an absolute position, int64-held (0-d for a scalar position).

    Examples
    --------
    >>> int(as_uint64(position_context(3))) == _ref.position_context(3)
    True
    """
    return mix(as_words(position) ^ _POSITION_SALT)


def context_hashes(tokens: Any, window: int) -> torch.Tensor:
    """``out[..., t]`` = :func:`context_hash` of ``tokens[..., :t]`` for ``t`` in ``0..n``.

    Vectorised as the reference: ``window`` absorb steps, here over every position *and* every
    leading (batch) index of ``tokens [..., n]``. Padding after a sequence's end does not
    affect ``out[..., t]`` for ``t`` up to that sequence's length.

    Parameters
    ----------
    tokens : Tensor or array_like of int, shape (..., n)
        Token ids in ``[0, 2**63)``.
    window : int
        Context length ``h >= 1``.

    Returns
    -------
    Tensor of int64, shape (..., n + 1)

    Examples
    --------
    >>> ref = _ref.context_hashes([5, 1, 2], 2)
    >>> bool((as_uint64(context_hashes(torch.tensor([5, 1, 2]), 2)) == ref).all())
    True
    """
    check_positive_int(window, "window")
    if isinstance(tokens, torch.Tensor):
        seq = as_words(tokens)
    else:
        seq = as_words(np.asarray(tokens, dtype=np.int64))
    if seq.ndim == 0:
        seq = seq.reshape(1)
    n = seq.shape[-1]
    lead = seq.shape[:-1]
    start = mix(
        torch.tensor(_signed(window ^ _ref._CONTEXT_SALT), dtype=torch.int64, device=seq.device)
    )
    state = start.expand(*lead, n + 1)
    ends = torch.arange(n + 1, device=seq.device)
    absent = torch.full((*lead, n + 1), _ABSENT, dtype=torch.int64, device=seq.device)
    for offset in range(window, 0, -1):
        index = ends - offset
        if n:
            picked = seq[..., index.clamp(min=0, max=n - 1)]
            word = torch.where(index >= 0, picked, absent)
        else:
            word = absent
        state = _absorb(state, word, _GOLDEN)
    return state


def context_hash(tokens: Any, window: int) -> torch.Tensor:
    """Hash of the previous ``window`` tokens of ``tokens [..., n]`` (0-d for one sequence).

    Examples
    --------
    >>> int(as_uint64(context_hash([1, 2], 2))) == _ref.context_hash([1, 2], 2)
    True
    """
    return context_hashes(tokens, window)[..., -1]


def _padded(sequences: Any, lengths: Any, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch as ``(tokens [B, n], lengths [B])`` on ``device``."""
    if isinstance(sequences, torch.Tensor):
        tokens = as_words(sequences, device)
        if tokens.ndim != 2:
            raise ValueError("sequences: expected a padded [B, n] tensor")
        if lengths is None:
            size = torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.int64)
        else:
            size = torch.as_tensor(lengths, dtype=torch.int64)
        return tokens, size.to(tokens.device)
    if lengths is not None:
        raise ValueError("lengths: only with a padded tensor of sequences")
    rows = [np.asarray(s, dtype=np.int64).ravel() for s in sequences]
    n = max((len(r) for r in rows), default=0)
    grid = np.zeros((len(rows), n), dtype=np.int64)
    for b, r in enumerate(rows):
        grid[b, : len(r)] = r
    size = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    return as_words(grid, device), size.to(device)


def context_words(
    noise: _ref.KeyedNoise, sequences: Any, lengths: Any = None, device: Any = None
) -> torch.Tensor:
    """:meth:`KeyedNoise.context <specsampling.keyed.KeyedNoise.context>` for a batch.

    Parameters
    ----------
    noise : specsampling.keyed.KeyedNoise
        Key, watermark window and prompt start (validated by the reference class).
    sequences : sequence of sequences of int, or Tensor of shape (B, n)
        The sequences (prompt included), ragged, or padded with ``lengths``.
    lengths : array_like of int, shape (B,), optional
        Lengths of a padded tensor (all ``n`` when omitted).
    device : torch.device or str, optional

    Returns
    -------
    Tensor of int64, shape (B,)
        The context word of the position after each sequence (int64-held).

    Examples
    --------
    >>> noise = _ref.KeyedNoise(5, window=1)
    >>> seqs = [(3, 1), (2, 1), (1, 1), (1,)]
    >>> as_uint64(context_words(noise, seqs)).tolist() == [noise.context(s) for s in seqs]
    True
    """
    tokens, size = _padded(sequences, lengths, device)
    positional = position_context(size)
    if noise.window is None:
        return positional
    hashes = context_hashes(tokens, noise.window)  # [B, n + 1]
    word = hashes.gather(1, size[:, None])  # [B, 1]
    t = torch.arange(hashes.shape[1], device=hashes.device)
    window = (t >= noise.start) & (t < size[:, None])
    seen = ((hashes == word) & window).any(dim=1)
    return torch.where(seen, positional, word[:, 0])


def exponentials_after(
    noise: _ref.KeyedNoise,
    sequences: Any,
    rows: int,
    vocab_size: int,
    device: Any = None,
    lengths: Any = None,
) -> torch.Tensor:
    """:meth:`KeyedNoise.exponentials <specsampling.keyed.KeyedNoise.exponentials>` for a batch.

    Parameters
    ----------
    noise : specsampling.keyed.KeyedNoise
    sequences : sequence of sequences of int, or Tensor of shape (B, n)
        As for :func:`context_words`.
    rows : int
        Rows ``k < rows`` (independent races, e.g. GLS drafts).
    vocab_size : int
    device : torch.device or str, optional
    lengths : array_like of int, shape (B,), optional
        Lengths of a padded tensor.

    Returns
    -------
    Tensor of float64, shape (B, rows, vocab_size)
        ``out[b]`` is ``noise.exponentials(sequences[b], rows, vocab_size)``.

    Examples
    --------
    >>> noise = _ref.KeyedNoise(11)
    >>> exponentials_after(noise, [(1, 2), ()], rows=3, vocab_size=5).shape
    torch.Size([2, 3, 5])
    """
    check_positive_int(rows, "rows", minimum=0)
    check_positive_int(vocab_size, "vocab_size", minimum=0)
    context = context_words(noise, sequences, lengths, device)
    grid_rows = torch.arange(rows, device=context.device)[None, :, None]
    grid_tokens = torch.arange(vocab_size, device=context.device)[None, None, :]
    key = as_words(noise.key, context.device)
    return exponentials(key, context[:, None, None], grid_rows, grid_tokens)


def race_winner(proposal: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """The exponential race ``argmin_{proposal_z > 0} E_z / proposal_z``, batched, log domain.

    Scores are ``log E - log p`` in float64 (the portable :func:`log`), ``+inf`` where
    ``p = 0`` (never selected), and the lowest index wins ties, as in
    :func:`specsampling.keyed.laws.race_winner`. ``E = 0`` scores ``-inf`` (wins, lowest such
    index first). Inputs are not validated (no host sync): ``exps``
    must be non-negative and free of NaN, ``proposal`` a distribution per row.

    Parameters
    ----------
    proposal : Tensor, shape (..., V)
        Proposal probabilities (cast to float64).
    exps : Tensor, shape (..., V)
        Exponentials, broadcast against ``proposal``.

    Returns
    -------
    Tensor of int64, shape (...)

    Examples
    --------
    >>> p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    >>> e = torch.tensor([[0.3, 0.2, 0.0], [0.0, 0.0, 0.1]], dtype=torch.float64)
    >>> race_winner(p, e).tolist()
    [1, 0]
    """
    p = proposal.to(torch.float64)
    e = exps.to(torch.float64)
    scores = log(e) - log(p)
    scores = torch.where(p == 0, torch.full_like(scores, float("inf")), scores)
    return torch.argmin(scores, dim=-1)
