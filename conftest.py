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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``slow`` tests unless a marker expression is given (``-m slow`` selects them):
    the default run stays short, and nothing long is skipped silently (they count as
    deselected)."""
    if config.getoption("-m"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
