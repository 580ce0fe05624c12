"""Lets the same sources run compiled (mypyc) and as pure Python."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

__all__ = ["provide_mypyc_attr"]

T = TypeVar("T")


def _mypyc_attr(*_attrs: str, **_kwattrs: object) -> Callable[[T], T]:
    return lambda cls: cls


def provide_mypyc_attr(namespace: MutableMapping[str, Any]) -> None:
    """Bind ``mypyc_attr`` in a module that imports it only for type checking.

    mypyc reads ``@mypyc_attr(...)`` on a native class at build time and never calls
    it, so a compiled module needs no runtime binding; as pure Python the decorator
    runs and must exist, without making ``mypy_extensions`` a runtime dependency.
    """
    namespace.setdefault("mypyc_attr", _mypyc_attr)
