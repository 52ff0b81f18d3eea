"""Benchmark: the optimal-transport verifiers per node at the Qwen vocabulary, against SpecInfer.

Run from the repository root::

    python benchmarks/ot_verifiers.py             # writes benchmarks/results/ot_verifiers-<date>.md
    python benchmarks/ot_verifiers.py --no-write  # print only
    python benchmarks/ot_verifiers.py --quick --output /tmp/ot.md   # seconds: a smoke test

One node at vocabulary V (default 151,936): target = softmax of 3 x N(0, 1) logits, draft =
softmax of the same logits plus N(0, 1) noise (``common.model_pair``, seed 0), k i.i.d. draws
from the draft. Measured side by side in one run, the contenders taking turns within each repeat
(``common.interleaved_median``):

* ``ot_optimal`` with **top-k drafting** (the draft truncated to its ``k_top`` most probable
  tokens and renormalised; k_top in 16, 64, 256, 1024): the **plan** (``OTOptimal.node_plan``,
  what a verify call runs per node on tables it has validated once: ratio order, cut, levels,
  split trees, realised law, residual) and the **query** (the decision for the node's draws
  given the plan, then the residual draw);
* ``ot_binned`` with **full-support drafting** (tau in 1e-5, 1e-6, 1e-7): plan and query;
* ``khisti`` (s = 5) at full support: its tournament of LPs and query, once per k;
* **SpecInfer** on the same inputs: the reference node decision (recursive rejection, one
  residual per rejected candidate), the scale every row is divided by.

Every accept uniform is just below 1, so every contender takes its rejection path (SpecInfer
rejects all k candidates; the OT query draws from its residual): the worst case per node, and
the same path for all.

Also recorded: the split trees' sizes and heights, the acceptance gap to the optimum
(``sum min(p, r_real)``, exact for ``ot_optimal``, a lower bound for ``ot_binned``), and a
numpy prototype's figures for comparison (same machine class): 0.013-0.045 s plan and at most
0.3 ms query for top-k, 0.19-0.31 s for binned at full support. Goal: plan + query <= 2 ms per
node for top-k <= 256.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from common import interleaved_median, is_busy, model_pair, parser, report_result, sig, table

import specsampling as ss
from specsampling.ops import categorical
from specsampling.schemes.khisti import SCHEME as KHISTI
from specsampling.schemes.ot_binned import OTBinned
from specsampling.schemes.ot_optimal import SCHEME as OPTIMAL
from specsampling.schemes.ot_optimal import Plan, plan, selection
from specsampling.schemes.specinfer import SCHEME as SPECINFER

RESULTS = Path(__file__).resolve().parent / "results"
#: The accept uniform of every candidate: the rejection path (see ``one_k``).
REJECT_UNIFORM = 1 - 2**-20


def star(draws: list[int]) -> ss.DraftTree:
    """A one-level i.i.d. tree holding ``draws`` (with multiplicity, in drafting order)."""
    return ss.DraftTree.from_draws([(0, int(t)) for t in draws], law="iid")


def query(node_plan: Plan, target: np.ndarray, draws: list[int], u: float, v: float) -> int:
    """The per-query work of ``OTOptimal.node_verify`` given a built plan: selection, the
    categorical over (children, reject), the residual draw on a reject."""
    chosen = selection(node_plan, draws)
    children = list(dict.fromkeys(draws))
    weights = [
        chosen.get(t, 0.0) * min(1.0, target[t] / node_plan.realised_r[t])
        if node_plan.realised_r[t] > 0
        else 0.0
        for t in children
    ]
    pick = categorical(np.array([*weights, max(0.0, 1.0 - sum(weights))]), u)
    return children[pick] if pick < len(children) else categorical(node_plan.residual, v)


def measure(vocab: int, ks: list[int], tops: list[int], taus: list[float], repeats: int) -> dict:
    target, full_draft = model_pair(vocab, 0)
    rng = np.random.default_rng(1)
    rows: dict[str, list[list[str]]] = {"top": [], "binned": [], "khisti": []}
    for k in ks:
        for kind, row in one_k(k, target, full_draft, tops, taus, repeats, rng):
            rows[kind].append(row)
    return rows


def one_k(
    k: int,
    target: np.ndarray,
    full_draft: np.ndarray,
    tops: list[int],
    taus: list[float],
    repeats: int,
    rng: np.random.Generator,
) -> list[tuple[str, list[str]]]:
    """Every contender at ``k`` draws, timed side by side; rows of the three tables."""
    vocab = len(target)
    # Accept uniforms just below 1: every contender takes its rejection path (SpecInfer tests
    # and rejects all k candidates, one residual each; the OT query draws from its residual),
    # the worst case per node and the same path for all.
    noise = ss.Noise(accept=np.full(k + 1, REJECT_UNIFORM), sample=rng.random(k + 1))
    u, v = float(noise.accept[1]), float(noise.sample[0])

    def rows_of(draft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.stack([target] * (k + 1)), np.stack([draft] * (k + 1))

    fns = {}
    cases = []
    for k_top in tops:
        draft = np.zeros(vocab)
        top = np.argsort(-full_draft, kind="stable")[:k_top]
        draft[top] = full_draft[top]
        draft /= draft.sum()
        draws = [int(t) for t in rng.choice(vocab, size=k, p=draft)]
        built = plan(target, draft, k)
        cases.append(("top", k_top, built, draft))
        fns[f"plan:{k_top}"] = lambda d=draft: OPTIMAL.node_plan(target, d, k)
        fns[f"query:{k_top}"] = lambda b=built, w=draws: query(b, target, w, u, v)
        small_tree, small_rows = star(draws), rows_of(draft)
        fns[f"specinfer:{k_top}"] = lambda t=small_tree, r=small_rows: SPECINFER.node_verify(
            t, 0, *r, noise
        )
    draws = [int(t) for t in rng.choice(vocab, size=k, p=full_draft)]
    tree, full_rows = star(draws), rows_of(full_draft)
    fns["specinfer:full"] = lambda: SPECINFER.node_verify(tree, 0, *full_rows, noise)
    for tau in taus:
        built = plan(target, full_draft, k, tau)
        cases.append(("binned", tau, built, full_draft))
        binned = OTBinned(tau)
        fns[f"plan:{tau}"] = lambda b=binned: b.node_plan(target, full_draft, k)
        fns[f"query:{tau}"] = lambda b=built: query(b, target, draws, u, v)
    fns["khisti"] = lambda: KHISTI.decision(tree, 0, *full_rows)
    best = interleaved_median(fns, repeats)
    out = []
    for kind, knob, built, draft in cases:
        optimum = ss.optimal_acceptance(target, draft, k)
        gap = optimum - float(np.minimum(target, built.realised_r).sum())
        spent = best[f"plan:{knob}"] + best[f"query:{knob}"]
        base = best[f"specinfer:{knob}" if kind == "top" else "specinfer:full"]
        row = [
            str(k),
            str(knob) if kind == "top" else f"{knob:g}",
            " + ".join(str(len(b) - 1) for b in built.cell_bounds),
            " + ".join(f"{t.num_nodes} / {max(t.height, 0)}" for t in built.trees),
            sig(best[f"plan:{knob}"] * 1e3),
            sig(best[f"query:{knob}"] * 1e3),
            sig(base * 1e3),
            sig(spent / base, 2) + "x",
            f"{optimum:.4f}",
            f"{gap:.1e}",
            f"{float(built.loss_bound):.1e}",
        ]
        out.append((kind, row))
    khisti = best["khisti"] / best["specinfer:full"]
    out.append(
        (
            "khisti",
            [
                str(k),
                sig(best["khisti"] * 1e3),
                sig(best["specinfer:full"] * 1e3),
                sig(khisti, 2) + "x",
            ],
        )
    )
    return out


HEADER = [
    "k",
    "{knob}",
    "cells (A* + H*)",
    "tree nodes / height (A*, H*)",
    "plan (ms)",
    "query (ms)",
    "SpecInfer (ms)",
    "(plan + query) / SpecInfer",
    "optimum",
    "optimum - sum min(p, r)",
    "bound sum l_g",
]


def torch_rows(vocab: int, k: int, k_top: int, repeats: int) -> list[list[str]]:
    """``ssg.verify`` on one i.i.d. star (B = 1, float64 tables): the host-planned lowerings
    against SpecInfer's lowering on the same batch (top-k drafting)."""
    import torch

    import specsampling.gpu as ssg

    target, full_draft = model_pair(vocab, 0)
    draft = np.zeros(vocab)
    top = np.argsort(-full_draft, kind="stable")[:k_top]
    draft[top] = full_draft[top]
    draft /= draft.sum()
    rng = np.random.default_rng(2)
    tree = star([int(t) for t in rng.choice(vocab, size=k, p=draft)])
    batch = ssg.TreeBatch.from_trees([tree])
    size = tree.num_nodes  # repeated draws share a node
    target_probs = torch.from_numpy(np.stack([target] * size))[None]  # [1, N, V]
    draft_probs = torch.from_numpy(np.stack([draft] * size))[None]  # [1, N, V]
    noise = ssg.Noise.from_reference([ss.Noise.draw(rng, tree.num_nodes)])
    names = ["specinfer", "ot_optimal", "ot_binned", "khisti"]
    fns = {
        name: lambda n=name: ssg.verify(n, batch, target_probs, draft_probs, noise)
        for name in names
    }
    best = interleaved_median(fns, repeats)
    return [
        [f"`{name}`", sig(best[name] * 1e3), sig(best[name] / best["specinfer"], 2) + "x"]
        for name in names
    ]


