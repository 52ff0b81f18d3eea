"""Estimates with error bars (numpy only): :class:`Estimate` and :class:`Comparison`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsampling.errors import InvalidDistribution
from specsampling.shapes import Shape

#: The two-sided 95% quantile of the standard normal.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A Monte-Carlo mean with its standard error and a 95% confidence interval.

    Attributes
    ----------
    mean : float
        The estimate.
    stderr : float
        Its standard error (sample standard deviation / sqrt(n)).
    num_trees : int
        Drafted trees (rounds) behind it.
    method : str
        ``"plain"``, ``"rao-blackwell"``, or ``"difference"`` (a paired difference).
    variance_ratio : float or None
        Rao-Blackwell only: the per-tree variance of plain Monte Carlo over that of this
        estimate, measured on the same trees (how many plain rounds one tree is worth).

    Examples
    --------
    >>> est = Estimate(2.5, 0.01, 1000)
    >>> [round(x, 4) for x in est.ci]
    [2.4804, 2.5196]
    >>> print(est)
    2.5 +- 0.0196 (95%, 1000 trees, plain)
    """

    mean: float
    stderr: float
    num_trees: int
    method: str = "plain"
    variance_ratio: float | None = None

    @property
    def ci(self) -> tuple[float, float]:
        """The 95% normal confidence interval ``(low, high)``: ``mean +- 1.96 stderr``.

        The normal approximation, reliable from a few hundred trees. At tens of trees, and when
        every tree gives the same count (``stderr`` 0, a zero-width interval), it can be far too
        narrow: use more trees or the Rao-Blackwellised method.
        """
        return (self.mean - Z95 * self.stderr, self.mean + Z95 * self.stderr)

    @property
    def num_rounds(self) -> int:
        """``num_trees`` (one round per drafted tree)."""
        return self.num_trees

    @classmethod
    def of(
        cls, values: Any, method: str = "plain", variance_ratio: float | None = None
    ) -> Estimate:
        """The estimate from per-tree ``values`` (at least two, all finite).

        >>> Estimate.of([1.0, float("nan")])
        Traceback (most recent call last):
        ...
        specsampling.errors.InvalidDistribution: values: NaN or inf at index 1
        """
        data = np.asarray(values, dtype=np.float64)
        n = int(data.size)
        if n < 2:
            raise ValueError(f"values: need at least two values for a standard error, got {n}")
        finite = np.isfinite(data).ravel()
        if not finite.all():
            index = int(np.flatnonzero(~finite)[0])
            raise InvalidDistribution(f"values: NaN or inf at index {index}")
        stderr = float(data.std(ddof=1) / math.sqrt(n))
        return cls(float(data.mean()), stderr, n, method, variance_ratio)

    def __iter__(self) -> Any:
        """``mean, stderr, num_trees = estimate``, as the earlier named tuple unpacked."""
        return iter((self.mean, self.stderr, self.num_trees))

    def __str__(self) -> str:
        ratio = "" if self.variance_ratio is None else f", variance / {self.variance_ratio:.3g}"
        return (
            f"{self.mean:.6g} +- {Z95 * self.stderr:.3g} (95%, {self.num_trees} trees, "
            f"{self.method}{ratio})"
        )


@dataclass(frozen=True)
class Comparison:
    """Schemes estimated on the same drafted trees, with paired differences.

    ``estimates[name]`` is each scheme's :class:`Estimate`; ``differences[(a, b)]`` the paired
    estimate of ``E_a[tau + 1] - E_b[tau + 1]`` for every pair in the given order.
    """

    estimates: dict[str, Estimate]
    differences: dict[tuple[str, str], Estimate]
    method: str
    num_trees: int
    shape: Shape | None = field(default=None)

    def __getitem__(self, name: str) -> Estimate:
        return self.estimates[name]

    def table(self) -> str:
        """A plain-text table: each scheme, then each paired difference."""
        labels = list(self.estimates) + [f"{a} - {b}" for a, b in self.differences]
        width = max(16, *(len(label) for label in labels))
        lines = [f"{'scheme':<{width}} {'E[tau+1]':>10}   {'95% CI':<20}"]
        for name, est in self.estimates.items():
            low, high = est.ci
            lines.append(f"{name:<{width}} {est.mean:>10.4f}   [{low:.4f}, {high:.4f}]")
        for (a, b), est in self.differences.items():
            low, high = est.ci
            label = f"{a} - {b}"
            lines.append(f"{label:<{width}} {est.mean:>+10.4f}   [{low:+.4f}, {high:+.4f}]")
        return "\n".join(lines)


__all__ = ["Z95", "Comparison", "Estimate"]
