"""What the engine's query moves between its stages: the schemas, and how rows and
outcomes travel in them.

Rows travel in blobs, ``marshal``'d lists of their wire form (parsed once, in the
packers, in parallel over the input), compressed with zstd: each crosses the JVM and a
shuffle as bytes, never converted value by value. Outcomes and quarantined rows leave
the last stage as Arrow IPC streams, which the executors write to the output files.

Every value and every frame a worker hands the JVM is of bounded size (a blob of
:data:`BLOB_ROWS` rows or about :data:`BLOB_BYTES`, a frame of about
:data:`FRAME_BYTES`): a micro-batch whose input is all malformed rows of a megabyte
each must not become one value, or one Arrow batch, past the JVM's limits.
"""

from __future__ import annotations

import json
import marshal
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

from tickwheel.pipeline.contract.events import OutcomeKind, Quarantined
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.io.outputs import (
    outcome_size,
    outcomes_table,
    quarantine_table,
    quarantined_size,
)
from tickwheel.pipeline.semantics.partition import (
    CommittedChanges,
    PartitionChanges,
    PartitionStatus,
)

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["BLOB_BYTES", "BLOB_ROWS", "CHUNK_SCHEMA", "END", "FILE_SCHEMA", "FORWARD",
           "FRAME_BYTES", "KEY_ROWS", "NONE", "OUTPUT_SCHEMA", "PROGRESS_SCHEMA",
           "WRITTEN_SCHEMA", "committed_view", "decoded", "encoded", "frames", "from_ipc",
           "ipc_pieces", "output_frames", "quarantine_ipcs", "status_json", "view_changes"]

T = TypeVar("T")

#: The file sources' columns (the query never selects ``content``: no file is read).
FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"
#: The packers' chunks, grouped by ``grp`` (a stage 1 partition's label). ``dest``
#: says what a chunk is: stage 1's rows (:data:`KEY_ROWS`, with the slice's top in
#: ``ts``; ``rows`` holds them and the times of the slice's rows for stage 2's
#: partition of the same number), the end of input (:data:`END`, with the point to
#: end at in ``ts``, or :data:`NONE`: just past the latest row read), or rows that
#: stage 1's partition of the same number forwards to stage 2's (:data:`FORWARD`).
CHUNK_SCHEMA = "grp int, dest int, ts long, rows binary"
#: Stage 1's output, grouped by ``grp`` (a stage 2 partition's label): forwarded rows,
#: progress rows with the runs of the row times released (every stage 1 partition
#: sends every stage 2 partition its runs), or its release point (``ts``) with its
#: late updates and its status.
PROGRESS_SCHEMA = ("grp int, ts long, rows binary, progress binary, quarantine binary, "
                   "status string")
#: Stage 2's output, one or more rows per partition and micro-batch.
OUTPUT_SCHEMA = "outcomes binary, quarantine binary, status string, view binary"
#: What the executors that write a micro-batch's output files tell the driver: each
#: partition's statuses, and the rows they wrote.
WRITTEN_SCHEMA = "status string, outcomes long, quarantined long, view binary"
#: A blob of outcomes or quarantined rows holds at most this many rows ...
BLOB_ROWS = 65_536
#: ... and about this many bytes (by :func:`~tickwheel.pipeline.io.outputs.outcome_size` and
#: :func:`~tickwheel.pipeline.io.outputs.quarantined_size`).
BLOB_BYTES = 16 << 20
#: A frame a worker yields holds about this many bytes of blobs (one blob at least).
FRAME_BYTES = 64 << 20

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


def ipc_pieces(rows: Sequence[T], to_table: Callable[[list[T]], pa.Table],
               size: Callable[[T], int]) -> list[bytes]:
    """``rows`` as Arrow IPC blobs of at most :data:`BLOB_ROWS` rows and about
    :data:`BLOB_BYTES` each; none for no rows."""
    pieces: list[bytes] = []
    start = weight = 0
    for i, row in enumerate(rows):
        weight += size(row)
        if i + 1 - start >= BLOB_ROWS or weight >= BLOB_BYTES:
            pieces.append(_ipc(to_table(list(rows[start:i + 1]))))
            start, weight = i + 1, 0
    if start < len(rows):
        pieces.append(_ipc(to_table(list(rows[start:]))))
    return pieces


