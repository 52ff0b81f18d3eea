"""Benchmark: batched torch tree verification on CPU, vs the numpy reference and a read floor.

Run from the repository root::

    pip install -e ".[torch]"
    python benchmarks/torch_trees.py            # writes benchmarks/results/torch_trees-<date>.md
    python benchmarks/torch_trees.py --no-write # print only
    python benchmarks/torch_trees.py --quick --output /tmp/trees.md   # seconds: smoke test
    python benchmarks/torch_trees.py --schemes spectr resispec   # those rows only

``B`` trees of 32 drafted nodes (``Shape.paths(4, 8)``, ``Shape.branching((2, 3, 4))`` without
and with replacement) are drafted by the reference from a real-size synthetic pair
(``common.SyntheticPair``: softmax of 3 x N(0, 1) logits, draft = the same plus N(0, 1), per
prefix), with their tables ``[B, N, V]``. For every registered tree lowering of
``specsampling.gpu.SCHEMES`` (iterated at run time) whose reference supports the shape, measured
side by side in one run, taking turns within each repeat (``common.interleaved_median_within``:
the repeats that fit in ``--budget`` seconds per scheme and shape):

* the lowering, ``ssg.verify(..., validate=False)`` on float32 and on float64 tables, both
  with the rows' reference noise (the walk's cost depends on the rows it keeps walking, so the
  ratios compare the same walks);
* the numpy reference, ``ss.SCHEMES[name].verify`` looping over the rows (float64, with the
  reference's own input checks, as a caller uses it);
* the read floor: one ``sum`` over each float32 input table;
* the ``standard`` walk of the same batch (``get_lowering("standard").walk`` on the float32
  tables and the same noise: slot 0 at every node, the same number of levels), the yardstick of
  the column "f32 / standard" (goal: at most 3x for the multi-candidate rules); the f32 side
  also pays ``ssg.verify``'s dispatch and shape checks, which the bare walk does not.

The float64 run is also checked path-wise against the reference's verdicts (column "equal"),
so the benchmark times the computation the tests certify. The ratios are the claim; absolute
times depend on the CPU and its load (printed).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    SyntheticPair,
    interleaved_median_within,
    is_busy,
    machine_lines,
    parse_torch_args,
    report_result,
    sig,
    table,
    torch_parser,
)

import specsampling as ss
import specsampling.gpu as ssg
from specsampling.gpu.schemes import TreeLowering
from specsampling.gpu.schemes.resispec import ResiSpec
from specsampling.schemes import resispec_policy, tables

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = (
    ss.Shape.paths(4, 8),
    ss.Shape.branching((2, 3, 4)),
    ss.Shape.branching((2, 3, 4), replacement=True),
)


#: ResiSpec's explicit policies, timed next to the registered default (``Optimised``, whose
#: optimiser is planned on the host per node): the batched rule without the planning.
RESISPEC_POLICIES = (
    resispec_policy.Greedy(),
    resispec_policy.ConstantRatio(),
    resispec_policy.ConfidenceDamping(),
)


def tree_schemes(
    shape: ss.Shape, only: tuple[str, ...] = ()
) -> tuple[list[tuple[str, Any]], list[list[str]]]:
    """``(label, lowering)`` of the registered tree lowerings whose reference supports
    ``shape``, ResiSpec's explicit policies after its default; the rest, with why. With
    ``only``, the rows whose label contains one of those strings."""
    usable: list[tuple[str, Any]] = []
    skipped = []
    for name in sorted(ssg.SCHEMES):
        lowering = ssg.get_lowering(name)
        if not isinstance(lowering, TreeLowering):
            skipped.append([name, "keyed coupling: runs from a key, not a tree verifier"])
        elif ss.SCHEMES[name].supports(shape):
            usable.append((f"`{name}`", lowering))
            if name == "resispec":
                usable += [
                    (f"`resispec` {type(policy).__name__}", ResiSpec(policy))
                    for policy in RESISPEC_POLICIES
                ]
    if only:
        usable = [(label, low) for label, low in usable if any(part in label for part in only)]
    return usable, skipped


def measure(
    shape: ss.Shape,
    batch_size: int,
    vocab_size: int,
    repeats: int,
    seed: int,
    budget_s: float,
    only: tuple[str, ...] = (),
):
    """Rows of the table for one shape, the floor (s), mean nodes per tree, skipped schemes."""
    usable, skipped = tree_schemes(shape, only)
    pair = SyntheticPair(vocab_size, seed)
    rng = np.random.default_rng(seed)
    trees = [shape.draft(pair, rng) for _ in range(batch_size)]
    numpy_tables = [tables(pair, tree) for tree in trees]
    noises = [ss.Noise.draw(rng, tree.num_nodes) for tree in trees]
    batch = ssg.TreeBatch.from_trees(trees)
    target64, draft64 = ssg.tables_batch(
        [t for t, _ in numpy_tables], [d for _, d in numpy_tables]
    )  # [B, N, V] float64 each
    target32, draft32 = target64.float(), draft64.float()  # [B, N, V]
    noise = ssg.Noise.from_reference(noises)
    standard = ssg.get_lowering("standard")
    assert isinstance(standard, TreeLowering)
    rows = []
    for label, lowering in usable:
        reference = lowering.reference_scheme
        expected = [
            tuple(reference.verify(tree, t, d, n))
            for tree, (t, d), n in zip(trees, numpy_tables, noises, strict=True)
        ]
        out = ssg.verify(lowering, batch, target64, draft64, noise)
        got = list(zip(out.node.tolist(), out.token.tolist(), strict=True))
        equal = sum(g == e for g, e in zip(got, expected, strict=True))

        def reference_loop(reference=reference):
            for tree, (t, d), n in zip(trees, numpy_tables, noises, strict=True):
                reference.verify(tree, t, d, n)

        fns = {
            "floor": lambda: (target32.sum(), draft32.sum()),
            "f32": lambda lowering=lowering: ssg.verify(
                lowering, batch, target32, draft32, noise, validate=False
            ),
            "f64": lambda lowering=lowering: ssg.verify(
                lowering, batch, target64, draft64, noise, validate=False
            ),
            "reference": reference_loop,
            # the check_batch of verify refuses trees for standard: its walk, on the same inputs
            "standard": lambda: standard.walk(batch, target32, draft32, noise),
        }
        spent, rounds = interleaved_median_within(fns, repeats, budget_s)  # seconds, median
        rows.append(
            [
                label,
                sig(spent["f32"] * 1e3),
                sig(spent["f64"] * 1e3),
                sig(spent["f32"] / spent["floor"], 2) + "x",
                sig(spent["reference"] * 1e3),
                sig(batch_size / spent["f32"]),
                sig(batch_size / spent["reference"]),
                sig(spent["reference"] / spent["f32"]) + "x",
                f"{equal}/{batch_size}",
                sig(spent["floor"] * 1e3),
                sig(spent["f32"] / spent["standard"], 2) + "x",
                str(rounds) if rounds else "1 (no warm-up)",
            ]
        )
    mean_nodes = float(np.mean([tree.num_nodes for tree in trees]))
    return rows, mean_nodes, skipped


HEADER = [
    "scheme",
    "lowering f32 (ms)",
    "lowering f64 (ms)",
    "f32 / read floor",
    "reference loop (ms)",
    "rounds/s lowering f32",
    "rounds/s reference",
    "lowering / reference",
    "equal (f64)",
    "read floor (ms)",
    "f32 / standard",
    "timed rounds",
]


def main() -> None:
    parser = torch_parser(__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="seconds per scheme and shape: slower schemes get fewer timed rounds",
    )
    parser.add_argument(
        "--schemes",
        nargs="+",
        default=(),
        metavar="NAME",
        help="time only the rows whose label contains one of these (e.g. spectr resispec)",
    )
    args = parse_torch_args(parser)
    if args.quick:
        args.batch, args.vocab, args.repeats = 4, 500, 2
    began = time.perf_counter()
    load_before = os.getloadavg()
    sections = []
    keyed: dict[str, str] = {}
    for shape in SHAPES:
        rows, mean_nodes, skipped = measure(
            shape, args.batch, args.vocab, args.repeats, args.seed, args.budget, tuple(args.schemes)
        )
        keyed.update({name: why for name, why in skipped})
        body = table(HEADER, rows) if rows else "No registered tree lowering supports it."
        sections.append(
            f"## `{shape!r}` (law `{shape.law.value}`), B = {args.batch}, V = {args.vocab:,}\n\n"
            f"Mean {mean_nodes:.1f} nodes per tree (root included; the reference merges "
            f"repeated prefixes).\n\n{body}"
        )
    load_after = os.getloadavg()
    busy = is_busy(load_before)  # the after value includes this benchmark's own threads
    keyed_text = (
        "\n\nNot timed (registered, not tree verifiers): "
        + ", ".join(f"`{name}`" for name in sorted(keyed))
        + "."
        if keyed
        else ""
    )
    quick = " **(`--quick` sizes: a smoke test, not a result)**" if args.quick else ""
    selected = (
        "Rows selected by `--schemes "
        + " ".join(args.schemes)
        + "` (labels containing one of these; the others not timed).\n"
        if args.schemes
        else ""
    )
    text = f"""# Torch tree verification on CPU{quick}

