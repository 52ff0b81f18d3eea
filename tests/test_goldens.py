"""Golden values worked out independently of this library and typed in, never computed by it.

Single-position table (``acc = P(Y in drafts)``, k drafts):

| Case | p | q | k | Naive (Σmin) | NSS | SpecInfer (RRS) | RRS-w/o |
|---|---|---|---|---|---|---|---|
| A  | (1/2,1/3,1/6) | uniform(3) | 2 | 0.833333 | 0.555556 | 0.888889 | 0.916667 |
| A3 | same          | same       | 3 | 0.833333 | 0.703704 | 0.925926 | 1.000000 |
| D  | (1,0)         | (0,1)      | 2 | 0        | 0        | 0        | 0        |
| E  | (.7,.2,.1)    | same       | 2 | 1        | 0.728    | 1        | 1        |

Chain and i.i.d. tree, p = (1/3, 2/3), q = (2/3, 1/3), L = 2: token-level / SpecInfer
E[tau] = 10/9 on the chain and 4/3 on the i.i.d. K = 2 tree. Constant acceptance alpha:
E[tau + 1] = (1 - alpha^(gamma+1)) / (1 - alpha).
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

import specsampling as ss
from specsampling import Shape, calculators
from specsampling.pairs import Stationary, Table

THIRDS = [F(1, 3)] * 3
ROWS = {
    "A": ([F(1, 2), F(1, 3), F(1, 6)], THIRDS, 2),
    "A3": ([F(1, 2), F(1, 3), F(1, 6)], THIRDS, 3),
    "D": ([F(1), F(0)], [F(0), F(1)], 2),
    "E": ([F(7, 10), F(2, 10), F(1, 10)], [F(7, 10), F(2, 10), F(1, 10)], 2),
}
# The table's columns, as printed (6 decimals).
GOLDEN = {
    "A": {"standard": 0.833333, "nss": 0.555556, "specinfer": 0.888889, "rsd": 0.916667},
    "A3": {"standard": 0.833333, "nss": 0.703704, "specinfer": 0.925926, "rsd": 1.0},
    "D": {"standard": 0.0, "nss": 0.0, "specinfer": 0.0, "rsd": 0.0},
    "E": {"standard": 1.0, "nss": 0.728, "specinfer": 1.0, "rsd": 1.0},
}
# The same entries as exact rationals (each matches the printed decimal).
GOLDEN_EXACT = {
    "A": {"standard": F(5, 6), "nss": F(5, 9), "specinfer": F(8, 9), "rsd": F(11, 12)},
    "A3": {"standard": F(5, 6), "nss": F(19, 27), "specinfer": F(25, 27), "rsd": F(1)},
    "D": {"standard": F(0), "nss": F(0), "specinfer": F(0), "rsd": F(0)},
    "E": {"standard": F(1), "nss": F(91, 125), "specinfer": F(1), "rsd": F(1)},
}
CELLS = [(row, scheme) for row in ROWS for scheme in GOLDEN[row]]


def test_exact_goldens_match_the_printed_table():
    for row, values in GOLDEN_EXACT.items():
        for scheme, value in values.items():
            assert abs(float(value) - GOLDEN[row][scheme]) <= 5e-7, (row, scheme)


def _num_drafts(row, scheme):
    return 1 if scheme == "standard" else ROWS[row][2]


def _floats(values):
    return [float(x) for x in values]


def acceptance_by_enumeration(scheme, target, draft, num_drafts):
    """P(first emitted token is one of the root's drafted candidates), by exact enumeration."""
    resolved = ss.get_scheme(scheme)
    pair = Stationary(target, draft)
    total = 0
    for tree, weight, verdicts in resolved.outcomes(pair, resolved.single_shape(num_drafts), ()):
        drafted = {tree.tokens[c] for c in tree.candidates[0]}
        for verdict, prob in verdicts.items():
            first = tree.prefix(verdict.node)[0] if verdict.node else verdict.token
            if first in drafted:
                total += weight * prob
    return total


@pytest.mark.parametrize(("row", "scheme"), CELLS)
def test_single_position_acceptance_exact(row, scheme):
    target, draft, _ = ROWS[row]
    k = _num_drafts(row, scheme)
    expected = GOLDEN_EXACT[row][scheme]
    assert ss.acceptance(scheme, target, draft, k) == expected
    assert acceptance_by_enumeration(scheme, target, draft, k) == expected


@pytest.mark.parametrize(("row", "scheme"), CELLS)
def test_single_position_acceptance_float(row, scheme):
    target, draft, _ = ROWS[row]
    k = _num_drafts(row, scheme)
    expected = GOLDEN[row][scheme]
    got = ss.acceptance(scheme, _floats(target), _floats(draft), k)
    assert isinstance(got, (float, np.floating))
    assert abs(got - expected) <= 5e-7
    enumerated = acceptance_by_enumeration(scheme, _floats(target), _floats(draft), k)
    assert abs(enumerated - expected) <= 5e-7


@pytest.mark.parametrize("row", list(ROWS))
def test_closed_form_calculators(row):
    target, draft, k = ROWS[row]
    assert calculators.standard_acceptance(target, draft) == GOLDEN_EXACT[row]["standard"]
    assert calculators.nss_acceptance(target, draft, k) == GOLDEN_EXACT[row]["nss"]
    assert calculators.specinfer_acceptance(target, draft, k) == GOLDEN_EXACT[row]["specinfer"]
    assert ss.SCHEMES["rsd"].closed_acceptance(target, draft, k) is None


@pytest.mark.parametrize(("row", "scheme"), CELLS)
def test_output_law_is_the_target(row, scheme):
    target, draft, _ = ROWS[row]
    k = _num_drafts(row, scheme)
    law = ss.output_law(scheme, target, draft, k)
    assert list(law) == list(target)
    float_law = ss.output_law(scheme, _floats(target), _floats(draft), k)
    np.testing.assert_allclose(float_law, _floats(target), rtol=0, atol=1e-15)


TOY = Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])


