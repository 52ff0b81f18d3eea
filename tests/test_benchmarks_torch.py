"""The torch benchmarks stay runnable: each script in its ``--quick`` configuration (seconds).

``benchmarks/torch_chains.py``, ``benchmarks/torch_trees.py`` and ``benchmarks/gpu/run.py``
(on CPU) must exit cleanly, write their tables, and cover every registered lowering (timed, or
listed with the reason it is not). The tree benchmark's float64 run must agree path-wise with
the reference on every row, and the tensor-built chain batch the benchmarks fall back on must
equal the reference chain trees. No timing is asserted: speed claims live in the results.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import specsampling as ss
from specsampling import gpu as ssg
from specsampling.gpu.schemes import TreeLowering

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import common  # noqa: E402

TREE_SHAPES = (
    ss.Shape.paths(4, 8),
    ss.Shape.branching((2, 3, 4)),
    ss.Shape.branching((2, 3, 4), replacement=True),
)


def run_script(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of every markdown table whose first column is ``first_header``."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith(f"| {first_header} |"):
            inside = True
        elif inside and line.startswith("|---"):
            continue
        elif inside and line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        else:
            inside = False
    return rows


def test_chain_tree_batch_equals_reference_chains() -> None:
    draft_tokens = torch.tensor([[3, 0, 7], [5, 5, 1]])
    built = common.chain_tree_batch(ssg, draft_tokens, ss.Shape.chain(3).law)
    expected = ssg.TreeBatch.from_trees(
        [ss.DraftTree.chain(row, law="iid") for row in draft_tokens.tolist()]
    )
    for name in ("parents", "tokens", "num_nodes", "candidates", "depth"):
        assert torch.equal(getattr(built, name), getattr(expected, name)), name
    assert built.to_trees() == expected.to_trees()
    assert (built.chains, built.max_depth) == (expected.chains, expected.max_depth)


def test_torch_chains_quick(tmp_path: Path) -> None:
    output = tmp_path / "chains.md"
    run_script("benchmarks/torch_chains.py", "--quick", "--output", str(output))
    text = output.read_text()
    assert "## Throughput" in text and "## Latency per round" in text
    rows = table_rows(text, "scheme")
    timed = {row[0].strip("`") for row in rows if row[1] in ("verify_chain", "verify (tree path)")}
    assert timed, text
    for row in rows:
        if row[0].strip("`") in timed:
            assert float(row[2].replace(",", "")) > 0 and row[5].endswith("x"), row
    chain = ss.Shape.chain(4)
    for name in ssg.SCHEMES:
        if ss.SCHEMES[name].supports(chain):  # timed, or listed with the reason
            assert f"`{name}`" in text, name


def test_torch_trees_quick(tmp_path: Path) -> None:
    output = tmp_path / "trees.md"
    run_script("benchmarks/torch_trees.py", "--quick", "--output", str(output))
    text = output.read_text()
    sections = text.split("\n## ")[1:]
    assert len(sections) == 3, text
    for section in sections:
        shape_text = re.match(r"`([^`]*)`", section).group(1)
        rows = table_rows(section, "scheme")
        names = {row[0].strip("`") for row in rows}
        shape = next(s for s in TREE_SHAPES if repr(s) == shape_text)
        for name in ssg.SCHEMES:
            lowering = ssg.get_lowering(name)
            if isinstance(lowering, TreeLowering) and ss.SCHEMES[name].supports(shape):
                assert name in names, (shape_text, name)
        for row in rows:
            assert row[8] == "4/4", (shape_text, row)  # path-wise equal on every row (f64)


def test_torch_trees_selects_schemes(tmp_path: Path) -> None:
    """``--schemes`` times only the rows whose label contains a given string, and says so."""
    output = tmp_path / "trees.md"
    run_script(
        "benchmarks/torch_trees.py", "--quick", "--schemes", "spectr", "Greedy",
        "--output", str(output),
    )  # fmt: skip
    text = output.read_text()
    assert "Rows selected by `--schemes spectr Greedy`" in text
    labels = set()
    for section in text.split("\n## ")[1:]:
        labels |= {row[0] for row in table_rows(section, "scheme")}
    assert labels == {"`spectr`", "`resispec` Greedy"}, labels


def test_interleaved_median_within_a_budget() -> None:
    """Fast calls get every repeat; calls whose warm-up overruns the budget are timed once."""
    calls = {"a": 0, "b": 0}

    def count(name):
        def call():
            calls[name] += 1

        return call

    medians, rounds = common.interleaved_median_within(
        {name: count(name) for name in calls}, 5, 60.0
    )
    assert rounds == 5 and calls == {"a": 6, "b": 6} and set(medians) == {"a", "b"}
    slow = {"slow": lambda: time.sleep(0.02)}
    medians, rounds = common.interleaved_median_within(slow, 5, 0.01)
    assert rounds == 0 and medians["slow"] >= 0.02
    medians, rounds = common.interleaved_median_within(slow, 9, 0.05)  # 0.05 / 0.02: two fit
    assert 1 <= rounds <= 2


def test_gpu_script_on_cpu(tmp_path: Path) -> None:
    """``benchmarks/gpu/run.py --quick`` on the CPU: every step but decoding and the tests, each
    a row per scheme; the path-wise step certifies what it checks, float32 agrees."""
    out = tmp_path / "gpu"
    run_script(
        "benchmarks/gpu/run.py",
        str(out),
        "--device",
        "cpu",
        "--quick",
        "--skip-tests",
        "--skip-decode",
    )
    data = json.loads((out / "results.json").read_text())
    text = (out / "results.md").read_text()
    for section in ("## Goals", "## Path-wise on the device", "## Float32 agreement"):
        assert section in text
    assert "## Chains" in text and "## Trees" in text
    assert [r["scheme"] for r in data["pathwise"]] == ["standard", "block", "gumbel"]
    assert all(r["certified"] and r["cases"] > 0 for r in data["pathwise"]), data["pathwise"]
    assert [r["scheme"] for r in data["agreement"]] == ["standard", "nss", "block", "traversal"]
    assert all(r["rows"] == 2_000 and r["differ"] <= 1 for r in data["agreement"])
    assert data["chains"] and data["trees"], data["notes"]
    for record in data["chains"] + data["trees"]:
        assert record["verify_s"] is not None and record["verify_s"] > 0, record
        assert record["floor_s"] > 0, record
    for record in data["chains"]:  # from logits and our vLLM-layout adapter, every scheme
        assert record["logits_s"] > 0 and record["vllm_adapter_s"] > 0, record
    assert {r["B"] for r in data["chains"]} == {1, 4}
    assert "`standard` verify reaches" in text
    assert not any(n.startswith("run aborted") for n in data["notes"]), data["notes"]


def test_gpu_script_survives_a_failing_step(tmp_path: Path) -> None:
    """One GPU run, eight minutes: a step or a size that raises is a note and the run goes on
    (the steps after it still run and their results are saved)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_run", BENCHMARKS / "gpu" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.Run(module.arguments().parse_args([str(tmp_path), "--device", "cpu"]))

    def fails() -> None:
        raise ValueError("scheme: refused on this device\nsecond line")

    ran = []
    run.attempt("chains: B=1, V=32000", fails)
    run.attempt("tree step", lambda: ran.append(1))
    assert ran == [1]
    note = "chains: B=1, V=32000: aborted: ValueError: scheme: refused on this device"
    assert run.notes == [note]
    assert "aborted: ValueError" in (tmp_path / "results.md").read_text()
    assert module.sync_check(torch, "cpu", fails) == "n/a (CPU)"


