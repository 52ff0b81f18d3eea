"""Helpers shared by the benchmark scripts: timing, the synthetic model pair, markdown tables."""

from __future__ import annotations

import argparse
import math
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


def report_result(
    text: str, output: Path | None, default: Path, *, no_write: bool, quick: bool, busy: bool
) -> None:
    """:func:`report`, but a ``--quick`` run or a busy machine never writes into ``results/``
    unless ``--output`` names a file."""
    write = not no_write
    if write and output is None and (quick or busy):
        print(
            "not writing benchmarks/results/: "
            + ("--quick sizes" if quick else "busy machine")
            + " (pass --output to save anyway)",
            file=sys.stderr,
        )
        write = False
    report(text, output, default, write)


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The benchmarks' command line: the docstring's first line, ``--output`` and ``--no-write``;
    each script adds its own sizes."""
    made = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    made.add_argument("--output", type=Path, default=None, help="result file (markdown)")
    made.add_argument("--no-write", action="store_true", help="print only")
    return made


# --------------------------------------------------------------------------- torch benchmarks
# Shared by torch_chains.py, torch_trees.py and gpu/run.py. torch is imported inside the
# functions, so the numpy-only benchmarks above never need it.


def torch_parser(doc: str | None) -> argparse.ArgumentParser:
    """:func:`parser` plus the CPU torch benchmarks' ``--threads`` and ``--quick``."""
    made = parser(doc)
    made.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's); 1 avoids stalls on a shared machine",
    )
    made.add_argument(
        "--quick", action="store_true", help="tiny sizes (seconds): a smoke test, not a result"
    )
    return made


def parse_torch_args(made: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse, and apply ``--threads`` to torch."""
    import torch

    args = made.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return args


def interleaved_median(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall time of each callable over ``repeats`` rounds, the callables taking turns
    within each round (after one warm-up call each), so that every ratio between them is
    measured under the same machine state. The median, not the best: on a shared virtual
    machine single timings of a memory-bound pass scatter by an order of magnitude in both
    directions, and a best-of picks up the rare fast outlier."""
    return interleaved_median_within(fns, repeats, math.inf)[0]


def interleaved_median_within(
    fns: dict[str, Callable[[], Any]], repeats: int, budget_s: float
) -> tuple[dict[str, float], int]:
    """:func:`interleaved_median` within a time budget: ``(medians, rounds timed)``.

    The warm-up calls are timed; when they took more than ``budget_s`` seconds together, those
    times are the result (one round, ``0`` returned: no warm-up; for calls of seconds the first
    call's extra cost is noise), else as many of the ``repeats`` rounds as fit in the budget (at
    least one) are timed after them."""
    first: dict[str, float] = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
    spent = sum(first.values())
    if spent > budget_s:
        return first, 0
    fit = budget_s / max(spent, 1e-9)  # rounds the budget holds (inf: no budget)
    rounds = repeats if fit >= repeats else max(1, int(fit))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in times.items()}, rounds


def cpu_model() -> str:
    """The CPU's model name and its last-level cache, as Linux reports them (``/proc/cpuinfo``,
    ``/sys``), else ``platform.processor()``: runs on different machines of one kind differ by
    tens of percent, so every result names the CPU it ran on."""
    import platform
    from pathlib import Path

    name = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
        caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))
        if not caches:
            return name
        level, size = ((caches[-1] / key).read_text().strip() for key in ("level", "size"))
        return f"{name}, L{level} {size}"  # the last index is the last level
    except OSError:  # not Linux, or no such files: the name alone
        return name


