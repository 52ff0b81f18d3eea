"""The ``specsampling`` command line and the certification it runs.

The full ``certify`` run takes several seconds; it runs once for the table and once for JSON.
Broken schemes are certified as objects (never registered), so the global registry stays clean.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import pytest

import specsampling as ss
from specsampling.calculators import nss_acceptance
from specsampling.certify import TOLERANCE, Report, certify, exit_code
from specsampling.cli import format_report, main
from specsampling.schemes.nss import NSS
from specsampling.schemes.standard import Standard


class ResidualIsTarget(Standard):
    """Mutant: the rejection branch samples the target instead of norm((p - q)_+)."""

    name = "mutant-residual-is-target"

    def residual(self, target: Any, draft: Any) -> Any:
        return target


class AcceptsRefusedShapes(NSS):
    """Mutant: claims chains only but never raises UnsupportedShape (exact anyway: it is NSS)."""

    name = "mutant-silent-refusal"

    def supports(self, shape: ss.Shape) -> bool:
        return shape.is_chain

    def check(self, shape: ss.Shape) -> None:
        return None


class Crashes(Standard):
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


def test_certify_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certify", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].split(" | ")[0].strip() == "scheme"
    for name in ss.SCHEMES:
        row = next(line for line in lines if line.split(" | ")[0].strip() == name)
        assert row.rstrip().endswith("certified")
        assert "VIOLATION" not in row
    assert "all certified" in lines[-1]
    assert "refuses (raises UnsupportedShape)" in out


def test_certify_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certify", "--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["certified"] is True
    assert data["version"] == ss.__version__
    by_name = {s["name"]: s for s in data["schemes"]}
    assert set(by_name) == set(ss.SCHEMES)
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
    assert "top((2, 2))" in by_name["nss"]["supported"]
    assert by_name["nss"]["refused"] == []


def test_module_entry_point_subprocess() -> None:
    cmd = [sys.executable, "-m", "specsampling", "certify", "--scheme", "nss"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("nss ")]
    assert len(rows) == 1 and rows[0].rstrip().endswith("certified")
    assert "specinfer" not in done.stdout
    assert "/" in done.stderr and "[" in done.stderr  # the progress bar, shown by default


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
