"""pyarrow, imported on first use and naming the extra that installs it when missing,
and a Parquet file opened by Python: Parquet input, and every output file."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["open_parquet", "pyarrow_modules"]


def pyarrow_modules() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("Parquet needs pyarrow: pip install 'tickwheel[cli]'") from exc
    return pa, pq


@contextlib.contextmanager
def open_parquet(path: Path) -> Iterator[Any]:
    """``pyarrow.parquet.ParquetFile`` over a file Python opened: pyarrow encodes a
    path as UTF-8, which a name holding a byte that is not (a surrogate) cannot be."""
    _, pq = pyarrow_modules()
    with open(path, "rb") as raw, pq.ParquetFile(raw) as file:
        yield file
