"""The scheme registry: name -> scheme object. Registering a scheme puts it under test."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

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


class Registry(Mapping[str, Scheme]):
    """Read-only mapping of scheme names to scheme objects (``KeyError`` lists the names)."""

    def __init__(self) -> None:
        self._schemes: dict[str, Scheme] = {}

    def register(self, scheme: Scheme) -> Scheme:
        """Add ``scheme`` under ``scheme.name``; a name may be registered once."""
        if scheme.name in self._schemes:
            raise ValueError(f"scheme {scheme.name!r} is already registered")
        self._schemes[scheme.name] = scheme
        return scheme

    def __getitem__(self, name: str) -> Scheme:
        try:
            return self._schemes[name]
        except KeyError:
            raise KeyError(
                f"unknown scheme {name!r}; registered: {sorted(self._schemes)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._schemes)

    def __len__(self) -> int:
        return len(self._schemes)

    def __repr__(self) -> str:
        return f"Registry({sorted(self._schemes)})"


SCHEMES = Registry()
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
