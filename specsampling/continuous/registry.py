"""The continuous-scheme registry: name -> scheme object (names are resolved only here)."""

from __future__ import annotations

from typing import TypeAlias

from .._registry import Registry
from . import block, dgrs, reflection
from .base import ContinuousScheme

#: The continuous schemes by name.
#:
#: >>> sorted(SCHEMES)
#: ['block', 'dgrs', 'reflection']
#: A registered continuous scheme name or a scheme object.
ContinuousSchemeLike: TypeAlias = "str | ContinuousScheme"

SCHEMES: Registry[ContinuousScheme] = Registry("continuous scheme")
for _scheme in (reflection.SCHEME, dgrs.SCHEME, block.SCHEME):
    SCHEMES.register(_scheme)


def get_scheme(scheme: ContinuousSchemeLike) -> ContinuousScheme:
    """Resolve a registered name, or pass a scheme object through.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the registered names).
    TypeError
        For anything that is neither a name nor a scheme object.

    Examples
    --------
    >>> get_scheme("reflection").name
    'reflection'
    >>> get_scheme("rmc")
    Traceback (most recent call last):
    ...
    ValueError: scheme: unknown continuous scheme 'rmc'; registered: ['block', 'dgrs', 'reflection']
    """
    if isinstance(scheme, str):
        if scheme not in SCHEMES:
            raise ValueError(
                f"scheme: unknown continuous scheme {scheme!r}; registered: {sorted(SCHEMES)}"
            )
        return SCHEMES[scheme]
    if isinstance(scheme, ContinuousScheme):
        return scheme
    raise TypeError(
        f"scheme: expected a registered name or a continuous scheme object, got {scheme!r}"
    )