def quarantine_ipcs(rows: list[Quarantined]) -> list[bytes]:
    return ipc_pieces(rows, quarantine_table, quarantined_size)


def status_json(status: PartitionStatus) -> str:
    return json.dumps(asdict(status))


def from_ipc(blobs: list[bytes | None], empty: pa.Table) -> pa.Table:
    import pyarrow as pa

    tables = [pa.ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in blobs if blob]
    return pa.concat_tables(tables) if tables else empty


def frames(columns: dict[str, str], rows: list[tuple[Any, ...]]) -> Iterator[pd.DataFrame]:
    """``rows`` (tuples in the order of ``columns``, which maps a column to its dtype) as
    frames of about :data:`FRAME_BYTES` of bytes values each; one frame at least."""
    import pandas as pd

    def frame(part: list[tuple[Any, ...]]) -> pd.DataFrame:
        cells = list(zip(*part, strict=True)) if part else [() for _ in columns]
        return pd.DataFrame({name: pd.Series(list(values), dtype=dtype)
                             for (name, dtype), values in zip(columns.items(), cells,
                                                               strict=True)})

    start = weight = 0
    for i, row in enumerate(rows):
        weight += sum(len(v) for v in row if isinstance(v, bytes))
        if weight >= FRAME_BYTES:
            yield frame(rows[start:i + 1])
            start, weight = i + 1, 0
    if start < len(rows) or not rows:
        yield frame(rows[start:])


_OUTPUT_COLUMNS = {"outcomes": "object", "quarantine": "object", "status": "object",
                   "view": "object"}


def output_frames(outcomes: list[OutcomeRow], quarantine: list[Quarantined],
                  statuses: list[PartitionStatus], forwarded: list[tuple[bytes | None, str | None]],
                  view: bytes | None = None) -> Iterator[pd.DataFrame]:
    """Stage 2's rows for one call: its outcomes and quarantined rows as Arrow IPC
    blobs and its status, then stage 1's late updates and statuses, passed on as they
    came, and what the call changed for a reader's view (:func:`view_changes`)."""
    rows: list[tuple[Any, ...]] = [
        *((blob, None, None, None) for blob in ipc_pieces(outcomes, outcomes_table,
                                                          outcome_size)),
        *((None, blob, None, None) for blob in quarantine_ipcs(quarantine)),
        *((None, None, status_json(s), None) for s in statuses),
        *((None, blob, text, None) for blob, text in forwarded)]
    if view is not None:
        rows.append((None, None, None, view))
    return frames(_OUTPUT_COLUMNS, rows)


def view_changes(changes: PartitionChanges, outcomes: list[OutcomeRow],
                 held: list[tuple[str, Any]] | None) -> bytes:
    """What an op partition's call changed, for a reader's view in the driver: its
    changed entries, the op ids it forgot, its outcomes (id, outcome, resolved_ms,
    latency_ms), and, from a partition restored rather than kept in its worker (a new
    application, a worker lost, an attempt run again), every entry it holds."""
    return encoded([changes.entries, [op_id for op_id, first in changes.seen if first is None],
                    [(row.op_id, row.outcome.value, row.resolved_ms, row.latency_ms)
                     for row in outcomes], held])


def committed_view(batch_id: int, blobs: list[bytes], release_ms: int | None,
                   ) -> CommittedChanges:
    """The blobs of :func:`view_changes` that one batch's partitions sent, as the
    local engine gives its own (a partition's entries after its changes)."""
    entries: list[tuple[str, Any]] = []
    forgotten: list[tuple[str, int | None]] = []
    outcomes: list[OutcomeRow] = []
    for blob in blobs:
        changed, gone, rows, held = decoded(blob)
        entries += changed
        if held is not None:
            entries += held
        forgotten += [(op_id, None) for op_id in gone]
        outcomes += [OutcomeRow(op_id, OutcomeKind(kind), resolved, latency, (), None)
                     for op_id, kind, resolved, latency in rows]
    return CommittedChanges(batch_id, entries, forgotten, outcomes, release_ms)
