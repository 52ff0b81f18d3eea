"""The chain fast paths compile: ``verify_chain(..., validate=False)`` of every chain engine
(the standard rule, nss, block, traversal, greedy; real draft tables and point masses) traces under
``torch.compile(fullgraph=True)`` without a graph break, and the compiled call returns the
eager tokens. The default run traces with the ``eager`` backend (dynamo only: a graph break is
an error); the ``slow`` test compiles with inductor. Compiled vs eager speed is in
``benchmarks/torch_chains.py``.
"""

from __future__ import annotations

import pytest
import torch

from specsampling import gpu as ssg

SCHEMES = ("standard", "specinfer", "nss", "block", "traversal", "greedy", "khisti")


def inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    batch, gamma, vocab = 4, 3, 300
    target = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=g), -1).to(dtype)
    draft = torch.softmax(torch.randn(batch, gamma, vocab, generator=g), -1).to(dtype)
    tokens = torch.multinomial(draft.reshape(-1, vocab).double(), 1, generator=g)
    tokens = tokens.reshape(batch, gamma)
    tokens[1, 2:] = -1  # a ragged row
    tokens[2] = -1  # a row without drafts
    accept = torch.rand(batch, gamma + 1, generator=g, dtype=torch.float64)
    sample = torch.rand(batch, gamma + 1, generator=g, dtype=torch.float64)
    return tokens, target, draft, accept, sample


def every_engine(tokens, target, draft, accept, sample):  # type: ignore[no-untyped-def]
    noise = ssg.Noise(accept, sample)
    out = [ssg.verify_chain(n, tokens, target, draft, noise, validate=False) for n in SCHEMES]
    for name in ("standard", "block"):
        out.append(ssg.verify_chain(name, tokens, target, None, noise, validate=False))
    return tuple(v.tokens for v in out)


def test_every_chain_engine_traces_without_a_graph_break() -> None:
    torch._dynamo.reset()
    args = inputs()
    compiled = torch.compile(every_engine, fullgraph=True, backend="eager")
    for got, want in zip(compiled(*args), every_engine(*args), strict=True):
        assert torch.equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_inductor_compiled_standard_and_block_equal_eager(dtype: torch.dtype) -> None:
    torch._dynamo.reset()
    args = inputs(dtype)

    def two(tokens, target, draft, accept, sample):  # type: ignore[no-untyped-def]
        noise = ssg.Noise(accept, sample)
        return tuple(
            ssg.verify_chain(n, tokens, target, draft, noise, validate=False).tokens
            for n in ("standard", "block")
        )

    compiled = torch.compile(two, fullgraph=True)
    for got, want in zip(compiled(*args), two(*args), strict=True):
        assert torch.equal(got, want)
