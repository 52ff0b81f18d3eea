"""Benchmark: Monte-Carlo block efficiency at V = 32k, ours against the numpy reference loop.

Run from the repository root::

    python benchmarks/simulators.py            # writes benchmarks/results/simulators-<date>.md
    python benchmarks/simulators.py --quick --output /tmp/sim.md   # seconds: smoke test

On one :class:`specsampling.simulators.pairs.Synthetic` pair (``V = --vocab-size``, 32,000),
every tree drafted after one fixed context and every node's distributions computed (the pair's
prefix cache is off for the reference, which would otherwise reuse the fixed root's), per scheme
and shape, trees (rounds) per second of

* the **reference**: ``specsampling.simulators.estimate_emitted``, the numpy reference sampler
  round after round (``ss.speculate``: the pair called per node, the reference verifier per tree);
* **ours, plain**: ``sim.estimate(..., method="plain")``: batched drafting on torch, the pair
  evaluated once per level, the torch lowering verifying the whole batch;
* **ours, Rao-Blackwellised**: ``sim.estimate(...)``: the same trees, then the reference node
  law per tree (one tree of RB is worth ``variance_ratio`` plain rounds, also reported);
* the **pair floor**: computing the trees' target and draft tables alone
  (``Synthetic.node_probs`` on as many nodes), the part no estimator on this pair can skip.

The contenders take turns within each repeat; each figure is the median over ``--repeats``. The
ratios are the claim; absolute rates depend on the CPU and its load (printed).
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from common import is_busy, machine_lines, parser, report_result, sig, table

import specsampling as ss
from specsampling import simulators as sim

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = (1, 2, 3, 4)  # every tree of every contender drafts after this context
CASES = [
    ("standard", ss.Shape.chain(4)),
    ("traversal", ss.Shape.paths(2, 3)),
    ("specinfer", ss.Shape.delayed(2, trunk=1, branch=2)),
]


def main() -> None:
    made = parser(__doc__)
    made.add_argument("--vocab-size", type=int, default=32000)
    made.add_argument("--trees", type=int, default=1024, help="trees per run of ours")
    made.add_argument("--reference-trees", type=int, default=64)
    made.add_argument("--repeats", type=int, default=3)
    made.add_argument("--threads", type=int, default=2)
    made.add_argument("--quick", action="store_true")
    args = made.parse_args()
    if args.quick:
        args.vocab_size, args.trees, args.reference_trees, args.repeats = 2000, 64, 8, 1
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    pair = sim.pairs.Synthetic(vocab_size=args.vocab_size, seed=0)
    # The reference calls the pair per node; its face caches recent prefixes, which at one
    # fixed root would spare it most of the work. Both sides compute every node here.
    uncached = sim.pairs.Synthetic(vocab_size=args.vocab_size, seed=0)
    uncached._cache_size = 0
    rows = []
    for scheme, shape in CASES:
        nodes = 1 + len(shape.steps)
        runs: dict[str, list[float]] = {"reference": [], "plain": [], "rb": [], "floor": []}
        ratio = float("nan")
        for repeat in range(args.repeats):
            rng = np.random.default_rng(repeat)
            start = time.perf_counter()
            sim.estimate_emitted(scheme, uncached, shape, args.reference_trees, rng, ROOT)
            runs["reference"].append(args.reference_trees / (time.perf_counter() - start))
            start = time.perf_counter()
            sim.estimate(
                scheme, pair, shape, args.trees, "plain", repeat, prefix=ROOT, progress=False
            )
            runs["plain"].append(args.trees / (time.perf_counter() - start))
            start = time.perf_counter()
            est = sim.estimate(
                scheme, pair, shape, args.trees, generator=repeat, prefix=ROOT, progress=False
            )
            runs["rb"].append(args.trees / (time.perf_counter() - start))
            ratio = est.variance_ratio or float("nan")
            hashes = pair.hash_prefixes([ROOT] * args.trees).repeat_interleave(nodes)
            lengths = torch.full((len(hashes),), 5)
            start = time.perf_counter()
            for chunk in range(0, len(hashes), 4096):
                pair.node_probs(hashes[chunk : chunk + 4096], lengths[chunk : chunk + 4096])
            runs["floor"].append(args.trees / (time.perf_counter() - start))
        rate = {k: statistics.median(v) for k, v in runs.items()}
        rows.append(
            [
                scheme,
                repr(shape),
                sig(rate["reference"]),
                sig(rate["plain"]),
                sig(rate["rb"]),
                sig(rate["floor"]),
                sig(rate["plain"] / rate["reference"], 2) + "x",
                sig(rate["rb"] / rate["reference"], 2) + "x",
                sig(ratio, 2),
                sig(rate["floor"] / rate["plain"], 2) + "x",
            ]
        )
    load_after = os.getloadavg()
    quick = " **(`--quick`: a smoke test, not a result)**" if args.quick else ""
    text = f"""# Simulators: trees per second at V = {args.vocab_size:,}{quick}

Generated by `python benchmarks/simulators.py`; see `benchmarks/README.md`.

{machine_lines(load_before, load_after)}
- pair: `{pair!r}`; ours {args.trees} trees per run, the reference {args.reference_trees} rounds
  per run; median of {args.repeats} repeats, the contenders taking turns

{
        table(
            [
                "scheme",
                "shape",
                "reference trees/s",
                "ours plain trees/s",
                "ours RB trees/s",
                "pair floor trees/s",
                "plain / reference",
                "RB / reference",
                "RB variance ratio",
                "floor / plain",
            ],
            rows,
        )
    }

"RB variance ratio": plain Monte Carlo's per-tree variance over the Rao-Blackwellised one, on
the same trees; RB's effective rate is its trees/s times this ratio. "floor / plain": how far
plain Monte Carlo is from only computing the pair's tables (what bounds any estimator here).
"""
    report_result(
        text,
        args.output,
        RESULTS / f"simulators-{datetime.date.today()}.md",
        no_write=args.no_write,
        quick=args.quick,
        busy=is_busy(load_before),
    )


if __name__ == "__main__":
    main()
