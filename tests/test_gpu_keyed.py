"""The torch keyed field (``specsampling.gpu.keyed``) against the numpy reference, bit for bit.

* Hash bits, uniforms, position contexts, context hashes and context words must be identical
  to :mod:`specsampling.keyed.field` (integer arithmetic and exact conversions).
* Exponentials must be identical to the reference's: both evaluate the same portable ``log1p``
  (the un-fused fdlibm steps, :func:`specsampling.keyed.field.log1p`), never the host's
  ``np.log1p`` (numpy's AVX512 loop, or the C library's, fused or not), which they must stay
  within one ulp of. The same for the portable ``log`` of the race.
* Golden literals, computed once with the reference, catch a change to either backend.
* A mutant with sign-extending shifts must fail the goldens.
* ``race_winner`` must pick the reference winner on random and adversarial inputs.

Every test runs on ``cpu``, and again on ``cuda`` (marked ``cuda``) where a GPU is present.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specsampling.gpu import keyed as gk
from specsampling.keyed import field as ref
from specsampling.keyed.laws import race_winner as ref_race_winner

# The cuda copies run only where a GPU is present (on CPU they would repeat the cpu runs).
DEVICES = ["cpu"] + [pytest.param("cuda", marks=pytest.mark.cuda, id="cuda")] * bool(
    torch.cuda.is_available()
)

# (key, context, row, token, hash bits, uniform, exponential): computed once with the reference
# (bits, uniforms) and the portable log1p (exponentials); pasted as literals.
GOLDEN = [
    (0x0, 0x78B6AD1DB62B3816, 0, 0x0, 0xB3A303441CD77940, "0x1.6746068839aefp-1",
     "0x1.35ad55b218eaep+0"),
    (0xFFFFFFFFFFFFFFFF, 0x44397B35A3F58724, 7, 0x7FFFFFFFFFFFFFFF, 0xF6BDCFE2804CDCB2,
     "0x1.ed7b9fc50099bp-1", "0x1.a8e9a5bee4d06p+1"),
    (0x3039, 0xF31EEF30EA12A283, 3, 0x2517F, 0x6B799358442C72DE, "0x1.ade64d6110b1cp-2",
     "0x1.16bead90ae94ep-1"),
    (0x8000000000000000, 0x7DA9A44328C00742, 1, 0x1, 0x50A7CD4E9CDD14A7, "0x1.429f353a73744p-2",
     "0x1.8381c3bc4128ep-2"),
]  # fmt: skip
GOLDEN_CONTEXTS = {
    "position_context(0)": 0x78B6AD1DB62B3816,
    "context_hash([1, 2, 3], 2)": 0x44397B35A3F58724,
    "position_context(10**9)": 0xF31EEF30EA12A283,
    "context_hash([], 4)": 0x7DA9A44328C00742,
}

KEYS = [0, 1, 7, 12345, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1, 0x9E3779B97F4A7C15]
TOKENS = np.concatenate(
    [np.arange(64), [151935, 2**31 - 1, 2**31, 2**32 + 1, 2**53 + 1, 2**62, 2**63 - 1]]
).astype(np.uint64)
ROWS = np.arange(8, dtype=np.uint64)


def _contexts() -> np.ndarray:
    rng = np.random.default_rng(20240611)
    positions = np.array([0, 1, 2, 3, 100, 10**6, 2**32, 2**63, 2**64 - 1], dtype=np.uint64)
    hashes = [ref.context_hash([], 1), ref.context_hash([5], 1), ref.context_hash([1, 2, 3], 2)]
    hashes += [ref.context_hash(rng.integers(0, 50_000, size=9), w) for w in (1, 3, 8)]
    raw = rng.integers(0, 2**64, size=8, dtype=np.uint64, endpoint=False)
    words = [np.asarray(ref.position_context(positions)), np.array(hashes, dtype=np.uint64), raw]
    return np.concatenate([*words, np.array([0, 2**63, 2**64 - 1], dtype=np.uint64)])


CONTEXTS = _contexts()


def _bits(x: np.ndarray) -> np.ndarray:
    return np.atleast_1d(np.array(x, dtype=np.float64)).view(np.int64)


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(_bits(a) - _bits(b)).max(initial=0))


# --- goldens --------------------------------------------------------------------------------


def test_golden_contexts_of_the_reference() -> None:
    assert ref.position_context(0) == GOLDEN_CONTEXTS["position_context(0)"]
    assert ref.context_hash([1, 2, 3], 2) == GOLDEN_CONTEXTS["context_hash([1, 2, 3], 2)"]
    assert ref.position_context(10**9) == GOLDEN_CONTEXTS["position_context(10**9)"]
    assert ref.context_hash([], 4) == GOLDEN_CONTEXTS["context_hash([], 4)"]


@pytest.mark.parametrize("device", DEVICES)
def test_golden_contexts_of_the_lowering(device: str) -> None:
    assert int(gk.as_uint64(gk.position_context(gk.as_words(0, device)))) == GOLDEN[0][1]
    tokens = torch.tensor([1, 2, 3], device=device)
    assert int(gk.as_uint64(gk.context_hash(tokens, 2))) == GOLDEN[1][1]
    assert int(gk.as_uint64(gk.position_context(10**9))) == GOLDEN[2][1]
    assert int(gk.as_uint64(gk.context_hash(torch.zeros(0, dtype=torch.int64), 4))) == GOLDEN[3][1]


@pytest.mark.parametrize(("key", "context", "row", "token", "bits", "unit", "exp"), GOLDEN)
def test_golden_values_of_the_reference(key, context, row, token, bits, unit, exp) -> None:
    assert int(ref.hash_bits(key, context, row, token)) == bits
    assert float(ref.uniforms(key, context, row, token)) == float.fromhex(unit)
    # The reference's E is portable (its own log1p): exactly the literal, on every host.
    assert float(ref.exponentials(key, context, row, token)) == float.fromhex(exp)
    # ... and within one ulp of the host's np.log1p.
    assert abs(_ulps(-np.log1p(-ref.uniforms(key, context, row, token)), float.fromhex(exp))) <= 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("key", "context", "row", "token", "bits", "unit", "exp"), GOLDEN)
def test_golden_values_of_the_lowering(device, key, context, row, token, bits, unit, exp) -> None:
    args = [gk.as_words(v, device) for v in (key, context, row, token)]
    got = gk.hash_bits(*args)
    assert got.device.type == torch.device(device).type
    assert int(gk.as_uint64(got)) == bits
    assert gk.uniforms(*args).item() == float.fromhex(unit)
    e = gk.exponentials(*args)
    assert e.dtype == torch.float64
    assert e.item() == float.fromhex(exp)
    # Python ints work too (placed on the CPU).
    assert int(gk.as_uint64(gk.hash_bits(key, context, row, token))) == bits


# --- many indices ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("key", KEYS)
def test_hash_bits_and_uniforms_match_the_reference(device: str, key: int) -> None:
    grid = CONTEXTS[:, None, None], ROWS[None, :, None], TOKENS[None, None, :]
    want = ref.hash_bits(key, *grid)
    args = [gk.as_words(a, device) for a in grid]
    got = gk.hash_bits(gk.as_words(key, device), *args)
    assert got.dtype == torch.int64 and tuple(got.shape) == want.shape
    np.testing.assert_array_equal(gk.as_uint64(got), want)
    u = gk.uniforms(key, *args)
    np.testing.assert_array_equal(_bits(u.cpu().numpy()), _bits(ref.uniforms(key, *grid)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("key", KEYS[::3])
def test_exponentials_bit_identical_to_the_reference(device: str, key: int) -> None:
    grid = CONTEXTS[:, None, None], ROWS[None, :, None], TOKENS[None, None, :]
    got = gk.exponentials(key, *[gk.as_words(a, device) for a in grid]).cpu().numpy()
    want = ref.exponentials(key, *grid)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert _ulps(want, -np.log1p(-ref.uniforms(key, *grid))) <= 1


@pytest.mark.parametrize("device", DEVICES)
def test_log1p_on_the_whole_field_domain(device: str) -> None:
    rng = np.random.default_rng(5)
    j = np.arange(1, 54)
    units = np.concatenate(
        [
            [0.0, 2.0**-53, 2.0**-52, 3 * 2.0**-53, 2.0**-30, 2.0**-29, 2.0**-28],
            1.0 - 2.0**-j,  # u = 1 - U a power of two: the hu == 0, f == 0 branch
            1.0 - 2.0**-j * (1 + 2.0**-30),  # hu == 0, f != 0
            np.nextafter(1 - math.sqrt(0.5), [0.0, 1.0]),  # the k = 0 / reduction boundary
            np.nextafter(1 - math.sqrt(2) / 2 * (1 + 2.0**-40), [0.0, 1.0]),
            [ref.LARGEST_UNIFORM, ref.LARGEST_UNIFORM - 2.0**-53, 0.5, 0.25, 0.75],
            rng.integers(0, 2**53, size=200_000) * 2.0**-53,
            rng.integers(0, 2**25, size=20_000) * 2.0**-53,  # small U: k = 0, tiny f
        ]
    )
    units = np.floor(units * 2.0**53) * 2.0**-53  # the field's grid
    x = torch.from_numpy(-units).to(device)
    got = gk.log1p(x).cpu().numpy()
    np.testing.assert_array_equal(_bits(got), _bits(ref.log1p(-units)))
    assert _ulps(got, np.log1p(-units)) <= 1
    e = -got
    assert _bits(e[:1]).item() == 0  # E(U = 0) is +0.0
    assert e.max() <= 53 * math.log(2) * (1 + 2.0**-52) and np.all(np.isfinite(e))
    assert -gk.log1p(torch.tensor([-ref.LARGEST_UNIFORM], dtype=torch.float64)).item() == (
        float.fromhex("0x1.25e4f7b2737fap+5")
    )


@pytest.mark.parametrize("device", DEVICES)
def test_log_on_the_race_domain(device: str) -> None:
    rng = np.random.default_rng(9)
    tiny = 5e-324
    values = np.concatenate(
        [
            [0.0, tiny, 2 * tiny, 2.0**-1022, np.nextafter(2.0**-1022, 0), 2.0**-1021, 1e-300],
            [0.5, 1.0, 2.0, np.nextafter(1.0, 0), np.nextafter(1.0, 2), math.sqrt(2), 0.7071],
            [53 * math.log(2), ref.LARGEST_UNIFORM, 1e300, np.finfo(np.float64).max],
            rng.random(100_000),  # probabilities
            np.exp(rng.uniform(-744, 709, size=100_000)),  # every binade
            rng.integers(1, 2**52, size=10_000) * tiny,  # subnormals
            ref.exponentials(3, ref.position_context(1), 0, np.arange(20_000)),
        ]
    )
    got = gk.log(torch.from_numpy(values).to(device)).cpu().numpy()
    want = ref.log(values)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    finite = values > 0
    assert _ulps(want[finite], np.log(values[finite])) <= 1
    assert want[0] == -np.inf and np.isinf(ref.log([np.inf])[0])
    assert np.isnan(ref.log([-1.0, np.nan])).all()
    specials = torch.tensor([0.0, np.inf, -1.0, np.nan], dtype=torch.float64, device=device)
    out = gk.log(specials).cpu().numpy()
    assert out[0] == -np.inf and out[1] == np.inf and np.isnan(out[2:]).all()


# --- the mutant: sign-extending shifts ------------------------------------------------------


def _mix_arithmetic(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 30)
    x = x * gk._M1
    x = x ^ (x >> 27)
    x = x * gk._M2
    return x ^ (x >> 31)


def _hash_mutant(key, context, row, tokens) -> torch.Tensor:
    def absorb(state, word, salt):
        return _mix_arithmetic(state ^ _mix_arithmetic(word + salt))

    state = _mix_arithmetic(gk.as_words(key) ^ gk._SALTS[0])
    state = absorb(state, gk.as_words(context), gk._SALTS[1])
    state = absorb(state, gk.as_words(row), gk._SALTS[2])
    return absorb(state, gk.as_words(tokens), gk._SALTS[3])


def test_arithmetic_shift_mutant_fails_the_goldens() -> None:
    caught = [int(gk.as_uint64(_hash_mutant(*g[:4]))) != g[4] for g in GOLDEN]
    assert all(caught)
    grid = CONTEXTS[:, None, None], ROWS[None, :, None], TOKENS[None, None, :]
    mutant = gk.as_uint64(_hash_mutant(12345, *[gk.as_words(a) for a in grid]))
    assert np.mean(mutant != ref.hash_bits(12345, *grid)) > 0.99
    # ... while the masked logical shift is what makes the real one pass.
    real = gk.as_uint64(gk.hash_bits(12345, *[gk.as_words(a) for a in grid]))
    np.testing.assert_array_equal(real, ref.hash_bits(12345, *grid))


# --- word conversions -----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_word_inputs(device: str) -> None:
    words = [0, 1, 2**63 - 1, 2**63, 2**64 - 1]
    as_int64 = gk.as_words(words, device)
    assert as_int64.tolist() == [0, 1, 2**63 - 1, -(2**63), -1]
    via_uint64 = torch.tensor(np.array(words, dtype=np.uint64).view(np.int64)).view(torch.uint64)
    assert torch.equal(gk.as_words(via_uint64).to(device), as_int64)
    assert torch.equal(gk.as_words(torch.tensor([3, 4], dtype=torch.int32)), torch.tensor([3, 4]))
    want = ref.hash_bits(9, np.array(words, dtype=np.uint64), 2, 5)
    np.testing.assert_array_equal(gk.as_uint64(gk.hash_bits(9, as_int64, 2, 5)), want)
    for bad in ([-1], [2**64], 1.5, [True]):
        with pytest.raises(ValueError):
            gk.as_words(bad)
    for bad_tensor in (torch.tensor([-1], dtype=torch.int32), torch.tensor([1.0])):
        with pytest.raises(ValueError):
            gk.as_words(bad_tensor)


# --- contexts -------------------------------------------------------------------------------

SEQUENCES = [(), (5,), (1, 1), (3, 1, 4, 1, 5, 9, 2, 6), (7, 7, 7, 7, 7), (2**62, 0, 151935)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [1, 2, 3, 8])
def test_context_hashes_batched_and_padded(device: str, window: int) -> None:
    n = max(len(s) for s in SEQUENCES)
    padded = torch.full((len(SEQUENCES), n), 99, dtype=torch.int64)
    for b, s in enumerate(SEQUENCES):
        padded[b, : len(s)] = torch.tensor(s, dtype=torch.int64)
    out = gk.context_hashes(padded.to(device), window)
    assert tuple(out.shape) == (len(SEQUENCES), n + 1)
    for b, s in enumerate(SEQUENCES):
        want = ref.context_hashes(list(s), window)
        np.testing.assert_array_equal(gk.as_uint64(out[b, : len(s) + 1]), want)
        assert int(gk.as_uint64(gk.context_hash(list(s), window))) == ref.context_hash(s, window)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("window", "start"), [(None, 0), (1, 0), (2, 0), (2, 3), (3, 1)])
def test_context_words_and_exponentials_after(device: str, window, start: int) -> None:
    rng = np.random.default_rng(3)
    seqs = list(SEQUENCES) + [tuple(rng.integers(0, 3, size=n)) for n in (4, 9, 17)]
    noise = ref.KeyedNoise(2**64 - 5, window=window, start=start)
    words = gk.context_words(noise, seqs, device=device)
    assert gk.as_uint64(words).tolist() == [noise.context(s) for s in seqs]
    # Padded form with lengths gives the same words.
    n = max(len(s) for s in seqs)
    padded = torch.zeros((len(seqs), n), dtype=torch.int64)
    for b, s in enumerate(seqs):
        padded[b, : len(s)] = torch.tensor([int(t) for t in s], dtype=torch.int64)
    lengths = [len(s) for s in seqs]
    assert torch.equal(gk.context_words(noise, padded.to(device), lengths).cpu(), words.cpu())
    out = gk.exponentials_after(noise, seqs, rows=3, vocab_size=40, device=device)
    assert out.dtype == torch.float64 and tuple(out.shape) == (len(seqs), 3, 40)
    for b, s in enumerate(seqs):
        grid = np.arange(3)[:, None], np.arange(40)[None, :]
        want = noise.exponentials(s, 3, 40)
        np.testing.assert_array_equal(_bits(out[b].cpu().numpy()), _bits(want))
        np.testing.assert_array_equal(
            _bits(want), _bits(ref.exponentials(noise.key, noise.context(s), *grid))
        )


def test_some_context_falls_back_to_the_position() -> None:
    noise = ref.KeyedNoise(5, window=1)
    words = gk.as_uint64(gk.context_words(noise, [(1, 1), (1,)])).tolist()
    assert words[0] == ref.position_context(2) and words[1] == ref.context_hash([1], 1)


# --- the race -------------------------------------------------------------------------------


def _reference_winners(proposal: np.ndarray, exps: np.ndarray) -> np.ndarray:
    return np.array([int(ref_race_winner(p, e)) for p, e in zip(proposal, exps, strict=True)])


def _check_race(proposal: np.ndarray, exps: np.ndarray, device: str) -> None:
    got = gk.race_winner(torch.from_numpy(proposal).to(device), torch.from_numpy(exps).to(device))
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.cpu().numpy(), _reference_winners(proposal, exps))


@pytest.mark.parametrize("device", DEVICES)
def test_race_winner_random(device: str) -> None:
    rng = np.random.default_rng(11)
    for vocab in (2, 7, 300):
        p = rng.dirichlet(np.full(vocab, 0.3), size=200)
        p[rng.random(p.shape) < 0.3] = 0.0
        p[:, 0] += p.sum(axis=1) == 0
        p /= p.sum(axis=1, keepdims=True)
        e = -np.log1p(-rng.random(p.shape))
        _check_race(p, e, device)
        keyed = gk.exponentials(3, gk.position_context(vocab), 0, torch.arange(vocab))
        _check_race(p, np.broadcast_to(keyed.numpy(), p.shape).copy(), device)


@pytest.mark.parametrize("device", DEVICES)
def test_race_winner_adversarial(device: str) -> None:
    big = 53 * math.log(2)
    cases = [
        ([0.5, 0.5, 0.0], [0.3, 0.2, 0.0]),  # p = 0 with E = 0 is never chosen
        ([0.0, 0.5, 0.5], [0.0, 0.2, 0.1]),
        ([0.25, 0.25, 0.25, 0.25], [0.4, 0.4, 0.4, 0.4]),  # all tied: lowest index
        ([0.1, 0.3, 0.3, 0.3], [0.9, 0.2, 0.2, 0.2]),  # identical pairs tie: lowest
        ([0.2, 0.3, 0.5], [0.0, 0.0, 0.1]),  # E = 0 ties at -inf: lowest
        ([0.0, 0.2, 0.8], [0.0, 0.0, 0.0]),
        ([0.3, 0.7, 0.0], [big, big, 0.0]),  # E = 53 ln 2 everywhere
        ([1e-300, 1.0 - 1e-300, 0.0], [1e-300, big, 0.0]),
        ([0.0, 0.0, 1.0], [0.0, 0.0, big]),  # a single support point
        ([5e-324, 1.0, 0.0], [5e-324, 1.0, 0.0]),  # subnormals: both score 0
        ([0.5, 0.5], [big, big]),
        ([0.0, 0.0], [0.1, 0.2]),  # no support (invalid): every score is +inf, index 0
    ]
    for p, e in cases:
        _check_race(np.array([p]), np.array([e]), device)
    # Stacked, with an extra batch dimension.
    p = np.array([[0.25, 0.25, 0.5, 0.0]] * 6)
    e = np.array([[0.3, 0.2, 0.4, 0.0], [0, 0, 0, 0], [0.1, 0.1, 0.2, 0.0]] * 2, dtype=float)
    got = gk.race_winner(torch.from_numpy(p).to(device), torch.from_numpy(e).to(device))
    np.testing.assert_array_equal(got.cpu().numpy(), _reference_winners(p, e))
    # float32 proposals are cast to float64 first.
    p32 = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float32, device=device)
    e64 = torch.tensor([[0.3, 0.2, 0.0]], dtype=torch.float64, device=device)
    assert gk.race_winner(p32, e64).tolist() == [1]
