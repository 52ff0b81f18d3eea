"""Single-position acceptance against the number of drafts, every scheme next to the optimum.

Regenerate ``docs/plots/acceptance.png`` (deterministic, under 10 seconds) with::

    python docs/plots/acceptance.py

For each of three target/draft pairs and ``k = 1..6`` drafts it plots every registered scheme
that is exact for its own single-position draft law (``ss.acceptance``: closed forms where the
scheme has one, exact enumeration otherwise) and, as lines, the optimum for i.i.d. drafts and
for drafts without replacement (``ss.optimal_acceptance``). Greedy and SpecHub are compared
with the optimum of their own draft law, which they attain (see ``docs/choosing.md``). The
values are printed as a table too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

import specsampling as ss

DRAFTS = range(1, 7)
#: Small vocabularies keep the enumeration-only schemes (RSD, traversal) fast up to k = 6.
PAIRS = {
    "near pair (4 tokens)": ([0.45, 0.3, 0.15, 0.1], [0.35, 0.3, 0.2, 0.15]),
    "skewed pair p=(.7,.2,.1), q=(.1,.2,.7)": ([0.7, 0.2, 0.1], [0.1, 0.2, 0.7]),
    "random Dirichlet(1) pair (6 tokens, seed 7)": tuple(
        np.random.default_rng(7).dirichlet(np.ones(6), size=2)
    ),
}
# name -> (label, matplotlib style); the chain verifiers only exist at k = 1.
STYLES = {
    "standard": (
        "standard = block (k = 1 only)",
        {"marker": "*", "color": "black", "ms": 13, "zorder": 5},
    ),
    "nss": ("NSS", {"marker": "v", "color": "tab:gray"}),
    "specinfer": ("SpecInfer (RRS)", {"marker": "o", "color": "tab:blue"}),
    "traversal": ("traversal (i.i.d. star)", {"marker": "x", "color": "tab:cyan", "ls": ":"}),
    "spectr": ("SpecTr", {"marker": "s", "color": "tab:green", "ms": 5}),
    "rsd": ("RSD (RRS w/o)", {"marker": "^", "color": "tab:orange"}),
    "greedy": ("greedy", {"marker": "D", "color": "tab:red", "ms": 5}),
    "spechub": ("SpecHub (k = 2)", {"marker": "o", "color": "tab:purple", "mfc": "none", "ms": 11}),
    "resispec": ("ResiSpec (optimised)", {"marker": "P", "color": "tab:brown", "ms": 6}),
    "gumbel": ("Gumbel (k = 1 only)", {"marker": "X", "color": "tab:pink", "ms": 10, "zorder": 5}),
    "poisson": ("Poisson list (w/o)", {"marker": ">", "color": "tab:pink", "ls": "--"}),
    "gls": ("GLS (= gls_strong here)", {"marker": "<", "color": "tab:olive", "ls": "--"}),
}
# block is identical to standard at one position, and gls_strong to gls (all rows are active
# at the first position): each pair is drawn as one line.
SKIP = {"block", "gls_strong"}


def values(target: object, draft: object) -> dict[str, list[float | None]]:
    """Acceptance per scheme (``None`` where the scheme has no law) and the two optima."""
    result: dict[str, list[float | None]] = {}
    for name, scheme in ss.SCHEMES.items():
        if name in SKIP:
            continue
        row: list[float | None] = []
        for k in DRAFTS:
            exact_here = scheme.supports(scheme.single_shape(k))
            row.append(float(ss.acceptance(name, target, draft, k)) if exact_here else None)
        result[name] = row
    for label, replacement in (("optimum i.i.d.", True), ("optimum w/o", False)):
        result[label] = [
            float(ss.optimal_acceptance(target, draft, k, replacement=replacement)) for k in DRAFTS
        ]
    return result


def plot(output: Path) -> None:
    fig, axes = plt.subplots(1, len(PAIRS), figsize=(14, 4.8), sharey=True)
    for ax, (title, (target, draft)) in zip(axes, PAIRS.items(), strict=True):
        table = values(target, draft)
        ks = list(DRAFTS)
        ax.plot(ks, table["optimum w/o"], color="black", lw=2.2, ls="--", label="optimum w/o")
        ax.plot(ks, table["optimum i.i.d."], color="black", lw=1.6, label="optimum i.i.d.")
        for name, (label, style) in STYLES.items():
            points = [(k, v) for k, v in zip(ks, table[name], strict=True) if v is not None]
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=label, lw=1.2, **{"ls": "-", **style})
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("drafts k")
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
        print(f"\n{title}")
        print("k".ljust(16) + "".join(f"{k:>8}" for k in ks))
        for name, row in table.items():
            cells = "".join(f"{'-':>8}" if v is None else f"{v:8.4f}" for v in row)
            print(name.ljust(16) + cells)
    axes[0].set_ylabel("acceptance P(Y in drafts)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=9, frameon=False)
    fig.suptitle("Single-position acceptance: every scheme on its own draft law, and the optimum")
    fig.tight_layout(rect=(0, 0.11, 1, 1))
    fig.savefig(output, dpi=100, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    plot(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_suffix(".png"))
