"""Shared pieces of the Hugging Face decoder tests: tiny random causal LMs, a perturbed-copy
draft, left padding, and the always-accept mutant (``tests/test_hf_*.py``)."""

from __future__ import annotations

import copy
import types
from typing import Any

import pytest
import torch
import transformers

import specsampling.gpu as ssg
from specsampling.gpu.hf import SpeculativeDecoder, TreeVerification
from specsampling.gpu.schemes.base import Verified

_FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
}


def tiny_causal_lm(
    family: str,
    seed: int,
    *,
    vocab: int = 64,
    attn: str = "eager",
    dtype: torch.dtype = torch.float32,
    layers: int = 2,
    sharpness: float = 1.0,
    **extra: Any,
) -> Any:
    """A random ``family`` ("llama" or "qwen") model: hidden 32, 4 heads (2 KV), no EOS; its
    head scaled by ``sharpness`` (peaked distributions, so drafts get rejected)."""
    torch.manual_seed(seed)
    config_class, model_class = _FAMILIES[family]
    config = config_class(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation=attn,
        **extra,
    )
    model = model_class(config).to(dtype).eval()
    if sharpness != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpness)
    return no_eos(model)


def _norm_in_input_dtype(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def float64_norms(model: Any) -> Any:
    """``model`` with every ``RMSNorm`` computed in its input dtype: Hugging Face's Llama / Qwen2
    ``RMSNorm`` casts to float32 even in a float64 model, so a 1e-14 difference between two
    float64 forwards that straddles a float32 rounding boundary becomes a float32 ulp, which
    later layers grow to ~1e-6 in the logits (``tests/test_hf_parity_ragged.py``)."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_norm_in_input_dtype, module)
    return model


def no_eos(model: Any) -> Any:
    """Random models have no real EOS: ``generate`` must not stop at the config's default."""
    model.generation_config.eos_token_id = None
    return model


def perturbed(model: Any, scale: float, seed: int) -> Any:
    """A copy of ``model`` with Gaussian noise on its weights: a draft that mostly agrees."""
    torch.manual_seed(seed)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(scale * torch.randn_like(parameter))
    return other


def left_pad(prompts: Any, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of left-padded prompts of different lengths."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


class AcceptAll(TreeVerification):
    """Mutant verification: emits the whole drafted chain and a bonus, never testing anything."""

    def verify_tables(self, tree: Any, target_probs: Any, draft_probs: Any, generator: Any) -> Any:
        depth = tree.max_depth
        rows = torch.arange(tree.batch_size)
        u = torch.rand(tree.batch_size, dtype=torch.float64, generator=generator)
        bonus = ssg.ops.categorical(target_probs[rows, depth], u)
        tokens = torch.cat([tree.tokens[:, 1:], bonus[:, None]], dim=1)
        full = torch.full_like(bonus, depth + 1)
        return Verified(full - 1, bonus, tokens, full)


class AlwaysAccept(SpeculativeDecoder):
    """Mutant decoder: ``scheme``'s lowering behind :class:`AcceptAll`."""

    def __init__(self, target: Any, draft: Any, scheme: str, shape: Any) -> None:
        lowering = ssg.schemes.tree_lowering(ssg.schemes.get_lowering(scheme))
        super().__init__(target, draft, AcceptAll(lowering, shape), shape)


def trace_prefixes(trace: Any) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """``(where, prefixes)`` of a decoder :class:`~specsampling.gpu.hf.RoundTrace`: each real
    node ``(b, n)`` and its full prefix (the row's committed context, then the node's path)."""
    from specsampling.gpu.tree import node_paths

    paths = node_paths(trace.tree).tolist()
    real = trace.tree.real_nodes().tolist()
    where, prefixes = [], []
    for b, context in enumerate(trace.contexts):
        for n, is_real in enumerate(real[b]):
            if is_real:
                where.append((b, n))
                prefixes.append(context + [t for t in paths[b][n] if t >= 0])
    return where, prefixes


def plain_logits(model: Any, prefixes: Any) -> torch.Tensor:
    """The last-position logits of a plain no-cache forward of every prefix ``[R, V]`` (one
    forward per distinct length, no padding): what the decoder's cached tree forwards must give."""
    out: list[Any] = [None] * len(prefixes)
    by_length: dict[int, list[int]] = {}
    for index, prefix in enumerate(prefixes):
        by_length.setdefault(len(prefix), []).append(index)
    for indices in by_length.values():
        logits = model(input_ids=torch.tensor([prefixes[i] for i in indices])).logits[:, -1]
        for row, i in enumerate(indices):
            out[i] = logits[row]
    return torch.stack(out)


@pytest.fixture(autouse=True)
def no_grad() -> Any:
    """Every test without autograd (import it into a test module to use it there)."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    """Tiny models: one intra-op thread (two threads on a shared 2-core machine spin-wait,
    making a 32x32 matmul ~400x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
