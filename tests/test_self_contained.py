"""The project speaks of itself alone: no tracked file cites what a user's checkout lacks.

A user has no ``shared/`` folder next to the checkout, no issue tracker of ours and no private
list of peer bugs. Code, docstrings, comments, docs, benchmark scripts and their recorded
results, and tests cite instead the paper (an arXiv id), the peer's public issue or file
(``vllm-project/vllm#43150``) or our own docs page (``docs/torch.md``).

Every tracked file (``git ls-files``; without git, a walk of the tree) is scanned line by line,
except ``docs/_build/`` (build helpers), binary files and this file (its examples are the
patterns themselves). Flagged:

* a path into ``shared/``: ``../shared/`` or ``shared/design``, ``shared/specs``, ...;
* the private design and spec files by name (``TORCH.md``, ``peer-bugs.md``, ...) and sections of
  "the spec(s)" (``specs §3.4``, ``the spec's``);
* issue numbers (``issue 12``, ``issue-3``) and "the issue's";
* private bug labels ``B1`` .. ``B24`` where they are used as labels: after "bug", "peer", an
  opening bracket, a comma, a slash, "and" or a comment ruler, at the start of a comment or
  docstring, or followed by a colon or a closing bracket; and in test names (``test_b5_...``).
  ``B`` as a batch size (``B = 64``, ``[B, N, V]``) is not a label.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
SKIPPED_DIRS = ("docs/_build/",)
#: Directories never walked when git is not available (not part of the tracked tree).
UNTRACKED_DIRS = {
    *(".git", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv", "venv"),
    *("__pycache__", "site", "node_modules", "mathjax", "build", "dist"),
}

PATTERNS: dict[str, re.Pattern[str]] = {
    "a path into shared/": re.compile(
        r"\.\./shared/|\bshared/(?:design|specs|seeds|hooks|wheels)\b"
    ),
    # Upper case only: ``docs/torch.md`` and ``docs/architecture.md`` are our own pages.
    "a private design file": re.compile(r"\b(?:TORCH|ARCHITECTURE|STYLE|REVIEW)\.md\b"),
    "a private spec file": re.compile(
        r"\b(?:discrete-schemes|residual-diffusion-poisson|optimal-transport-verifiers)\.md\b"
        r"|peer-bugs?\b",
        re.IGNORECASE,
    ),
    "a section of the private specs": re.compile(
        r"\bspec(?:s|ification)?\b(?:'s|')?,?[ \w-]{0,25}?(?:§|section\s+\d)"
        r"|\b(?i:the)\s+spec(?:s|ification)?(?:'s|')|\b(?i:the) specs\b"
        r"|\bspecs'"
    ),
    "an issue number": re.compile(r"\bissues?[ -]\d+\b|\bthe issue's\b", re.IGNORECASE),
}

#: ``B1`` .. ``B24`` as a word (not ``B16x``, not a decimal).
LABEL = re.compile(r"(?<![\w.-])B(?:[1-9]|1[0-9]|2[0-4])(?!\w|\.\d)")
#: What makes it a label: the text just before it on its line ...
LABEL_BEFORE = re.compile(
    r"(?:\bbugs?|\bpeers?|peer-bugs?|[(\[/,;]|\band|-{3,}"
    r"|^\s*(?:#:?|[rR]?\"\"\"|\*|-)|\"\"\")\s*$",
    re.IGNORECASE,
)
#: ... or just after it.
LABEL_AFTER = re.compile(r"^(?:\s*[:)\]]|'s\b)")
#: A test named after a label: ``test_b5_strict``, ``test_tail_is_float64_b9``.
LABEL_IN_TEST_NAME = re.compile(r"\btest_(?:\w*?_)?b(?:[1-9]|1[0-9]|2[0-4])(?:_\w*)?\b")


def line_problems(line: str) -> list[str]:
    """What ``line`` cites that a user cannot follow (empty when it is self-contained)."""
    found = [kind for kind, pattern in PATTERNS.items() if pattern.search(line)]
    for match in LABEL.finditer(line):
        before, after = line[: match.start()], line[match.end() :]
        if LABEL_BEFORE.search(before[-40:]) or LABEL_AFTER.match(after):
            found.append(f"a private bug label ({match.group()})")
            break
    if LABEL_IN_TEST_NAME.search(line):
        found.append("a private bug label in a test name")
    return found


def tracked_files() -> list[str]:
    """Paths relative to the root: ``git ls-files`` when git knows the tree, else a walk."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        listed = ""
    if listed:
        return sorted(path for path in listed.split("\0") if path)
    walked = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in UNTRACKED_DIRS and not d.endswith(".egg-info")]
        walked += [(Path(folder) / name).relative_to(ROOT).as_posix() for name in files]
    return sorted(walked)


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of a text file; nothing for a binary or missing one."""
    try:
        data = path.read_bytes()
    except OSError:  # tracked but deleted in the working tree, or a dangling link
        return
    if b"\0" in data[:8192]:
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    yield from enumerate(text.splitlines(), start=1)


def scan(paths: list[str]) -> list[str]:
    """``file:line: kind | line`` for every hit in ``paths`` (relative to the root)."""
    hits = []
    for relative in paths:
        if relative == SELF or relative.startswith(SKIPPED_DIRS):
            continue
        for number, line in text_lines(ROOT / relative):
            for kind in line_problems(line):
                hits.append(f"{relative}:{number}: {kind} | {line.strip()[:120]}")
    return hits


def test_no_file_cites_what_a_user_lacks() -> None:
    paths = tracked_files()
    assert len(paths) > 100, "the tree was not found"
    hits = scan(paths)
    assert not hits, (
        f"{len(hits)} citations a user cannot follow (cite the paper, the peer's public issue "
        "or our docs instead):\n" + "\n".join(hits)
    )


@pytest.mark.parametrize(
    "line",
    [
        "row (``tests/test_gpu_pathwise.py``). See ``../shared/design/TORCH.md``.",
        "Derived in this project (`shared/specs/optimal-transport-verifiers.md`, section 3).",
        "(about a minute at vocab 2,000); see the report of issue 9, part 5.",
        "Goals (Issue 10): HF loop / ours >= 10x",
        '"""The issue-3 closed forms at a large vocabulary',
        "python benchmarks/decode.py   # the issue's run",
        "    draws bottom out at 2^-24 (peer bug B9).",
        "uniforms bottom out at 2^-24, peer bugs B3, B8, B11).",
        '    """B5: ``u = 0`` with ``p(x) = 0 < q(x)`` accepts an impossible token',
        "# ----------------------------------------------------------------- B4 / B19",
        '"(g) inclusive accept test u*q <= p (B5)",',
        "regressions from peer-bugs.md section 5",
        "Golden values (specs §8.3): p = (1/2, 1/3, 1/6)",
        "Block verification of drafted chains (spec §B2).",
        "the lossless criterion of the specs, section 0",
        "| derived here (specs, OT verifiers §3) |",
        "The specs reconstruct it as the probability of the sub-event",
        "(the specification's prototype: 0.19-0.31 s)",
        "The spec's measurements on random instances are quoted as total variation",
        "  every path) and B24 (the bonus token's KV: a self-draft accepts everything).",
        "def test_b5_accept_test_is_strict():",
        "def test_tail_resolution_is_float64_b9() -> None:",
    ],
)
def test_the_scan_flags_private_citations(line: str) -> None:
    assert line_problems(line), line


@pytest.mark.parametrize(
    "line",
    [
        "(float32 uniforms bottom out at 2^-24: vllm-project/vllm#43150)",
        "Hugging Face loop is only 1.3x above it at B = 64, at B = 1 and V = 151,936",
        "target_probs [B, γ + 1, V], draft_probs [B, γ, V] or None",
        "noise shared between drafting and verification is harmless",
        "The prompt, shared by every stream (its length is the keyed noise's ``start``).",
        "def greedy_inputs(spec: list[list[int]], output: list[list[int]]) -> tuple:",
        "Derived in this project (see the theorem above).",
        "Its block efficiency is compared in §1.",
        "specsampling §2 of the guide; for spec in specs: s = spec.name",
        "huggingface/transformers#32867 and SafeAILab/EAGLE#215",
        "a bf16 or B16 tensor, a 2 x B2B link, 1.5B/0.5B pair",
        "guide: [the torch backend](docs/torch.md), [architecture](docs/architecture.md)",
        "def test_batched_equals_row_by_row(kwargs):",
    ],
)
def test_the_scan_passes_self_contained_lines(line: str) -> None:
    assert not line_problems(line), line_problems(line)