def machine_lines(load_before: tuple[float, ...], load_after: tuple[float, ...]) -> str:
    """Markdown bullet lines: platform, CPUs, versions, torch threads, load average (with a
    warning when it exceeded half the CPU count: the numbers then measure contention), and the
    glibc allocator setting when ``GLIBC_TUNABLES`` is set (it moves the CPU floors)."""
    import datetime
    import os
    import platform

    import torch

    import specsampling as ss

    cpus = os.cpu_count() or 1
    busy = load_before[0] > cpus / 2  # "after" includes the benchmark's own threads
    warning = (
        " (**busy machine: above half the CPU count before the run; rerun on an idle machine "
        "before quoting these numbers**)"
        if busy
        else " (idle before the run; the value after includes the benchmark's own threads)"
    )
    return "\n".join(
        [
            f"- date: {datetime.date.today().isoformat()}",
            f"- platform: {platform.platform()} ({platform.machine()})",
            f"- CPU: {cpu_model()}; count: {cpus}; torch threads: {torch.get_num_threads()}",
            f"- Python {platform.python_version()}, numpy {np.__version__}, torch "
            f"{torch.__version__}, specsampling {ss.__version__}",
            "- load average (1, 5, 15 min) before: "
            + ", ".join(f"{x:.2f}" for x in load_before)
            + "; after: "
            + ", ".join(f"{x:.2f}" for x in load_after)
            + warning,
        ]
        + (
            [f"- **allocator setting**: run with `GLIBC_TUNABLES={tunables}` (see docs/torch.md)"]
            if (tunables := os.environ.get("GLIBC_TUNABLES"))
            else []
        )
    )


def is_busy(load: tuple[float, ...]) -> bool:
    """Whether the 1-minute load average exceeds half the CPU count."""
    import os

    return load[0] > (os.cpu_count() or 1) / 2


def chain_logits(
    batch_size: int,
    gamma: int,
    vocab_size: int,
    seed: int = 0,
    device: Any = "cpu",
    dtype: Any = None,
) -> tuple[Any, Any, Any]:
    """A correlated model pair's chain round, as tensors: target logits ``[B, γ + 1, V]``
    (3 x N(0, 1)), draft logits ``[B, γ, V]`` (the target's first γ rows plus N(0, 1)), and draft
    tokens ``[B, γ]`` sampled from the draft's softmax (like :func:`model_pair`, row by row)."""
    import torch

    dtype = dtype or torch.float32
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (batch_size, gamma + 1, vocab_size)
    target_logits = 3.0 * torch.randn(shape, generator=gen, device=device, dtype=dtype)
    noise = torch.randn(shape[0], gamma, vocab_size, generator=gen, device=device, dtype=dtype)
    draft_logits = target_logits[:, :gamma] + noise  # [B, γ, V]
    draft_probs = draft_logits.float().softmax(-1).reshape(-1, vocab_size)  # [B γ, V]
    draft_tokens = torch.multinomial(draft_probs, 1, generator=gen).reshape(batch_size, gamma)
    return target_logits, draft_logits, draft_tokens


def chain_tree_batch(ssg: Any, draft_tokens: Any, law: Any) -> Any:
    """The chains ``draft_tokens [B, γ]`` as an ``ssg.TreeBatch`` built with tensor ops only
    (no per-row Python): node ``n`` holds draft ``n`` and its one candidate is node ``n + 1``.
    Equal to ``TreeBatch.from_trees([DraftTree.chain(row, law) for row in draft_tokens])``."""
    import torch

    batch_size, gamma = draft_tokens.shape
    device = draft_tokens.device
    nodes = torch.arange(gamma + 1, device=device)  # [γ + 1]
    tokens = torch.cat(
        [torch.full((batch_size, 1), -1, dtype=torch.long, device=device), draft_tokens.long()],
        1,
    )  # [B, γ + 1]
    parents = (nodes - 1).repeat(batch_size, 1)  # [B, γ + 1]; root: -1
    children = torch.where(nodes < gamma, nodes + 1, -1)  # [γ + 1]
    candidates = children[None, :, None].repeat(batch_size, 1, 1)  # [B, γ + 1, 1]
    depth = nodes.repeat(batch_size, 1)  # [B, γ + 1]
    num_nodes = torch.full((batch_size,), gamma + 1, dtype=torch.long, device=device)  # [B]
    return ssg.TreeBatch(
        parents=parents,
        tokens=tokens,
        num_nodes=num_nodes,
        candidates=candidates,
        depth=depth,
        laws=(law,) * batch_size,
        chains=(True,) * batch_size,
        max_depth=gamma,
    )


