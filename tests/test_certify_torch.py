"""``specsampling certify --backend torch``: every torch lowering checked against its reference.

The full run (every scheme of ``ss.SCHEMES``, lowered or not) runs once for the table; the other
tests certify one cheap scheme. Broken lowerings are either passed as objects or injected into
the lowering registry with ``monkeypatch`` (restored after each test), so the registry the other
tests see stays clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

import specsampling as ss
from specsampling import gpu as ssg
from specsampling.certify import exit_code
from specsampling.certify_torch import TorchReport, certify_torch
from specsampling.cli import format_torch_report, main

Standard = ssg.schemes.standard.Standard
RSD = ssg.schemes.rsd.RSD


def kinds(report: TorchReport) -> set[str]:
    return {v.kind for s in report.schemes for v in s.violations}


def row_of(out: str, name: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.split(" | ")[0].strip() == name)
    return [cell.strip() for cell in line.split(" | ")]


# ---------------------------------------------------------------- mutants of the lowering
class InclusiveAccept(Standard):
    """``u * q <= p``: accepts a token of zero target mass when ``u == 0``."""

    def accepts(self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> Any:
        return u * draft_x.double() <= target_x.double()


class BonusFromParent(Standard):
    """The bonus after a fully accepted chain is drawn from the parent's target row."""

    def bonus_row(self, batch: Any, node: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(batch.batch_size, device=node.device)
        return batch.parents[rows, node].clamp_min(0)


class PaddingSelectable(RSD):
    """Padded candidate slots treated as real (``-1`` ids clamped to node 0)."""

    def candidate_mask(self, candidate_nodes: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(candidate_nodes, dtype=torch.bool)


class RatioAccept(Standard):
    """``u < p / q``: the same test in exact arithmetic, another one in float64 (where
    ``fl(u q) = p`` and ``u`` lies one float below ``fl(p / q)``)."""

    def accepts(self, u: torch.Tensor, target_x: torch.Tensor, draft_x: torch.Tensor) -> Any:
        return u < target_x.double() / draft_x.double()


class FirstRowRefusal(Standard):
    """Refuses a tree its reference is not exact for only as the first row of a batch."""

    def check_batch(self, batch: Any) -> None:
        if batch.laws and not self.reference_scheme.exact_for(batch.laws[0], batch.chains[0]):
            raise ss.UnsupportedShape("refused")


class SilentRefusal(Standard):
    """Verifies trees of any law: exact on chains, but never refuses an i.i.d. star."""

    def check_batch(self, batch: Any) -> None:
        return None


class Crashes(Standard):
    def walk(self, *args: Any) -> Any:
        raise RuntimeError("boom")


class FakeKeyed(ssg.schemes.Lowering):
    """A keyed lowering object (not a tree lowering): checked through ``ssg.generate``."""

    name = "gumbel"


def reference_generate(
    scheme: Any, pair: Any, shape: Any, length: int, *, key: list[int], batch_size: int
) -> Any:
    """A ``generate`` that returns the reference streams of the keys as a ``[B, L]`` tensor."""
    assert batch_size == len(key)
    rng = np.random.default_rng(5)
    return torch.tensor([ss.generate(scheme.name, pair, shape, length, rng, key=k) for k in key])


# ---------------------------------------------------------------- the real registry
def test_full_run_table_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    """Every scheme of ``ss.SCHEMES`` gets a row: lowered ones certified, the others failing
    as NOT LOWERED (never skipped); the exit status is 0 iff every scheme is lowered."""
    status = main(["certify", "--backend", "torch", "--no-progress"])
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].split(" | ")[0].strip() == "scheme" and "path-wise rows" in lines[0]
    missing = [
        name
        for name in ss.SCHEMES
        if name not in ssg.SCHEMES
        or not (isinstance(ssg.SCHEMES[name], ssg.schemes.TreeLowering) or hasattr(ssg, "generate"))
    ]
    for name in ss.SCHEMES:
        cells = row_of(out, name)
        if name in missing:
            assert cells[1] == "not lowered" and cells[-1] == "NOT LOWERED", cells
        else:
            assert cells[-1] == "certified", cells
            assert int(cells[3]) > 0
    assert status == (1 if missing else 0)
    assert ("all certified" in lines[-1]) == (not missing)
    if missing:
        assert f"not lowered: {', '.join(missing)}" in lines[-1]
    assert "refuses (raises UnsupportedShape)" in out  # rsd, specinfer and standard refuse


def test_json_and_default_backend(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["certify", "--json", "--no-progress", "--scheme", "standard"]
    assert main([*argv, "--backend", "torch"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "torch" and data["certified"] is True
    assert data["torch_version"] == torch.__version__ and data["device"] == "cpu"
    (scheme,) = data["schemes"]
    assert scheme["name"] == "standard" and scheme["lowering"] == "tree"
    assert scheme["certified"] is True and scheme["violations"] == []
    assert scheme["pathwise_rows"] > 0 and scheme["law_rows"] == 3 * scheme["law_trees"] > 0
    assert "star(2, replacement=True)" in scheme["refused"]
    # --backend numpy is the default, unchanged: the exact engine's report
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*argv, "--backend", "numpy"]) == 0
    numpy_report = json.loads(capsys.readouterr().out)
    assert "backend" not in default and default["schemes"][0]["exact_ok"] is True
    for report in (default, numpy_report):
        report.pop("seconds")
    assert default == numpy_report


def test_bad_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certify", "--backend", "jax"]) == 2
    assert "invalid choice: 'jax'" in capsys.readouterr().err


# ---------------------------------------------------------------- violations are caught
def test_device_option(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["certify", "--backend", "torch", "--no-progress", "--scheme", "standard"]
    assert main([*base, "--device", "cpu"]) == 0
    assert "float64 on cpu" in capsys.readouterr().out
    assert main([*base, "--device", "nope"]) == 2
    assert "certify: --device: 'nope' is not a torch device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*base, "--device", "cuda"]) == 2
        assert "--device: 'cuda': no CUDA device on this machine" in capsys.readouterr().err
    assert main(["certify", "--scheme", "standard", "--device", "cpu"]) == 2
    assert "--device: only with --backend torch" in capsys.readouterr().err


def test_broken_lowering_injected_into_the_registry_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(ssg.SCHEMES._items, "standard", InclusiveAccept())
    assert main(["certify", "--backend", "torch", "--no-progress", "--scheme", "standard"]) == 1
    out = capsys.readouterr().out
    assert row_of(out, "standard")[-1].startswith("VIOLATION (")
    assert "VIOLATION [path-wise]" in out and "rows differ" in out
    assert "NOT certified (violations: standard)" in out.splitlines()[-1]


@pytest.mark.parametrize("mutant", [InclusiveAccept(), BonusFromParent(), PaddingSelectable()])
def test_mutants_fail_the_pathwise_and_the_law_check(mutant: Any) -> None:
    report = certify_torch([mutant])
    (scheme,) = report.schemes
    assert not scheme.certified and exit_code(report) == 1
    assert {"path-wise", "law"} <= kinds(report)
    assert "VIOLATION" in format_torch_report(report)


def test_accept_tests_are_probed_on_their_own_boundaries() -> None:
    """Random uniforms almost never land where ``u q(x) < p(x)`` and ``u < p(x) / q(x)``
    disagree; the noise rows at ``fl(p(x) / q(x))`` and one float below it do."""
    (scheme,) = certify_torch([RatioAccept()]).schemes
    assert not scheme.certified and "path-wise" in {v.kind for v in scheme.violations}


def test_a_refused_tree_after_a_supported_one_is_still_refused() -> None:
    (scheme,) = certify_torch([FirstRowRefusal()]).schemes
    assert not scheme.certified and {v.kind for v in scheme.violations} == {"refusal"}
    assert all("as the second row of a batch" in v.detail for v in scheme.violations)


def test_silent_refusal_and_crash_are_violations() -> None:
    report = certify_torch([SilentRefusal(), Crashes()])
    silent, crash = report.schemes
    assert {v.kind for v in silent.violations} == {"refusal"}
    assert {v.shape for v in silent.violations} >= {
        "star(2, replacement=True)",
        "paths(2, 2)",
        "grafted chain(1)",  # a grafted tree, which the reference refuses too
    }
    assert all("silently verified" in v.detail for v in silent.violations)
    assert {v.kind for v in crash.violations} == {"exception"}
    assert all("RuntimeError: boom" in v.detail for v in crash.violations)
    assert exit_code(report) == 1


def test_an_unlowered_scheme_is_a_failing_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(ssg.SCHEMES._items, "rsd")
    assert main(["certify", "--backend", "torch", "--no-progress", "--scheme", "rsd"]) == 1
    out = capsys.readouterr().out
    assert row_of(out, "rsd")[1:] == ["not lowered", "8 of 20", "0", "-", "-", "-", "NOT LOWERED"]
    assert "NOT LOWERED: no lowering in specsampling.gpu.SCHEMES" in out


def test_keyed_lowerings_go_through_generate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ssg.SCHEMES._items, "gumbel", FakeKeyed())
    monkeypatch.delattr(ssg, "generate", raising=False)
    (missing,) = certify_torch(["gumbel"]).schemes
    assert missing.lowering == "not lowered" and not missing.certified
    assert "specsampling.gpu.generate does not exist" in missing.note

    monkeypatch.setattr(ssg, "generate", reference_generate, raising=False)
    report = certify_torch(["gumbel"])
    (keyed,) = report.schemes
    assert keyed.lowering == "keyed" and keyed.certified and exit_code(report) == 0
    assert keyed.keyed_streams == len(keyed.supported) * 2 * 4  # shapes x pairs x keys

    def shifted(*args: Any, **kwargs: Any) -> list[list[int]]:
        rows = reference_generate(*args, **kwargs).tolist()
        rows[1][-1] = (rows[1][-1] + 1) % 3  # a wrong last token for the second key
        return rows

    monkeypatch.setattr(ssg, "generate", shifted)
    report = certify_torch(["gumbel"])
    assert kinds(report) == {"keyed stream"} and exit_code(report) == 1
    (wrong,) = report.schemes
    assert len(wrong.violations) == 2 * len(wrong.supported)
    assert all(v.detail.startswith("key 1: ") for v in wrong.violations)


def test_names_objects_and_progress() -> None:
    calls: list[tuple[int, int, str]] = []
    report = certify_torch(
        ["standard", ss.SCHEMES["standard"], Standard()], progress=lambda *a: calls.append(a)
    )
    assert [s.name for s in report.schemes] == ["standard"] * 3
    assert report.certified and exit_code(report) == 0
    assert [done for done, _, _ in calls] == list(range(1, len(calls) + 1))
    assert {total for _, total, _ in calls} == {len(calls)}
    with pytest.raises(KeyError, match="registered"):
        certify_torch(["no-such-scheme"])


# ---------------------------------------------------------------- without torch
BLOCK_TORCH = (
    "import sys\n"
    "class NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'torch':\n"
    "            raise ImportError('no torch here')\n"
    "sys.meta_path.insert(0, NoTorch())\n"
)


def test_without_torch_the_core_works_and_the_torch_backend_says_how_to_install() -> None:
    code = BLOCK_TORCH + (
        "from specsampling.cli import main\n"
        "assert 'torch' not in sys.modules\n"
        "assert main(['certify', '--no-progress', '--scheme', 'standard']) == 0\n"
        "sys.exit(main(['certify', '--backend', 'torch', '--no-progress']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "all certified" in done.stdout  # the numpy backend ran
    assert done.stderr.startswith("specsampling certify: the torch backend needs")
    assert 'pip install "specsampling[torch]"' in done.stderr
    assert "Traceback" not in done.stderr