def test_chain_golden_ten_ninths():
    assert ss.expected_emitted("standard", TOY, Shape.chain(2)) == F(19, 9)
    assert ss.expected_emitted("specinfer", TOY, Shape.chain(2)) == F(19, 9)
    assert ss.expected_emitted("rsd", TOY, Shape.chain(2)) == F(19, 9)
    assert calculators.chain_expected_accepted(TOY, 2) == F(10, 9)


def test_chain_golden_through_the_context_dependent_path():
    """The same toy as a Table: the calculator's recursion over contexts, not the beta-power sum."""
    rows = ([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    table = Table({prefix: rows for prefix in [(), (0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]})
    assert calculators.chain_expected_accepted(table, 2) == F(10, 9)
    assert ss.expected_emitted("standard", table, Shape.chain(2)) == F(19, 9)


def test_chain_golden_in_float():
    pair = Stationary([1 / 3, 2 / 3], [2 / 3, 1 / 3])
    assert abs(ss.expected_emitted("standard", pair, Shape.chain(2)) - 19 / 9) < 1e-14
    assert abs(calculators.chain_expected_accepted(pair, 2) - 10 / 9) < 1e-14


def test_iid_tree_golden_four_thirds():
    assert ss.expected_emitted("specinfer", TOY, Shape.paths(2, 2)) == 1 + F(4, 3)
    pair = Stationary([1 / 3, 2 / 3], [2 / 3, 1 / 3])
    assert abs(ss.expected_emitted("specinfer", pair, Shape.paths(2, 2)) - 7 / 3) < 1e-14


STATIONARY_PAIRS = [
    ([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]),
    ([F(1, 2), F(1, 3), F(1, 6)], THIRDS),
    ([F(1, 10), F(0), F(9, 10)], [F(1, 5), F(3, 5), F(1, 5)]),
    ([F(1, 4), F(3, 4)], [F(1, 4), F(3, 4)]),
]


@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", STATIONARY_PAIRS, ids=str)
def test_constant_alpha_block_efficiency(rows, gamma):
    target, draft = rows
    alpha = sum(min(a, b) for a, b in zip(target, draft, strict=True))
    expected = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    pair = Stationary(target, draft)
    assert ss.expected_emitted("standard", pair, Shape.chain(gamma)) == expected
    assert calculators.chain_expected_accepted(pair, gamma) == expected - 1


def test_constant_alpha_formula_values():
    """(1 - a^(g+1)) / (1 - a) written out for a = 5/6: g = 1 gives 11/6, g = 2 gives 91/36."""
    pair = Stationary(*STATIONARY_PAIRS[1])
    assert ss.expected_emitted("standard", pair, Shape.chain(1)) == F(11, 6)
    assert ss.expected_emitted("standard", pair, Shape.chain(2)) == F(91, 36)


@pytest.mark.parametrize("scheme", ["nss", "specinfer", "rsd"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_closed_forms_equal_enumeration_on_random_pairs(scheme, k):
    for seed in range(6):
        pair = ss.pairs.Random(4, seed=seed, exact=True)
        target, draft = pair.target(()), pair.draft(())
        expected = acceptance_by_enumeration(scheme, target, draft, k)
        assert ss.acceptance(scheme, target, draft, k) == expected, seed


# ----------------------------------------------------------------- sequence-level goldens
# Block verification on p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2: the motivating example of
# Sun et al. (arXiv 2403.10444), E[tau] = 11/9 against 10/9 for token-level verification;
# traversal equals block on chains and gets 115/81 on two i.i.d. paths of length 2.
BLOCK_TOY = ((F(1, 3), F(2, 3)), (F(2, 3), F(1, 3)))


@pytest.mark.parametrize("scheme", ["block", "traversal"])
def test_block_golden_eleven_ninths(scheme):
    pair = Stationary(*BLOCK_TOY)
    assert ss.expected_emitted(scheme, pair, Shape.chain(2)) == 1 + F(11, 9)
    assert calculators.block_expected_accepted(pair, 2) == F(11, 9)


def test_traversal_tree_golden():
    assert ss.expected_emitted("traversal", Stationary(*BLOCK_TOY), Shape.paths(2, 2)) == 1 + F(
        115, 81
    )


# E[tau + 1] on chains, token-level and block (worked out independently; 3-4 significant digits).
CHAIN_TABLE = [
    ((0.8, 0.2), (0.5, 0.5), 2, 2.19, 2.25),
    ((0.8, 0.2), (0.5, 0.5), 3, 2.533, 2.722),
    ((0.5, 0.3, 0.2), (0.2, 0.3, 0.5), 3, 2.533, 2.695),
]


@pytest.mark.parametrize(("target", "draft", "gamma", "token", "block"), CHAIN_TABLE)
def test_block_chain_table(target, draft, gamma, token, block):
    pair = Stationary(target, draft)
    assert abs(ss.expected_emitted("standard", pair, Shape.chain(gamma)) - token) < 5e-4
    assert abs(ss.expected_emitted("block", pair, Shape.chain(gamma)) - block) < 5e-4
    assert abs(calculators.block_expected_accepted(pair, gamma) + 1 - block) < 5e-4