def main() -> None:
    made = parser(__doc__)
    made.add_argument("--vocab", type=int, default=151_936)
    made.add_argument("--repeats", type=int, default=9)
    made.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    args = made.parse_args()
    ks, tops, taus = [2, 4, 8], [16, 64, 256, 1024], [1e-5, 1e-6, 1e-7]
    if args.quick:
        args.vocab, args.repeats, ks, tops, taus = 3_000, 2, [2, 4], [16, 64], [1e-5]
    began = time.perf_counter()
    load_before = os.getloadavg()
    rows = measure(args.vocab, ks, tops, taus, args.repeats)
    torch_k, torch_top = ks[-1], tops[min(2, len(tops) - 1)]
    lowered = torch_rows(args.vocab, torch_k, torch_top, args.repeats)
    load_after = os.getloadavg()
    import datetime
    import platform

    busy = is_busy(load_before)
    quick = " **(`--quick` sizes: a smoke test, not a result)**" if args.quick else ""
    text = f"""# Optimal-transport verifiers per node, against SpecInfer{quick}

Generated by `python benchmarks/ot_verifiers.py`; see `benchmarks/README.md`.

- date: {datetime.date.today().isoformat()}
- platform: {platform.platform()} ({platform.machine()}); CPU count: {os.cpu_count()}
- Python {platform.python_version()}, numpy {np.__version__}, specsampling {ss.__version__}
- load average before: {", ".join(f"{x:.2f}" for x in load_before)}; after: \
{", ".join(f"{x:.2f}" for x in load_after)}{" (**busy machine**)" if busy else " (idle before)"}
- run time of the whole benchmark: {time.perf_counter() - began:.1f} s

One node at vocabulary {args.vocab:,}: target softmax(3 N(0, 1)), draft the same logits plus
N(0, 1) (seed 0), k i.i.d. draws, every accept uniform just below 1 (the rejection path, the
worst case, for every contender). Median of {args.repeats} interleaved repeats. "plan" builds the
node's plan (once per node, on validated tables: ratio order, cut, levels, split trees, realised
law and residual); "query" is the decision for the node's draws given the plan plus the residual
draw; SpecInfer is the reference node decision on the same inputs. The torch lowerings run
exactly this plan on the host (`HostPlanned`).

## `ot_optimal`, top-k drafting

{table([h.format(knob="k_top") for h in HEADER], rows["top"])}

A numpy prototype's figures (k = 8): plan 13-45 ms for k_top = 16..1024 (tree 17-667
nodes), query <= 0.3 ms. Goal: plan + query <= 2 ms for k_top <= 256.

## `ot_binned`, full-support drafting

{table([h.format(knob="tau") for h in HEADER], rows["binned"])}

"optimum - sum min(p, r)" is an upper bound on the acceptance `ot_binned` loses (residual hits
only add). A numpy prototype's figures: 0.19-0.31 s per plan at V = 150,000.

## `khisti` (s = 5), full-support drafting

{table(["k", "tournament + query (ms)", "SpecInfer (ms)", "khisti / SpecInfer"], rows["khisti"])}

Each of the k - 1 rounds sorts the vocabulary by its score and solves one LP (HiGHS) on the host.

## The torch lowerings: `ssg.verify` on one star (k = {torch_k}, k_top = {torch_top})

{table(["scheme", "verify (ms)", "/ specinfer"], lowered)}

B = 1, float64 tables `[1, k + 1, V]` on the CPU, validation on (the default). The host-planned
lowerings (`HostPlanned`) copy the tables to numpy and run the reference plan of every node with
two or more candidates that the walk reaches (here: the star's root); SpecInfer's lowering is
batched torch throughout.
"""
    report_result(
        text,
        args.output,
        RESULTS / f"ot_verifiers-{datetime.date.today()}.md",
        no_write=args.no_write,
        quick=args.quick,
        busy=busy,
    )


if __name__ == "__main__":
    main()
