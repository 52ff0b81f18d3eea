"""Benchmark: ``specsampling.gpu.process`` (temperature, top-k, top-p) against one torch.softmax.

Run from the repository root::

    pip install -e ".[torch]"
    python benchmarks/torch_processing.py            # writes results/torch_processing-<date>.md
    python benchmarks/torch_processing.py --no-write # print only
    python benchmarks/torch_processing.py --quick --output /tmp/processing.md   # seconds

Float32 logits of 3 x N(0, 1) (the target table of ``common.chain_logits``) in two sizes: the chain
round's rows, B = 64 x (γ + 1) = 576 rows at V = 32,000, and one round at the Qwen vocabulary, 9
rows at V = 151,936. One row of the table per setting (temperature alone, top-k 50, top-p 0.9,
top-k 50 with top-p 0.9, greedy T = 0, and top-p 0.9 with the peaked rows' partial sort switched
off, an ablation): ``ssg.process`` with ``validate=True`` (the default: top-p alone by a partial
sort of the first 64 ranks where most rows are peaked, else, and for the rows it cannot decide, a
radix select; top-k, with or without top-p, from the logits: the k + 1 largest by block maxima,
top-p counted inside the top-k set) and with ``validate=False`` (the value checks skipped; on the
CPU, where host reads cost no synchronisation, the same routes), and ``torch.softmax`` of the same
table, the floor (``process`` cannot avoid one softmax pass), and Hugging Face's logits warpers
then ``torch.softmax`` (the peer, where transformers is installed). All contenders take turns
within each repeat (``common.interleaved_median``: the median of each). Goal: process / softmax
<= 1.3x. Each size runs three times: the benchmark's rows, then the logits scaled by 2 (peaked
rows, nuclei of tens of tokens, as a language model's usually are), then by 1.5 (nuclei of about
a hundred tokens: past the partial sort's first 64 ranks). The ratios are the claim; absolute
times depend on the CPU and its load (printed).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from common import (
    chain_logits,
    interleaved_median,
    is_busy,
    machine_lines,
    parse_torch_args,
    report_result,
    sig,
    table,
    torch_parser,
)

import specsampling.gpu as ssg
from specsampling.gpu import processing

RESULTS = Path(__file__).resolve().parent / "results"

#: The logits' scale in the peaked tables: nuclei of tens of tokens, as a language model's usually
#: are, where the benchmark's 3 x N(0, 1) rows keep thousands.
PEAKED = 2.0

#: The logits' scale in the middle tables: nuclei of about a hundred tokens, past the partial
#: sort's first ranks (top-p alone then escalates to more ranks before any radix select).
MIDDLE = 1.5

#: The ablation row: top-p alone with the peaked rows' partial sort switched off (every row by
#: the radix select, as before that route existed), side by side with the default in one run.
RADIX_ONLY = "top-p 0.9, radix select only"

#: (name, keyword arguments of ``ssg.process``), one table row each.
SETTINGS = [
    ("T = 0.7", {"temperature": 0.7}),
    ("top-k 50", {"top_k": 50}),
    ("top-p 0.9", {"top_p": 0.9}),
    (RADIX_ONLY, {"top_p": 0.9}),
    ("top-k 50 + top-p 0.9", {"top_k": 50, "top_p": 0.9}),
    ("T = 0 (greedy)", {"temperature": 0.0}),
]

HEADER = [
    "setting",
    "process (ms)",
    "process, validate=False (ms)",
    "torch.softmax (ms)",
    "process / softmax",
    "validate=False / softmax",
    "HF warpers + softmax (ms)",
    "HF / process",
]


def hf_warpers(kwargs: dict):
    """Hugging Face's logits warpers for ``kwargs`` (temperature, top-k, top-p, in the order
    its sampler applies them), or None where transformers is absent or has none (T = 0 is its
    argmax, no warper)."""
    try:
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    except ImportError:
        return None
    warpers = []
    if "temperature" in kwargs:
        if kwargs["temperature"] == 0:
            return None
        warpers.append(TemperatureLogitsWarper(kwargs["temperature"]))
    if "top_k" in kwargs:
        warpers.append(TopKLogitsWarper(kwargs["top_k"]))
    if "top_p" in kwargs:
        warpers.append(TopPLogitsWarper(kwargs["top_p"]))
    return warpers


def nucleus_size(logits: torch.Tensor, top_p: float = 0.9) -> int:
    """The median number of tokens top-p keeps in a row of ``logits``."""
    ranked = torch.softmax(logits.double(), -1).sort(-1, descending=True).values
    return int(((ranked.cumsum(-1) - ranked) < top_p).sum(-1).median())


def measure(
    num_rows: int, vocab_size: int, repeats: int, seed: int, scale: float = 1.0
) -> tuple[list[list[str]], int]:
    """The table rows for float32 logits ``[num_rows, V]`` (``scale`` times the benchmark's
    3 x N(0, 1)), and the median top-p 0.9 nucleus."""
    batch_size, rem = divmod(num_rows, 9)
    assert rem == 0, "rows are B x (γ + 1) with γ = 8"
    logits = chain_logits(batch_size, 8, vocab_size, seed)[0].reshape(-1, vocab_size)  # [R, V]
    logits = logits * scale
    fns = {"softmax": lambda: torch.softmax(logits, -1)}

    def call(name, **kwargs):
        if name != RADIX_ONLY:
            return ssg.process(logits, **kwargs)
        share, processing._PEAKED_SHARE = processing._PEAKED_SHARE, math.inf  # never the prefix
        try:
            return ssg.process(logits, **kwargs)
        finally:
            processing._PEAKED_SHARE = share

    for name, kwargs in SETTINGS:
        fns[f"process:{name}"] = lambda name=name, kwargs=kwargs: call(name, **kwargs)
        fns[f"fast:{name}"] = lambda name=name, kwargs=kwargs: call(name, **kwargs, validate=False)
        validated, unvalidated = fns[f"process:{name}"](), fns[f"fast:{name}"]()
        assert torch.equal(validated, unvalidated), name  # both routes keep the same tokens
        warpers = hf_warpers(kwargs)
        if warpers is not None and name != RADIX_ONLY:

            def hf(warpers=warpers):
                scores = logits
                for warper in warpers:
                    scores = warper(None, scores)
                return torch.softmax(scores, -1)

            fns[f"hf:{name}"] = hf
    median = interleaved_median(fns, repeats)  # seconds
    rows = []
    for name, _ in SETTINGS:
        ours, fast, floor = median[f"process:{name}"], median[f"fast:{name}"], median["softmax"]
        hf = median.get(f"hf:{name}")
        rows.append(
            [
                name,
                sig(ours * 1e3),
                sig(fast * 1e3),
                sig(floor * 1e3),
                sig(ours / floor, 2) + "x",
                sig(fast / floor, 2) + "x",
                "—" if hf is None else sig(hf * 1e3),
                "—" if hf is None else sig(hf / ours, 2) + "x",
            ]
        )
    return rows, nucleus_size(logits)


def main() -> None:
    parser = torch_parser(__doc__)
    parser.add_argument("--rows", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--latency-rows", type=int, default=9)
    parser.add_argument("--latency-vocab", type=int, default=151_936)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    args = parse_torch_args(parser)
    if args.quick:
        args.rows, args.vocab, args.latency_rows, args.latency_vocab = 18, 2_000, 9, 5_000
        args.repeats = 2
    began = time.perf_counter()
    load_before = os.getloadavg()
    sizes = [(args.rows, args.vocab), (args.latency_rows, args.latency_vocab)]
    tables = [
        (rows, vocab, scale, *measure(rows, vocab, args.repeats, args.seed, scale))
        for scale in (1.0, PEAKED, MIDDLE)
        for rows, vocab in sizes
    ]
    load_after = os.getloadavg()
    quick = " **(`--quick` sizes: a smoke test, not a result)**" if args.quick else ""
    sections = "\n\n".join(
        f"## {rows} rows, V = {vocab:,}"
        + (f", peaked logits ({scale:g} x 3 x N(0, 1))" if scale == PEAKED else "")
        + (f", middle logits ({scale:g} x 3 x N(0, 1))" if scale == MIDDLE else "")
        + f"\n\nMedian top-p 0.9 nucleus: {nucleus:,} tokens.\n\n{table(HEADER, body)}"
        for rows, vocab, scale, body, nucleus in tables
    )
    text = f"""# Torch processing on CPU: `ssg.process` against one softmax{quick}

