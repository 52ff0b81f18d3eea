"""The scheme registry: name -> scheme object. Registering a scheme puts it under test."""

from __future__ import annotations

from typing import Any

from .._registry import Registry
from . import (
    block,
    gls,
    greedy,
    gumbel,
    nss,
    resispec,
    rsd,
    spechub,
    specinfer,
    spectr,
    standard,
    traversal,
)
from .base import NodeScheme, Scheme, TreeScheme, Verdict, VerdictLaw, tables
from .coupled import KeyedScheme

#: The registry of discrete schemes; registering a scheme puts it under test.
SCHEMES: Registry[Scheme] = Registry("scheme")
for _module in (standard, nss, specinfer, rsd, block, traversal, spectr, greedy, spechub, resispec):
    SCHEMES.register(_module.SCHEME)
for _keyed in (gumbel.GUMBEL, gumbel.POISSON, gls.GLS_ACTIVE, gls.GLS_STRONG):
    SCHEMES.register(_keyed)


def get_scheme(scheme: Any) -> Scheme:
    """Resolve a registered name or pass a scheme object through.

    >>> get_scheme("nss").name
    'nss'
    """
    if isinstance(scheme, str):
        return SCHEMES[scheme]
    if isinstance(scheme, Scheme):
        return scheme
    raise TypeError(f"scheme: expected a registered name or a scheme object, got {scheme!r}")


__all__ = [
    "SCHEMES",
    "KeyedScheme",
    "NodeScheme",
    "Registry",
    "Scheme",
    "TreeScheme",
    "Verdict",
    "VerdictLaw",
    "get_scheme",
    "tables",
]
