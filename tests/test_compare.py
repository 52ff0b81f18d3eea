"""``specsampling.compare`` and the ``specsampling compare`` command line.

Every value ``compare`` reports is checked against the function that defines it: acceptance
against :func:`ss.acceptance`, the optimum against :func:`ss.optimal_acceptance` (i.i.d. and
without-replacement laws) or :func:`ss.lp_acceptance` over the scheme's own single-position law
(greedy, hub), tree rows against :func:`ss.expected_emitted`. The command line is driven through
``main([...])`` in-process.
"""

from __future__ import annotations

import json
from fractions import Fraction as F
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specsampling as ss
from specsampling.cli import main
from specsampling.compare import (
    MAX_LP_VOCAB,
    Comparison,
    Row,
    TreeRow,
    compare,
    compare_tree,
    parse_shape,
)
from specsampling.optimal import lp_acceptance, optimal_acceptance
from specsampling.schemes.nss import NSS

SKEWED = ([0.7, 0.2, 0.1], [0.1, 0.2, 0.7])
EXACT_SKEWED = ([F(7, 10), F(2, 10), F(1, 10)], [F(1, 10), F(2, 10), F(7, 10)])
PAIRS = {
    "skewed": SKEWED,
    "exact-skewed": EXACT_SKEWED,
    "uniform-draft": ([F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3),
    "zeros": ([0.5, 0.0, 0.3, 0.2], [0.0, 0.6, 0.1, 0.3]),
    "equal": ([0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]),
    "one-hot-draft": ([0.25, 0.75], [1.0, 0.0]),
}
#: compare() renormalises float inputs before the functions renormalise them again.
ULPS = 1e-15
# Schemes whose single-position law is one of their own: the optimum is the LP over that law.
OWN_LAW = {"greedy", "hub"}


def by_name(result: Comparison) -> dict[str, Row]:
    return {row.scheme: row for row in result.rows}


def expected_optimum(target: Any, draft: Any, k: int, scheme: Any) -> float:
    """The optimum for the scheme's own single-position draft law, from its definition."""
    shape = scheme.single_shape(k)
    if shape.is_chain or shape.law == "iid":
        return float(optimal_acceptance(target, draft, k, replacement=True))
    if shape.law == "without":
        return float(optimal_acceptance(target, draft, k, replacement=False))
    return lp_acceptance(target, draft, k, shape=shape)


# ---------------------------------------------------------------- compare: single position


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_rows_equal_their_definitions(name: str, k: int) -> None:
    target, draft = PAIRS[name]
    result = compare(target, draft, k)
    assert [row.scheme for row in result.rows] == list(ss.SCHEMES)
    assert result.vocab_size == len(target) and result.num_drafts == k
    # compare() validates (renormalises) float inputs once more: equal up to a few ulps.
    assert result.optimum_iid == pytest.approx(optimal_acceptance(target, draft, k), abs=ULPS)
    without = optimal_acceptance(target, draft, k, replacement=False)
    assert result.optimum_without == pytest.approx(without, abs=ULPS)
    for row in result.rows:
        scheme = ss.SCHEMES[row.scheme]
        if not scheme.supports(scheme.single_shape(k)):
            assert row.acceptance is None and row.gap is None and row.note
            continue
        assert row.note == ""
        accepted = float(ss.acceptance(row.scheme, target, draft, k))
        assert row.acceptance == pytest.approx(accepted, abs=ULPS)
        assert row.optimum == pytest.approx(expected_optimum(target, draft, k, scheme), abs=1e-12)
        assert row.gap == row.optimum - row.acceptance
        assert row.gap >= -1e-12, row
        if row.draft_law in OWN_LAW:  # greedy and SpecHub attain their own law's optimum
            assert abs(row.gap) <= 1e-9, row


def test_draft_laws_and_refusals_at_two_drafts() -> None:
    rows = by_name(compare(*SKEWED, 2))
    laws = {name: row.draft_law for name, row in rows.items()}
    assert laws == {
        "standard": "-",
        "nss": "iid",
        "specinfer": "iid",
        "rsd": "without",
        "block": "-",
        "traversal": "iid",
        "spectr": "iid",
        "greedy": "greedy",
        "spechub": "hub",
        "resispec": "iid",
        "gumbel": "-",
        "poisson": "without",
        "gls": "iid",
        "gls_strong": "iid",
        "ot_optimal": "iid",
        "ot_binned": "iid",
        "khisti": "iid",
    }
    single = ("standard", "block", "gumbel")
    for name in single:  # chain verifiers: one draft per position only
        row = rows[name]
        assert (row.acceptance, row.optimum, row.gap) == (None, None, None)
        assert row.note == "not defined for num_drafts=2"
    assert all(rows[n].acceptance is not None for n in ss.SCHEMES if n not in single)


def test_spechub_has_no_law_for_three_drafts() -> None:
    rows = by_name(compare(*SKEWED, 3))
    assert rows["spechub"].acceptance is None
    assert rows["spechub"].note == "not defined for num_drafts=3"
    assert rows["greedy"].acceptance == pytest.approx(1.0)  # T = {2, 1}, X = 0: every token


def test_one_draft_every_scheme_applies() -> None:
    target, draft = EXACT_SKEWED
    beta = float(ss.calculators.standard_acceptance(target, draft))  # 0.4
    rows = by_name(compare(target, draft, 1))
    for name, row in rows.items():
        assert row.note == "" and row.draft_law == "iid", row
        assert row.optimum == pytest.approx(beta, abs=1e-12)
        if name == "nss":  # sum_x p(x) q(x): NSS ignores q
            assert row.acceptance == pytest.approx(0.07 + 0.04 + 0.07)
        elif isinstance(ss.SCHEMES[name], ss.schemes.KeyedScheme):
            # communication-free: sum_j 1 / sum_i max(p_i / p_j, q_i / q_j), below 1 - TV
            gumbel = sum(
                1 / sum(max(pi / pj, qi / qj) for pi, qi in zip(target, draft, strict=True))
                for pj, qj in zip(target, draft, strict=True)
            )
            assert gumbel == F(13, 40)  # 1/10 + 1/8 + 1/10
            assert row.acceptance == pytest.approx(float(gumbel), abs=1e-12)
        else:  # every other scheme is standard speculative sampling on one draft
            assert row.acceptance == pytest.approx(beta, abs=1e-12)


def test_skewed_pair_numbers() -> None:
    """The numbers quoted in docs/choosing.md (skewed pair, k = 2)."""
    result = compare(*SKEWED, 2)
    values = {r.scheme: round(r.acceptance, 4) for r in result.rows if r.acceptance is not None}
    assert values == {
        "nss": 0.296,
        "specinfer": 0.46,
        "rsd": 0.6,
        "traversal": 0.46,
        "spectr": 0.4726,
        "greedy": 0.6333,
        "spechub": 0.6333,
        "resispec": 0.4855,
        "poisson": 0.6389,
        "gls": 0.4427,
        "gls_strong": 0.4427,
        "ot_optimal": 0.49,  # the i.i.d. optimum, below
        "ot_binned": 0.49,
        "khisti": 0.49,  # k = 2 without truncation (3 tokens <= s): the optimum too
    }
    assert round(result.optimum_iid, 4) == 0.49
    assert round(result.optimum_without, 4) == 0.6583


def test_scheme_subset_keeps_order_and_accepts_objects() -> None:
    result = compare(*SKEWED, 2, schemes=["rsd", ss.SCHEMES["nss"]])
    assert [row.scheme for row in result.rows] == ["rsd", "nss"]
    with pytest.raises(KeyError, match="unknown scheme 'nosuch'"):
        compare(*SKEWED, 2, schemes=["nosuch"])


def test_own_law_optimum_skipped_above_max_lp_vocab() -> None:
    vocab = MAX_LP_VOCAB + 1
    target = np.arange(1, vocab + 1, dtype=np.float64)
    draft = target[::-1].copy()
    rows = by_name(compare(target / target.sum(), draft / draft.sum(), 2))
    for name in ("greedy", "spechub"):
        assert rows[name].acceptance is not None
        assert rows[name].optimum is None and rows[name].gap is None
    assert rows["specinfer"].optimum is not None


def test_enumeration_too_large_is_a_note_not_a_crash() -> None:
    """No closed form (rsd, traversal) and 500**2 draft tuples: the row says why."""
    rng = np.random.default_rng(0)
    target, draft = rng.dirichlet(np.ones(500)), rng.dirichlet(np.ones(500))
    result = compare(target, draft, 2, schemes=["rsd", "traversal", "specinfer"])
    rows = by_name(result)
    for name, optimum in (("rsd", result.optimum_without), ("traversal", result.optimum_iid)):
        assert rows[name].acceptance is None and rows[name].gap is None
        assert rows[name].optimum == optimum
        assert "exceeds" in rows[name].note or "enumeration" in rows[name].note
    assert rows["specinfer"].acceptance is not None


@pytest.mark.parametrize(
    ("target", "draft", "k", "message"),
    [
        ([0.5, 0.4], [0.5, 0.5], 2, "target: mass is 0.9"),
        ([0.5, 0.5], [0.5, 0.25, 0.25], 2, "draft: vocabulary mismatch"),
        ([0.5, 0.5], [0.5, 0.5], 0, "num_drafts"),
        ([F(1, 2), F(1, 2)], [0.5, 0.5], 2, "not mixed"),
    ],
)
def test_invalid_inputs(target: Any, draft: Any, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compare(target, draft, k)


def test_spechub_attains_its_optimum_when_the_draft_is_nearly_one_hot() -> None:
    """Regression: a float draft whose hub mass rounds to 1.0 but keeps a second token is
    drafted as a pair by Shape.hub; the verifier and closed form must treat it as one."""
    row = by_name(compare([0.7, 0.3], [1e-17, 1.0], 2))["spechub"]
    assert row.gap is not None and abs(row.gap) <= 1e-9
    pair = ss.pairs.Stationary([0.7, 0.3], [1e-17, 1.0])
    assert ss.lossless_error("spechub", pair, ss.Shape.hub()) <= 1e-12


class Overflows(NSS):
    """A scheme whose closed form fails the way large k did (OverflowError, RecursionError)."""

    name = "mutant-overflows"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def closed_acceptance(self, target: Any, draft: Any, num_drafts: int) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error", [OverflowError("int too large"), RecursionError("too deep"), ValueError("too big")]
)
def test_a_failing_scheme_is_a_note_not_a_crash(error: BaseException) -> None:
    rows = by_name(compare(*SKEWED, 3, schemes=[Overflows(error), "nss"]))
    assert rows["mutant-overflows"].acceptance is None
    assert str(error) in rows["mutant-overflows"].note
    if not isinstance(error, ValueError):
        assert f"failed at num_drafts=3: {type(error).__name__}" in rows["mutant-overflows"].note
    assert rows["nss"].acceptance is not None


def test_compare_takes_a_tolerance() -> None:
    target = [0.7, 0.2, 0.1 + 3e-4]
    with pytest.raises(ss.InvalidDistribution, match=r"target: mass is 1\.0003.*tolerance="):
        compare(target, SKEWED[1], 2)
    loose = compare(target, SKEWED[1], 2, tolerance=1e-3)
    direct = compare(np.array(target) / sum(target), SKEWED[1], 2)
    assert [r.acceptance for r in loose.rows] == pytest.approx([r.acceptance for r in direct.rows])


@pytest.mark.parametrize("schemes", ["nss", 3])
def test_schemes_must_be_a_list(schemes: Any) -> None:
    with pytest.raises(TypeError, match="schemes: expected a list") as info:
        compare(*SKEWED, 2, schemes=schemes)
    if schemes == "nss":
        assert "['nss']" in str(info.value)
    with pytest.raises(TypeError, match="schemes: expected a list"):
        compare_tree(ss.pairs.Stationary(*SKEWED), ss.Shape.chain(1), schemes=schemes)


def test_compare_tree_refuses_non_pairs_and_non_shapes() -> None:
    with pytest.raises(TypeError, match=r"pair: .*Stationary\(target, draft\)"):
        compare_tree(SKEWED, ss.Shape.chain(1))
    with pytest.raises(TypeError, match=r"shape: expected a specsampling.Shape.*parse_shape"):
        compare_tree(ss.pairs.Stationary(*SKEWED), "chain(1)")
    with pytest.raises(TypeError, match="shape: expected text"):
        parse_shape(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------- compare_tree

TREE_SHAPES = [
    ss.Shape.chain(2),
    ss.Shape.star(2),
    ss.Shape.star(2, replacement=False),
    ss.Shape.paths(2, 2),
    ss.Shape.branching((2, 1)),
    ss.Shape.delayed(2, trunk=1, branch=1),
    ss.Shape.top((2, 1)),
    ss.Shape.greedy((2,)),
    ss.Shape.hub(),
]


@pytest.mark.parametrize("shape", TREE_SHAPES, ids=repr)
@pytest.mark.parametrize("exact", [False, True])
def test_tree_rows_equal_expected_emitted(shape: ss.Shape, exact: bool) -> None:
    pair = ss.pairs.Random(3, seed=5, exact=exact)
    rows = compare_tree(pair, shape)
    assert [row.scheme for row in rows] == list(ss.SCHEMES)
    for row in rows:
        if ss.SCHEMES[row.scheme].supports(shape):
            assert row.note == ""
            assert row.expected_emitted == float(ss.expected_emitted(row.scheme, pair, shape))
            assert 1 <= row.expected_emitted <= shape.depth + 1
        else:
            assert row.expected_emitted is None
            assert row.note == f"not exact for {shape!r}"


def test_tree_refusals_by_shape() -> None:
    pair = ss.pairs.Stationary(*SKEWED)

    def supported(shape: ss.Shape) -> set[str]:
        return {r.scheme for r in compare_tree(pair, shape) if r.expected_emitted is not None}

    assert supported(ss.Shape.chain(2)) == set(ss.SCHEMES)
    assert supported(ss.Shape.paths(2, 2)) == {
        "nss",
        "specinfer",
        "traversal",
        "spectr",
        "resispec",
        "gls",
        "gls_strong",
        "ot_optimal",
        "ot_binned",
        "khisti",
    }
    assert supported(ss.Shape.branching((2, 2))) == {
        "nss",
        "rsd",
        "traversal",
        "resispec",
        "poisson",
    }
    assert supported(ss.Shape.top((2, 2))) == {"nss"}  # deterministic trees: NSS only
    assert supported(ss.Shape.greedy((2, 2))) == {"nss", "greedy"}
    assert supported(ss.Shape.hub(2)) == {"nss", "spechub"}


def test_tree_golden_block_over_standard() -> None:
    """Sun et al.'s example: block 1 + 11/9, standard 1 + 10/9 on a two-token chain."""
    pair = ss.pairs.Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    rows = {r.scheme: r for r in compare_tree(pair, ss.Shape.chain(2), ["standard", "block"])}
    assert rows["block"].expected_emitted == pytest.approx(20 / 9)
    assert rows["standard"].expected_emitted == pytest.approx(19 / 9)
    assert isinstance(rows["block"], TreeRow)


# ---------------------------------------------------------------- parse_shape


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("chain(3)", ss.Shape.chain(3)),
        ("  chain( 3 )  ", ss.Shape.chain(3)),
        ("chain(length=2)", ss.Shape.chain(2)),
        ("star(4)", ss.Shape.star(4)),
        ("star(4, replacement=False)", ss.Shape.star(4, replacement=False)),
        ("star(num_drafts=2, replacement=True)", ss.Shape.star(2)),
        ("paths(2, 3)", ss.Shape.paths(2, 3)),
        ("branching((2, 2))", ss.Shape.branching((2, 2))),
        ("branching([3, 1], replacement=True)", ss.Shape.branching((3, 1), replacement=True)),
        ("delayed(2, trunk=1, branch=2)", ss.Shape.delayed(2, trunk=1, branch=2)),
        ("delayed(3, 0, 1)", ss.Shape.delayed(3, trunk=0, branch=1)),
        ("top((3, 2))", ss.Shape.top((3, 2))),
        ("greedy((3,))", ss.Shape.greedy((3,))),
        ("greedy([2, 2])", ss.Shape.greedy((2, 2))),
        ("hub()", ss.Shape.hub()),
        ("hub(2)", ss.Shape.hub(2)),
        ("hub(depth=3)", ss.Shape.hub(3)),
    ],
)
def test_parse_shape(text: str, shape: ss.Shape) -> None:
    parsed = parse_shape(text)
    assert repr(parsed) == repr(shape)
    assert (parsed.steps, parsed.law, parsed.is_chain) == (shape.steps, shape.law, shape.is_chain)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("foo(1)", "cannot parse 'foo\\(1\\)'; expected e.g. 'chain\\(3\\)'"),
        ("chain", "cannot parse"),
        ("chain(3", "cannot parse"),
        ("", "cannot parse"),
        ("chain(x)", "arguments of 'chain\\(x\\)' must be numbers"),
        ("chain(__import__('os').getcwd())", "must be numbers"),
        ("chain(1 2)", "must be numbers"),
        ("chain(1, 2, 3)", "shape: wrong arguments in 'chain\\(1, 2, 3\\)'"),
        ("star(2, replace=False)", "shape: wrong arguments"),
        ("chain(0)", "length"),
        ("branching(())", "widths"),
    ],
)
def test_parse_shape_rejects_garbage(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_shape(text)


# ---------------------------------------------------------------- the command line


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> dict[str, list[str]]:
    """First column -> cells, for the lines of the table under its rule."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", "+"} and line)
    return {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in line.split("|")] for line in lines[rule + 1 :])
    }


SKEWED_ARGS = ["--target", "0.7,0.2,0.1", "--draft", "0.1,0.2,0.7"]


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*SKEWED_ARGS, "-k", "2"], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == (
        "single position, vocab 3, 2 drafts: optimum 0.490000 (i.i.d.), "
        "0.658333 (without replacement)"
    )
    header = [c.strip() for c in out.splitlines()[2].split("|")]
    assert header == ["scheme", "draft law", "acceptance", "optimum (same law)", "gap", "note"]
    rows = table_rows(out)
    assert list(rows) == list(ss.SCHEMES)
    assert rows["specinfer"] == ["iid", "0.460000", "0.490000", "0.030000", ""]
    assert rows["greedy"] == ["greedy", "0.633333", "0.633333", "0.000000", ""]
    assert rows["block"] == ["-", "-", "-", "-", "not defined for num_drafts=2"]


def test_cli_default_is_two_drafts(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(SKEWED_ARGS, capsys)
    assert "2 drafts" in out.splitlines()[0]


def test_cli_json_matches_compare(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*SKEWED_ARGS, "-k", "3", "--json"], capsys)
    assert (code, err) == (0, "")
    payload = json.loads(out)
    result = compare(*SKEWED, 3)
    assert set(payload) == {"vocab_size", "num_drafts", "optimum_iid", "optimum_without", "rows"}
    assert (payload["vocab_size"], payload["num_drafts"]) == (3, 3)
    assert payload["optimum_iid"] == result.optimum_iid
    assert payload["optimum_without"] == result.optimum_without
    assert payload["rows"] == [
        {
            "scheme": r.scheme,
            "draft_law": r.draft_law,
            "acceptance": r.acceptance,
            "optimum": r.optimum,
            "gap": r.gap,
            "note": r.note,
        }
        for r in result.rows
    ]
    assert [r["scheme"] for r in payload["rows"]] == list(ss.SCHEMES)


def test_cli_exact_fractions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--target", "1/3,2/3", "--draft", "2/3,1/3", "-k", "2", "--json"], capsys)
    assert code == 0
    payload = json.loads(out)
    result = compare([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)], 2)
    assert [r["acceptance"] for r in payload["rows"]] == [r.acceptance for r in result.rows]
    nss = next(r for r in payload["rows"] if r["scheme"] == "nss")
    assert nss["acceptance"] == float(F(1, 3) * F(8, 9) + F(2, 3) * F(5, 9))  # exactly 2/3


def test_cli_tree_mode(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--target", "1/3,2/3", "--draft", "2/3,1/3", "--shape", "chain(2)"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out.startswith("exact E[tau+1] on chain(2) for Stationary(")
    rows = table_rows(out)
    assert list(rows) == list(ss.SCHEMES)
    assert rows["block"] == ["2.222222", ""]
    assert rows["traversal"] == ["2.222222", ""]
    assert rows["standard"] == ["2.111111", ""]


def test_cli_tree_mode_json_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*SKEWED_ARGS, "--shape", "paths(2, 2)", "--json"], capsys)
    assert code == 0
    payload = json.loads(out)
    assert set(payload) == {"shape", "pair", "rows"}
    assert payload["shape"] == "paths(2, 2)"
    pair = ss.pairs.Stationary(*SKEWED)
    expected = compare_tree(pair, ss.Shape.paths(2, 2))
    assert payload["rows"] == [
        {"scheme": r.scheme, "expected_emitted": r.expected_emitted, "note": r.note}
        for r in expected
    ]
    refused = {r["scheme"] for r in payload["rows"] if r["expected_emitted"] is None}
    assert refused == {"standard", "rsd", "block", "greedy", "spechub", "gumbel", "poisson"}
    assert all(
        r["note"] == "not exact for paths(2, 2)" for r in payload["rows"] if r["scheme"] in refused
    )


def test_cli_random_pair(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--random", "3,1", "--shape", "chain(2)"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith(
        "exact E[tau+1] on chain(2) for Random(vocab_size=3, seed=1, exact=False)"
    )
    rows = table_rows(out)
    expected = compare_tree(ss.pairs.Random(3, 1), ss.Shape.chain(2))
    assert rows == {r.scheme: [f"{r.expected_emitted:.6f}", ""] for r in expected}


@pytest.mark.parametrize("suffix", [".json", ".npy"])
def test_cli_file_input(suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"pair{suffix}"
    target, draft = SKEWED
    if suffix == ".json":
        path.write_text(json.dumps({"target": target, "draft": draft}))
    else:
        np.save(path, np.array([target, draft]))
    code, out, err = run(["--file", str(path), "-k", "2"], capsys)
    assert (code, err) == (0, "")
    _, direct, _ = run([*SKEWED_ARGS, "-k", "2"], capsys)
    assert out == direct


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "0.5,0.4", "--draft", "0.5,0.5"], "target: mass is 0.9, not 1"),
        (["--target", "0.5,0.5"], "give --target and --draft"),
        ([], "give --target and --draft"),
        (["--random", "3,1"], "--random needs --shape"),
        (["--random", "3", "--shape", "chain(2)"], "--random: expected VOCAB,SEED"),
        ([*SKEWED_ARGS, "--shape", "foo(1)"], "shape: cannot parse 'foo(1)'"),
        ([*SKEWED_ARGS, "--shape", "chain(x)"], "must be numbers"),
        ([*SKEWED_ARGS, "-k", "0"], "num_drafts: expected an integer >= 1"),
        (["--target", "0.5,x", "--draft", "0.5,0.5"], "--target: expected comma-separated"),
        (["--file", "missing.json"], "No such file"),
        (["--file", "pair.npy", *SKEWED_ARGS], "give either --file or --target/--draft"),
    ],
)
def test_cli_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("specsampling compare: ")
    assert message in err


def test_cli_bad_file_contents_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    npy = tmp_path / "three.npy"
    np.save(npy, np.full((3, 2), 0.5))
    no_draft = tmp_path / "no_draft.json"
    no_draft.write_text(json.dumps({"target": [0.5, 0.5]}))
    broken = tmp_path / "broken.json"
    broken.write_text("not json")
    for path, message in (
        (npy, "--file: expected shape (2, vocab_size), got (3, 2)"),
        (no_draft, "draft"),
        (broken, "Expecting value"),
    ):
        code, _, err = run(["--file", str(path)], capsys)
        assert code == 2, path
        assert message in err, err


def test_cli_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([*SKEWED_ARGS, "-k", "two"], capsys)
    assert code == 2
    assert "invalid int value: 'two'" in err
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    assert "--random V,SEED" in out and "--shape" in out


def test_cli_reads_both_distributions_exactly_when_either_has_a_fraction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["compare", "--target", "1/2,1/2", "--draft", "0.25,0.75", "-k", "1", "--json"]) == 0
    )
    rows = {row["scheme"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["standard"]["acceptance"] == 0.75
