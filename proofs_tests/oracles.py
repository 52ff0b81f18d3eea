"""Oracles shared by the proofs: acceptance by enumeration, boundary noise, law distances."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import numpy as np
from scipy import stats

import specsampling as ss
from specsampling.keyed import LARGEST_UNIFORM, KeyedNoise
from specsampling.noise import LARGEST_BELOW_ONE
from specsampling.pairs import ModelPair
from specsampling.schemes import tables

#: The uniforms at both ends of [0, 1): the boundary noise every scheme must survive.
BOUNDARY_UNIFORMS = (0.0, LARGEST_BELOW_ONE)


def max_deviation(law: dict[Any, Any], other: dict[Any, Any]) -> Any:
    """Max absolute difference of two laws over the union of their keys (exact for Fractions)."""
    return max(abs(law.get(key, 0) - other.get(key, 0)) for key in {*law, *other})


def enumerated_acceptance(scheme: Any, pair: ModelPair, shape: ss.Shape) -> Any:
    """P(first emitted token is a drafted root token), summed over the scheme's outcomes."""
    total: Any = 0
    for tree, weight, verdicts in scheme.outcomes(pair, shape, ()):
        drafted = {tree.tokens[child] for child in tree.children(0)}
        for verdict, prob in verdicts.items():
            path = tree.prefix(verdict.node)
            first = path[0] if path else verdict.token
            if first in drafted:
                total = total + weight * prob
    return total


def boundary_violations(
    scheme: Any, pair: ModelPair, shape: ss.Shape, max_trees: int = 400
) -> list[str]:
    """Verify every draftable tree (up to ``max_trees``) with constant boundary noise.

    Every combination of ``0.0`` and the largest float below one for the accept and sample
    uniforms is tried. Returns a description of each verdict that accepts a drafted token of
    zero target probability, emits a token of zero target probability or emits an id outside
    ``[0, vocab_size)`` (sgl-project/sglang#35771, #30822; vllm-project/vllm#44744); empty when
    the scheme is sound.
    """
    vocab = pair.vocab_size
    problems: list[str] = []
    for tree, _ in itertools.islice(shape.enumerate(pair), max_trees):
        target_probs, draft_probs = tables(pair, tree)
        n = tree.num_nodes
        for u_accept, u_sample in itertools.product(BOUNDARY_UNIFORMS, repeat=2):
            noise = ss.Noise.checked(np.full(n, u_accept), np.full(n, u_sample), n)
            node, token = scheme.verify(tree, target_probs, draft_probs, noise)
            where = f"tree {tree.tokens}/{tree.parents}, u=({u_accept}, {u_sample})"
            if not 0 <= node < n:
                problems.append(f"{where}: verdict node {node} is not a tree node")
                continue
            if not 0 <= token < vocab:
                problems.append(f"{where}: emitted id {token} outside [0, {vocab})")
                continue
            if not target_probs[node][token] > 0:
                problems.append(f"{where}: emitted token {token} has target probability 0")
            child = node
            while child > 0:
                parent = tree.parents[child]
                if not target_probs[parent][tree.tokens[child]] > 0:
                    problems.append(
                        f"{where}: accepted token {tree.tokens[child]} has target probability 0"
                    )
                child = parent
    return problems


