"""Exceptions raised by specsampling."""

from __future__ import annotations


class InvalidDistribution(ValueError):
    """A distribution, token id or noise array is malformed; the message names the argument."""


class UnsupportedShape(ValueError):
    """A scheme was asked to verify drafts whose law it is not exact for."""


class UnknownName(KeyError, ValueError):
    """A name that is not registered (a scheme, say): a ``KeyError`` for mapping lookups and a
    ``ValueError`` for argument checks, whose text reads as written (no quotes around it).

    >>> str(UnknownName("scheme: unknown scheme 'x'"))
    "scheme: unknown scheme 'x'"
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
