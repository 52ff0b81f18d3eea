"""The keyed family lives in ``specsampling.keyed``; the old public modules warn for one release."""

from __future__ import annotations

import importlib
import sys

import pytest

import specsampling as ss
from specsampling.keyed import gls_law, laws, watermark


@pytest.mark.parametrize(
    ("old", "new"),
    [("couplings", laws), ("gls", gls_law), ("watermark", watermark)],
)
def test_old_module_warns_and_reexports(old: str, new: object) -> None:
    sys.modules.pop(f"specsampling.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"specsampling.{old} is deprecated"):
        module = importlib.import_module(f"specsampling.{old}")
    for name in new.__all__:  # type: ignore[attr-defined]
        assert getattr(module, name) is getattr(new, name)


def test_attribute_access_on_the_package_warns() -> None:
    sys.modules.pop("specsampling.couplings", None)
    vars(ss).pop("couplings", None)  # an earlier import bound the submodule on the package
    with pytest.warns(DeprecationWarning):
        assert ss.couplings.decode is laws.decode


def test_keyed_package_reexports_the_field() -> None:
    assert ss.keyed.exponentials is ss.keyed.field.exponentials
    assert ss.keyed.KeyedNoise is ss.keyed.field.KeyedNoise
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = ss.nope
