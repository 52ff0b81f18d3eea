"""The ``specsampling`` command line and the certification it runs.

The full ``certify`` run takes several seconds; it runs once for the table and once for JSON.
Broken schemes are certified as objects (never registered), so the global registry stays clean.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import specsampling as ss
from specsampling import compare as ss_compare
from specsampling.calculators import nss_acceptance
from specsampling.certify import TOLERANCE, Report, certify, exit_code
from specsampling.cli import format_report, main
from specsampling.noise import Noise
from specsampling.ops import accept_probability, accepts, categorical
from specsampling.schemes.base import Step
from specsampling.schemes.nss import NSS
from specsampling.schemes.standard import Standard


class ResidualIsTarget(Standard):
    """Mutant: the rejection branch samples the target instead of norm((p - q)_+)."""

    name = "mutant-residual-is-target"

    def residual(self, target: Any, draft: Any) -> Any:
        return target

    def node_verify(
        self, tree: ss.DraftTree, node: int, target_probs: Any, draft_probs: Any, noise: Noise
    ) -> Step:
        (child,) = tree.candidates[node]
        target, draft = target_probs[node], draft_probs[node]
        token = tree.tokens[child]
        if accepts(noise.accept[child], target[token], draft[token]):
            return child, None
        return None, categorical(self.residual(target, draft), noise.sample[node])

    def node_law(
        self, tree: ss.DraftTree, node: int, target_probs: Any, draft_probs: Any
    ) -> tuple[list[tuple[int, Any]], Any]:
        (child,) = tree.candidates[node]
        target, draft = target_probs[node], draft_probs[node]
        accept = accept_probability(target[tree.tokens[child]], draft[tree.tokens[child]])
        return [(child, accept)], (1 - accept) * self.residual(target, draft)


class AcceptsRefusedShapes(NSS):
    """Mutant: claims chains only but never raises UnsupportedShape (exact anyway: it is NSS)."""

    name = "mutant-silent-refusal"

    def supports(self, shape: ss.Shape) -> bool:
        return shape.is_chain

    def check(self, shape: ss.Shape) -> None:
        return None


class Crashes(ResidualIsTarget):
    """Mutant: verification raises."""

    name = "mutant-crashes"

    def residual(self, target: Any, draft: Any) -> Any:
        raise RuntimeError("boom")


class WrongClosedForm(Standard):
    """Mutant: the closed form sum_x p(x) q(x) instead of sum_x min(p(x), q(x))."""

    name = "mutant-closed-form"

    def closed_acceptance(self, target: Any, draft: Any, num_drafts: int) -> Any:
        return nss_acceptance(target, draft, num_drafts) if num_drafts == 1 else None


def kinds(report: Report) -> set[str]:
    return {v.kind for s in report.schemes for v in s.violations}


# ---------------------------------------------------------------- the real registry


#: The full certification, run once for the table and the JSON tests (about a minute).
_FULL_REPORT: dict[str, Report] = {}


@pytest.fixture
def certify_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make each CLI certification (the full one, or a selection of names) run once per test
    session."""
    import specsampling.cli as cli

    def cached(selected: Any = None, progress: Any = None) -> Report:
        names = (
            None
            if selected is None
            else tuple(s if isinstance(s, str) else s.name for s in selected)
        )
        if names is not None and any(not isinstance(s, str) for s in selected):
            return certify(selected, progress=progress)
        key = "full" if names is None else ",".join(names)
        if key not in _FULL_REPORT:
            _FULL_REPORT[key] = certify(selected, progress=progress)
        return _FULL_REPORT[key]

    monkeypatch.setattr(cli, "certify", cached)


#: The default run certifies a few schemes through the CLI (the README's set-up line and the
#: long run, ``-m slow``, certify the whole registry): a rational scheme, a keyed coupling, the
#: two without-replacement / i.i.d. refusals the design singles out.
SELECTION = ("block", "gumbel", "rsd", "specinfer")


def _selected(names: Any) -> list[str]:
    return [arg for name in names for arg in ("--scheme", name)]


@pytest.mark.slow
def test_certify_table(capsys: pytest.CaptureFixture[str], certify_once: None) -> None:
    _check_table(capsys, [], ss.SCHEMES)


def test_certify_table_of_a_selection(
    capsys: pytest.CaptureFixture[str], certify_once: None
) -> None:
    _check_table(capsys, _selected(SELECTION[:2]), SELECTION[:2])


