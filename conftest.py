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