@pytest.mark.slow
def test_gpu_script_decodes_on_cpu(tmp_path: Path) -> None:
    """The decoding step: ``benchmarks/gpu/decode.py --tiny`` run by ``run.py``, its table in
    the results."""
    out = tmp_path / "gpu"
    run_script(
        "benchmarks/gpu/run.py",
        str(out),
        "--device",
        "cpu",
        "--quick",
        "--skip-tests",
        "--pathwise-schemes",
        "standard",
    )
    data = json.loads((out / "results.json").read_text())
    assert "| pair | draft | B |" in data["decode"], data["notes"]
    assert len(table_rows(data["decode"], "pair")) >= 2


@pytest.mark.slow
def test_decode_benchmark_quick(tmp_path: Path) -> None:
    """``benchmarks/decode.py --quick`` (random tiny models): both temperature tables, every
    configuration a row, ours with a time split (no timing is asserted)."""
    output = tmp_path / "decode.md"
    run_script("benchmarks/decode.py", "--quick", "--output", str(output))
    text = output.read_text()
    for temperature in ("0", "1"):
        assert f"## T = {temperature}" in text
    rows = table_rows(text, "configuration")
    assert len(rows) == 2 * (3 + 5)  # plain, HF assisted (bf16 and int8 draft), five of ours
    assert all(row[-1] == "-" or row[-1].count("%") == 3 for row in rows)


