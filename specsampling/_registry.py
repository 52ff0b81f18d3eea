"""A read-only name -> object registry, shared by the discrete and continuous scheme registries."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from .errors import UnknownName


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Mapping[str, T], Generic[T]):
    """Read-only mapping of ``item.name`` to items; a missing name's ``KeyError``
    (:class:`~specsampling.errors.UnknownName`, also a ``ValueError``) lists them.

    ``kind`` names what is registered in messages (``"scheme"``, ``"continuous scheme"``).

    >>> from types import SimpleNamespace
    >>> registry: Registry[SimpleNamespace] = Registry("number")
    >>> registry.register(SimpleNamespace(name="one")).name
    'one'
    >>> registry["two"]
    Traceback (most recent call last):
    ...
    specsampling.errors.UnknownName: unknown number 'two'; registered: ['one']
    """

    def __init__(self, kind: str = "scheme") -> None:
        self._kind = kind
        self._items: dict[str, T] = {}

    def register(self, item: T) -> T:
        """Add ``item`` under ``item.name``; a name may be registered once."""
        name = item.name
        if name in self._items:
            raise ValueError(f"{self._kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(
                f"unknown {self._kind} {name!r}; registered: {sorted(self._items)}"
            ) from None

    def lookup(self, name: str, argument: str = "scheme") -> T:
        """``self[name]``, a missing name's error starting with ``argument:``.

        >>> from types import SimpleNamespace
        >>> registry: Registry[SimpleNamespace] = Registry("number")
        >>> registry.lookup("two", "count")
        Traceback (most recent call last):
        ...
        specsampling.errors.UnknownName: count: unknown number 'two'; registered: []
        """
        if name not in self._items:
            raise UnknownName(
                f"{argument}: unknown {self._kind} {name!r}; registered: {sorted(self._items)}"
            )
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({sorted(self._items)})"
