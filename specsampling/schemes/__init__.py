"""The scheme registry: name -> scheme object. Registering a scheme puts it under test."""

from __future__ import annotations

from .._registry import Registry
from . import (
    block,
    gls,
    greedy,
    gumbel,
    khisti,
    nss,
    ot_binned,
    ot_optimal,
    resispec,
    rsd,
    spechub,
    specinfer,
    spectr,
    standard,
    traversal,
)
from .base import (
    KeyedCoupling,
    NodeScheme,
    Scheme,
    SchemeLike,
    TreeScheme,
    TreeVerifier,
    Verdict,
    VerdictLaw,
    tables,
)
from .coupled import KeyedScheme

#: The registry of discrete schemes; registering a scheme puts it under test.
SCHEMES: Registry[Scheme] = Registry("scheme")
for _scheme in (
    standard.SCHEME,
    nss.SCHEME,
    specinfer.SCHEME,
    rsd.SCHEME,
    block.SCHEME,
    traversal.SCHEME,
    spectr.SCHEME,
    greedy.SCHEME,
    spechub.SCHEME,
    resispec.SCHEME,
    gumbel.GUMBEL,
    gumbel.POISSON,
    gls.GLS_ACTIVE,
    gls.GLS_STRONG,
    ot_optimal.SCHEME,
    ot_binned.SCHEME,
    khisti.SCHEME,
):
    SCHEMES.register(_scheme)


def get_scheme(scheme: SchemeLike) -> Scheme:
    """Resolve a registered name or pass a scheme object through.

    >>> get_scheme("nss").name
    'nss'
    >>> get_scheme("stndard")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    specsampling.errors.UnknownName: scheme: unknown scheme 'stndard'; registered: ['block', ...]
    """
    if isinstance(scheme, str):
        return SCHEMES.lookup(scheme, "scheme")
    if isinstance(scheme, Scheme):
        return scheme
    raise TypeError(f"scheme: expected a registered name or a scheme object, got {scheme!r}")


__all__ = [
    "SCHEMES",
    "KeyedCoupling",
    "KeyedScheme",
    "NodeScheme",
    "Registry",
    "Scheme",
    "SchemeLike",
    "TreeScheme",
    "TreeVerifier",
    "Verdict",
    "VerdictLaw",
    "get_scheme",
    "tables",
]
