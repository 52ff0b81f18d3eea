"""``benchmarks/torch_processing.py`` stays runnable: its ``--quick`` run (seconds) exits cleanly
and writes its six tables (two sizes, each also with peaked and middle logits), one row per
setting (the radix-select-only ablation included), with finite ratios, and Hugging Face's
warpers timed beside each setting it has one for. No timing is asserted: speed claims live in
the results."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = [
    "T = 0.7",
    "top-k 50",
    "top-p 0.9",
    "top-p 0.9, radix select only",
    "top-k 50 + top-p 0.9",
    "T = 0 (greedy)",
]


def test_quick_run_writes_the_table(tmp_path):
    output = tmp_path / "processing.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/torch_processing.py", "--quick", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    text = output.read_text()
    assert "## 18 rows, V = 2,000\n" in text and "## 9 rows, V = 5,000\n" in text
    assert text.count("peaked logits (2 x 3 x N(0, 1))") == 2
    assert text.count("middle logits (1.5 x 3 x N(0, 1))") == 2
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| setting |")
    ]
    assert [row[0] for row in rows] == SETTINGS * 6
    for row in rows:
        assert len(row) == 8, row
        ratios = [float(cell.rstrip("x").replace(",", "")) for cell in row[4:6]]
        assert all(math.isfinite(ratio) and ratio > 0 for ratio in ratios), row
        if row[0] in ("T = 0 (greedy)", "top-p 0.9, radix select only"):
            assert row[6:] == ["—", "—"], row  # no HF warper for greedy; the ablation is ours
        else:  # Hugging Face's warpers, then softmax, timed beside it
            assert math.isfinite(float(row[7].rstrip("x").replace(",", ""))), row
