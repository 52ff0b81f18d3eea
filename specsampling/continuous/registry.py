"""The continuous-scheme registry: name -> scheme object (names are resolved only here)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from . import block, dgrs, reflection
from .base import ContinuousScheme


class Registry(Mapping[str, ContinuousScheme]):
    """Read-only mapping of continuous scheme names to scheme objects.

    >>> sorted(SCHEMES)
    ['block', 'dgrs', 'reflection']
    >>> SCHEMES["dgrs"].reference.split(":")[0]
    'arXiv 2609.17691'
    """

    def __init__(self, *schemes: ContinuousScheme) -> None:
        self._schemes = {scheme.name: scheme for scheme in schemes}

    def __getitem__(self, name: str) -> ContinuousScheme:
        try:
            return self._schemes[name]
        except KeyError:
            raise KeyError(
                f"unknown continuous scheme {name!r}; registered: {sorted(self._schemes)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._schemes)

    def __len__(self) -> int:
        return len(self._schemes)

    def __repr__(self) -> str:
        return f"Registry({sorted(self._schemes)})"


SCHEMES = Registry(reflection.SCHEME, dgrs.SCHEME, block.SCHEME)


def get_scheme(scheme: Any) -> ContinuousScheme:
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
