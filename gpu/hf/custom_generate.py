"""Speculative decoding inside ``model.generate(custom_generate=...)`` (transformers 5.17+), with
:class:`~specsampling.gpu.hf.SpeculativeDecoder` doing the rounds.

Two forms, both transformers' own hook:

* ``custom_generate=generate`` (the callable): the draft is our ``draft_model`` keyword, since
  transformers does not pass ``assistant_model`` to a callable; a call that gives
  ``assistant_model`` anyway is refused rather than decoded without its draft;
* ``custom_generate=GENERATE_DIR, trust_remote_code=True`` (the directory form, a folder shipped
  in this package whose ``custom_generate/generate.py`` transformers runs with every ``generate``
  argument): HF's own ``assistant_model=`` is the draft.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from specsampling.shapes import Shape

from .decoder import SpeculativeDecoder

#: The logits processors ``generate`` maps onto :func:`specsampling.gpu.process` (by class name).
_PROCESSORS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
#: The stopping criteria ``generate`` honours itself (max length, EOS).
_CRITERIA = {"MaxLengthCriteria", "EosTokenCriteria", "MaxNewTokensCriteria"}

#: The directory for ``model.generate(custom_generate=GENERATE_DIR, trust_remote_code=True,
#: assistant_model=draft, ...)``: transformers runs its ``custom_generate/generate.py``, which
#: forwards to :func:`generate_with_arguments`.
GENERATE_DIR = str(Path(__file__).resolve().parent / "hub")


def _caller_assistant_model() -> Any:
    """The ``assistant_model`` of the transformers ``generate`` call that called us, if any.

    transformers drops ``assistant_model`` before it calls a callable ``custom_generate`` (it is
    not in the callable's keyword arguments, and the generation config keeps no trace of it), so
    the only place it is still visible is the calling frame's locals. Best effort: a caller that
    is not transformers' ``generate`` gives ``None``.
    """
    frame = sys._getframe(2)  # generate() -> _caller_assistant_model(); 2 = generate's caller
    if frame.f_code.co_name != "generate" or "transformers" not in frame.f_code.co_filename:
        return None
    return frame.f_locals.get("assistant_model")


def generate(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    draft_model: Any = None,
    scheme: Any = "standard",
    shape: Shape | None = None,
    seed: int | None = None,
    key: Any = None,
    window: int | None = None,
    draft_length: Any = None,
    **model_kwargs: Any,
) -> torch.Tensor:
    """Speculative decoding inside ``model.generate(custom_generate=generate, ...)``.

    transformers (5.17+) calls this with the model, the prompt, its prepared logits processors,
    stopping criteria and generation config, plus our own keywords: ``draft_model`` (the draft:
    a model, :class:`LayerSkipDraft`, :class:`NGramDraft` or ``None``; ``assistant_model`` is not
    passed to a callable), ``scheme``, ``shape``, ``seed``, and ``key`` / ``window`` for the
    keyed couplings (:meth:`SpeculativeDecoder.generate`), and ``draft_length`` (an adaptive
    draft length, :mod:`specsampling.gpu.hf.lengths`; not ``length``, a name transformers
    uses itself); ``draft_model`` may be a :class:`ModelDraft` with ``confidence`` or a
    :class:`MixedDraft`. ``do_sample=False`` is greedy
    (``temperature = 0``); ``temperature`` / ``top_k`` / ``top_p`` go through
    :func:`specsampling.gpu.process`. Any other logits processor or stopping criterion is refused
    (it cannot be applied exactly to tree rows here) rather than silently dropped. Returns the
    sequences ``[B, L]`` (prompt, then the generated tokens padded with ``pad_token_id``).
    """
    if synced_gpus or streamer is not None:
        raise ValueError("generate: synced_gpus and streamer are not supported")
    if _caller_assistant_model() is not None:
        raise ValueError(
            "assistant_model: transformers does not pass it to a callable custom_generate, so it "
            "would be dropped; give the draft as draft_model=..., or call generate with "
            "custom_generate=specsampling.gpu.hf.GENERATE_DIR, trust_remote_code=True, which "
            "takes assistant_model"
        )
    config = generation_config if generation_config is not None else model.generation_config
    for name in ("num_beams", "num_beam_groups"):
        if (getattr(config, name, None) or 1) > 1:
            raise ValueError(
                f"{name}: beam search is not speculative sampling; speculative decoding here "
                f"keeps {name}=1 (greedy with do_sample=False, or sampling)"
            )
    if getattr(config, "return_dict_in_generate", False):
        raise ValueError(
            "return_dict_in_generate: speculative decoding here returns the sequences only "
            "(no scores, logits, attentions or hidden states); SpeculativeDecoder.generate "
            "returns its own record with the rounds' statistics"
        )
    unsupported = sorted(
        {type(p).__name__ for p in (logits_processor or ())} - _PROCESSORS
        | {type(c).__name__ for c in (stopping_criteria or ())} - _CRITERIA
    )
    if unsupported:
        raise ValueError(
            f"generate: {unsupported} are not supported by speculative decoding here (only "
            "temperature, top_k, top_p, max length and EOS)"
        )
    length = input_ids.shape[1]
    max_new = config.max_new_tokens
    if max_new is None:
        max_new = max(0, int(config.max_length) - length)
    sample = bool(config.do_sample)
    temperature = float(config.temperature if config.temperature is not None else 1.0)
    top_k = config.top_k if sample and config.top_k else None
    top_p = config.top_p if sample and config.top_p is not None and config.top_p < 1 else None
    decoder = SpeculativeDecoder(model, draft_model, scheme, shape, length=draft_length)
    out = decoder.generate(
        input_ids,
        max_new_tokens=max_new,
        temperature=temperature if sample else 0.0,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        eos_token_id=config.eos_token_id,
        attention_mask=model_kwargs.get("attention_mask"),
        pad_token_id=config.pad_token_id,
        key=key,
        window=window,
    )
    return out.sequences


#: ``generate`` arguments the directory form cannot honour exactly: refused when given.
_REFUSED_ARGUMENTS = (
    "prefix_allowed_tokens_fn",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
)


def generate_with_arguments(model: Any, **arguments: Any) -> torch.Tensor:
    """The directory form's entry: every ``generate`` argument, ``assistant_model`` included.

    transformers calls this (through ``GENERATE_DIR``'s ``custom_generate/generate.py``) with the
    model and all of ``model.generate``'s arguments. ``assistant_model`` (or ``draft_model``, not
    both) becomes the draft; the call then re-enters ``model.generate`` with the callable
    :func:`generate`, so generation-config handling, logits processors and stopping criteria are
    transformers' own and exactly those of the callable form.
    """
    assistant = arguments.pop("assistant_model", None)
    if assistant is not None and arguments.get("draft_model") is not None:
        raise ValueError("assistant_model: give the draft once, as assistant_model or draft_model")
    if assistant is not None:
        arguments["draft_model"] = assistant
    for name in _REFUSED_ARGUMENTS:
        if arguments.pop(name, None) is not None:
            raise ValueError(f"{name}: not supported by speculative decoding here")
    return model.generate(custom_generate=generate, **arguments)


__all__ = ["GENERATE_DIR", "generate", "generate_with_arguments"]
