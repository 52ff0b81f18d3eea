"""The registry of lowerings: reference scheme name -> batched torch object.

Same names as :data:`specsampling.SCHEMES`; registering a lowering puts it under the path-wise
test (``tests/test_gpu_pathwise.py``).

>>> sorted(SCHEMES)
['nss', 'rsd', 'specinfer', 'standard']
"""

from __future__ import annotations

from typing import Any

import specsampling as ss
from specsampling._registry import Registry

from . import nss, rsd, specinfer, standard
from .base import NodeLowering, NodeStep, Verified

#: Lowered schemes by reference name.
SCHEMES: Registry[NodeLowering] = Registry("torch lowering")
for _lowering in (standard.LOWERING, nss.LOWERING, specinfer.LOWERING, rsd.LOWERING):
    SCHEMES.register(_lowering)


def get_lowering(scheme: Any) -> NodeLowering:
    """A registered name, a lowering object, or a registered reference scheme object.

    >>> get_lowering("nss").name, get_lowering(ss.SCHEMES["rsd"]).name
    ('nss', 'rsd')
    """
    if isinstance(scheme, str):
        return SCHEMES[scheme]
    if isinstance(scheme, NodeLowering):
        return scheme
    name = getattr(scheme, "name", None)
    if isinstance(name, str) and name in ss.SCHEMES and ss.SCHEMES[name] is scheme:
        return SCHEMES[name]
    raise TypeError(f"scheme: expected a lowered scheme name or lowering object, got {scheme!r}")


__all__ = ["SCHEMES", "NodeLowering", "NodeStep", "Verified", "get_lowering"]
