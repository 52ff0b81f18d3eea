"""Mutants of the continuous schemes and the checks that must catch them.

Each mutant changes one rule of ``specsampling.continuous`` that the docs name as a pitfall
(the Pitfalls of ``docs/continuous/*.md``). A check returns a p-value or a list of violations; the
registered scheme (the mutant's twin) must pass it and the mutant must fail it.

Two of the pinned rules are coupling *contracts*, not output-law requirements: the residual
state of D-GRS reuses the **first** child's :math:`z_\\perp`, and block verification draws a
**fresh** one. Every child's :math:`z_\\perp` is independent of the accept decisions (D-GRS) and,
given :math:`\\tau^* = i` and the accepted prefix, the drafted :math:`z_\\perp` at level
:math:`i+1` is independent of :math:`\\tau^*` (:math:`\\Pr(\\tau^* = i \\mid \\tilde Y_{1..i+1}) =
h_i(1 - w_{i+1})` depends on :math:`\\tilde Y_{i+1}` only through :math:`\\hat s_{i+1}`), so the
"last child" and "reused draft noise" variants are lossless in law. They are caught by the joint
law of (output, drafts): the correlation of the output's :math:`z_\\perp` with the drafts'.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from specsampling.continuous import (
    Frame,
    NodeNoise,
    acceptance,
    verify_chain_with_noise,
    verify_with_noise,
)
from specsampling.continuous.base import Array
from specsampling.continuous.block import Block
from specsampling.continuous.dgrs import DGRS, Recursion

# ----------------------------------------------------------------------------- mutants


class DGRSScannedByRatio(DGRS):
    """D-GRS pitfall 1 (``docs/continuous/dgrs.md``): scans the children by decreasing likelihood
    ratio, not in drafting order."""

    name = "mutant-dgrs-scanned-by-ratio"

    def order(self, s: Array) -> Any:
        return np.argsort(-s, axis=1, kind="stable")


class DGRSLastChildZperp(DGRS):
    """D-GRS pitfall 2: the residual state takes the LAST child's z_perp."""

    name = "mutant-dgrs-last-child-zperp"

    def residual_zperp(self, zperp: Array) -> Array:
        return zperp[:, -1]


class BlockReusedDraftNoise(Block):
    """Block verification: the residual reuses the drafted child's z_perp instead of fresh
    Gaussian noise."""

    name = "mutant-block-reused-draft-noise"

    def residual_zperp(self, frame: Frame, gaussian: Array, child_zperp: Array) -> Array:
        return child_zperp


class DGRSInclusive(DGRS):
    """Accepts with ``u <= beta``: ``u = 0`` accepts a child whose beta is 0."""

    name = "mutant-dgrs-inclusive"

    def accepts(self, u: Array, beta: Array) -> Any:
        return u <= beta


class DGRSTauBeforeDegenerateCheck(DGRS):
    """D-GRS pitfall 3: forms tau = ln(lambda)/delta for every row and only then looks for
    degenerate rows (those whose recursion is not finite), so a tiny nonzero delta runs the full
    scan."""

    name = "mutant-dgrs-tau-before-degenerate-check"

    def recursion(self, delta: Array, num_drafts: int) -> Recursion:
        n = delta.shape[0]
        lam = np.zeros((n, num_drafts + 1))
        mass = np.ones((n, num_drafts + 1))
        with np.errstate(all="ignore"):
            for k in range(1, num_drafts + 1):
                lam[:, k] = lam[:, k - 1] + mass[:, k - 1]
                tau = np.log(lam[:, k]) / delta
                t = tau + delta / 2
                g = stats.norm.sf(t - delta) - lam[:, k] * stats.norm.sf(t)
                mass[:, k] = np.clip(g, 0.0, mass[:, k - 1])
        degenerate = ~np.all(np.isfinite(mass), axis=1)
        return Recursion(degenerate, lam, np.log(lam[:, -1]), mass)

    def log_ratios(self, frame: Frame, s: Array, rec: Recursion) -> Array:
        delta = frame.delta[:, None]
        return np.where(rec.degenerate[:, None], 0.0, delta * (s - delta / 2))


class BlockAlwaysResidual(Block):
    """Never accepts; always draws from the target. Passes KS, fails the acceptance check."""

    name = "mutant-block-always-residual"

    def verify_node(self, frame: Frame, s: Array, zperp: Array, noise: NodeNoise) -> Any:
        out = super().verify_node(frame, s, zperp, noise)
        target_s = frame.delta + stats.norm.ppf(noise.residual)
        return out._replace(child=np.full_like(out.child, -1), s=target_s)


class BlockFirstFailure(Block):
    """Stops the block scan at the first failed test instead of taking the last success."""

    name = "mutant-block-first-failure"

    def selects(self, eta: Array, h: Array) -> Any:
        selected = eta < h
        return np.cumprod(selected, axis=-1).astype(bool) if selected.ndim == 2 else selected


# ----------------------------------------------------------------------------- node checks

DIM = 4
STD = 0.7


