"""Helpers shared by the benchmark scripts: timing, the synthetic model pair, markdown tables."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall time over ``repeats`` calls (after one warm-up call) and the result."""
    value = fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def model_pair(vocab_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A peaked target and a correlated draft (softmax of noisy logits), like a real model pair."""
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal(vocab_size)
    target = np.exp(logits - logits.max())
    draft_logits = logits + rng.standard_normal(vocab_size)
    draft = np.exp(draft_logits - draft_logits.max())
    return target / target.sum(), draft / draft.sum()


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def report(text: str, output: Path | None, default: Path, write: bool) -> None:
    """Print the markdown report and, if ``write``, save it to ``output`` (or ``default``)."""
    print(text)
    if write:
        target = output or default
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}", file=sys.stderr)


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The benchmarks' command line: the docstring's first line, ``--output`` and ``--no-write``;
    each script adds its own sizes."""
    made = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    made.add_argument("--output", type=Path, default=None, help="result file (markdown)")
    made.add_argument("--no-write", action="store_true", help="print only")
    return made
