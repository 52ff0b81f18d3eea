"""The multi-draft optimum (specsampling.optimal; Hu et al., arXiv 2502.18779; goldens).

References used here are independent of the module: brute force over every token subset with
draft-tuple probabilities enumerated directly (exact, Fractions), the LP solved by HiGHS, and
closed forms of the without-replacement mass for k = 2, 3.
"""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import specsampling as ss
from specsampling import _optimal_race, calculators, optimal
from specsampling.optimal import lp_acceptance, optimal_acceptance

THIRDS = [F(1, 3)] * 3
# Worked out independently: (p, q, k) -> (OPT iid, OPT w/o).
GOLDEN = {
    "A": (([F(1, 2), F(1, 3), F(1, 6)], THIRDS, 2), (1, 1)),
    "A3": (([F(1, 2), F(1, 3), F(1, 6)], THIRDS, 3), (1, 1)),
    "D": (([F(1), F(0)], [F(0), F(1)], 2), (0, 0)),
    "E": (([F(7, 10), F(2, 10), F(1, 10)], [F(7, 10), F(2, 10), F(1, 10)], 2), (1, 1)),
}
GOLDEN_CELLS = [(row, replacement) for row in GOLDEN for replacement in (True, False)]


# ---------------------------------------------------------------- independent references


def draft_tuples(draft, k, replacement):
    """Every ordered draft tuple of positive probability with its probability (exact)."""
    tokens = [x for x, q in enumerate(draft) if q > 0]
    if replacement:
        for drafts in itertools.product(tokens, repeat=k):
            yield drafts, np.prod([draft[x] for x in drafts], dtype=object)
        return
    for drafts in itertools.permutations(tokens, min(k, len(tokens))):
        prob, left = F(1), [draft[x] for x in range(len(draft))]
        for x in drafts:
            prob *= F(left[x]) / sum(left)
            left[x] = 0
        yield drafts, prob


def brute_force(target, draft, k, replacement):
    """min over every subset H of p(H) + P(some draft not in H), tuples enumerated."""
    tuples = list(draft_tuples(draft, k, replacement))
    vocab = len(target)
    best = None
    for size in range(vocab + 1):
        for subset in itertools.combinations(range(vocab), size):
            missed = sum((prob for drafts, prob in tuples if not set(drafts) <= set(subset)), 0)
            value = sum((target[x] for x in subset), 0) + missed
            best = value if best is None else min(best, value)
    return best


# ---------------------------------------------------------------- strategies (by mapping)


@st.composite
def pairs(draw, exact=False, max_vocab=5):
    """(target, draft) over 2..max_vocab tokens with zeros, p == q and disjoint supports."""
    vocab = draw(st.integers(2, max_vocab))
    weights = st.lists(st.integers(0, 12), min_size=vocab, max_size=vocab)
    target, draft = draw(weights), draw(weights)
    relation = draw(st.sampled_from(["independent"] * 3 + ["equal", "disjoint"]))
    if relation == "equal":
        draft = list(target)
    if relation == "disjoint":
        half = draw(st.integers(1, vocab - 1))
        target = [w if x < half else 0 for x, w in enumerate(target)]
        draft = [w if x >= half else 0 for x, w in enumerate(draft)]
    target = _normalise(target, exact, hot=0)
    draft = _normalise(draft, exact, hot=vocab - 1)
    return target, draft


def _normalise(weights, exact, hot):
    if sum(weights) == 0:
        weights = [1 if x == hot else 0 for x in range(len(weights))]
    total = sum(weights)
    return [F(w, total) if exact else w / total for w in weights]


def dirichlet_pair(rng, vocab, zeros=True):
    target = rng.dirichlet(np.full(vocab, rng.choice([0.2, 1.0, 3.0])))
    draft = rng.dirichlet(np.full(vocab, rng.choice([0.2, 1.0, 3.0])))
    if zeros:
        target[rng.random(vocab) < 0.2] = 0.0
        draft[rng.random(vocab) < 0.2] = 0.0
    target[0] += 1e-3 if target.sum() == 0 else 0.0
    draft[-1] += 1e-3 if draft.sum() == 0 else 0.0
    return target / target.sum(), draft / draft.sum()


# ---------------------------------------------------------------- goldens and exactness


@pytest.mark.parametrize(("row", "replacement"), GOLDEN_CELLS)
def test_goldens_exact(row, replacement):
    (target, draft, k), expected = GOLDEN[row]
    value = optimal_acceptance(target, draft, k, replacement=replacement)
    assert isinstance(value, F)
    assert value == expected[0 if replacement else 1]


@pytest.mark.parametrize(("row", "replacement"), GOLDEN_CELLS)
def test_goldens_float_and_lp(row, replacement):
    (target, draft, k), expected = GOLDEN[row]
    golden = expected[0 if replacement else 1]
    floats = ([float(x) for x in target], [float(x) for x in draft])
    assert abs(optimal_acceptance(*floats, k, replacement=replacement) - golden) <= 1e-12
    assert abs(lp_acceptance(*floats, k, replacement=replacement) - golden) <= 1e-9
    assert abs(lp_acceptance(target, draft, k, replacement=replacement) - golden) <= 1e-9


