"""Target calls saved by speculative sampling on a toy diffusion, per scheme, budget and draft.

Regenerate ``docs/plots/diffusion.png`` (deterministic, about 20 seconds) with::

    python docs/plots/diffusion.py

The process is the 8-D, 8-component Gaussian mixture of ``benchmarks/diffusion.py`` (component
std 0.1, VP, Euler-Maruyama with N = 50 steps). For each draft (frozen increment, moment-matched
Gaussian) and each scheme it runs ``specsampling.simulators.diffusion.speculative_sample`` on 500
sample paths and plots the fraction of target passes saved against plain sampling. The x axis is
the most states one target pass can commit: L + 1 for a chain of length L, L for a tree of depth
L (its leaves are not evaluated). The dotted line is the ceiling of a perfect draft, 1 - 1/x.
The values are printed as a table too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from specsampling.simulators import diffusion as df

NUM_SAMPLES = 500
NUM_STEPS = 50
# label -> (lookahead factory over its budget, budgets, most states per pass, style)
SCHEMES: dict[str, tuple[Callable[[int], Any], tuple[int, ...], Callable[[int], int], Any]] = {
    "reflection chain": (df.reflection_chain, (1, 2, 4, 8), lambda b: b + 1, {"marker": "o"}),
    "block chain": (df.block_chain, (1, 2, 4, 8), lambda b: b + 1, {"marker": "s"}),
    "RMC walk (K = 1)": (
        lambda b: df.Tree(1, b, "reflection"),
        (2, 3, 4),
        lambda b: b,
        {"marker": "x", "ls": ":"},
    ),
    "D-GRS tree K = 2": (lambda b: df.dgrs_tree(2, b), (2, 3, 4), lambda b: b, {"marker": "^"}),
    "D-GRS tree K = 4": (lambda b: df.dgrs_tree(4, b), (2, 3, 4), lambda b: b, {"marker": "v"}),
}
DRAFTS = {"frozen": "frozen increment (training free)", "gaussian": "moment-matched Gaussian"}


def process() -> df.VPDiffusion:
    rng = np.random.default_rng(0)  # the 8-D setup of benchmarks/diffusion.py
    means = 3.0 * rng.standard_normal((8, 8))
    data = df.GaussianMixture(means, rng.dirichlet(np.full(8, 3.0)), std=0.1)
    return df.VPDiffusion(data, num_steps=NUM_STEPS)


def values() -> dict[str, dict[str, list[tuple[int, float]]]]:
    """draft -> scheme -> [(most states per pass, fraction saved)]."""
    diffusion = process()
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for d_index, draft in enumerate(DRAFTS):
        out[draft] = {}
        for s_index, (name, (build, budgets, ceiling, _)) in enumerate(SCHEMES.items()):
            points = []
            for budget in budgets:
                rng = np.random.default_rng([d_index, s_index, budget])
                run = df.speculative_sample(diffusion, draft, build(budget), NUM_SAMPLES, rng)
                points.append((ceiling(budget), run.saved))
            out[draft][name] = points
    return out


def plot(output: Path) -> None:
    table = values()
    fig, axes = plt.subplots(1, len(DRAFTS), figsize=(12, 4.6), sharey=True)
    grid = np.arange(2, 10)
    for ax, (draft, title) in zip(axes, DRAFTS.items(), strict=True):
        ax.plot(grid, 100 * (1 - 1 / grid), color="gray", ls=":", lw=1.2, label="perfect draft")
        for name, (_, _, _, style) in SCHEMES.items():
            xs, ys = zip(*table[draft][name], strict=True)
            ax.plot(xs, 100 * np.array(ys), label=name, lw=1.4, **style)
        ax.set_title(f"draft: {title}", fontsize=10)
        ax.set_xlabel("most states committed per target pass (chain L + 1, tree depth L)")
        ax.set_xticks(grid)
        ax.grid(alpha=0.3)
        print(f"\n{draft}")
        for name, points in table[draft].items():
            cells = "  ".join(f"{x}: {100 * y:5.1f}%" for x, y in points)
            print(f"{name:20s} {cells}")
    axes[0].set_ylabel("target calls saved vs plain (%)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=9, frameon=False)
    fig.suptitle(
        f"Speculative sampling of a toy diffusion (8-D mixture, N = {NUM_STEPS} steps, "
        f"{NUM_SAMPLES} paths): target passes saved"
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(output, dpi=100, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    plot(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_suffix(".png"))