def _check_table(capsys: pytest.CaptureFixture[str], argv: list[str], names: Any) -> None:
    assert main(["certify", "--no-progress", *argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].split(" | ")[0].strip() == "scheme"
    shown = {line.split(" | ")[0].strip() for line in lines[1:] if " | " in line}
    assert set(names) <= shown and not shown & (set(ss.SCHEMES) - set(names))
    for name in names:
        row = next(line for line in lines if line.split(" | ")[0].strip() == name)
        assert row.rstrip().endswith("certified")
        assert "VIOLATION" not in row
    assert "all certified" in lines[-1]
    assert "refuses (raises UnsupportedShape)" in out


@pytest.mark.slow
def test_certify_json(capsys: pytest.CaptureFixture[str], certify_once: None) -> None:
    by_name = _check_json(capsys, [], ss.SCHEMES)
    assert "top((2, 2))" in by_name["nss"]["supported"]
    assert by_name["nss"]["refused"] == []


def test_certify_json_of_a_selection(
    capsys: pytest.CaptureFixture[str], certify_once: None
) -> None:
    _check_json(capsys, _selected(SELECTION), SELECTION)


def _check_json(capsys: pytest.CaptureFixture[str], argv: list[str], names: Any) -> Any:
    assert main(["certify", "--json", "--no-progress", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["certified"] is True
    assert data["version"] == ss.__version__
    by_name = {s["name"]: s for s in data["schemes"]}
    assert set(by_name) == set(names)
    for name, scheme in by_name.items():
        assert scheme["certified"] is True, name
        assert scheme["violations"] == []
        assert scheme["cases"] > 0
        assert 0 <= scheme["max_float_error"] <= TOLERANCE
        if ss.SCHEMES[name].rational:
            assert scheme["exact_ok"] is True
            assert scheme["max_exact_error"] == "0"
            assert scheme["exact_cases"] > 0
        assert 1 <= scheme["emitted_min"] <= scheme["emitted_max"]
        assert "chain(1)" in scheme["supported"]
        assert not set(scheme["supported"]) & set(scheme["refused"])
    # The draft laws the design singles out: RRS-without-replacement on i.i.d. drafts is refused,
    # and so is RRS-with-replacement on without-replacement drafts; NSS takes every tree.
    assert "star(2, replacement=True)" in by_name["rsd"]["refused"]
    assert "star(2, replacement=False)" in by_name["specinfer"]["refused"]
    return by_name


def test_module_entry_point_subprocess() -> None:
    cmd = [sys.executable, "-m", "specsampling", "certify", "--scheme", "nss"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("nss ")]
    assert len(rows) == 1 and rows[0].rstrip().endswith("certified")
    assert "specinfer" not in done.stdout
    # progress is shown by default; stderr is a pipe here, not a terminal: one final line, no bar
    assert re.fullmatch(r"(\d+)/\1 cases checked in \d+ s\n", done.stderr), done.stderr


def test_console_script_version() -> None:
    """The README's main command is the installed console script: it must exist."""
    exe = shutil.which("specsampling")
    assert exe is not None, "the console script `specsampling` is not installed"
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert done.stdout.strip() == f"specsampling {ss.__version__}"


# ---------------------------------------------------------------- usage errors


def test_unknown_scheme_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certify", "--scheme", "nss", "--scheme", "no-such-scheme"]) == 2
    err = capsys.readouterr().err
    assert "unknown scheme 'no-such-scheme'" in err
    for name in ss.SCHEMES:
        assert name in err


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["certify", "--bogus"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: specsampling" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"specsampling {ss.__version__}"


def test_scheme_option_selects_and_dedupes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["certify", "--json", "--no-progress", "--scheme", "standard", "--scheme", "standard"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data["schemes"]] == ["standard"]


# ---------------------------------------------------------------- violations are caught


def test_broken_residual_is_a_violation() -> None:
    report = certify([ResidualIsTarget()])
    (scheme,) = report.schemes
    assert not scheme.certified and not report.certified
    assert exit_code(report) == 1
    assert scheme.max_float_error > TOLERANCE
    assert scheme.exact_ok is False and scheme.max_exact_error != "0"
    assert {"float error", "exact error"} <= kinds(report)
    text = format_report(report)
    assert "VIOLATION" in text and "NOT certified: mutant-residual-is-target" in text


def test_silently_accepting_a_refused_shape_is_a_violation() -> None:
    report = certify([AcceptsRefusedShapes()])
    (scheme,) = report.schemes
    assert kinds(report) == {"refusal"}  # lossless on what it runs, but it does not refuse
    assert scheme.max_float_error <= TOLERANCE and scheme.exact_ok is True
    refused_shapes = {v.shape for v in scheme.violations}
    assert refused_shapes == set(scheme.refused) and "top((2, 2))" in refused_shapes
    assert all("silently accepted" in v.detail for v in scheme.violations)
    assert exit_code(report) == 1


def test_crash_is_a_violation_not_a_crash() -> None:
    report = certify([Crashes()])
    assert "exception" in kinds(report)
    assert any("RuntimeError: boom" in v.detail for s in report.schemes for v in s.violations)
    assert exit_code(report) == 1


def test_wrong_closed_form_is_a_violation() -> None:
    report = certify([WrongClosedForm()])
    (scheme,) = report.schemes
    assert kinds(report) == {"closed form"}
    assert scheme.max_float_error <= TOLERANCE and scheme.exact_ok is True
    assert exit_code(report) == 1


def test_names_and_objects_mix_and_progress_counts() -> None:
    calls: list[tuple[int, int, str]] = []
    report = certify(["standard", ss.SCHEMES["standard"]], progress=lambda *a: calls.append(a))
    assert [s.name for s in report.schemes] == ["standard", "standard"]
    assert report.certified and exit_code(report) == 0
    assert [done for done, _, _ in calls] == list(range(1, len(calls) + 1))
    assert {total for _, total, _ in calls} == {len(calls)}
    assert report.to_dict()["schemes"][0]["certified"] is True


def test_unknown_name_raises_keyerror_listing_names() -> None:
    with pytest.raises(KeyError, match="registered"):
        certify(["no-such-scheme"])


# ---------------------------------------------------------------- compare: bad input

SKEWED_ARGS = ["--target", "0.7,0.2,0.1", "--draft", "0.1,0.2,0.7"]


def compare_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = compare_cli(argv, capsys)
    assert (code, out) == (2, ""), err
    assert err.startswith("specsampling compare: "), err
    assert message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--random", "3,1", "--shape", "chain(2)", *SKEWED_ARGS], "either --random or --target"),
        (["--random", "3,1", "--shape", "chain(2)", "--file", "x.json"], "or --file, not both"),
        (["--random", "3,1", "--shape", "chain(2)", "--logits"], "or --logits"),
        (["--random", "3,1", "--shape", "chain(2)", "--tolerance", "1e-3"], "or --tolerance"),
        ([*SKEWED_ARGS, "--shape", "chain(2)", "-k", "3"], "-k/--num-drafts is for single"),
        (["--target", "1/0,1", "--draft", "1/2,1/2"], "--target: entry 0 '1/0' divides by zero"),
        (["--target", "1/2,1/2", "--draft", "1/2,x"], "--draft: expected comma-separated"),
        (["--target", "0.5,,0.5", "--draft", "0.5,0.5"], "entry 1 '' is not a number"),
        (["--target", "-0.5,1.5", "--draft", "0.5,0.5"], "target: negative entry at index 0"),
        (["--target", "2,1,0", "--draft", "0,1,2"], "logits or counts? apply"),
        ([*SKEWED_ARGS, "--temperature", "0.5"], "--temperature processes logits: add --logits"),
        ([*SKEWED_ARGS, "--top-k", "2", "--top-p", "0.5"], "--top-k, --top-p processes logits"),
        ([*SKEWED_ARGS, "--logits", "--tolerance", "1e-3"], "--tolerance is for given"),
        ([*SKEWED_ARGS, "--logits", "--top-k", "0"], "--top-k: expected an integer >= 1, got 0"),
        ([*SKEWED_ARGS, "--logits", "--top-p", "2"], "--top-p: expected a number"),
        ([*SKEWED_ARGS, "--logits", "--temperature", "nan"], "--temperature: expected a finite"),
        (["--logits", "--target", "1/2,0", "--draft", "0,1"], "'1/2' is not a number"),
        (["--logits", "--target", "-inf,-inf", "--draft", "0,1"], "(target row): logits: a row"),
        (["--file", "."], "--file: cannot read .: Is a directory"),
    ],
)
def test_compare_usage_errors_are_clear(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_usage_error(argv, message, capsys)


@pytest.mark.parametrize("value", ["-1", "abc", "nan"])
def test_bad_tolerance_option(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = compare_cli([*SKEWED_ARGS, "--tolerance", value], capsys)
    assert (code, out) == (2, "")
    assert f"argument --tolerance: expected a number >= 0, got '{value}'" in err


def test_file_content_decides_the_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A JSON file named .npy got numpy's advice to load it with allow_pickle=True."""
    named_npy = tmp_path / "pair.npy"
    named_npy.write_text(json.dumps({"target": [0.7, 0.2, 0.1], "draft": [0.1, 0.2, 0.7]}))
    code, out, err = compare_cli(["--file", str(named_npy)], capsys)
    assert (code, err) == (0, "")
    assert out == compare_cli(SKEWED_ARGS, capsys)[1]
    real_npy = tmp_path / "pair.json"
    np.save(tmp_path / "array.npy", np.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]]))
    (tmp_path / "array.npy").rename(real_npy)
    assert compare_cli(["--file", str(real_npy)], capsys)[:2] == (0, out)


def test_unreadable_files_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "garbage.npy"
    garbage.write_text("target = 0.5, 0.5")
    pickled = tmp_path / "pickled.npy"
    np.save(pickled, np.array([[0.5, 0.5], [0.5, "x"]], dtype=object), allow_pickle=True)
    archive = tmp_path / "pair.npz"
    np.savez(archive, pair=np.full((2, 2), 0.5))
    binary = tmp_path / "binary.json"
    binary.write_bytes(bytes(range(256)))
    truncated = tmp_path / "truncated.npy"
    np.save(truncated, np.full((2, 100), 0.01))
    truncated.write_bytes(truncated.read_bytes()[:200])
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"target": [0.5, 0.5], "draft": [0.5, 0.5], "k": 3}))
    complex_rows = tmp_path / "complex.npy"
    np.save(complex_rows, np.full((2, 2), 0.5 + 0j))
    cases = [
        (garbage, "garbage.npy is not a .npy array (no NumPy header) and not valid JSON"),
        (pickled, "holds an object (pickled) array, which is never loaded"),
        (archive, "is a zip archive (.npz?)"),
        (binary, "binary.json is not UTF-8 JSON"),
        (truncated, "cannot read"),
        (extra, "unknown keys ['k']"),
        (complex_rows, "target: entries must be real numbers, got an array of complex"),
    ]
    for path, message in cases:
        assert_usage_error(["--file", str(path)], message, capsys)
        assert "allow_pickle" not in capsys.readouterr().err


