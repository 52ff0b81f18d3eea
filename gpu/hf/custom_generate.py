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


#: transformers' assisted-generation options (generation-config fields) that a callable
#: ``custom_generate`` receives but this decoder does not read, with the values transformers
#: fills in when they are not given (a value outside them was set by the caller or the model's
#: generation config, and is refused rather than ignored), and what to use instead.
_ASSISTED_OPTIONS = {
    "num_assistant_tokens": (
        (None, 20),
        "the draft length is shape=specsampling.Shape.chain(n), or an adaptive "
        "draft_length=specsampling.gpu.hf.HeuristicLength(initial=n)",
    ),
    "num_assistant_tokens_schedule": (
        (None, "constant"),
        "give draft_length=specsampling.gpu.hf.HeuristicLength(...) (transformers' "
        "'heuristic_transient' schedule) or CostModelLength(...)",
    ),
    "assistant_confidence_threshold": (
        (None, 0.4),
        "give draft_model=specsampling.gpu.hf.ModelDraft(model, confidence=...)",
    ),
    "prompt_lookup_num_tokens": (
        (None,),
        "give draft_model=specsampling.gpu.hf.NGramDraft(...) with shape=Shape.chain(n)",
    ),
    "max_matching_ngram_size": (
        (None,),
        "give draft_model=specsampling.gpu.hf.NGramDraft(n=...)",
    ),
    "assistant_early_exit": (
        (None,),
        "give draft_model=specsampling.gpu.hf.LayerSkipDraft(model, layers)",
    ),
    "assistant_lookbehind": ((None, 10), "the draft shares the target's vocabulary here"),
    "target_lookbehind": ((None, 10), "the draft shares the target's vocabulary here"),
}


def _caller_local(name: str) -> Any:
    """The local ``name`` of the transformers ``generate`` call that called us, if any.

    transformers drops ``assistant_model``, ``streamer`` and ``synced_gpus`` before it calls a
    callable ``custom_generate`` (they are not in the callable's keyword arguments, and the
    generation config keeps no trace of them), so the only place they are still visible is the
    calling frame's locals. Best effort: a caller that is not transformers' ``generate`` gives
    ``None``.
    """
    frame = sys._getframe(2)  # generate() -> _caller_local(); 2 = generate's caller
    if frame.f_code.co_name != "generate" or "transformers" not in frame.f_code.co_filename:
        return None
    return frame.f_locals.get(name)


class _PromptSent:
    """A transformers streamer whose prompt transformers has already put: the decoder's own
    ``put`` of the prompt is skipped, every later ``put`` and ``end`` passed on."""

    def __init__(self, streamer: Any) -> None:
        self.streamer, self.prompt_skipped = streamer, False

    def put(self, tokens: torch.Tensor) -> None:
        if not self.prompt_skipped:
            self.prompt_skipped = True
            return
        self.streamer.put(tokens)

    def end(self) -> None:
        self.streamer.end()


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
    :func:`specsampling.gpu.process`. A ``streamer`` given to ``generate`` (which transformers
    puts the prompt into and does not pass on) gets each round's committed tokens, then
    ``end()``. Any other logits processor or stopping criterion is refused
    (it cannot be applied exactly to tree rows here) rather than silently dropped, and so are
    ``synced_gpus`` and transformers' assisted-generation settings (``num_assistant_tokens``,
    ``assistant_confidence_threshold``, ``prompt_lookup_num_tokens``, ...) other than its
    defaults, each error naming this decoder's equivalent. Returns the
    sequences ``[B, L]`` (prompt, then the generated tokens padded with ``pad_token_id``).
    """
    if synced_gpus or _caller_local("synced_gpus"):
        raise ValueError("synced_gpus: not supported by speculative decoding here")
    if streamer is None and _caller_local("streamer") is not None:
        # transformers put the prompt into it and then dropped it from our arguments
        streamer = _PromptSent(_caller_local("streamer"))
    if _caller_local("assistant_model") is not None:
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
    for name, (defaults, instead) in _ASSISTED_OPTIONS.items():
        value = getattr(config, name, None)
        if not any(value is d or value == d for d in defaults):
            raise ValueError(
                f"{name}: transformers' assisted-generation option is not read by this "
                f"decoder (got {value!r}); {instead}"
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
        streamer=streamer,
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
