"""Fuzzed bad input at a real vocabulary size (V = 151,936) for ``ssg.verify_chain`` and the vLLM
and FlashInfer adapters, in float32 and bf16: every call either raises a clear error naming an
argument (``name: ...``) or returns tokens in ``[0, V)`` with positive target mass at their
position. Never NaN, never an out-of-range id, never a raw error from deep inside.

Each case starts from valid softmax tables and applies one defect: NaN, inf, a negative entry or
a row of mass 2 in one table row (read or not), a draft id out of range, an empty batch, rows with
no drafts. Seeds are fixed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specsampling.gpu as ssg  # noqa: E402
from specsampling.gpu import flashinfer, vllm  # noqa: E402

VOCAB = 151_936
GAMMA = 3
DEFECTS = ("nan", "inf", "negative", "mass2", "id_high", "id_low", "empty", "no_drafts", "none")
#: A clear error names an argument first: ``target_probs[0, 1]: ...``, ``draft_token_ids: ...``.
CLEAR = re.compile(r"^[a-z_]+(\[[0-9, ]+\])?: ")


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def tables(rng: np.random.Generator, batch: int, dtype: torch.dtype):
    """Valid chain inputs: ``(tokens [B, γ], target [B, γ + 1, V], draft [B, γ, V])``."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    logits = torch.randn((batch, GAMMA + 1, VOCAB), generator=g) * 3
    target = torch.softmax(logits, -1).to(dtype)
    draft = torch.softmax(logits[:, :GAMMA] + torch.randn_like(logits[:, :GAMMA]), -1).to(dtype)
    tokens = torch.multinomial(draft.float().reshape(-1, VOCAB), 1, generator=g)
    return tokens.reshape(batch, GAMMA), target, draft


def damage(defect: str, rng: np.random.Generator, tokens, target, draft):
    """One defect applied in place (or by replacing the input); returns the inputs and the
    draft counts per row."""
    batch = tokens.shape[0]
    counts = torch.full((batch,), GAMMA, dtype=torch.long)
    b, n, v = int(rng.integers(batch)), int(rng.integers(GAMMA)), int(rng.integers(VOCAB))
    table = target if rng.random() < 0.5 else draft
    if defect == "nan":
        table[b, n, v] = float("nan")
    elif defect == "inf":
        table[b, n, v] = float("inf")
    elif defect == "negative":
        table[b, n, v] = -0.5
    elif defect == "mass2":
        table[b, n] *= 2
    elif defect == "id_high":
        tokens[b, n] = VOCAB + int(rng.integers(5))
    elif defect == "id_low":
        tokens[b, n] = -2 - int(rng.integers(5))
    elif defect == "empty":
        tokens, target, draft = tokens[:0], target[:0], draft[:0]
        counts = counts[:0]
    elif defect == "no_drafts":
        counts[b] = 0
    return tokens, target, draft, counts


def check_output(tokens_out, emitted, target) -> None:
    """Emitted tokens in ``[0, V)`` with positive target mass at their position."""
    for row in range(tokens_out.shape[0]):
        for lane in range(int(emitted[row])):
            token = int(tokens_out[row, lane])
            assert 0 <= token < VOCAB, (row, lane, token)
            assert float(target[row, lane, token]) > 0, (row, lane, token)


def outcome(call) -> str:
    try:
        call()
    except (ValueError, TypeError) as err:  # InvalidDistribution is a ValueError
        assert CLEAR.match(str(err)), f"unclear error: {err!r}"
        return "refused"
    return "ran"


def run_chain(tokens, target, draft, counts, generator) -> None:
    out = ssg.verify_chain(
        "standard", tokens, target, draft, generator=generator, num_draft_tokens=counts
    )
    check_output(out.tokens, out.num_emitted, target)


def run_flashinfer(tokens, target, draft, counts, generator) -> None:
    if bool((counts < GAMMA).any()):  # FlashInfer's layout has no per-row lengths
        return
    out, _, emitted = flashinfer.chain_speculative_sampling(
        draft, tokens, target, generator=generator
    )
    check_output(out, emitted + 1, target)


def run_vllm(tokens, target, draft, counts, generator) -> None:
    """The chains flattened into vLLM's ragged layout (``counts[b]`` drafts of row ``b``)."""
    lengths = counts.tolist()
    take = [(b, n) for b in range(len(lengths)) for n in range(lengths[b])]
    flat_ids = torch.stack([tokens[b, n] for b, n in take]) if take else tokens.reshape(-1)[:0]
    flat_target = torch.stack([target[b, n] for b, n in take]) if take else target[0:0, 0]
    flat_draft = torch.stack([draft[b, n] for b, n in take]) if take else draft[0:0, 0]
    out = vllm.rejection_sample(
        flat_ids,
        lengths,
        GAMMA,
        torch.tensor(lengths, dtype=torch.long).cumsum(0),
        flat_draft,
        flat_target,
        torch.zeros((len(lengths), 1), dtype=torch.long),
        generator=generator,
    )
    for b, n in enumerate(lengths):  # the accepted drafts: in range, positive target mass
        for lane in range(n):
            token = int(out[b, lane])
            if token < 0:
                break
            assert 0 <= token < VOCAB and float(target[b, lane, token]) > 0, (b, lane, token)


SURFACES = {"verify_chain": run_chain, "flashinfer": run_flashinfer, "vllm": run_vllm}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_fuzzed_bad_input_is_refused_or_verified_soundly(dtype) -> None:
    rng = np.random.default_rng(2026)
    seen: dict[str, set[str]] = {}
    for case in range(3 * len(DEFECTS)):
        defect = DEFECTS[case % len(DEFECTS)]
        inputs = damage(defect, rng, *tables(rng, 2, dtype))
        for name, run in SURFACES.items():
            generator = torch.Generator().manual_seed(case)
            result = outcome(lambda run=run, g=generator, args=inputs: run(*args, g))
            seen.setdefault(defect, set()).add(f"{name}:{result}")
    # every defect sits in a row or lane that is read: every surface refuses it, clearly; empty
    # batches and rows without drafts are valid and verified soundly
    for defect in ("nan", "inf", "negative", "mass2", "id_high", "id_low"):
        assert seen[defect] == {f"{name}:refused" for name in SURFACES}, (defect, seen[defect])
    for defect in ("empty", "no_drafts", "none"):
        assert seen[defect] == {f"{name}:ran" for name in SURFACES}, (defect, seen[defect])