@given(pairs(exact=True, max_vocab=4), st.integers(1, 3), st.booleans())
def test_equals_brute_force_exactly(pair, k, replacement):
    target, draft = pair
    expected = brute_force(target, draft, k, replacement)
    assert optimal_acceptance(target, draft, k, replacement=replacement) == expected


@given(pairs(), st.integers(1, 3), st.booleans())
def test_equals_lp(pair, k, replacement):
    target, draft = pair
    value = optimal_acceptance(target, draft, k, replacement=replacement)
    assert abs(value - lp_acceptance(target, draft, k, replacement=replacement)) <= 1e-9


def test_equals_lp_seeded_sweep():
    rng = np.random.default_rng(20261129)
    for _ in range(120):
        target, draft = dirichlet_pair(rng, int(rng.integers(2, 6)))
        k = int(rng.integers(1, 4))
        for replacement in (True, False):
            value = optimal_acceptance(target, draft, k, replacement=replacement)
            reference = lp_acceptance(target, draft, k, replacement=replacement)
            assert abs(value - reference) <= 1e-9, (target, draft, k, replacement)


@given(pairs(exact=True), st.booleans())
def test_one_draft_is_standard_acceptance(pair, replacement):
    target, draft = pair
    expected = calculators.standard_acceptance(target, draft)
    assert optimal_acceptance(target, draft, 1, replacement=replacement) == expected


@given(pairs(), st.integers(1, 4))
def test_without_replacement_dominates_iid_and_grows_with_k(pair, k):
    target, draft = pair
    iid = optimal_acceptance(target, draft, k)
    without = optimal_acceptance(target, draft, k, replacement=False)
    assert -1e-12 <= iid <= without + 1e-12 <= 1 + 2e-12
    assert optimal_acceptance(target, draft, k + 1) >= iid - 1e-12
    assert optimal_acceptance(target, draft, k + 1, replacement=False) >= without - 1e-12


def test_draws_cover_the_draft_support():
    target, draft = [F(1, 2), F(1, 4), F(1, 4)], [F(1, 2), F(1, 2), F(0)]
    assert optimal_acceptance(target, draft, 2, replacement=False) == F(3, 4)
    assert optimal_acceptance(target, draft, 5, replacement=False) == F(3, 4)
    assert lp_acceptance(target, draft, 5, replacement=False) == pytest.approx(0.75, abs=1e-9)


# ---------------------------------------------------------------- schemes stay below the optimum


def test_optimum_bounds_every_registered_scheme():
    rng = np.random.default_rng(7)
    cases = [GOLDEN[row][0] for row in GOLDEN]
    for _ in range(6):
        target, draft = dirichlet_pair(rng, int(rng.integers(2, 5)))
        exact = [F(x).limit_denominator(1000) for x in target]
        exact_draft = [F(x).limit_denominator(1000) for x in draft]
        exact[-1] = 1 - sum(exact[:-1])
        exact_draft[0] = 1 - sum(exact_draft[1:])
        if min(exact) >= 0 and min(exact_draft) >= 0:
            cases.append((exact, exact_draft, None))
    checked = set()
    for target, draft, _ in cases:
        for k in (1, 2, 3):
            for name, scheme in ss.SCHEMES.items():
                shape = scheme.single_shape(k)
                try:
                    accepted = ss.acceptance(name, target, draft, k)
                except ss.UnsupportedShape:
                    continue
                if shape.law in ("iid", "without"):
                    best = optimal_acceptance(target, draft, k, replacement=shape.law == "iid")
                else:  # the scheme's own draft law (greedy, hub): the LP for that law
                    best = lp_acceptance(target, draft, k, shape=shape)
                    accepted = float(accepted)
                slack = 0 if isinstance(accepted, F) else 1e-12
                assert accepted <= best + slack, (name, target, draft, k)
                checked.add(name)
    assert {"nss", "specinfer", "rsd"} <= checked


def test_lp_over_a_shapes_own_draft_law():
    target, draft = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    for k, replacement in itertools.product((1, 2, 3), (True, False)):
        star = ss.Shape.star(k, replacement=replacement)
        expected = lp_acceptance(target, draft, k, replacement=replacement)
        assert lp_acceptance(target, draft, k, shape=star) == pytest.approx(expected, abs=1e-12)
    # Greedy multi-draft attains the LP optimum of its own draft law (``docs/schemes/greedy.md``):
    # T = {3} (top-1 of q), q' = q on {0, 1, 2} renormalised, alpha = p(T) + sum min(p, q').
    target, draft = [0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]
    greedy = lp_acceptance(target, draft, 2, shape=ss.Shape.greedy((2,)))
    assert greedy == pytest.approx(0.1 + 1 / 6 + 0.3 + 0.2, abs=1e-9)
    with pytest.raises(ValueError, match="depth 1"):
        lp_acceptance(target, draft, 2, shape=ss.Shape.chain(2))