class NodeCase(NamedTuple):
    target: Array
    draft: Array
    children: Array
    along: Array  # unit vector e
    across: Array  # a unit vector orthogonal to e


def node_case(delta: float, num_drafts: int, size: int, rng: np.random.Generator) -> NodeCase:
    """``size`` nodes with mismatch ``delta`` along a fixed oblique direction."""
    along = np.array([1.0, -2.0, 0.5, 1.0])
    along /= np.linalg.norm(along)
    across = np.array([2.0, 1.0, 0.0, 0.0]) / np.sqrt(5.0)
    draft = np.broadcast_to(np.array([0.3, -1.0, 2.0, 0.5]), (size, DIM))
    target = draft + STD * delta * along
    children = draft[:, None, :] + STD * rng.standard_normal((size, num_drafts, DIM))
    return NodeCase(target, draft, children, along, across)


class NodeLaw(NamedTuple):
    p_along: float
    p_across: float
    acceptance_z: float


def node_law(scheme: Any, num_drafts: int, delta: float, size: int, seed: int) -> NodeLaw:
    """KS of the standardised output along e and across it, and the acceptance z-score."""
    rng = np.random.default_rng(seed)
    case = node_case(delta, num_drafts, size, rng)
    noise = NodeNoise.draw(rng, size, num_drafts, DIM)
    out = verify_with_noise(scheme, case.target, case.draft, STD, case.children, noise)
    standard = (out.states - case.target) / STD
    alpha = acceptance("dgrs", delta, num_drafts)  # the closed form of the correct rule
    measured = float(np.mean(out.index >= 0))
    se = np.sqrt(max(alpha * (1 - alpha), 1e-300) / size)
    return NodeLaw(
        float(stats.kstest(standard @ case.along, "norm").pvalue),
        float(stats.kstest(standard @ case.across, "norm").pvalue),
        abs(measured - alpha) / se,
    )


def zperp_correlations(scheme: Any, num_drafts: int, size: int, seed: int) -> tuple[float, ...]:
    """On residual outputs: correlation of the output's across-coordinate with the first and
    the last child's (D-GRS contract: 1 with the first, 0 with the last)."""
    rng = np.random.default_rng(seed)
    case = node_case(1.5, num_drafts, size, rng)
    noise = NodeNoise.draw(rng, size, num_drafts, DIM)
    out = verify_with_noise(scheme, case.target, case.draft, STD, case.children, noise)
    rows = out.index < 0
    output = out.states[rows] @ case.across
    first = case.children[rows, 0] @ case.across
    last = case.children[rows, -1] @ case.across
    return (
        float(np.corrcoef(output, first)[0, 1]),
        float(np.corrcoef(output, last)[0, 1]),
        int(rows.sum()),
    )


def boundary_violations(scheme: Any) -> list[str]:
    """``u = 0`` on a child whose acceptance probability is 0 must not accept it."""
    problems = []
    delta = 2.0
    draft = np.zeros((1, DIM))
    target = draft.copy()
    target[0, 0] = delta
    # child 0 at s = 0 (ratio e^-2, rejected by u = 1 - 2^-53); child 1 at s = -3 has
    # ratio e^-8 < lambda_1 = 1, so beta = 0.
    children = np.zeros((1, 2, DIM))
    children[0, 1, 0] = -3.0
    noise = NodeNoise(np.array([[1 - 2**-53, 0.0]]), np.array([0.5]), np.zeros((1, DIM)))
    out = verify_with_noise(scheme, target, draft, 1.0, children, noise)
    if out.index[0] == 1:
        problems.append("u = 0 accepted child 1 whose beta is 0")
    return problems


def degenerate_violations(scheme: Any, num_drafts: int = 4) -> list[str]:
    """delta <= 1e-10 must accept child 0 under every noise, and acceptance must be 1."""
    problems = []
    rng = np.random.default_rng(5)
    for delta in (0.0, 1e-12, 5e-11):
        case = node_case(delta, num_drafts, 200, rng)
        noise = NodeNoise(
            np.full((200, num_drafts), 1 - 2**-53), rng.random(200), rng.standard_normal((200, 4))
        )
        out = verify_with_noise(scheme, case.target, case.draft, STD, case.children, noise)
        if np.any(out.index != 0) or not np.all(np.isfinite(out.states)):
            problems.append(f"delta={delta}: a degenerate node did not accept child 0")
        value = scheme.acceptance(np.array([delta]), num_drafts)[0]
        if not value == 1.0:
            problems.append(f"delta={delta}: acceptance {value} != 1")
    return problems


# ----------------------------------------------------------------------------- chain checks

CHAIN_STD = np.array([0.8, 1.0, 1.2, 0.9])
TARGET_MAP = np.array([[1.0, 1.5], [0.0, 0.9]])
TARGET_SHIFT = np.array([1.2, 0.0])
DRAFT_MAP = np.array([[0.9, 0.0], [0.0, 1.0]])
DRAFT_SHIFT = np.array([0.0, 0.3])


