"""``specsampling simulate``: sweeps of schemes x shapes x temperatures x budgets.

On a synthetic pair (``--vocab-size``, ``--divergence``, ...; one pair per temperature) or on a
recorded file (``--recorded FILE``), every scheme runs on every given shape it is exact for
(``--shapes``), and with ``--budgets`` the verifier-aware search picks each scheme's best shape
per node budget. Prints a table (or ``--json``), and with ``--plots DIR`` writes

* ``block_efficiency_vs_budget.png`` (with ``--budgets``): each scheme's best E[tau+1] per budget;
* ``acceptance_vs_depth.png``: each scheme's acceptance rate per depth on the first shape, with
  the mean target-draft L1 distance;
* ``tokens_per_second.png`` (with a cost: ``--cost-ratio`` or ``--cost FILE.json``): predicted
  speedup over plain decoding for every row of the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specsampling.compare import parse_shape
from specsampling.errors import InvalidDistribution, UnsupportedShape


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="specsampling simulate",
        description="Monte-Carlo block efficiency of schemes x shapes x temperatures x budgets on "
        "a synthetic LLM-like pair or on recorded real-model trees (needs torch).",
    )
    made.add_argument("--schemes", default="traversal,specinfer,spectr,nss")
    made.add_argument("--shapes", nargs="*", default=None, help="e.g. 'paths(2, 3)' 'chain(4)'")
    made.add_argument("--budgets", default=None, help="node budgets for the shape search, e.g. 4,8")
    made.add_argument("--families", default=None, help="shape families searched, e.g. chain,paths")
    made.add_argument("--num-trees", type=int, default=256)
    made.add_argument("--method", default="rao-blackwell", choices=("rao-blackwell", "plain"))
    made.add_argument("--seed", type=int, default=0, help="the Monte-Carlo seed")
    pair = made.add_argument_group("synthetic pair (ignored with --recorded)")
    pair.add_argument("--vocab-size", type=int, default=32000)
    pair.add_argument("--pair-seed", type=int, default=0)
    pair.add_argument("--temperatures", default="1.0")
    pair.add_argument("--divergence", type=float, default=0.5)
    pair.add_argument("--zipf", type=float, default=1.5)
    pair.add_argument("--spread", type=float, default=0.5)
    pair.add_argument("--depth-growth", type=float, default=0.0)
    made.add_argument("--recorded", default=None, help="a file written by simulators.record")
    made.add_argument("--cost-ratio", type=float, default=None, help="draft/target forward cost")
    made.add_argument("--cost", default=None, help="a CostModel as JSON (CostModel.as_dict)")
    made.add_argument("--json", default=None, help="write the rows as JSON to this file")
    made.add_argument("--plots", default=None, help="write the plots into this directory")
    made.add_argument("--no-progress", action="store_true")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``specsampling simulate``; returns the exit status."""
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 0
    try:
        rows, profiles = run(args)
    except ImportError as err:  # pragma: no cover - exercised only without torch
        sys.stderr.write(f"specsampling simulate: {err} (pip install 'specsampling[torch]')\n")
        return 2
    except (ValueError, TypeError, KeyError, OSError, InvalidDistribution, UnsupportedShape) as err:
        sys.stderr.write(f"specsampling simulate: {err}\n")
        return 2
    sys.stdout.write(format_table(rows) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    if args.plots:
        for path in plot(rows, profiles, Path(args.plots)):
            sys.stdout.write(f"wrote {path}\n")
    return 0


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The sweep's rows (one dict per scheme x shape x temperature) and depth profiles."""
    from . import cost as cost_module
    from .depth import depth_profile
    from .estimators import estimate, resolve
    from .pairs import Synthetic
    from .recorded import RecordedTrees
    from .search import search_shape

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    for name in schemes:
        resolve(name)
    shapes = [parse_shape(s) for s in (args.shapes or [])]
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else []
    if not shapes and not budgets:
        if args.recorded is None:
            shapes = [parse_shape("paths(2, 3)")]
    families = tuple(f.strip() for f in args.families.split(",")) if args.families else None
    cost = None
    if args.cost:
        cost = cost_module.CostModel.from_dict(json.loads(Path(args.cost).read_text()))
    elif args.cost_ratio is not None:
        cost = cost_module.CostModel.relative(draft_ratio=args.cost_ratio)
    progress = False if args.no_progress else None
    sources: list[tuple[float | None, Any]] = []
    if args.recorded:
        recorded = RecordedTrees.load(args.recorded)
        sources.append((recorded.meta.get("temperature"), recorded))
        shapes = [recorded.shape]
        budgets = []
    else:
        for text in args.temperatures.split(","):
            t = float(text)
            pair = Synthetic(
                args.vocab_size,
                seed=args.pair_seed,
                temperature=t,
                divergence=args.divergence,
                zipf=args.zipf,
                spread=args.spread,
                depth_growth=args.depth_growth,
            )
            sources.append((t, pair))
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}

    def add(scheme: str, shape: Any, est: Any, temperature: Any, budget: Any) -> None:
        row = {
            "temperature": temperature,
            "scheme": scheme,
            "shape": repr(shape),
            "budget": budget,
            "block_efficiency": est.mean,
            "stderr": est.stderr,
            "ci": list(est.ci),
            "num_trees": est.num_trees,
            "method": est.method,
        }
        if cost is not None and hasattr(shape, "steps"):
            row["predicted_speedup"] = cost.speedup(max(1.0, est.mean), shape)
            row["predicted_tokens_per_second"] = cost.tokens_per_second(max(1.0, est.mean), shape)
        rows.append(row)

    for temperature, source in sources:
        for scheme in schemes:
            obj = resolve(scheme)
            for shape in shapes:
                if not obj.supports(shape):
                    continue
                est = estimate(
                    scheme,
                    source,
                    None if args.recorded else shape,
                    None if args.recorded else args.num_trees,
                    args.method,
                    args.seed,
                    progress=progress,
                )
                add(scheme, shape, est, temperature, None)
            for budget in budgets:
                best = search_shape(
                    scheme,
                    source,
                    budget,
                    families=families,
                    num_trees=args.num_trees,
                    generator=args.seed,
                    progress=progress,
                )
                add(scheme, best.shape, best.estimate, temperature, budget)
            if args.plots and shapes and obj.supports(shapes[0]) and temperature == sources[0][0]:
                profiles[scheme] = depth_profile(
                    scheme,
                    source,
                    None if args.recorded else shapes[0],
                    None if args.recorded else args.num_trees,
                    args.seed,
                    progress=progress,
                )
    if not rows:
        raise ValueError("schemes: none of them is exact for the given shapes")
    return rows, profiles


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of the rows."""
    speed = any("predicted_speedup" in r for r in rows)
    head = f"{'T':>5} {'scheme':<12} {'shape':<34} {'budget':>6} {'E[tau+1]':>9} {'+-95%':>7}"
    lines = [head + (f" {'speedup':>8}" if speed else "")]
    for r in rows:
        t = "-" if r["temperature"] is None else f"{r['temperature']:g}"
        budget = "-" if r["budget"] is None else str(r["budget"])
        line = (
            f"{t:>5} {r['scheme']:<12} {r['shape']:<34} {budget:>6} "
            f"{r['block_efficiency']:>9.4f} {1.96 * r['stderr']:>7.4f}"
        )
        if speed:
            line += (
                f" {r['predicted_speedup']:>7.3f}x" if "predicted_speedup" in r else f" {'-':>8}"
            )
        lines.append(line)
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], profiles: dict[str, Any], folder: Path) -> list[Path]:
    """Write the plots of the module doc into ``folder``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    searched = [r for r in rows if r["budget"] is not None]
    if searched:
        fig, ax = plt.subplots(figsize=(6, 4))
        for (scheme, t), group in _groups(searched):
            group.sort(key=lambda r: r["budget"])
            ax.errorbar(
                [r["budget"] for r in group],
                [r["block_efficiency"] for r in group],
                yerr=[1.96 * r["stderr"] for r in group],
                marker="o",
                capsize=3,
                label=f"{scheme} (T={t:g})" if t is not None else scheme,
            )
        ax.set_xlabel("node budget (drafted nodes)")
        ax.set_ylabel("best E[tau + 1]")
        ax.set_title("Block efficiency of the best shape per budget")
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, folder / "block_efficiency_vs_budget.png"))
    if profiles:
        fig, ax = plt.subplots(figsize=(6, 4))
        distance = None
        for scheme, prof in profiles.items():
            depths = list(range(1, len(prof.acceptance) + 1))
            ax.plot(depths, prof.acceptance, marker="o", label=scheme)
            distance = prof.distance
        if distance is not None:
            twin = ax.twinx()
            twin.plot(range(1, len(distance) + 1), distance, "k--", label="|p - q|_1")
            twin.set_ylabel("mean |p - q|_1 at the parent depth (dashed)")
        ax.set_xlabel("depth d")
        ax.set_ylabel("acceptance rate P(tau >= d) / P(tau >= d-1)")
        ax.set_title("Acceptance against depth")
        ax.legend(loc="lower left")
        fig.tight_layout()
        written.append(_save(fig, folder / "acceptance_vs_depth.png"))
    priced = [r for r in rows if "predicted_speedup" in r]
    if priced:
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(priced) + 1.5))
        labels = [f"{r['scheme']} {r['shape']}" for r in priced]
        ax.barh(labels, [r["predicted_speedup"] for r in priced])
        ax.axvline(1.0, color="k", linewidth=0.8)
        ax.set_xlabel("predicted speedup over plain decoding")
        ax.set_title("Predicted tokens/s, relative to plain decoding")
        fig.tight_layout()
        written.append(_save(fig, folder / "tokens_per_second.png"))
    return written


def _groups(rows: Sequence[dict[str, Any]]) -> list[tuple[tuple[str, Any], list[dict[str, Any]]]]:
    out: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["scheme"], r["temperature"]), []).append(r)
    return list(out.items())


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["format_table", "main", "parser", "plot", "run"]
