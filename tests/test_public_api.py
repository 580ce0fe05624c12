"""The public API is the package root's sorted ``__all__``; everything else is private."""

from __future__ import annotations

import types

import tickwheel


def test_all_is_sorted_and_unique() -> None:
    assert list(tickwheel.__all__) == sorted(set(tickwheel.__all__))


def test_every_exported_name_exists() -> None:
    for name in tickwheel.__all__:
        assert hasattr(tickwheel, name), name


def test_no_public_name_is_left_out_of_all() -> None:
    # Subpackages are reachable as attributes once imported; they are not exports.
    public = {n for n, v in vars(tickwheel).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public - {"annotations"} == set(tickwheel.__all__)


def test_compiled_is_a_bool() -> None:
    assert isinstance(tickwheel.compiled, bool)