# ---------------------------------------------------------------- the large-vocabulary method


def test_race_matches_exact_enumeration():
    """The exponential-race W on every prefix, against exact tuple enumeration (V <= 7)."""
    rng = np.random.default_rng(11)
    worst = 0.0
    for trial in range(150):
        vocab = int(rng.integers(3, 8))
        k = int(rng.integers(2, min(vocab, 5)))
        draft = rng.dirichlet(np.full(vocab, rng.choice([0.05, 0.3, 1.0, 5.0])))
        if trial % 5 == 0:
            draft[rng.integers(vocab)] = 1e-12  # tiny masses
        if trial % 7 == 0:
            draft[rng.choice(vocab, 2, replace=False)] = [1e-250, 1e-310]  # to subnormals
        draft = np.maximum(draft, 1e-320)
        draft /= draft.sum()
        exact = [F(x) for x in draft]
        lengths = np.arange(k, vocab)
        got = _optimal_race.prefix_masses(draft, k, lengths)
        tuples = list(draft_tuples(exact, k, replacement=False))
        expected = [
            float(sum((prob for drafts, prob in tuples if max(drafts) < j), F(0))) for j in lengths
        ]
        worst = max(worst, float(np.abs(got - expected).max()))
    assert worst <= 1e-12


@pytest.mark.parametrize("k", [2, 3])
def test_race_matches_closed_forms_at_moderate_vocab(k):
    rng = np.random.default_rng(k)
    draft = rng.dirichlet(np.full(300, 0.3))
    lengths = np.unique(np.linspace(k, 299, 25).astype(int))
    got = _optimal_race.prefix_masses(draft, k, lengths)
    for j, value in zip(lengths, got, strict=True):
        q, inside = draft[:j], draft[:j].sum()
        if k == 2:
            expected = np.sum(q * (inside - q) / (1 - q))
        else:
            pair = q[:, None] + q[None, :]
            terms = q[:, None] * q[None, :] / (1 - q[:, None]) * (inside - pair) / (1 - pair)
            expected = terms.sum() - np.trace(terms)
        assert abs(value - expected) <= 1e-12, j


def test_prefix_route_matches_subset_route(monkeypatch):
    """Sorted prefixes + race vs every subset (exact DP): the prefix property and accuracy."""
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(80):
        target, draft = dirichlet_pair(rng, int(rng.integers(3, 10)))
        k = int(rng.integers(2, 5))
        cases.append((target, draft, k, optimal_acceptance(target, draft, k, replacement=False)))
    monkeypatch.setattr(optimal, "MAX_SUBSET_SUPPORT", 0)
    for target, draft, k, by_subsets in cases:
        by_prefixes = optimal_acceptance(target, draft, k, replacement=False)
        assert abs(by_prefixes - by_subsets) <= 1e-12, (target, draft, k)


@pytest.mark.parametrize("k", [2, 4])
def test_vocab_150000(k):
    rng = np.random.default_rng(0)
    logits = 3 * rng.standard_normal(150_000)
    target = np.exp(logits - logits.max())
    draft = np.exp(logits + rng.standard_normal(logits.size) - logits.max())
    target, draft = target / target.sum(), draft / draft.sum()
    iid = optimal_acceptance(target, draft, k)
    without = optimal_acceptance(target, draft, k, replacement=False)
    assert 0.0 <= calculators.standard_acceptance(target, draft) <= iid <= without <= 1.0
    assert calculators.specinfer_acceptance(target, draft, k) <= iid + 1e-12


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0.5, 0.5], [1.0]), "vocabulary mismatch"),
        (([0.5, 0.6], [0.5, 0.5]), "target: mass"),
        (([0.5, 0.5], [-0.5, 1.5]), "draft: negative"),
        (([[0.5, 0.5]], [[0.5, 0.5]]), "1-D"),
        (([F(1, 2), F(1, 2)], [0.5, 0.5]), "not mixed"),
    ],
)
def test_invalid_distributions(args, message):
    for function in (optimal_acceptance, lp_acceptance):
        with pytest.raises(ValueError, match=message):
            function(*args, 2)


@pytest.mark.parametrize("function", [optimal_acceptance, lp_acceptance])
def test_invalid_arguments(function):
    with pytest.raises(ValueError, match="num_drafts"):
        function([0.5, 0.5], [0.5, 0.5], 0)
    with pytest.raises(ValueError, match="num_drafts"):
        function([0.5, 0.5], [0.5, 0.5], 2.0)
    with pytest.raises(ValueError, match="replacement"):
        function([0.5, 0.5], [0.5, 0.5], 2, replacement="no")


def test_lp_refuses_large_instances():
    with pytest.raises(ValueError, match="MAX_LP_VARIABLES"):
        lp_acceptance(np.full(40, 1 / 40), np.full(40, 1 / 40), 3)
    with pytest.raises(ValueError, match="MAX_LP_VARIABLES"):
        lp_acceptance(np.full(40, 1 / 40), np.full(40, 1 / 40), 4, replacement=False)
