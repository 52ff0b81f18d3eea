"""Command line.

``specsampling certify`` re-derives every scheme's guarantees on this machine: exit status ``0``
when every scheme is certified, ``1`` on any violation. ``specsampling compare`` prints every
scheme's exact acceptance next to the optimum (or, with ``--shape``, every scheme's exact
expected emitted tokens on a tree). Usage errors exit with ``2``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from . import __version__
from .certify import Report, SchemeReport, certify, exit_code
from .compare import Comparison, TreeRow, compare, compare_tree, parse_shape
from .errors import InvalidDistribution, UnsupportedShape
from .pairs import ModelPair, Random, Stationary
from .schemes import SCHEMES

#: Violations printed per scheme before the rest is summarised.
MAX_LISTED = 5


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status (never calls ``sys.exit``).

    >>> main(["certify", "--scheme", "nosuch"])
    2
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse: --help, --version and usage errors
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 2
    if args.command == "certify":
        return _certify(args.scheme, as_json=args.json, show_progress=not args.no_progress)
    if args.command == "compare":
        try:
            return _compare(args)
        except BrokenPipeError:  # output piped into `head`
            return 0
        except (ValueError, KeyError, OSError) as err:
            sys.stderr.write(f"specsampling compare: {err}\n")
            return 2
    parser.print_usage(sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specsampling",
        description="Exact (lossless) speculative-sampling schemes, proven by exact computation.",
    )
    parser.add_argument("--version", action="version", version=f"specsampling {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "certify",
        help="check every scheme's losslessness by exact enumeration",
        description=(
            "For every scheme and every built-in draft shape it supports, compute the lossless "
            "error on a suite of model pairs in float64 and, for rational schemes, exactly with "
            "Fractions. Exit 0 iff every scheme is certified, 1 on any violation."
        ),
    )
    run.add_argument(
        "--scheme",
        action="append",
        metavar="NAME",
        type=_scheme_name,
        help=f"certify only this scheme (repeatable; registered: {', '.join(SCHEMES)})",
    )
    run.add_argument("--json", action="store_true", help="print a machine-readable report")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    cmp = commands.add_parser(
        "compare",
        help="every scheme's exact acceptance next to the optimum",
        description=(
            "Single position (default): every scheme's exact acceptance P(Y in drafts) under its "
            "own draft law, the LP optimum for that law and the gap. With --shape: every "
            "scheme's exact expected emitted tokens E[tau+1] on that draft shape, for the "
            "stationary pair (--target, --draft) or a seeded random pair (--random V,SEED)."
        ),
        epilog=(
            "examples: specsampling compare --target 0.5,0.3,0.2 --draft 0.2,0.3,0.5 -k 2; "
            "specsampling compare --target 1/3,2/3 --draft 2/3,1/3 --shape 'chain(2)'"
        ),
    )
    cmp.add_argument("--target", metavar="P", help="comma-separated probabilities (a/b exact)")
    cmp.add_argument("--draft", metavar="Q", help="comma-separated probabilities (a/b exact)")
    cmp.add_argument(
        "--file",
        type=Path,
        help='JSON {"target": [...], "draft": [...]} or .npy array of shape (2, vocab_size)',
    )
    cmp.add_argument("-k", "--num-drafts", type=int, default=2, help="drafts (default 2)")
    cmp.add_argument("--shape", help="a draft shape, e.g. 'paths(2, 2)': compare on a tree")
    cmp.add_argument("--random", metavar="V,SEED", help="tree mode: a seeded random pair")
    cmp.add_argument("--json", action="store_true", help="print machine-readable results")
    return parser


def _scheme_name(name: str) -> str:
    if name not in SCHEMES:
        raise argparse.ArgumentTypeError(
            f"unknown scheme {name!r}; registered schemes: {', '.join(sorted(SCHEMES))}"
        )
    return name


def _certify(names: list[str] | None, *, as_json: bool, show_progress: bool) -> int:
    bar = _Bar(sys.stderr) if show_progress else None
    report = certify(None if names is None else list(dict.fromkeys(names)), progress=bar)
    if bar is not None:
        bar.close()
    if as_json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_report(report))
    return exit_code(report)


def _compare(args: argparse.Namespace) -> int:
    if args.shape is not None:
        shape = parse_shape(args.shape)
        pair = _random_pair(args.random) if args.random else Stationary(*_distributions(args))
        try:
            rows = compare_tree(pair, shape)
        except UnsupportedShape as err:  # pragma: no cover - compare_tree checks support first
            raise ValueError(str(err)) from None
        _emit_tree(rows, pair, args.shape, as_json=args.json)
        return 0
    if args.random:
        raise ValueError("--random needs --shape (tree mode)")
    target, draft = _distributions(args)
    _emit_single(compare(target, draft, args.num_drafts), as_json=args.json)
    return 0


def _distributions(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.file is not None:
        if args.target or args.draft:
            raise ValueError("give either --file or --target/--draft, not both")
        if args.file.suffix == ".npy":
            data = np.load(args.file)
            if data.ndim != 2 or data.shape[0] != 2:
                raise InvalidDistribution(
                    f"--file: expected shape (2, vocab_size), got {data.shape}"
                )
            return data[0], data[1]
        content = json.loads(args.file.read_text())
        if not isinstance(content, dict) or not {"target", "draft"} <= set(content):
            raise ValueError('--file: expected a JSON object {"target": [...], "draft": [...]}')
        return content["target"], content["draft"]
    if not args.target or not args.draft:
        raise ValueError("give --target and --draft (comma-separated), or --file")
    exact = "/" in args.target + args.draft
    return _numbers(args.target, "--target", exact), _numbers(args.draft, "--draft", exact)


def _numbers(text: str, name: str, exact: bool) -> list[Any]:
    try:
        return [Fraction(part) if exact else float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated numbers, got {text!r}") from None


def _random_pair(text: str) -> ModelPair:
    try:
        vocab, seed = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--random: expected VOCAB,SEED, got {text!r}") from None
    return Random(vocab, seed)


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{0.0 if abs(value) < 5e-7 else value:.6f}"  # no "-0.000000"


def _emit_single(result: Comparison, *, as_json: bool) -> None:
    if as_json:
        payload = {
            "vocab_size": result.vocab_size,
            "num_drafts": result.num_drafts,
            "optimum_iid": result.optimum_iid,
            "optimum_without": result.optimum_without,
            "rows": [row.__dict__ for row in result.rows],
        }
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    header = ("scheme", "draft law", "acceptance", "optimum (same law)", "gap", "note")
    rows = [
        (r.scheme, r.draft_law, _cell(r.acceptance), _cell(r.optimum), _cell(r.gap), r.note)
        for r in result.rows
    ]
    sys.stdout.write(
        f"single position, vocab {result.vocab_size}, {result.num_drafts} drafts: "
        f"optimum {result.optimum_iid:.6f} (i.i.d.), {result.optimum_without:.6f} "
        "(without replacement)\n\n" + format_table(header, rows)
    )


def _emit_tree(rows: tuple[TreeRow, ...], pair: ModelPair, shape: str, *, as_json: bool) -> None:
    if as_json:
        payload = {"shape": shape, "pair": repr(pair), "rows": [row.__dict__ for row in rows]}
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    table = [(r.scheme, _cell(r.expected_emitted), r.note) for r in rows]
    sys.stdout.write(
        f"exact E[tau+1] on {shape} for {pair!r}\n\n"
        + format_table(("scheme", "E[tau+1]", "note"), table)
    )


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by ``|``, with a rule under the header."""
    cells = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def format_report(report: Report) -> str:
    """The human-readable report: a table, then shapes and violations per scheme."""
    header = (
        "scheme",
        "supported shapes",
        "cases",
        "max abs error float64",
        "exact (Fraction)",
        "E[tau+1] range",
        "closed form",
        "verdict",
    )
    lines = format_table(header, [_row(s) for s in report.schemes]).splitlines()
    lines.append("")
    for scheme in report.schemes:
        lines.append(f"{scheme.name}: supports {', '.join(scheme.supported) or 'nothing'}")
        if scheme.refused:
            refused = ", ".join(scheme.refused)
            lines.append(f"  refuses (raises UnsupportedShape): {refused}")
        for v in scheme.violations[:MAX_LISTED]:
            lines.append(f"  VIOLATION [{v.kind}] {v.shape} on {v.pair}: {v.detail}")
        if len(scheme.violations) > MAX_LISTED:
            lines.append(f"  ... and {len(scheme.violations) - MAX_LISTED} more violations")
        if scheme.cases == 0:
            lines.append("  no built-in shape is supported: nothing was checked")
    cases = sum(s.cases for s in report.schemes)
    failed = [s.name for s in report.schemes if not s.certified]
    verdict = "all certified" if not failed else f"NOT certified: {', '.join(failed)}"
    lines.append("")
    lines.append(
        f"{len(report.schemes)} schemes, {cases} cases, tolerance {report.tolerance:g} "
        f"(exact cases must be 0), {report.seconds:.1f} s: {verdict}"
    )
    return "\n".join(lines) + "\n"


