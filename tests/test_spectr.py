"""SpecTr K-SEQ (specsampling/schemes/spectr.py): goldens, exactness, rho*, duplicates, a mutant.

Goldens are printed decimals worked out independently (``tests/test_goldens.py``), compared within
5e-7:

| Case | p | q | k | SpecTr acc (rho*) |
|---|---|---|---|---|
| A  | (1/2,1/3,1/6) | uniform(3) | 2 | 0.924764 (1.274292) |
| A3 | same          | same       | 3 | 0.969682 (1.409046) |
| D  | (1,0)         | (0,1)      | 2 | 0 (rho* = 1)        |
| E  | (.7,.2,.1)    | same       | 2 | 1 (rho* = 1)        |

Tree: p = (1/3, 2/3), q = (2/3, 1/3), two i.i.d. paths of length 2: E[tau] = 1.405487.
"""

from __future__ import annotations

import itertools
import time
from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from specsampling import DraftTree, Noise, Shape
from specsampling.ops import categorical
from specsampling.pairs import Random, Stationary
from specsampling.schemes import tables
from specsampling.schemes.spectr import (
    RHO_TOLERANCE,
    SCHEME,
    SpecTr,
    _residual,
    optimal_rho,
    spectr_acceptance,
)
from specsampling.schemes.standard import SCHEME as STANDARD

