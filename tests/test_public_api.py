"""The public API is the sorted ``__all__`` of the package root and of ``tickwheel.aio``;
everything else is private."""

from __future__ import annotations

import types

import pytest

import tickwheel
import tickwheel.aio

PACKAGES = [tickwheel, tickwheel.aio]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_is_sorted_and_unique(package: types.ModuleType) -> None:
    assert list(package.__all__) == sorted(set(package.__all__))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_exported_name_exists(package: types.ModuleType) -> None:
    for name in package.__all__:
        assert hasattr(package, name), name


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_no_public_name_is_left_out_of_all(package: types.ModuleType) -> None:
    # Subpackages are reachable as attributes once imported; they are not exports.
    public = {n for n, v in vars(package).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public - {"annotations"} == set(package.__all__)


def test_compiled_is_a_bool() -> None:
    assert isinstance(tickwheel.compiled, bool)