def test_large_k_never_gives_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """gls crashed from k = 69, rsd from k = 988 (RecursionError), traversal overflowed."""
    for k in ("69", "988"):
        code, out, err = compare_cli([*SKEWED_ARGS, "-k", k], capsys)
        assert (code, err) == (0, ""), err
        assert f"{k} drafts" in out


def test_unexpected_library_errors_exit_2_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise TypeError("Cannot cast ufunc 'add' output")

    monkeypatch.setattr("specsampling.cli.compare", broken)
    assert_usage_error(SKEWED_ARGS, "error: the computation failed with TypeError", capsys)


def test_logits_are_processed_alike_for_target_and_draft(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target_logits, draft_logits = [2.0, 1.0, -1.0, -math.inf], [-1.0, 0.5, 2.0, 0.0]
    argv = ["--logits", "--target", "2,1,-1,-inf", "--draft", "-1,0.5,2,0", "--json"]
    argv += ["--temperature", "0.7", "--top-k", "3", "--top-p", "0.9", "-k", "2"]
    code, out, err = compare_cli(argv, capsys)
    assert (code, err) == (0, "")
    target = ss.process(target_logits, 0.7, 3, 0.9)
    draft = ss.process(draft_logits, 0.7, 3, 0.9)
    expected = ss_compare.compare(target, draft, 2)
    rows = json.loads(out)["rows"]
    assert [r["acceptance"] for r in rows] == [r.acceptance for r in expected.rows]
    # Defaults: temperature 1, no truncation; the tree mode takes logits too.
    code, out, _ = compare_cli(["--logits", "--target", "0,1", "--draft", "1,0", "-k", "1"], capsys)
    assert code == 0
    code, out, _ = compare_cli(
        ["--logits", "--target", "0,1", "--draft", "1,0", "--shape", "chain(1)"], capsys
    )
    assert code == 0 and "Stationary(target=[0.268941, 0.731059]" in out


def test_low_precision_probabilities_with_tolerance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = np.array([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]])
    rows[:, 0] += 2e-3  # bf16 rounding
    path = tmp_path / "bf16.npy"
    np.save(path, rows.astype(np.float32))
    assert_usage_error(["--file", str(path)], "CLI --tolerance 0.01", capsys)
    code, out, err = compare_cli(["--file", str(path), "--tolerance", "1e-2", "--json"], capsys)
    assert (code, err) == (0, "")
    expected = ss_compare.compare(*rows.astype(np.float32), 2, tolerance=1e-2)
    assert [r["acceptance"] for r in json.loads(out)["rows"]] == [
        r.acceptance for r in expected.rows
    ]
    tree = ["--file", str(path), "--tolerance", "1e-2", "--shape", "chain(1)"]
    assert compare_cli(tree, capsys)[0] == 0