TOLERANCE = 5e-7
FLOAT_TOLERANCE = 1e-12
THIRDS = [F(1, 3)] * 3
ROWS = {
    "A": ([F(1, 2), F(1, 3), F(1, 6)], THIRDS, 2, 0.924764, 1.274292),
    "A3": ([F(1, 2), F(1, 3), F(1, 6)], THIRDS, 3, 0.969682, 1.409046),
    "D": ([F(1), F(0)], [F(0), F(1)], 2, 0.0, 1.0),
    "E": ([F(7, 10), F(2, 10), F(1, 10)], [F(7, 10), F(2, 10), F(1, 10)], 2, 1.0, 1.0),
}
TOY = ([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
LOSSLESS_SHAPES = [
    Shape.chain(2),
    Shape.star(2),
    Shape.star(3),
    Shape.paths(2, 2),
    Shape.delayed(2, trunk=1, branch=1),
    Shape.branching((2, 1), replacement=True),
]


def _floats(values):
    return [float(x) for x in values]


def enumerated_acceptance(scheme, target, draft, num_drafts):
    """P(first emitted token is a drafted root token), summed over ``scheme.outcomes``."""
    total = 0
    pair = Stationary(target, draft)
    for tree, weight, verdicts in scheme.outcomes(pair, Shape.star(num_drafts), ()):
        drafted = {tree.tokens[child] for child in tree.candidates[0]}
        for (node, token), prob in verdicts.items():
            if (*tree.prefix(node), token)[0] in drafted:
                total = total + weight * prob
    return total


def beta(target, draft, rho):
    return sum((min(p / rho, q) for p, q in zip(target, draft, strict=True)), 0 * rho)


def f(target, draft, rho, k):
    """p_acc(rho) - rho * beta(rho), straight from the definitions."""
    b = beta(target, draft, rho)
    return 1 - (1 - b) ** k - rho * b


# --------------------------------------------------------------------------- goldens
@pytest.mark.parametrize("row", list(ROWS))
def test_single_position_goldens(row):
    target, draft, k, acc, rho = ROWS[row]
    exact_acc = spectr_acceptance(target, draft, k)
    exact_rho = optimal_rho(target, draft, k)
    assert isinstance(exact_acc, F) and isinstance(exact_rho, F)
    assert abs(float(exact_acc) - acc) <= TOLERANCE
    assert abs(float(exact_rho) - rho) <= TOLERANCE
    float_acc = spectr_acceptance(_floats(target), _floats(draft), k)
    assert isinstance(float_acc, (float, np.floating))
    assert abs(float_acc - acc) <= TOLERANCE
    assert abs(optimal_rho(_floats(target), _floats(draft), k) - rho) <= TOLERANCE
    assert ss.acceptance(SCHEME, target, draft, k) == exact_acc
    assert enumerated_acceptance(SCHEME, target, draft, k) == exact_acc


def test_degenerate_rho_is_exactly_one():
    for target, draft, k, _, _ in (ROWS["D"], ROWS["E"]):
        assert optimal_rho(target, draft, k) == 1
        assert optimal_rho(_floats(target), _floats(draft), k) == 1.0
    assert spectr_acceptance(*ROWS["D"][:3]) == 0
    assert spectr_acceptance(*ROWS["E"][:3]) == 1


def test_tree_golden():
    pair = Stationary(*TOY)
    exact = ss.expected_emitted(SCHEME, pair, Shape.paths(2, 2))
    assert abs(float(exact) - 2.405487) <= TOLERANCE
    float_pair = Stationary(*map(_floats, TOY))
    assert abs(ss.expected_emitted(SCHEME, float_pair, Shape.paths(2, 2)) - 2.405487) <= TOLERANCE


# --------------------------------------------------------------------------- k = 1 is standard
@pytest.mark.parametrize("shape", [Shape.chain(1), Shape.chain(2), Shape.star(1)], ids=repr)
def test_single_candidate_is_standard_exactly(shape):
    for vocab, seed in [(2, 0), (3, 1), (3, 2), (4, 3), (4, 5), (5, 7)]:
        pair = Random(vocab, seed=seed, exact=True)
        assert ss.round_law(SCHEME, pair, shape) == ss.round_law(STANDARD, pair, shape)
        rng = np.random.default_rng(seed)
        for tree, _ in shape.enumerate(pair):
            probs = tables(pair, tree)
            for _ in range(5):
                noise = Noise.draw(rng, tree.num_nodes)
                assert SCHEME.verify(tree, *probs, noise) == STANDARD.verify(tree, *probs, noise)


# --------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("shape", LOSSLESS_SHAPES, ids=repr)
def test_lossless_float(shape):
    for vocab, seed in [(2, 0), (3, 1), (3, 4), (4, 2)]:
        pair = Random(vocab, seed=seed)
        assert ss.lossless_error(SCHEME, pair, shape) <= FLOAT_TOLERANCE, (vocab, seed)
    for target, draft, _, _, _ in ROWS.values():
        pair = Stationary(_floats(target), _floats(draft))
        assert ss.lossless_error(SCHEME, pair, shape) <= FLOAT_TOLERANCE


@pytest.mark.parametrize("shape", LOSSLESS_SHAPES, ids=repr)
def test_lossless_exact(shape):
    for vocab, seed in [(2, 0), (3, 1), (3, 4), (3, 6)]:
        assert ss.lossless_error(SCHEME, Random(vocab, seed=seed, exact=True), shape) == 0
    for target, draft, _, _, _ in ROWS.values():
        assert ss.lossless_error(SCHEME, Stationary(target, draft), shape) == 0


def test_refused_shapes():
    assert SCHEME.supports(Shape.chain(3)) and SCHEME.supports(Shape.paths(3, 2))
    assert SCHEME.supports(Shape.star(4)) and SCHEME.supports(Shape.delayed(2, 1, 2))
    for shape in (Shape.star(2, replacement=False), Shape.branching((2, 2)), Shape.top((2,))):
        assert not SCHEME.supports(shape)
        with pytest.raises(ss.UnsupportedShape):
            ss.round_law(SCHEME, Stationary(*TOY), shape)


# --------------------------------------------------------------------------- closed form
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_closed_form_equals_enumeration(k):
    for vocab, seed in [(2, 0), (3, 1), (3, 2), (4, 3), (4, 8)][: 5 if k < 4 else 3]:
        pair = Random(vocab, seed=seed, exact=True)
        target, draft = pair.target(()), pair.draft(())
        assert spectr_acceptance(target, draft, k) == enumerated_acceptance(
            SCHEME, target, draft, k
        ), (vocab, seed)
        target, draft = _floats(target), _floats(draft)
        closed = spectr_acceptance(target, draft, k)
        assert abs(closed - enumerated_acceptance(SCHEME, target, draft, k)) <= FLOAT_TOLERANCE


def test_closed_form_at_a_large_vocabulary():
    rng = np.random.default_rng(0)
    vocab = 150_000
    target, draft = rng.dirichlet(np.full(vocab, 0.1)), rng.dirichlet(np.full(vocab, 0.1))
    target[: vocab // 3] = 0
    target /= target.sum()
    start = time.perf_counter()
    alpha = spectr_acceptance(target, draft, 4)
    elapsed = time.perf_counter() - start
    assert 0 <= alpha <= 1
    assert alpha >= np.minimum(target, draft).sum() - FLOAT_TOLERANCE
    assert elapsed < 10, elapsed


# --------------------------------------------------------------------------- rho*
@pytest.mark.parametrize("k", [2, 3, 4, 6])
def test_rho_is_on_the_feasible_side_and_f_is_monotone(k):
    for vocab, seed in [(3, 0), (3, 1), (4, 2), (5, 3), (6, 4)]:
        pair = Random(vocab, seed=seed, exact=True)
        target, draft = list(pair.target(())), list(pair.draft(()))
        rho = optimal_rho(target, draft, k)
        assert 1 <= rho <= k
        b = beta(target, draft, rho)
        if b == 0:
            continue
        gamma = (1 - (1 - b) ** k) / b
        assert gamma <= rho  # feasible, exactly
        assert f(target, draft, rho, k) <= 0
        if rho > 1:  # within the tolerance of the root: the lower bracket end is infeasible
            assert f(target, draft, rho - RHO_TOLERANCE, k) > 0
        grid = [1 + F(i, 16) * (k - 1) for i in range(17)]
        values = [f(target, draft, r, k) for r in grid]
        assert all(a >= b for a, b in itertools.pairwise(values))
        assert values[0] >= 0 >= values[-1]


# --------------------------------------------------------------------------- duplicates
class SharedUniform(SpecTr):
    """Every copy of a token re-tested with the child's one uniform: a rejected copy stays
    rejected, so a duplicate adds nothing (right for SpecInfer, wrong for SpecTr)."""

    name = "mutant-spectr-shared-uniform"

    def node_verify(self, tree, node, target_probs, draft_probs, noise):
        target, draft = target_probs[node], draft_probs[node]
        candidates = tree.candidates[node]
        rho = self.rho(target, draft, len(candidates))
        for child in candidates:
            token = tree.tokens[child]
            if noise.accept[child] * rho * draft[token] < target[token]:
                return child, None
        return None, categorical(_residual(target, draft, rho, len(candidates)), noise.sample[node])


def _descend_on_a_grid(scheme, tree, probs, cells):
    """Fraction of accept uniforms on a midpoint grid for which ``verify`` descends to node 1."""
    grid = (np.arange(cells) + 0.5) / cells
    noises = (Noise.checked([0, u], [0.5, 0.5], 2) for u in grid)
    return sum(scheme.verify(tree, *probs, noise).node == 1 for noise in noises) / cells


def test_duplicate_candidates_are_tested_independently():
    """Two copies of one token, one child node: each copy accepts with prob a independently."""
    target, draft = np.array([0.2, 0.8]), np.array([0.6, 0.4])
    tree = DraftTree.from_draws([(0, 0), (0, 0)], law="iid")
    assert tree.candidates[0] == (1, 1)
    probs = (np.stack([target] * 2), np.stack([draft] * 2))
    a = 0.2 / (optimal_rho(target, draft, 2) * 0.6)
    law = SCHEME.verdict_law(tree, *probs)
    descend = sum(p for (node, _), p in law.items() if node == 1)
    assert abs(descend - (1 - (1 - a) ** 2)) <= FLOAT_TOLERANCE
    # verify, integrated over the accept uniform (one jump, so the grid is off by <= 1 / cells).
    cells = 4_000
    assert abs(_descend_on_a_grid(SCHEME, tree, probs, cells) - descend) <= 2 / cells
    # The mutant descends with probability a only; the same check catches it.
    mutant = _descend_on_a_grid(SharedUniform(), tree, probs, cells)
    assert abs(mutant - a) <= 2 / cells and abs(mutant - descend) > 0.1


def test_boundary_noise_never_emits_a_zero_target_token():
    pair = Random(4, seed=3)
    for tree, _ in Shape.paths(3, 1).enumerate(pair):
        target_probs, draft_probs = tables(pair, tree)
        for u in (0.0, float(np.nextafter(1.0, 0.0))):
            node, token = SCHEME.verify(
                tree, target_probs, draft_probs, Noise.constant(u, tree.num_nodes)
            )
            assert target_probs[node][token] > 0


# --------------------------------------------------------------------------- mutant
class InfeasibleRho(SpecTr):
    """rho halfway between 1 and rho*: on the infeasible side, gamma > rho."""

    name = "mutant-spectr-infeasible-rho"

    def rho(self, target, draft, num_drafts):
        return (1 + super().rho(target, draft, num_drafts)) / 2


def test_infeasible_rho_mutant_is_caught():
    mutant = InfeasibleRho()
    target, draft, k, _, _ = ROWS["A"]
    assert ss.lossless_error(mutant, Stationary(target, draft), Shape.star(k)) > 1e-9
    float_pair = Stationary(_floats(target), _floats(draft))
    assert ss.lossless_error(mutant, float_pair, Shape.star(k)) > 1e-9
    assert ss.lossless_error(mutant, Stationary(*TOY), Shape.paths(2, 2)) > 1e-9
    assert ss.lossless_error(SCHEME, Stationary(target, draft), Shape.star(k)) == 0