def chain_verifier(ssg: Any, name: str, law: Any, prefer_fast: bool = True) -> tuple[str, Any]:
    """``(path, run)``: ``run(draft_tokens, target_probs, draft_probs, generator=None)`` verifies
    chains with ``ssg.verify_chain`` when the package has it (validation off), else through the
    generic tree path (``chain_tree_batch`` plus the draft table padded to ``γ + 1`` rows, a copy
    that the chain path saves). ``path`` names which one runs."""
    import inspect

    import torch

    fast = getattr(ssg, "verify_chain", None) if prefer_fast else None
    if fast is not None:
        params = inspect.signature(fast).parameters
        options = {"validate": False} if "validate" in params else {}
        takes_generator = "generator" in params

        def run_fast(draft_tokens, target_probs, draft_probs, generator=None):
            extra = dict(options)
            if generator is not None and takes_generator:
                extra["generator"] = generator
            return fast(name, draft_tokens, target_probs, draft_probs, None, **extra)

        return "verify_chain", run_fast

    def run_tree(draft_tokens, target_probs, draft_probs, generator=None):
        batch = chain_tree_batch(ssg, draft_tokens, law)
        draft = torch.cat([draft_probs, draft_probs[:, -1:]], 1)  # [B, γ + 1, V]; last unread
        return ssg.verify(
            name, batch, target_probs, draft, None, generator=generator, validate=False
        )

    return "verify (tree path)", run_tree


def chain_schemes(ssg: Any, gamma: int) -> tuple[list[tuple[str, str, Any]], list[list[str]]]:
    """The registered lowerings usable on chains of ``gamma`` drafts, each probed on a tiny
    round: ``([(name, path, run)], [[name, why not]])``. Iterates ``ssg.SCHEMES`` at run time,
    so lowerings registered later are picked up; a scheme refused by ``verify_chain`` falls back
    to the tree path."""
    import torch

    import specsampling as ss

    shape = ss.Shape.chain(gamma)
    target_logits, draft_logits, draft_tokens = chain_logits(2, gamma, 16, seed=1)
    target = ssg.process(target_logits)
    draft = ssg.process(draft_logits)
    usable, skipped = [], []
    for name in sorted(ssg.SCHEMES):
        reference = ss.SCHEMES.get(name)
        if reference is None or not getattr(reference, "supports", lambda s: False)(shape):
            skipped.append([name, "reference does not support chains"])
            continue
        errors = []
        for prefer_fast in (True, False):
            path, run = chain_verifier(ssg, name, shape.law, prefer_fast)
            try:
                out = run(draft_tokens, target, draft, torch.Generator().manual_seed(0))
                assert tuple(out.token.shape) == (2,)
            except Exception as error:  # recorded in the report, never hidden
                errors.append(f"{path}: {type(error).__name__}: {str(error).splitlines()[0]}")
                continue
            usable.append((name, path, run))
            break
        else:
            skipped.append([name, "; ".join(dict.fromkeys(errors))])
    return usable, skipped


class SyntheticPair:
    """A model pair over a real-size vocabulary: at every prefix the target is the softmax of
    3 x N(0, 1) logits and the draft the softmax of the same logits plus N(0, 1) (as
    :func:`model_pair`), seeded by ``(seed, prefix)``; for drafting trees with
    ``ss.Shape.draft``."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.seed = seed
        self._cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def _row(self, prefix: Any) -> tuple[np.ndarray, np.ndarray]:
        key = tuple(int(t) for t in prefix)
        if key not in self._cache:
            rng = np.random.default_rng([self.seed, len(key), *key])
            logits = 3.0 * rng.standard_normal(self.vocab_size)
            target = np.exp(logits - logits.max())
            draft_logits = logits + rng.standard_normal(self.vocab_size)
            draft = np.exp(draft_logits - draft_logits.max())
            self._cache[key] = (target / target.sum(), draft / draft.sum())
        return self._cache[key]

    def target(self, prefix: Any) -> np.ndarray:
        return self._row(prefix)[0]

    def draft(self, prefix: Any) -> np.ndarray:
        return self._row(prefix)[1]


def sig(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits (no exponent; thousands separated).

    >>> sig(0.001234), sig(12.345), sig(123456.7), sig(float("nan"))
    ('0.00123', '12.3', '123,457', 'nan')
    """
    import math

    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"
