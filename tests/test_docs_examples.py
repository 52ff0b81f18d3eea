"""Every fenced ``python`` block in the README and the docs runs (docs are part of the feature).

Each block runs in a fresh interpreter from a scratch directory, so blocks that write files do
not touch the checkout; printed values are checked by the blocks' own comments and by the unit
tests, this test makes sure no example is broken.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
EXAMPLES = [
    pytest.param(code, id=f"{page.relative_to(ROOT)}#{i}")
    for page in PAGES
    for i, code in enumerate(BLOCK.findall(page.read_text()))
]


def test_the_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 20


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs(code: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
