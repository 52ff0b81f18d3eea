"""The runs behind docs/simulators-findings.md: DDTE's comparisons on synthetic pairs and on
recorded Qwen2.5-Coder trees, with the simulators.

Run from the repository root (after ``python benchmarks/record_qwen.py`` for part D/E)::

    python benchmarks/simulators_findings.py   # writes results/simulators-findings-<date>.md
    python benchmarks/simulators_findings.py --quick --output /tmp/f.md   # a smoke test

Parts, each a table with 95% intervals (Rao-Blackwellised estimates; differences paired on the
same trees):

A. matched i.i.d. multi-path drafting (``paths(k, 4)``, k = 2, 4) on a ``Synthetic`` pair at
   V = 32,000 whose divergence grows with depth: traversal against SpecInfer, SpecTr and NSS;
B. acceptance against depth (traversal and SpecInfer on ``paths(2, 4)``), with the target-draft
   L1 distance per depth;
C. delayed expansion against root branching at a matched budget of 6 drafted nodes, for the OT
   schemes (SpecInfer, SpecTr) and traversal;
D. the same comparison as A on the recorded Qwen trees (``--recorded``);
E. the gap to the k-draft optimum per node on the recorded root distributions: each scheme's
   exact single-position acceptance with 2 i.i.d. drafts against ``ss.optimal_acceptance``.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import numpy as np
import torch
from common import machine_lines, parser, report_result, table

import specsampling as ss
from specsampling import simulators as sim
from specsampling.gpu import hf

RESULTS = Path(__file__).resolve().parent / "results"
OT_SCHEMES = ["traversal", "specinfer", "spectr", "nss"]


def ci(est: sim.Estimate, signed: bool = False) -> str:
    low, high = est.ci
    fmt = "{:+.3f}" if signed else "{:.3f}"
    return f"{fmt.format(est.mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def comparison_rows(out: sim.Comparison, shape: ss.Shape) -> list[list[str]]:
    rows = [[repr(shape), name, ci(est), "-"] for name, est in out.estimates.items()]
    first = next(iter(out.estimates))
    for (a, b), d in out.differences.items():
        if a == first:
            rows.append(
                [
                    repr(shape),
                    f"{a} - {b}",
                    ci(d, signed=True),
                    f"{100 * d.mean / out[b].mean:+.1f}%",
                ]
            )
    return rows


COMPARISON_HEADER = ["shape", "scheme or paired difference", "E[tau+1] [95% CI]", "relative"]
DEPTH_HEADER = [
    "scheme",
    "depth d",
    "P(tau >= d) [95% CI]",
    "acceptance at d",
    "mean |p - q|_1 at depth d - 1",
]


def depth_rows(source: object, shape: ss.Shape | None, num_trees: int | None) -> list[list[str]]:
    """Acceptance against depth for traversal and SpecInfer on the same source (parts B, D)."""
    rows = []
    for name in ("traversal", "specinfer"):
        prof = sim.depth_profile(name, source, shape, num_trees, generator=0)
        for d, (r, a, l1) in enumerate(
            zip(prof.reach, prof.acceptance, prof.distance, strict=True)
        ):
            rows.append([name, str(d + 1), ci(r), f"{a:.3f}", f"{l1:.3f}"])
    return rows


def main() -> None:
    made = parser(__doc__)
    made.add_argument("--trees", type=int, default=512)
    made.add_argument("--vocab-size", type=int, default=32000)
    made.add_argument("--recorded", default=None, help="default: the record_qwen.py file")
    made.add_argument("--optimum-nodes", type=int, default=40)
    made.add_argument("--quick", action="store_true")
    args = made.parse_args()
    if args.quick:
        args.trees, args.vocab_size, args.optimum_nodes = 32, 500, 3
    torch.set_num_threads(2)
    began = time.perf_counter()
    load_before = os.getloadavg()
    pair = sim.pairs.Synthetic(vocab_size=args.vocab_size, seed=0, divergence=0.5, depth_growth=0.5)
    sections = []

    rows: list[list[str]] = []
    for k in (2, 4):
        shape = ss.Shape.paths(k, 4)
        rows += comparison_rows(
            sim.compare(OT_SCHEMES, pair, shape, args.trees, generator=0), shape
        )
    sections.append(
        f"## A. Matched i.i.d. multi-path drafting, synthetic pair\n\n`{pair!r}`, "
        f"{args.trees} trees per shape.\n\n" + table(COMPARISON_HEADER, rows)
    )

    shape = ss.Shape.paths(2, 4)
    sections.append(
        f"## B. Acceptance against depth, synthetic pair, {shape!r}\n\n"
        + table(DEPTH_HEADER, depth_rows(pair, shape, args.trees))
    )

    rows = []
    budget6 = [
        ss.Shape.paths(2, 3),
        ss.Shape.delayed(2, trunk=2, branch=2),
        ss.Shape.delayed(2, trunk=4, branch=1),
        ss.Shape.chain(6),
    ]
    for name in ("specinfer", "spectr", "traversal"):
        for shape, est in sim.sweep(name, pair, budget6, args.trees, generator=1):
            rows.append([name, repr(shape), str(len(shape.steps)), ci(est)])
    sections.append(
        "## C. Delayed expansion against root branching, 6 drafted nodes, synthetic pair\n\n"
        + table(["scheme", "shape", "drafted nodes", "E[tau+1] [95% CI]"], rows)
    )

    recorded = (
        Path(args.recorded)
        if args.recorded
        else (hf.cache_dir() / "recorded" / "qwen-coder-paths-2-3-t1.npz")
    )
    if recorded.exists():
        trees = sim.RecordedTrees.load(recorded)
        out = sim.compare(OT_SCHEMES, trees, generator=0)
        rows = comparison_rows(out, trees.shape)
        sections.append(
            f"## D. Recorded Qwen2.5-Coder trees\n\n`{recorded.name}`:\n\n"
            f"```text\n{trees.summary()}\n```\n\n"
            + table(COMPARISON_HEADER, rows)
            + "\n\nAcceptance against depth on the same trees:\n\n"
            + table(DEPTH_HEADER, depth_rows(trees, None, None))
        )
        rows = []
        gaps: dict[str, list[float]] = {}
        for index in range(min(args.optimum_nodes, len(trees))):
            target, draft = trees.tables(index)
            p, q = target[0], draft[0]
            best = float(ss.optimal_acceptance(p, q, 2))
            for name in ("specinfer", "spectr", "ot_optimal"):
                got = float(ss.acceptance(name, p, q, 2))
                gaps.setdefault(name, []).append(best - got)
            gaps.setdefault("optimum", []).append(best)
        for name, values in gaps.items():
            arr = np.array(values)
            rows.append([name, f"{arr.mean():.4f}", f"{arr.max():.4f}"])
        sections.append(
            f"## E. Gap to the 2-draft optimum at the recorded roots ({len(gaps['optimum'])} "
            "nodes)\n\nRows: the optimum's mean acceptance, then each scheme's mean and largest "
            "gap below it.\n\n" + table(["", "mean", "max"], rows)
        )
    else:
        sections.append(
            f"## D, E. Recorded trees\n\nNot run: {recorded} does not exist (run "
            "`python benchmarks/record_qwen.py`)."
        )
    load_after = os.getloadavg()
    quick = " **(`--quick`: a smoke test, not a result)**" if args.quick else ""
    text = (
        f"# What the simulators show{quick}\n\nGenerated by "
        "`python benchmarks/simulators_findings.py`; read with `docs/simulators-findings.md`.\n\n"
        f"{machine_lines(load_before, load_after)}\n"
        "- the figures are Monte-Carlo estimates, not timings: the machine's load does not "
        "change them\n"
        f"- run time {time.perf_counter() - began:.0f} s\n\n" + "\n\n".join(sections) + "\n"
    )
    report_result(
        text,
        args.output,
        RESULTS / f"simulators-findings-{datetime.date.today()}.md",
        no_write=args.no_write,
        quick=args.quick,
        busy=False,
    )


if __name__ == "__main__":
    main()
