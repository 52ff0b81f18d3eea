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
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specsampling.compare import parse_shape
from specsampling.errors import InvalidDistribution, UnsupportedShape
from specsampling.validation import check_output_dir, check_output_file


def _number(text: str, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _items(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected comma-separated values, got {text!r}")
    return items


def _temperatures(text: str) -> list[float]:
    values = [_number(item, integer=False) for item in _items(text)]
    if any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected temperatures >= 0 (0: greedy), got {text!r}")
    return values


def _budgets(text: str) -> list[int]:
    values = [int(_number(item, integer=True)) for item in _items(text)]
    if any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected node budgets >= 1, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    value = int(_number(text, integer=True))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _positive(text: str) -> float:
    value = _number(text, integer=False)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _shape(text: str) -> Any:
    try:
        return parse_shape(text)
    except (ValueError, UnsupportedShape) as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _cost(text: str) -> Any:
    """A :class:`~specsampling.simulators.cost.CostModel` read from a JSON file."""
    from .cost import CostModel

    try:
        data = json.loads(Path(text).read_text(encoding="utf-8"))
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: cannot read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON ({err})") from None
    try:
        return CostModel.from_dict(data)
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cost model as CostModel.as_dict writes it: {err}"
        ) from None


def parser() -> argparse.ArgumentParser:
    """The parser of ``specsampling simulate`` (every option with its help and default)."""
    made = argparse.ArgumentParser(
        prog="specsampling simulate",
        description="Monte-Carlo block efficiency of schemes x shapes x temperatures x budgets on "
        "a synthetic LLM-like pair or on recorded real-model trees (needs torch). Every "
        "argument, and the --json and --plots destinations, is checked before any work.",
    )
    made.add_argument(
        "--schemes",
        type=_items,
        default="traversal,specinfer,spectr,nss",
        metavar="A,B",
        help="comma-separated tree schemes (default: %(default)s)",
    )
    made.add_argument(
        "--shapes",
        nargs="*",
        default=None,
        type=_shape,
        metavar="SHAPE",
        help="draft shapes, e.g. 'paths(2, 3)' 'chain(4)' (default: 'paths(2, 3)' unless "
        "--budgets is given; not with --recorded, whose trees have their own shape)",
    )
    made.add_argument(
        "--budgets",
        default=None,
        type=_budgets,
        metavar="N,M",
        help="node budgets for the verifier-aware shape search, e.g. 4,8 (default: no search; "
        "not with --recorded)",
    )
    made.add_argument(
        "--families",
        default=None,
        type=_items,
        metavar="F,G",
        help="shape families searched, e.g. chain,paths (default: the search's own families)",
    )
    made.add_argument(
        "--num-trees",
        type=_positive_int,
        default=256,
        metavar="N",
        help="Monte-Carlo trees per estimate (default: %(default)s)",
    )
    made.add_argument(
        "--method",
        default="rao-blackwell",
        choices=("rao-blackwell", "plain"),
        help="the estimator (default: %(default)s)",
    )
    made.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="INT",
        help="the Monte-Carlo seed (default: %(default)s)",
    )
    pair = made.add_argument_group("synthetic pair (ignored with --recorded)")
    pair.add_argument(
        "--vocab-size",
        type=_positive_int,
        default=32000,
        metavar="V",
        help="vocabulary size (default: %(default)s)",
    )
    pair.add_argument(
        "--pair-seed",
        type=int,
        default=0,
        metavar="INT",
        help="seed of the synthetic pair (default: %(default)s)",
    )
    pair.add_argument(
        "--temperatures",
        default=[1.0],
        type=_temperatures,
        metavar="T,U",
        help="comma-separated temperatures >= 0, one pair each (default: 1.0)",
    )
    pair.add_argument(
        "--divergence",
        type=float,
        default=0.5,
        metavar="X",
        help="scale of the draft's logit noise at depth 0, 0: the target itself "
        "(default: %(default)s)",
    )
    pair.add_argument(
        "--zipf",
        type=float,
        default=1.5,
        metavar="X",
        help="exponent of the rank profile -zipf * ln(rank + 1) (default: %(default)s)",
    )
    pair.add_argument(
        "--spread",
        type=float,
        default=0.5,
        metavar="X",
        help="standard deviation of the log-sharpness across contexts (default: %(default)s)",
    )
    pair.add_argument(
        "--depth-growth",
        type=float,
        default=0.0,
        metavar="X",
        help="draft noise at depth d: divergence * (1 + depth_growth * d) (default: %(default)s)",
    )
    made.add_argument(
        "--recorded",
        default=None,
        metavar="FILE",
        help="trees recorded from real models by simulators.record (default: the synthetic pair)",
    )
    made.add_argument(
        "--cost-ratio",
        type=_positive,
        default=None,
        metavar="R",
        help="draft/target forward cost ratio, for predicted speedups (default: none)",
    )
    made.add_argument(
        "--cost",
        default=None,
        type=_cost,
        metavar="FILE",
        help="a CostModel as JSON (CostModel.as_dict), for predicted speedups (default: none)",
    )
    made.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="write the rows as JSON to this file (default: not written)",
    )
    made.add_argument(
        "--plots",
        default=None,
        metavar="DIR",
        help="write the plots into this directory, made if missing (default: no plots)",
    )
    made.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars on stderr (default: progress shown)",
    )
    return made


def check(args: argparse.Namespace) -> None:
    """The checks that need more than one option, or the file system, before any work:
    ``ValueError`` naming the option."""
    if args.recorded is not None:
        for option, value in (("--shapes", args.shapes), ("--budgets", args.budgets)):
            if value:
                raise ValueError(
                    f"{option}: not with --recorded: recorded trees have their own shape (the "
                    "one they were drafted with), and nothing new is drafted from them"
                )
        if not Path(args.recorded).is_file():
            raise ValueError(f"--recorded: no such file: {args.recorded!r}")
    if args.cost is not None and args.cost_ratio is not None:
        raise ValueError("--cost-ratio: give --cost or --cost-ratio, not both")
    if args.json:
        check_output_file(args.json, "--json")
    if args.plots:
        check_output_dir(args.plots, "--plots", create=True)
    from .estimators import resolve
    from .search import FAMILIES

    unknown = sorted(set(args.families or ()) - set(FAMILIES))
    if unknown:
        raise ValueError(f"--families: unknown {unknown}; expected some of {list(FAMILIES)}")
    for name in args.schemes:
        try:
            resolve(name)
        except (ValueError, UnsupportedShape) as err:
            raise ValueError(f"--schemes: {err}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``specsampling simulate``; returns the exit status."""
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 0
    try:
        check(args)
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

    schemes = list(args.schemes)
    for name in schemes:
        resolve(name)
    shapes = list(args.shapes or [])
    budgets = list(args.budgets or [])
    if not shapes and not budgets:
        if args.recorded is None:
            shapes = [parse_shape("paths(2, 3)")]
    families = tuple(args.families) if args.families else None
    cost = args.cost
    if cost is None and args.cost_ratio is not None:
        cost = cost_module.CostModel.relative(draft_ratio=args.cost_ratio)
    progress = False if args.no_progress else None
    sources: list[tuple[float | None, Any]] = []
    if args.recorded:
        recorded = RecordedTrees.load(args.recorded)
        sources.append((recorded.meta.get("temperature"), recorded))
        shapes = [recorded.shape]
    else:
        for t in args.temperatures:
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
    from matplotlib.ticker import MaxNLocator

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
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # budgets are node counts
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
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # depths are integers
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


__all__ = ["check", "format_table", "main", "parser", "plot", "run"]
