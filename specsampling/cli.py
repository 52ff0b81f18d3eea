"""Command line: ``specsampling certify`` re-derives every scheme's guarantees on this machine.

Exit status: ``0`` when every scheme is certified, ``1`` on any violation, ``2`` on a usage error
(an unknown scheme name, for instance).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from . import __version__
from .certify import Report, SchemeReport, certify, exit_code
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
    rows = [header, *(_row(s) for s in report.schemes)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
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
