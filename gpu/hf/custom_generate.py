"""Speculative decoding inside ``model.generate(custom_generate=generate, ...)`` (transformers
5.17+), with :class:`~specsampling.gpu.hf.SpeculativeDecoder` doing the rounds."""

from __future__ import annotations

from typing import Any

import torch

from specsampling.shapes import Shape

from .decoder import SpeculativeDecoder

#: The logits processors ``generate`` maps onto :func:`specsampling.gpu.process` (by class name).
_PROCESSORS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
#: The stopping criteria ``generate`` honours itself (max length, EOS).
_CRITERIA = {"MaxLengthCriteria", "EosTokenCriteria", "MaxNewTokensCriteria"}


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
    config = generation_config if generation_config is not None else model.generation_config
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


__all__ = ["generate"]
