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
from specsampling.errors import UnsupportedShape

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
    "ot_optimal",
    "khisti",
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


def tree_lowering(scheme: Any) -> TreeLowering:
    """:func:`get_lowering`, refusing the keyed couplings (they verify from a key, not from
    per-node uniforms) with :class:`~specsampling.UnsupportedShape` naming the way to run them.

    >>> tree_lowering("specinfer").name
    'specinfer'
    >>> tree_lowering("gumbel")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    specsampling.errors.UnsupportedShape: scheme: 'gumbel' is a keyed coupling ...
    """
    lowering = get_lowering(scheme)
    if not isinstance(lowering, TreeLowering):
        raise UnsupportedShape(
            f"scheme: {lowering.name!r} is a keyed coupling (drafter and verifier share one keyed "
            "noise field), not a tree verifier; run its rounds from a key with "
            "specsampling.gpu.generate(scheme, pair, shape, length, key=...)"
        )
    return lowering


__all__ = [
    "MODULES",
    "SCHEMES",
    "Lowering",
    "NodeLowering",
    "NodeStep",
    "TreeLowering",
    "Verified",
    "get_lowering",
    "tree_lowering",
]
