"""A mutant of the vLLM plugin, installed inside vLLM's worker processes: the negative control of
the law checks in ``tests/test_vllm_plugin_engine.py``.

vLLM runs the verifier in its own spawned processes, so a mutant cannot be patched in from the
test process; it travels as a worker extension instead. :class:`MutantExtension` is the plugin's
:class:`~specsampling.gpu.vllm_plugin.WorkerExtension` plus one RPC,
``collective_rpc("specsampling_mutate", args=(name,))``, which swaps the plugin's per-step
verifier (``vllm_plugin.verify_step``) for a named mutant, or back with ``None``.
"""

from __future__ import annotations

from typing import Any

import torch

from specsampling.gpu import vllm_plugin

_ORIGINAL = vllm_plugin.verify_step


def always_accept_step(
    scheme: str,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Any,
    probs: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """Every draft accepted, then the bonus row's argmax: lossy whenever a draft is not the
    target's only token (the plugin's verdict shape and padding are kept)."""
    out = _ORIGINAL(scheme, draft_token_ids, num_draft_tokens, probs, *args, **kwargs)
    start = row = 0
    for b, n in enumerate(int(n) for n in num_draft_tokens):
        out[b, :n] = draft_token_ids[start : start + n].to(out.dtype)
        out[b, n] = probs[row + n].argmax()
        out[b, n + 1 :] = -1
        start += n
        row += n + 1
    return out


MUTANTS = {"always_accept": always_accept_step}


class MutantExtension(vllm_plugin.WorkerExtension):
    """The plugin's worker extension with :meth:`specsampling_mutate` (tests only)."""

    def specsampling_mutate(self, name: str | None) -> str | None:
        vllm_plugin.verify_step = _ORIGINAL if name is None else MUTANTS[name]
        return name