def test_compare_help_lists_the_new_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = compare_cli(["--help"], capsys)
    assert code == 0
    for option in ("--logits", "--temperature", "--top-k", "--top-p", "--tolerance", "float32"):
        assert option in out


def test_models_command_lists_and_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """``specsampling models`` is the weights' own command line (gpu.hf.cli.models_main)."""
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in out
    assert main(["models", "fetch", "nosuch"]) == 2
    assert "unknown model 'nosuch'" in capsys.readouterr().err


# ---------------------------------------------------------------- the extras' commands


@pytest.mark.parametrize("argv", [["--help"], ["certify", "--help"], ["compare", "--help"]])
def test_core_help_never_imports_torch(argv: list[str]) -> None:
    """The numpy core's own commands print their help without importing torch (a fresh
    interpreter: this test process has torch loaded already)."""
    code = (
        "import sys, specsampling.cli as c\n"
        f"status = c.main({argv!r})\n"
        "print('status', status)\n"
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-2:] == ["status 0", "torch not imported"]
    assert lines[0].startswith("usage: specsampling")


@pytest.mark.parametrize(
    ("command", "module", "extra"),
    [
        ("decode", "specsampling.gpu.hf", "specsampling[hf]"),
        ("models", "specsampling.gpu.hf", "specsampling[hf]"),
        ("simulate", "specsampling.simulators", "specsampling[torch]"),
    ],
)
def test_extras_commands_without_the_extra_say_what_to_install(
    command: str,
    module: str,
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    assert main([command, "--help"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specsampling {command}: ") and f"pip install '{extra}'" in err


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ("decode", "usage: specsampling decode"),
        ("models", "usage: specsampling models"),
        ("simulate", "usage: specsampling simulate"),
    ],
)
def test_extras_commands_are_handed_their_arguments(
    command: str, usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    if command != "simulate":
        pytest.importorskip("transformers")
    assert main([command, "--help"]) == 0
    assert capsys.readouterr().out.startswith(usage)
    assert main([command, "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and f"specsampling {command}: error: " in err


# ---------------------------------------------------------------- simulate: bad input


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep itself fails the test: refusals must come before any work."""
    pytest.importorskip("torch")
    from specsampling.simulators import cli as simulate_cli

    monkeypatch.setattr(simulate_cli, "run", lambda args: pytest.fail("the sweep ran"))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--temperatures", "abc"], "argument --temperatures: expected a number, got 'abc'"),
        (["--temperatures", "1,-1"], "argument --temperatures: expected temperatures >= 0"),
        (["--temperatures", "1,,2"], "argument --temperatures: expected comma-separated"),
        (["--budgets", "x"], "argument --budgets: expected an integer, got 'x'"),
        (["--budgets", "4,0"], "argument --budgets: expected node budgets >= 1"),
        (["--num-trees", "0"], "argument --num-trees: expected an integer >= 1"),
        (["--vocab-size", "big"], "argument --vocab-size: expected an integer"),
        (["--cost-ratio", "-1"], "argument --cost-ratio: expected a number > 0"),
        (["--shapes", "bad("], "argument --shapes: "),
        (["--families", "chain,circle"], "--families: unknown ['circle']"),
        (["--schemes", ""], "argument --schemes: expected comma-separated values, got ''"),
        (["--schemes", "nss,,spectr"], "argument --schemes: expected comma-separated"),
        (["--schemes", "traversal,nosuch"], "--schemes: scheme: unknown scheme 'nosuch'"),
        (["--schemes", "gumbel"], "--schemes: scheme 'gumbel': the estimators verify drafted"),
        (["--cost-ratio", "0.1", "--cost", "{cost}"], "--cost-ratio: give --cost or --cost-ratio"),
    ],
)
def test_simulate_names_the_bad_option(
    argv: list[str],
    says: str,
    tmp_path: Path,
    no_sweep: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps(
            {"target_fixed": 1, "target_per_token": 0.1, "draft_fixed": 0.1, "draft_per_token": 0}
        )
    )
    argv = [a.replace("{cost}", str(cost)) for a in argv]
    assert main(["simulate", "--vocab-size", "16", *argv]) == 2
    assert says in capsys.readouterr().err


def test_simulate_names_a_bad_cost_file(
    tmp_path: Path, no_sweep: None, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "missing.json": None,
        "bad.json": "{not json",
        "list.json": "[1, 2]",
        "keys.json": json.dumps({"target_fixed": 1.0}),
    }
    expected = {
        "missing.json": "cannot read",
        "bad.json": "is not valid JSON",
        "list.json": "expected a mapping of costs",
        "keys.json": "missing cost(s)",
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        assert main(["simulate", "--cost", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"argument --cost: '{path}'" in err and expected[name] in err, err


def test_simulate_refuses_unwritable_outputs_before_any_work(
    tmp_path: Path, no_sweep: None, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    refusals = {
        ("--json", str(tmp_path / "no-dir" / "rows.json")): "--json: no directory",
        ("--json", str(a_file / "rows.json")): "--json: no directory",
        ("--json", str(tmp_path)): "is a directory",
        ("--plots", str(a_file)): "--plots: cannot make the directory",
        ("--plots", str(a_file / "plots")): "--plots: cannot make the directory",
    }
    for (option, value), says in refusals.items():
        assert main(["simulate", "--vocab-size", "16", option, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith("specsampling simulate: ") and says in err, err


def test_simulate_refuses_shapes_and_budgets_with_recorded_trees(
    tmp_path: Path, no_sweep: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import specsampling.simulators as sim

    pair = sim.pairs.Synthetic(vocab_size=12, seed=0)
    path = sim.RecordedTrees.from_pair(pair, ss.Shape.chain(2), 4, generator=0).save(
        tmp_path / "t.npz"
    )
    for extra, option in (
        (["--shapes", "chain(3)"], "--shapes"),
        (["--budgets", "4"], "--budgets"),
    ):
        assert main(["simulate", "--recorded", str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert f"specsampling simulate: {option}: not with --recorded" in err
        assert "recorded trees have their own shape" in err
    assert main(["simulate", "--recorded", str(tmp_path / "none.npz")]) == 2
    assert "--recorded: no such file" in capsys.readouterr().err


def test_simulate_with_a_cost_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A valid --cost file is the cost model of the predicted speedups."""
    pytest.importorskip("torch")
    costs = {"target_fixed": 1.0, "target_per_token": 0.0, "draft_fixed": 0.0}
    (tmp_path / "cost.json").write_text(json.dumps({**costs, "draft_per_token": 0.0}))
    out = tmp_path / "rows.json"
    argv = ["simulate", "--vocab-size", "16", "--schemes", "traversal", "--shapes", "chain(2)"]
    argv += ["--num-trees", "8", "--no-progress", "--cost", str(tmp_path / "cost.json")]
    assert main([*argv, "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    # free drafts and one target forward per round: the speedup is the block efficiency
    assert row["predicted_speedup"] == pytest.approx(row["block_efficiency"])
    assert "speedup" in capsys.readouterr().out


def test_simulate_every_option_has_help_with_its_default() -> None:
    pytest.importorskip("torch")
    from specsampling.simulators import cli as simulate_cli

    made = simulate_cli.parser()
    text = " ".join(made.format_help().split())
    options = [a for a in made._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 18
    for action in options:
        assert action.help and "default" in action.help, action.option_strings
        assert " ".join((action.help % {"default": action.default}).split()) in text


# ---------------------------------------------------------------- progress only on a terminal
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A redirected log gets one final line, never the bar's redraws; a terminal gets the bar."""
    from specsampling.cli import _Bar

    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr("specsampling.cli.time.monotonic", lambda: next(clock))
    log, terminal = io.StringIO(), _Terminal()
    for stream in (log, terminal):
        bar = _Bar(stream)
        for done in range(1, 51):
            bar(done, 50, f"case {done}")
        bar.close()
    assert log.getvalue().count("\n") == 1 and "\r" not in log.getvalue()
    assert log.getvalue().startswith("50/50 cases checked in ")
    assert terminal.getvalue().count("\r") == 50 and terminal.getvalue().endswith("\n")
    assert "[##############################] 50/50 case 50" in terminal.getvalue()