def target_mean(y: Array) -> Array:
    """Target kernel mean, affine in the parent; the mismatch depends on both coordinates."""
    out: Array = y @ TARGET_MAP.T + TARGET_SHIFT
    return out


def draft_mean(y: Array) -> Array:
    out: Array = y @ DRAFT_MAP.T + DRAFT_SHIFT
    return out


class Chains(NamedTuple):
    roots: Array  # (n, 2)
    children: Array  # (n, L, 2)
    target_means: Array  # (n, L + 1, 2)
    draft_means: Array  # (n, L, 2)
    std: Array  # (n, L + 1)


def draft_chains(size: int, length: int, rng: np.random.Generator) -> Chains:
    roots = rng.standard_normal((size, 2))
    parent, children = roots, []
    for i in range(length):
        parent = draft_mean(parent) + CHAIN_STD[i] * rng.standard_normal((size, 2))
        children.append(parent)
    kids = np.stack(children, axis=1)
    parents = np.concatenate([roots[:, None], kids], axis=1)
    std = np.broadcast_to(CHAIN_STD[: length + 1], (size, length + 1))
    return Chains(roots, kids, target_mean(parents), draft_mean(parents[:, :length]), std)


def fresh_noise_correlation(scheme: Any, size: int, seed: int) -> tuple[float, int]:
    """On residual outputs of block chains: correlation of the output's across-coordinate
    (in the residual level's frame) with the drafted child's at that level (fresh: 0)."""
    rng = np.random.default_rng(seed)
    length = 2
    chains = draft_chains(size, length, rng)
    noise = NodeNoise.draw(rng, size, length, 2)
    out = verify_chain_with_noise(
        scheme, chains.target_means, chains.draft_means, chains.std, chains.children, noise
    )
    rows = np.flatnonzero(out.num_committed < length)
    level = out.num_committed[rows]
    frame = Frame.of(
        chains.target_means[rows, level],
        chains.draft_means[rows, level],
        chains.std[rows, level],
    )
    _, out_perp = frame.project(out.states[rows])
    _, kid_perp = frame.project(chains.children[rows, level])
    across = np.stack([-frame.direction[:, 1], frame.direction[:, 0]], axis=1)
    a, b = np.sum(out_perp * across, axis=1), np.sum(kid_perp * across, axis=1)
    return float(np.corrcoef(a, b)[0, 1]), int(rows.size)


def chain_law(scheme: Any, size: int, seed: int, length: int = 3) -> tuple[list[float], float]:
    """KS p-values of each level's standardised innovation of the output sequence (committed
    prefix, extra state, then target samples) along and across the mismatch, and the z-score
    of the measured E[tau*] against the mean of the scheme's own weights."""
    rng = np.random.default_rng(seed)
    chains = draft_chains(size, length, rng)
    noise = NodeNoise.draw(rng, size, length, 2)
    out = verify_chain_with_noise(
        scheme, chains.target_means, chains.draft_means, chains.std, chains.children, noise
    )
    pvalues = []
    previous = chains.roots
    for j in range(length + 1):
        state = target_mean(previous) + CHAIN_STD[j] * rng.standard_normal((size, 2))
        state = np.where((out.num_committed == j)[:, None], out.states, state)
        if j < length:
            state = np.where((out.num_committed > j)[:, None], chains.children[:, j], state)
        gap = target_mean(previous) - draft_mean(previous)
        along = gap / np.linalg.norm(gap, axis=1, keepdims=True)
        across = np.stack([-along[:, 1], along[:, 0]], axis=1)
        innovation = (state - target_mean(previous)) / CHAIN_STD[j]
        for axis in (along, across):
            pvalues.append(float(stats.kstest(np.sum(innovation * axis, 1), "norm").pvalue))
        previous = state
    weights = block_weights(chains, reflection=scheme.name == "reflection").sum(axis=1)
    diff = out.num_committed - weights
    z = abs(float(np.mean(diff))) / (float(np.std(diff)) / np.sqrt(size))
    return pvalues, z


def block_weights(chains: Chains, reflection: bool = False) -> Array:
    """w_1..w_L of each drafted chain, computed from the kernels (E[tau*] = sum_i E[w_i]).

    With ``reflection``: the products of min(1, rho_j) instead (the reflection chain's
    probabilities of accepting levels 1..i)."""
    length = chains.children.shape[1]
    log_w = np.zeros(chains.children.shape[0])
    out = []
    for i in range(length):
        gap = chains.target_means[:, i] - chains.draft_means[:, i]
        z = (chains.children[:, i] - chains.draft_means[:, i]) / chains.std[:, i, None]
        delta = np.linalg.norm(gap, axis=1) / chains.std[:, i]
        s = np.sum(z * gap, axis=1) / np.linalg.norm(gap, axis=1)
        log_ratio = delta * (s - delta / 2)
        log_w = (
            log_w + np.minimum(0.0, log_ratio) if reflection else np.minimum(0.0, log_w + log_ratio)
        )
        out.append(np.exp(log_w))
    return np.stack(out, axis=1)
