r"""Int8 weight-only drafts: the same draft model reading half the bytes per forward.

A draft forward of one or a few tokens is a chain of matrix-vector products, and on a CPU
those are bound by how fast the weights stream in. :func:`quantize_int8` returns a copy of a
model whose linear layers hold their weights as int8 with one scale per output row
(symmetric, :math:`w \approx s_r \, \mathrm{round}(w / s_r)`, :math:`s_r = \max_j |w_{rj}| /
127`) and multiply by ``torch._weight_int8pack_mm`` (the weight-only int8 kernel gpt-fast and
torchao use). On a 2-core AVX-512 CPU a one-token forward of Qwen2.5-0.5B in bfloat16 took
57 ms, and 24 ms quantized.

That kernel loses to the bfloat16 matmul once many tokens go through at once (a prompt's
prefill), so a layer multiplies by its original floating weight, **shared** with the model it
was made from (no copy), when a call has more than ``max_rows`` tokens.

Why the law is kept. The quantized model is just another draft: its processed distribution is
what the drafting draws from and what the verifier reads, whatever the weights it was computed
with. Which weights a forward used depends on how many tokens it carried (the prompt's length,
the tokens pending from earlier rounds), all fixed before the round draws. Only acceptance can
change: a quantized draft agrees with the target about as often as the original (the decode
benchmark measures both).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from specsampling.validation import check_positive_int

#: Tokens per call up to which the int8 kernel is used (measured: 3x the bfloat16 matmul's
#: speed at 1-4 tokens, 1.5x at 8, even at about 16, half at 150).
MAX_ROWS = 12


class Int8Linear(torch.nn.Module):
    """A linear layer with an int8 weight ``[out, in]`` and per-row scales ``[out]``; calls of
    more than ``max_rows`` tokens use ``weight`` (the floating one it was made from)."""

    def __init__(self, linear: torch.nn.Linear, max_rows: int = MAX_ROWS) -> None:
        super().__init__()
        weight = linear.weight.detach()  # [out, in]
        scale = weight.float().abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.max_rows = max_rows
        bias = None if linear.bias is None else linear.bias.detach()
        int8_weight = torch.round(weight.float() / scale[:, None]).to(torch.int8)  # [out, in]
        # buffers (moved by .to()), not saved in a state dict; weight and bias are shared
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.register_buffer("int8_weight", int8_weight, persistent=False)
        self.register_buffer("scale", scale.to(weight.dtype), persistent=False)  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [M, in]
        if rows.shape[0] > self.max_rows or x.dtype != self.scale.dtype:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        out = torch._weight_int8pack_mm(rows, self.int8_weight, self.scale)  # [M, out]
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"max_rows={self.max_rows}"
        )


def quantize_int8(model: Any, max_rows: int = MAX_ROWS) -> Any:
    """A copy of ``model`` with every ``torch.nn.Linear`` an :class:`Int8Linear` (see the
    module doc); ``model`` itself is left as it is, and the copy shares its floating tensors
    (no second copy of the weights: move or cast ``model`` first, then quantize, since an
    in-place ``.to()`` of a shared parameter moves it in both).

    Measured and tested on CPUs only; ``max_rows=0`` runs every call on the floating weights
    (for a device whose torch build lacks the int8 kernel).

    ``max_rows``: calls of more tokens use the floating weights (default :data:`MAX_ROWS`).

    Examples
    --------
    >>> import torch, transformers
    >>> config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    >>> _ = torch.manual_seed(0)
    >>> draft = transformers.LlamaForCausalLM(config)
    >>> small = quantize_int8(draft)
    >>> type(small.lm_head).__name__, type(draft.lm_head).__name__
    ('Int8Linear', 'Linear')
    >>> ids = torch.tensor([[1, 2, 3]])
    >>> float((small(ids).logits - draft(ids).logits).abs().max().detach()) < 0.05
    True
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    max_rows = check_positive_int(max_rows, "max_rows", 0)
    if not hasattr(torch, "_weight_int8pack_mm"):
        raise RuntimeError("quantize_int8 needs torch._weight_int8pack_mm (torch >= 2.4)")
    widths = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if widths - {torch.float32, torch.float16, torch.bfloat16}:
        raise ValueError(
            f"model: int8 weight-only quantisation takes float32, float16 or bfloat16 weights "
            f"(torch's int8 kernel), got {sorted(str(w) for w in widths)}"
        )
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    made = copy.deepcopy(model, memo=shared)  # the module tree copied, the tensors shared
    for module in list(made.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, Int8Linear(child, max_rows))
    return made


__all__ = ["MAX_ROWS", "Int8Linear", "quantize_int8"]
