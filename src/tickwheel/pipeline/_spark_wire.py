"""What crosses the JVM between the query's stages: the schemas, the chunks the
packers make for the shards (their rows compressed), the control chunks, and the
Arrow IPC streams a shard hands its outcomes and quarantined rows over in."""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from tickwheel.pipeline.events import Quarantined
from tickwheel.pipeline.io import outcomes_table, quarantine_table
from tickwheel.pipeline.resolver import OutcomeRow
from tickwheel.pipeline.shard import NO_ROWS, Chunk, ShardStatus

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["BINARY_FILE_SCHEMA", "CHUNK_SCHEMA", "CODEC", "END_MARKER", "NO_TOP",
           "OUTPUT_SCHEMA", "WATERMARK_MARKER", "chunk_batch", "compressed", "control_chunk",
           "decompressed", "from_ipc", "ipc", "output_frame", "spark_schema"]

OUTPUT_SCHEMA = "outcomes binary, quarantine binary, status string"
# A chunk with both blobs empty is a control chunk: data chunks hold marshal'd lists,
# never empty bytes. See `Chunk` for low and ts (its top). A control chunk's low says
# what it is: a watermark marker (its ts less the lateness is the watermark it brings)
# or the end of input (every shard moves just past the input's latest row).
CHUNK_SCHEMA = "shard int, low long, ts long, own binary, shared binary"
WATERMARK_MARKER = NO_ROWS
END_MARKER = NO_ROWS - 1
#: The ts of a chunk without one (no well-formed row, or the end of input): the
#: smallest that F.timestamp_millis takes, so it never raises Spark's watermark, and
#: not a null, which would make the column's values floats in the processor's frames.
NO_TOP = -(2**63 // 1000)
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"


@functools.cache
def spark_schema(ddl: str) -> StructType:
    """The schema a DDL string of simple columns (``name type, ...``) describes.

    Built here instead of handing Spark the string: Spark parses DDL with its SQL
    parser in the JVM, slow on a cold JVM, and the five parses of a run's query took
    45 ms of its start (0.28 against 0.24 s to define the query, three runs each)."""
    from pyspark.sql import types

    kinds = {"string": types.StringType, "timestamp": types.TimestampType,
             "long": types.LongType, "int": types.IntegerType, "binary": types.BinaryType}
    fields = []
    for column in ddl.split(","):
        name, _, kind = column.strip().partition(" ")
        if kind not in kinds:
            raise ValueError(f"column {name!r} of {ddl!r}: type {kind!r} is not one of "
                             f"{', '.join(kinds)}")
        fields.append(types.StructField(name, kinds[kind]()))
    return types.StructType(fields)


#: How chunks' blobs and the processor's Arrow IPC streams travel. Everything a run
#: reads crosses the JVM three times as chunks (from the packers, through the shuffle,
#: to the shards) and its outcomes twice more (to the driver, as Arrow for
#: ``toArrow``): 94 MB and 42 MB for the 1M-event log, all copied, converted and
#: collected by the JVM. zstd (level 1) makes a chunk's marshal'd rows 6-8 times
#: smaller at about 2 ms per MB in the worker that packs them. With it, cold 1M-event
#: runs took 6.85 s against 7.74 s on local[2] and 11.0 s against 12.4 s on local[1],
#: warm ones 5.67 s against 6.34 s and 10.1 s against 11.0 s (medians of three and two
#: pairs of fresh processes on this 2-core machine).
CODEC = "zstd"
#: A compressed blob starts with its size, which decompression needs.
_SIZE = struct.Struct("<Q")


def compressed(blob: bytes) -> bytes:
    """``blob`` as it travels: compressed, its size first; empty stays empty (a
    control chunk's mark)."""
    if not blob:
        return blob
    import pyarrow as pa

    packed: bytes = pa.compress(blob, codec=CODEC, asbytes=True)
    return _SIZE.pack(len(blob)) + packed


def decompressed(blob: bytes) -> bytes:
    """The bytes :func:`compressed` was given."""
    if not blob:
        return blob
    import pyarrow as pa

    (size,) = _SIZE.unpack_from(blob)
    out: bytes = pa.decompress(memoryview(blob)[_SIZE.size:], decompressed_size=size,
                               codec=CODEC, asbytes=True)
    return out


def ipc(table: pa.Table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=CODEC)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(blobs: list[bytes | None], empty: pa.Table) -> pa.Table:
    import pyarrow as pa

    tables = [pa.ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in blobs if blob]
    return pa.concat_tables(tables) if tables else empty


def output_frame(outcomes: list[OutcomeRow], quarantine: list[Quarantined],
           status: ShardStatus) -> pd.DataFrame:
    """One row per handler call: the outcomes and the quarantined rows as Arrow IPC
    streams, and the shard's status. Rows of the contract's columns, one per outcome,
    cost a conversion per value in the worker (pandas to Arrow) and again in the JVM
    (Arrow to rows and back for the driver); blobs pass through both as bytes."""
    import pandas as pd

    return pd.DataFrame({
        "outcomes": pd.Series([ipc(outcomes_table(outcomes)) if outcomes else None],
                              dtype=object),
        "quarantine": pd.Series([ipc(quarantine_table(quarantine)) if quarantine else None],
                                dtype=object),
        "status": pd.Series([json.dumps(asdict(status))], dtype=object),
    })


def chunk_batch(chunks: list[Chunk], labels: list[int]) -> pa.RecordBatch:
    import pyarrow as pa

    schema = pa.schema([("shard", pa.int32()), ("low", pa.int64()), ("ts", pa.int64()),
                        ("own", pa.binary()), ("shared", pa.binary())])
    shard_ids, lows, tops, own, shared = zip(*chunks, strict=True)
    # Every chunk of a slice holds the same shared rows (one bytes object): compressed
    # once.
    packed: dict[int, bytes] = {}
    for blob in shared:
        if id(blob) not in packed:
            packed[id(blob)] = compressed(blob)
    return pa.RecordBatch.from_arrays(
        [pa.array([labels[s] for s in shard_ids], pa.int32()), pa.array(lows, pa.int64()),
         pa.array([NO_TOP if top is None else top for top in tops], pa.int64()),
         pa.array([compressed(blob) for blob in own], pa.binary()),
         pa.array([packed[id(blob)] for blob in shared], pa.binary())], schema=schema)


def control_chunk(marker: dict[str, Any], shard: int) -> Chunk:
    if marker.get("end"):
        return (shard, END_MARKER, NO_TOP, b"", b"")
    return (shard, WATERMARK_MARKER, int(marker["ts_ms"]), b"", b"")