def _row(scheme: SchemeReport) -> tuple[str, ...]:
    total = len(scheme.supported) + len(scheme.refused)
    if scheme.exact_ok is None:
        exact = "n/a"
    elif scheme.exact_ok:
        exact = f"0 ({scheme.exact_cases} cases)"
    else:
        exact = f"max {scheme.max_exact_error}"
    if scheme.emitted_min is None or scheme.emitted_max is None:
        emitted = "-"
    else:
        emitted = f"{scheme.emitted_min:.3f} .. {scheme.emitted_max:.3f}"
    closed = f"{scheme.closed_form_checks} ok" if scheme.closed_form_checks else "-"
    if scheme.structural_checks:
        closed += f", {scheme.structural_checks} invariance"
    verdict = "certified" if scheme.certified else f"VIOLATION ({len(scheme.violations)})"
    return (
        scheme.name,
        f"{len(scheme.supported)} of {total}",
        str(scheme.cases),
        f"{scheme.max_float_error:.1e}",
        exact,
        emitted,
        closed,
        verdict,
    )


class _Bar:
    """A one-line progress bar, redrawn at most ten times a second."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int, label: str) -> None:
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        filled = self.WIDTH * done // max(total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self._stream.write(f"\r[{bar}] {done}/{total} {label[:48]:<48}")
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
