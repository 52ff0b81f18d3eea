"""The samplers: plain Euler-Maruyama and speculative sampling, and the :class:`Run` they return.

:func:`speculative_sample` advances every sample path one round at a time, each round one
target pass, and its output law is exactly that of :func:`plain_sample`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Absolute imports: pytest (importlib mode) also loads these files as simulators.diffusion.*
from specsampling.simulators.diffusion.drafts import get_draft
from specsampling.simulators.diffusion.lookahead import Lookahead, _Advance
from specsampling.simulators.diffusion.process import Array, VPDiffusion


@dataclass(frozen=True, eq=False)
class Run:
    """Final samples of a sampler and, per sample path, what it cost.

    Attributes
    ----------
    samples : ndarray, shape (num_samples, dim)
        The states after ``num_steps`` steps.
    target_calls : ndarray of int, shape (num_samples,)
        Sequential target passes (NFEs) of each path, the warm-up pass included.
    target_rows : ndarray of int, shape (num_samples,)
        Target means evaluated for each path, summed over its passes.
    drafted : ndarray of int, shape (num_samples,)
        States drafted for each path.
    num_steps : int
        N; plain sampling makes N passes per path.
    """

    samples: Array
    target_calls: Array
    target_rows: Array
    drafted: Array
    num_steps: int

    @property
    def mean_calls(self) -> float:
        """Average target passes per path."""
        return float(self.target_calls.mean())

    @property
    def saved(self) -> float:
        """Fraction of target passes saved against plain sampling: ``1 - mean_calls / N``."""
        return 1.0 - self.mean_calls / self.num_steps

    @property
    def batch_passes(self) -> int:
        """Passes of a batch advanced in lockstep: the slowest path's count."""
        return int(self.target_calls.max())


def _check_process(process: Any) -> VPDiffusion:
    if not isinstance(process, VPDiffusion):
        raise TypeError(f"process: expected a VPDiffusion, got {type(process).__name__}")
    return process


def _plain_step(
    process: VPDiffusion, steps: Array, states: Array, rng: np.random.Generator
) -> tuple[Array, Array]:
    """One exact Euler-Maruyama step per row; also returns the target increment."""
    means = process.target_mean(states, steps)
    noise = rng.standard_normal(states.shape)
    return means + process.stds[steps][:, None] * noise, means - states


def plain_sample(process: VPDiffusion, num_samples: int, rng: np.random.Generator) -> Run:
    """Plain Euler-Maruyama sampling: N target passes per path.

    Examples
    --------
    >>> import numpy as np
    >>> from specsampling.simulators.diffusion import GaussianMixture, VPDiffusion
    >>> data = GaussianMixture([[-2.0], [2.0]], [0.5, 0.5], std=0.3)
    >>> run = plain_sample(VPDiffusion(data, num_steps=20), 500, np.random.default_rng(0))
    >>> run.samples.shape, run.mean_calls, run.saved
    ((500, 1), 20.0, 0.0)
    """
    process = _check_process(process)
    states = process.prior_sample(num_samples, rng)
    n = states.shape[0]
    for step in range(process.num_steps):
        states, _ = _plain_step(process, np.full(n, step), states, rng)
    full = np.full(n, process.num_steps)
    return Run(states, full, full.copy(), np.zeros(n, dtype=np.int64), process.num_steps)


def speculative_sample(
    process: VPDiffusion,
    draft: Any,
    lookahead: Lookahead,
    num_samples: int,
    rng: np.random.Generator,
) -> Run:
    """Speculative sampling of the Euler-Maruyama chain; the output law is exactly plain's.

    Paths are advanced together, one round each per loop (rows at different steps; rows with
    the same truncated depth share a library call). Each round is one target pass for its path.
    With a draft that uses an anchor (``"frozen"``), the warm-up pass at ``n = 0`` is a plain
    step whose target increment seeds the draft.

    Parameters
    ----------
    process : VPDiffusion
        The process and its discretisation (N steps).
    draft : str or Draft
        ``"frozen"``, ``"gaussian"``, ``"exact"`` or a draft object.
    lookahead : Chain or Tree
        For example ``reflection_chain(4)``, ``block_chain(4)`` or ``dgrs_tree(2, 3)``.
    num_samples : int
        Independent sample paths.
    rng : numpy.random.Generator
        All randomness (initial states, drafts, verification).

    Returns
    -------
    Run
        Final samples and per-path target passes, rows and drafted states.

    Examples
    --------
    >>> import numpy as np
    >>> from specsampling.simulators.diffusion import GaussianMixture, VPDiffusion, block_chain
    >>> from specsampling.simulators.diffusion import dgrs_tree
    >>> data = GaussianMixture([[-2.0], [2.0]], [0.5, 0.5], std=0.3)
    >>> process = VPDiffusion(data, num_steps=20)
    >>> run = speculative_sample(process, "exact", block_chain(3), 100, np.random.default_rng(0))
    >>> run.mean_calls  # a perfect draft commits L + 1 = 4 states per pass
    5.0
    >>> run = speculative_sample(process, "frozen", dgrs_tree(2, 3), 200, np.random.default_rng(0))
    >>> bool(run.mean_calls < process.num_steps)
    True
    """
    process = _check_process(process)
    draft = get_draft(draft)
    if not callable(getattr(lookahead, "advance", None)) or not callable(
        getattr(lookahead, "span", None)
    ):
        raise TypeError(f"lookahead: expected a Chain or Tree, got {lookahead!r}")
    states = process.prior_sample(num_samples, rng)
    total = process.num_steps
    n = states.shape[0]
    steps = np.zeros(n, dtype=np.int64)
    calls, rows, drafted = (np.zeros(n, dtype=np.int64) for _ in range(3))
    anchors = np.zeros_like(states)
    if draft.uses_anchor:  # warm-up pass at n = 0, used as the first plain step
        states, anchors = _plain_step(process, steps, states, rng)
        steps += 1
        calls += 1
        rows += 1
    while np.any(active := steps < total):
        live = np.flatnonzero(active)
        depths = lookahead.span(total - steps[live])
        for depth in np.unique(depths):
            sel = live[depths == depth]
            if depth == 0:
                new, increments = _plain_step(process, steps[sel], states[sel], rng)
                out = _Advance(np.ones(sel.size, dtype=np.int64), new, increments, 1, 0)
            else:
                out = lookahead.advance(
                    process, draft, steps[sel], states[sel], anchors[sel], int(depth), rng
                )
            states[sel], anchors[sel] = out.states, out.anchors
            steps[sel] += out.committed
            calls[sel] += 1
            rows[sel] += out.rows
            drafted[sel] += out.drafted
    if np.any(steps != total):  # a lookahead that overshoots the horizon is a bug
        raise RuntimeError("lookahead committed past the last step")
    return Run(states, calls, rows, drafted, total)


__all__ = ["Run", "plain_sample", "speculative_sample"]