class ConstantKeyedNoise(KeyedNoise):
    """Keyed noise whose every exponential is ``value``: the boundary of the keyed field."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        object.__setattr__(self, "value", value)

    def exponentials(self, sequence: Any, rows: int, vocab_size: int) -> Any:
        return np.full((rows, vocab_size), self.value)


#: The keyed field's extreme exponentials: ``U = 0`` and the largest ``U`` (``53 ln 2``).
BOUNDARY_EXPONENTIALS = (0.0, float(-np.log1p(-LARGEST_UNIFORM)))


def keyed_boundary_violations(scheme: Any, pair: ModelPair, shape: ss.Shape) -> list[str]:
    """Keyed couplings at the field's extremes: every drafted token has draft mass, every
    accepted or emitted token target mass, and ids stay in range (sgl-project/sglang#35771,
    #30822; vllm-project/vllm#44744)."""
    problems: list[str] = []
    for value in BOUNDARY_EXPONENTIALS:
        tree, (node, token) = scheme.sample_keyed(pair, shape, ConstantKeyedNoise(value))
        where = f"E = {value}: tree {tree.tokens}"
        for child in range(1, tree.num_nodes):
            path = tree.prefix(tree.parents[child])
            if not pair.draft(path)[tree.tokens[child]] > 0:
                problems.append(f"{where}: drafted token {tree.tokens[child]} has draft mass 0")
        if not 0 <= token < pair.vocab_size:
            problems.append(f"{where}: emitted id {token} outside [0, {pair.vocab_size})")
            continue
        emitted = (*tree.prefix(node), token)
        for i, t in enumerate(emitted):
            if not pair.target(emitted[:i])[t] > 0:
                problems.append(f"{where}: emitted token {t} has target probability 0")
    return problems


def sampled_counts(
    scheme: Any, pair: ModelPair, shape: ss.Shape, rounds: int, seed: int
) -> Counter[tuple[int, ...]]:
    """Counts of emitted token tuples over ``rounds`` sampled rounds (``scheme.sample``)."""
    rng = np.random.default_rng(seed)
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(rounds):
        tree, verdict = scheme.sample(pair, shape, rng, ())
        counts[(*tree.prefix(verdict.node), verdict.token)] += 1
    return counts


def chi_square_pvalue(counts: Counter[tuple[int, ...]], law: dict[Any, Any]) -> float:
    """Chi-square goodness of fit of ``counts`` to ``law``; bins merged to expected count >= 5.

    An observed outcome outside the law's support gives p-value 0.
    """
    rounds = sum(counts.values())
    if any(key not in law or not law[key] > 0 for key in counts):
        return 0.0
    expected = sorted(((float(prob) * rounds, counts.get(key, 0)) for key, prob in law.items()))
    observed_bins: list[float] = []
    expected_bins: list[float] = []
    pending_e = pending_o = 0.0
    for exp, obs in expected:
        pending_e, pending_o = pending_e + exp, pending_o + obs
        if pending_e >= 5:
            expected_bins.append(pending_e)
            observed_bins.append(pending_o)
            pending_e = pending_o = 0.0
    if expected_bins:
        expected_bins[-1] += pending_e
        observed_bins[-1] += pending_o
    if len(expected_bins) < 2:
        return 1.0
    scale = sum(observed_bins) / sum(expected_bins)
    return float(stats.chisquare(observed_bins, [e * scale for e in expected_bins]).pvalue)


def pooled_chi2(counts: Any, probs: Any) -> float:
    """Chi-square p-value of count array ``counts`` against ``probs``; the cells expecting
    fewer than 5 are pooled (with the last kept cell if the pool is still below 5). A count
    where the law has no mass gives 0."""
    counts, expected = np.asarray(counts, float), np.asarray(probs, float) * np.sum(counts)
    if np.any((expected == 0) & (counts > 0)):
        return 0.0
    small = expected < 5
    obs, exp = list(counts[~small]), list(expected[~small])
    if small.any():
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    if exp[-1] < 5 and len(exp) > 1:
        obs[-2:], exp[-2:] = [sum(obs[-2:])], [sum(exp[-2:])]
    return float(stats.chisquare(obs, exp).pvalue) if len(exp) > 1 else 1.0


def random_pairs(seed: int, count: int, max_size: int = 6) -> Any:
    """Random float ``(p, q)`` pairs over 2..``max_size`` tokens, built by mapping: zeros in
    the target, draft = target, zeros in the draft, a near one-hot target, or plain Dirichlet."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        size = int(rng.integers(2, max_size, endpoint=True))
        p = rng.dirichlet(np.full(size, rng.choice([0.3, 1.0, 3.0])))
        q = rng.dirichlet(np.full(size, rng.choice([0.3, 1.0, 3.0])))
        kind = int(rng.integers(5))
        if kind == 0:
            p = np.where((rng.random(size) < 0.4) & (np.arange(size) != p.argmax()), 0.0, p)
        elif kind == 1:
            q = p.copy()
        elif kind == 2:
            q = np.where((rng.random(size) < 0.4) & (np.arange(size) != q.argmax()), 0.0, q)
        elif kind == 3:
            p = np.where(np.arange(size) == rng.integers(size), 1.0, 1e-9)
        yield p / p.sum(), q / q.sum()