Generated by `python benchmarks/torch_processing.py`; see `benchmarks/README.md`.

{machine_lines(load_before, load_after)}
- run time of the whole benchmark: {time.perf_counter() - began:.1f} s

Float32 logits, 3 x N(0, 1) (`common.chain_logits`, seed {args.seed}). "process" is
`ssg.process(logits, ...)` as called by default (`validate=True`: the values are checked; top-p
alone runs a partial sort of 64 ranks where most rows are peaked, else a radix select; top-k, with
or without top-p, works from the logits: the k + 1 largest by block maxima, top-p counted inside
the top-k set); "validate=False" skips the checks (on the CPU it keeps these routes: host reads
cost no synchronisation there; an accelerator takes the sync-free full sort for top-p alone).
`torch.softmax` of the same table is the floor. Median of {args.repeats} interleaved repeats after
a warm-up. Goal: process / softmax <= 1.3x. The next two tables repeat the first two with the
logits scaled by {PEAKED:g} (peaked rows: nuclei of tens of tokens, where top-p alone tries a
partial sort of the first ranks before its radix select), the last two with the logits scaled by
{MIDDLE:g} (nuclei of about a hundred tokens: the rows the first 64 ranks leave undecided try
twice as many, then four times, before the radix select); "radix select only" is top-p 0.9 with
those partial sorts switched off, for comparison in the same run. "HF warpers + softmax" is the
peer's sampler on the same table, timed in the same repeats: transformers'
`TemperatureLogitsWarper` / `TopKLogitsWarper` / `TopPLogitsWarper` (a full sort for top-p),
then `torch.softmax`; "HF / process" is how many times longer it takes than `ssg.process`
(T = 0 has no HF warper: its argmax).

{sections}
"""
    today = time.strftime("%Y-%m-%d")
    report_result(
        text,
        args.output,
        RESULTS / f"torch_processing-{today}.md",
        no_write=args.no_write,
        quick=args.quick,
        busy=is_busy(load_before),
    )


if __name__ == "__main__":
    main()
