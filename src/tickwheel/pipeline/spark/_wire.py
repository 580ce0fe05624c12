"""What the engine's query moves between its stages: the schemas, and how rows and
outcomes travel in them.

Rows travel in blobs, ``marshal``'d lists of their wire form (parsed once, in the
packers, in parallel over the input), compressed with zstd: each crosses the JVM and a
shuffle as bytes, never converted value by value. Outcomes and quarantined rows leave
the last stage as Arrow IPC streams, read once by the driver.
"""

from __future__ import annotations

import json
import marshal
import struct
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from tickwheel.pipeline.events import Quarantined
from tickwheel.pipeline.io import outcomes_table, quarantine_table
from tickwheel.pipeline.partition import PartitionStatus
from tickwheel.pipeline.resolver import OutcomeRow

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["CHUNK_SCHEMA", "END", "FILE_SCHEMA", "FORWARD", "KEY_ROWS", "NONE",
           "OUTPUT_SCHEMA", "PROGRESS_SCHEMA", "decoded", "encoded", "from_ipc",
           "output_frame", "quarantine_ipc", "status_json"]

#: The file sources' columns (the query never selects ``content``: no file is read).
FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"
#: The packers' chunks, grouped by ``grp`` (a stage 1 partition's label). ``dest``
#: says what a chunk is: stage 1's rows (:data:`KEY_ROWS`, with the slice's top in
#: ``ts``), the end of input (:data:`END`, with the point to end at in ``ts``, or
#: :data:`NONE`: just past the latest row read), or rows that stage 1's partition of
#: the same number forwards to stage 2's (:data:`FORWARD`).
CHUNK_SCHEMA = "grp int, dest int, ts long, rows binary"
#: Stage 1's output, grouped by ``grp`` (a stage 2 partition's label): forwarded rows,
#: progress rows, or its release point (``ts``) with its late updates and its status.
PROGRESS_SCHEMA = ("grp int, ts long, rows binary, progress binary, quarantine binary, "
                   "status string")
#: Stage 2's output, one or more rows per partition and micro-batch.
OUTPUT_SCHEMA = "outcomes binary, quarantine binary, status string"

KEY_ROWS = -1
END = -2
FORWARD = 0  # dest >= FORWARD: forward to stage 2's partition ``dest``
#: No time: a long column has no nulls in the processors' frames without turning
#: into floats.
NONE = -(2**63)
#: How blobs travel: zstd at level 1 makes marshal'd rows 6-8 times smaller for about
#: 2 ms per MB in the worker that writes them.
CODEC = "zstd"
_SIZE = struct.Struct("<Q")  # a blob starts with its size, which decompression needs


def encoded(rows: list[Any]) -> bytes:
    """Rows as they travel."""
    import pyarrow as pa

    blob = marshal.dumps(rows)
    packed: bytes = pa.compress(blob, codec=CODEC, asbytes=True)
    return _SIZE.pack(len(blob)) + packed


def decoded(blob: bytes) -> list[Any]:
    """The rows :func:`encoded` was given; no rows for an empty blob."""
    if not blob:
        return []
    import pyarrow as pa

    (size,) = _SIZE.unpack_from(blob)
    raw = pa.decompress(memoryview(blob)[_SIZE.size:], decompressed_size=size,
                        codec=CODEC, asbytes=True)
    rows: list[Any] = marshal.loads(raw)
    return rows


def _ipc(table: pa.Table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=CODEC)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def quarantine_ipc(rows: list[Quarantined]) -> bytes | None:
    return _ipc(quarantine_table(rows)) if rows else None


def status_json(status: PartitionStatus) -> str:
    return json.dumps(asdict(status))


def from_ipc(blobs: list[bytes | None], empty: pa.Table) -> pa.Table:
    import pyarrow as pa

    tables = [pa.ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in blobs if blob]
    return pa.concat_tables(tables) if tables else empty


def output_frame(outcomes: list[OutcomeRow], quarantine: list[Quarantined],
                 statuses: list[PartitionStatus], forwarded: list[tuple[bytes | None, str]],
                 ) -> pd.DataFrame:
    """Stage 2's rows for one call: its outcomes and quarantined rows as Arrow IPC and
    its status, then stage 1's late updates and status, passed on as they came."""
    import pandas as pd

    outcome_blobs: list[bytes | None] = [_ipc(outcomes_table(outcomes)) if outcomes else None]
    quarantine_blobs: list[bytes | None] = [quarantine_ipc(quarantine)]
    texts = [status_json(s) for s in statuses]
    for blob, text in forwarded:
        outcome_blobs.append(None)
        quarantine_blobs.append(blob)
        texts.append(text)
    outcome_blobs += [None] * (len(texts) - len(outcome_blobs))
    quarantine_blobs += [None] * (len(texts) - len(quarantine_blobs))
    return pd.DataFrame({"outcomes": pd.Series(outcome_blobs, dtype=object),
                         "quarantine": pd.Series(quarantine_blobs, dtype=object),
                         "status": pd.Series(texts, dtype=object)})