def test_simulators_benchmark_quick(tmp_path: Path) -> None:
    """``benchmarks/simulators.py --quick``: every case a row with its four rates and ratios."""
    output = tmp_path / "sim.md"
    run_script("benchmarks/simulators.py", "--quick", "--output", str(output))
    rows = table_rows(output.read_text(), "scheme")
    assert [row[0] for row in rows] == ["standard", "traversal", "specinfer"]
    for row in rows:
        assert all(float(cell.rstrip("x").replace(",", "")) > 0 for cell in row[2:]), row


@pytest.mark.slow
def test_simulators_findings_quick(tmp_path: Path) -> None:
    """``benchmarks/simulators_findings.py --quick`` on the synthetic parts (no recorded file)."""
    output = tmp_path / "findings.md"
    run_script(
        "benchmarks/simulators_findings.py",
        "--quick",
        "--recorded",
        str(tmp_path / "none.npz"),
        "--output",
        str(output),
    )
    text = output.read_text()
    for part in ("## A.", "## B.", "## C.", "## D, E."):
        assert part in text
    assert "traversal - specinfer" in text


@pytest.mark.slow
def test_gpu_decode_script_on_cpu(tmp_path: Path) -> None:
    """``benchmarks/gpu/decode.py --tiny`` on CPU: every pair, batch and draft a row; the
    self-draft chain of 4 emits exactly 5 tokens a round (acceptance 1, rounds not cut short)."""
    out = tmp_path / "gpu"
    run_script(
        "benchmarks/gpu/decode.py",
        str(out),
        "--device",
        "cpu",
        "--tiny",
        "--new-tokens",
        "10",
        "--prompt-tokens",
        "8",
    )
    rows = json.loads((out / "decode.json").read_text())
    assert len(rows) == 2 * 3 * 2 * 2 and all(r["random_weights"] for r in rows)
    for r in rows:
        assert 0 <= r["verify_share"] <= 1 and r["tokens_per_second"] > 0
        if r["draft"] == "self":
            assert r["block_efficiency"] == pytest.approx(
                5 if r["shape"] == "chain(4)" else 4, rel=0.25
            )


@pytest.mark.slow
def test_cost_model_benchmark_quick(tmp_path: Path) -> None:
    """``benchmarks/cost_model.py --quick``: every configuration a row with a positive ratio."""
    output = tmp_path / "cost.md"
    run_script("benchmarks/cost_model.py", "--quick", "--output", str(output))
    rows = table_rows(output.read_text(), "scheme")
    assert len(rows) == 4 and all(float(row[-1].rstrip("x")) > 0 for row in rows)
