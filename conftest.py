"""Hypothesis profiles for the whole test suite.

* ``dev`` (default): few examples, fast local feedback, example database on.
* ``ci``: derandomized, no database, no deadline, failing examples printed as reproducible blobs.
* ``thorough``: many more examples, no deadline, for nightly or pre-release runs.

Select with ``HYPOTHESIS_PROFILE=<name>``; when the variable is unset, ``ci`` is used if ``CI``
is set and ``dev`` otherwise. Exact enumeration costs vary a lot between examples, so no profile
has a deadline.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "dev", max_examples=15, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK
)
settings.register_profile(
    "ci",
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK
)

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


LONG_CASES = Path(__file__).resolve().parent / "tests" / "long_cases.txt"


def long_cases(path: Path = LONG_CASES) -> set[str]:
    """The node ids listed in ``tests/long_cases.txt`` (one per line, ``#`` comment lines)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the cases of ``tests/long_cases.txt`` ``slow``, then deselect ``slow`` tests unless a
    marker expression is given (``-m slow`` selects them): the default run stays short, and
    nothing long is skipped silently (they count as deselected).

    Runs first, so ``-m``/``-k`` see the added marks on every collected item; when the whole suite
    was collected (no paths on the command line), an id of the list that no test has any more is
    a usage error, so a renamed test cannot silently move back into the default run."""
    listed = long_cases()
    collected = {item.nodeid for item in items}
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.getoption("-k"):
        stale = sorted(listed - collected)
        if stale:
            message = (
                f"{LONG_CASES.name} lists {len(stale)} node id(s) that no test has: "
                + ", ".join(stale[:5])
            )
            if os.environ.get("PYTEST_XDIST_WORKER") == "gw0":
                # xdist reports a worker's collection error as a crash without its text
                print(f"ERROR: {message}", file=sys.stderr, flush=True)
            raise pytest.UsageError(message)
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
    if config.getoption("-m"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
