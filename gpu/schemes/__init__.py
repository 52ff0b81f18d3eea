"""The registry of lowerings: reference scheme name -> batched torch object.

Same names as :data:`specsampling.SCHEMES`. Each module listed in ``MODULES`` (same file name as
the reference module it lowers) defines ``LOWERINGS``, the lowerings it holds; registering a
lowering puts it under the path-wise test (``tests/test_gpu_pathwise.py``).

>>> all(name in SCHEMES for name in ("standard", "nss", "specinfer", "rsd"))
True
"""

from __future__ import annotations

import importlib
from typing import Any

import specsampling as ss
from specsampling._registry import Registry

from .base import Lowering, NodeLowering, NodeStep, TreeLowering, Verified

#: The lowering modules, in registration order (one line each).
MODULES = (
    "standard",
    "nss",
    "specinfer",
    "rsd",
    "greedy",
    "spechub",
    "spectr",
    "resispec",
    "block",
    "traversal",
    "gumbel",
    "gls",
)

#: Lowered schemes by reference name.
SCHEMES: Registry[Lowering] = Registry("torch lowering")
for _module in MODULES:
    for _lowering in importlib.import_module(f"{__name__}.{_module}").LOWERINGS:
        SCHEMES.register(_lowering)


def get_lowering(scheme: Any) -> Lowering:
    """A registered name, a lowering object, or a registered reference scheme object.

    >>> get_lowering("nss").name, get_lowering(ss.SCHEMES["rsd"]).name
    ('nss', 'rsd')
    """
    if isinstance(scheme, str):
        return SCHEMES[scheme]
    if isinstance(scheme, Lowering):
        return scheme
    name = getattr(scheme, "name", None)
    if isinstance(name, str) and name in ss.SCHEMES and ss.SCHEMES[name] is scheme:
        return SCHEMES[name]
    raise TypeError(f"scheme: expected a lowered scheme name or lowering object, got {scheme!r}")


__all__ = [
    "MODULES",
    "SCHEMES",
    "Lowering",
    "NodeLowering",
    "NodeStep",
    "TreeLowering",
    "Verified",
    "get_lowering",
]
