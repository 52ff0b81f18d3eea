"""Exceptions raised by specsampling."""

from __future__ import annotations


class InvalidDistribution(ValueError):
    """A distribution, token id or noise array is malformed; the message names the argument."""


class UnsupportedShape(ValueError):
    """A scheme was asked to verify drafts whose law it is not exact for."""
