r"""Acceptance against depth in the drafted tree: :func:`depth_profile`.

For a scheme and a tree source, the profile gives, at every depth :math:`d` of the shape,

* the Rao-Blackwellised probability that the round accepts at least :math:`d` tokens,
  :math:`P(\tau \ge d) = E\big[\sum_{v:\,\mathrm{depth}(v) \ge d} P(\text{verdict node} = v
  \mid T)\big]`, with its standard error (their sum over :math:`d \ge 1` plus one is the block
  efficiency);
* the acceptance rate at that depth, :math:`P(\tau \ge d) / P(\tau \ge d - 1)`;
* the mean total-variation-type distance :math:`\lVert p - q \rVert_1` between target and draft
  at the drafted nodes of depth :math:`d - 1` (where the depth-:math:`d` candidates were drawn):
  DDTE's Figure 1 plots both against depth (Thomas et al., arXiv 2602.16994; see
  ``docs/simulators.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specsampling.shapes import Shape

from .estimators import _rounds, node_law
from .stats import Estimate


@dataclass(frozen=True)
class DepthProfile:
    """Per depth ``d = 1..D``: ``reach[d-1]`` estimates ``P(tau >= d)``, ``acceptance[d-1]``
    is ``P(tau >= d) / P(tau >= d - 1)``, ``distance[d-1]`` the mean ``||p - q||_1`` at the
    expanded nodes of depth ``d - 1`` (NaN where there are none)."""

    reach: tuple[Estimate, ...]
    acceptance: tuple[float, ...]
    distance: tuple[float, ...]

    @property
    def block_efficiency(self) -> float:
        """``1 + sum_d P(tau >= d)``."""
        return 1.0 + sum(r.mean for r in self.reach)

    def table(self) -> str:
        """One line per depth."""
        lines = [f"{'depth':>5} {'P(tau>=d)':>10} {'+-95%':>7} {'accept':>7} {'|p-q|_1':>8}"]
        for d, (r, a, l1) in enumerate(
            zip(self.reach, self.acceptance, self.distance, strict=True)
        ):
            lines.append(f"{d + 1:>5} {r.mean:>10.4f} {1.96 * r.stderr:>7.4f} {a:>7.4f} {l1:>8.4f}")
        return "\n".join(lines)


def depth_profile(
    scheme: Any,
    source: Any,
    shape: Any = None,
    num_trees: int | None = None,
    generator: Any = None,
    *,
    prefix: Any = None,
    progress: bool | None = None,
) -> DepthProfile:
    """The acceptance profile of ``scheme`` against depth (see the module doc).

    Examples
    --------
    >>> import specsampling as ss
    >>> from specsampling import simulators as sim
    >>> pair = ss.pairs.Stationary([1/3, 2/3], [2/3, 1/3])
    >>> prof = sim.depth_profile("standard", pair, ss.Shape.chain(2), 200, generator=0)
    >>> [abs(a - 2 / 3) < 0.1 for a in prof.acceptance]  # sum min(p, q) at every depth
    [True, True]
    >>> abs(prof.block_efficiency - 19 / 9) < 0.1
    True
    """
    planned = _rounds([scheme], source, shape, num_trees, "rao-blackwell", generator, prefix,
                      None, progress)  # fmt: skip
    (obj,) = planned.schemes
    used = planned.shape
    depth = used.depth if isinstance(used, Shape) else min(used.budget, used.max_depth)
    reach_rows: list[np.ndarray] = []
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for batch in planned.batches:  # folded into the profile and let go ([B, N, V] tables)
        trees = batch.trees.to_trees()
        sizes = batch.trees.num_nodes.tolist()
        target = batch.target.cpu().numpy()
        draft = batch.draft.cpu().numpy()
        for b, tree in enumerate(trees):
            n = sizes[b]
            law = node_law(obj, tree, target[b, :n], draft[b, :n])
            row = np.zeros(depth)
            for node, prob in law.items():
                row[: tree.depth(node)] += float(prob)
            reach_rows.append(row)
            for node in range(n):
                d = tree.depth(node)
                if tree.candidates[node] and d < depth:
                    sums[d] = sums.get(d, 0.0) + float(
                        np.abs(target[b, node] - draft[b, node]).sum()
                    )
                    counts[d] = counts.get(d, 0) + 1
    values = np.array(reach_rows)
    reach = tuple(Estimate.of(values[:, d], "rao-blackwell") for d in range(depth))
    acceptance = []
    previous = 1.0
    for r in reach:
        acceptance.append(r.mean / previous if previous > 0 else float("nan"))
        previous = r.mean
    distance = tuple(sums[d] / counts[d] if counts.get(d) else float("nan") for d in range(depth))
    return DepthProfile(reach, tuple(acceptance), distance)


__all__ = ["DepthProfile", "depth_profile"]