Generated by `python benchmarks/torch_trees.py`; see `benchmarks/README.md`.

{machine_lines(load_before, load_after)}
- run time of the whole benchmark: {time.perf_counter() - began:.1f} s

Trees drafted by the reference from `common.SyntheticPair` (seed {args.seed}). "lowering" is
`ssg.verify(..., validate=False)` on the batch; "reference loop" is `ss.SCHEMES[name].verify`
over the {args.batch} rows (float64, with its input checks); "read floor" is one `sum` over
each float32 table `[B, N, V]` (the lowering reads only the rows on each walked path, so it can
beat a full read). "lowering / reference" is the ratio of rounds per second (goal:
>= 100x). "equal" counts rows whose float64 verdict equals the reference's (same noise).
"f32 / standard" is the lowering's float32 time over the `standard` walk of the same batch
(slot 0 at every node: as many levels; goal <= 3x). "`resispec` Greedy", "ConstantRatio" and
"ConfidenceDamping" are ResiSpec with those explicit policies (defaults: rho*, a damping of 1/2
on every token), the batched rule without the default's per-node host optimiser.
{selected}Median of {args.repeats} interleaved repeats after a warm-up, or as many as fit in
{args.budget:g} s per scheme and shape ("timed rounds"; a scheme whose warm-up alone takes longer
is timed by that one call).

{chr(10).join(s + chr(10) for s in sections)}{keyed_text}
"""
    today = time.strftime("%Y-%m-%d")
    report_result(
        text,
        args.output,
        RESULTS / f"torch_trees-{today}.md",
        no_write=args.no_write,
        quick=args.quick,
        busy=busy,
    )


if __name__ == "__main__":
    main()
