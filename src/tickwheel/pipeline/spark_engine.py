"""The Spark engine: the purgatory as a Spark Structured Streaming job.

Needs ``pip install 'tickwheel[spark]'`` (PySpark, pandas, protobuf, pyarrow) and a
JVM. One query:

1. binary file sources, listing files only, over the event directory's JSON Lines
   files (``*.jsonl``, ``*.json``), which the packers read from the listed paths and
   split into lines as the reference engine reads them, over its ``*.parquet`` files,
   read by the reference engine's reader, and over ``CHECKPOINT/control/``, which only
   ever holds end-of-input markers;
2. ``mapInArrow`` cuts the rows of each file into one chunk per shard (see
   :mod:`tickwheel.pipeline.shard`): watches and cancels by ``op_id``, updates and
   ticks to every shard, and gives each chunk the largest ``ts_ms`` it holds;
3. an event-time watermark on that, ``lateness_ms`` behind the largest ``ts_ms``;
4. ``transformWithStateInPandas`` grouped by shard, in event time: each shard keeps a
   :class:`~tickwheel.pipeline.shard.Shard` (held rows, pending operations, key
   values) in the state store and one event-time timer at its next held row or
   deadline; rows are parsed and checked in Python, by the same code as the reference
   engine, so nothing is coerced;
5. ``foreachBatch`` writes the batch's outcomes, quarantined rows and shard counters
   to ``batch-<id>.parquet`` files, atomically and named by batch id, so a batch that
   runs again after a crash replaces its own files: exactly once, with readers that
   just read ``*.parquet``; then it hands the outcomes to an optional
   :class:`~tickwheel.pipeline.sink.OutcomeSink` (the batching dispatcher), which
   :class:`~tickwheel.pipeline.delivery.BatchDelivery` feeds while the next batch runs.

Spark drops rows at or below the watermark before a stateful operator sees them, so
the event-time column is not passed to it: shards find late rows themselves and
quarantine them. A run with ``final=True`` ends the input: once the query has caught
up with the input, a marker row moves the watermark just past the last row, in the
same query, so every row is applied and the outcomes are the reference engine's
(later rows at or before that point are late). A run with ``final=False`` is an
``availableNow`` query.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import pickle
import re
import struct
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tickwheel._validate import check_positive_int
from tickwheel.pipeline import _worker_state
from tickwheel.pipeline._seen_log import LogHead, load_seen, save_seen
from tickwheel.pipeline._spark_python import launcher
from tickwheel.pipeline.class_archive import archive_options
from tickwheel.pipeline.delivery import BatchDelivery
from tickwheel.pipeline.events import Quarantined
from tickwheel.pipeline.io import json_lines, outcomes_table, parquet_events, quarantine_table
from tickwheel.pipeline.resolver import OutcomeRow
from tickwheel.pipeline.shard import NO_ROWS, Chunk, Shard, ShardStatus, pack, pack_rows
from tickwheel.pipeline.sink import OutcomeSink

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.stateful_processor import (
        ExpiredTimerInfo,
        StatefulProcessorHandle,
        TimerValues,
    )
    from pyspark.sql.types import StructType

__all__ = ["SparkEngine", "SparkRunResult", "spark_session"]

log = logging.getLogger(__name__)

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OUTPUT_SCHEMA = "outcomes binary, quarantine binary, status string"
# A chunk with both blobs empty is a control chunk: data chunks hold marshal'd lists,
# never empty bytes. See `Chunk` for low and ts (its top). A control chunk's low says
# what it is: a watermark marker (its ts less the lateness is the watermark it brings)
# or the end of input (every shard moves just past the input's latest row).
CHUNK_SCHEMA = "shard int, low long, ts long, own binary, shared binary"
_WATERMARK_MARKER = NO_ROWS
_END_MARKER = NO_ROWS - 1
#: The ts of a chunk without one (no well-formed row, or the end of input): the
#: smallest that F.timestamp_millis takes, so it never raises Spark's watermark, and
#: not a null, which would make the column's values floats in the processor's frames.
_NO_TOP = -(2**63 // 1000)
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"
# The checkpoint is always a local directory. Spark's default manager writes it
# through Hadoop's FileContext, whose rename asks for each path's link status, and
# without Hadoop's native library that runs ``readlink`` in a new process: four per
# file written, about 500 per cold 1M-event run, on the driver's path between
# batches. The FileSystem manager renames with rename(2), atomic on a local disk:
# 1.1-2.1 s less for a cold 1M-event run on local[2] (three pairs of runs).
CHECKPOINT_MANAGER_SETTING = "spark.sql.streaming.checkpointFileManagerClass"
CHECKPOINT_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                      "FileSystemBasedCheckpointFileManager")
_LOCAL = re.compile(r"local\[(\d+|\*)\]")
#: Held rows at which a shard releases what it can in the middle of a micro-batch. A
#: worker of a cold 1M-event run on local[2] (all the input in one micro-batch) held
#: 724k rows per shard and peaked at 870 MB. At this many, a shard of that run
#: releases 6 times and its worker peaked at 540 MB; the cold run on local[2] was
#: faster in five pairs of five. Releasing after every chunk (19 times, 515 MB) cost
#: warm runs on local[1] 2 s: each release sorts what stays held and runs the
#: resolver once more, and one core pays that in full.
_RELEASE_AT_HELD_ROWS = 100_000
#: Passes a final run waits for its end-of-input marker: one is enough unless a
#: trigger raced with writing it.
_END_OF_INPUT_TRIES = 10


#: The driver JVM's options in local mode. One JVM does all of Spark's work there, on
#: the same few cores as the Python workers, and a run of a few minutes never pays
#: back the C2 compiler's threads: with C1 only and the parallel collector the JVM
#: used 39-44 s of CPU instead of 52-69 s for a cold 1M-event run on 2 cores (three
#: runs each), and warm runs were no slower. Clusters keep their own settings.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC"

# Huge pages for a local JVM and its Python workers, where the kernel hands them out
# on request (transparent huge pages in ``madvise`` or ``always`` mode). A cold run
# spends much of its system time faulting in fresh 4 KiB pages and zeroing them: the
# JVM's heap as it grows, and the malloc'd buffers of Arrow, Netty and RocksDB in the
# JVM and of the workers, which glibc hands back to the kernel and takes again batch
# after batch. In a cold 1M-event run on local[2] the JVM took 732k page faults (83k
# with huge pages) and its workers 535k (299k); its time fell from 11.1-11.3 s to
# 9.4-10.7 s (three pairs of runs), and warm runs were 2-15% faster.
_THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_HUGE_PAGE_JAVA_OPTION = "-XX:+UseTransparentHugePages"
_HUGE_PAGE_MALLOC = "glibc.malloc.hugetlb"


@functools.cache
def _schema(ddl: str) -> StructType:
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


def _huge_pages_on_request(mode_file: Path = _THP_MODE_FILE) -> bool:
    """Whether a process may ask for transparent huge pages: the kernel's mode (the
    bracketed word of ``always [madvise] never``) is not ``never``. Without them the
    JVM would print a warning at start."""
    try:
        mode = mode_file.read_text()
    except OSError:  # not Linux, or no THP in this kernel
        return False
    return "[" in mode and "[never]" not in mode


def _with_huge_page_malloc(tunables: str | None) -> str:
    """``GLIBC_TUNABLES`` asking glibc's malloc (2.35 and later; older ones ignore it)
    to back its arenas and large blocks with huge pages; a user's own
    ``glibc.malloc.hugetlb`` stays as it is, and so do their other tunables."""
    if not tunables:
        return f"{_HUGE_PAGE_MALLOC}=1"
    if any(t.split("=", 1)[0] == _HUGE_PAGE_MALLOC for t in tunables.split(":")):
        return tunables
    return f"{tunables}:{_HUGE_PAGE_MALLOC}=1"


@contextlib.contextmanager
def _environment_variable(name: str, value: str) -> Iterator[None]:
    """``name=value`` for the processes started meanwhile (the JVM, and through it its
    Python workers), not for this process's own later children."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def spark_session(master: str | None = "local[2]", app_name: str = "tickwheel",
                  driver_memory: str = "4g", jvm_log: Path | None = None,
                  java_options: str | None = None) -> SparkSession:
    """A session with what the engine needs: the RocksDB state store (required by
    ``transformWithState``), this interpreter for Python workers (unless
    ``PYSPARK_PYTHON`` says otherwise), quiet logs.

    With ``jvm_log``, a JVM started here writes its console output there instead of
    this process's terminal: its start-up warnings, and the lines PySpark's
    transformWithState driver worker prints for every query.

    ``java_options`` become ``spark.driver.extraJavaOptions``; by default, for a
    ``local`` master, :data:`LOCAL_JAVA_OPTIONS` and the class archive if one has been
    made (see :mod:`tickwheel.pipeline.class_archive`), and nothing otherwise. Like
    ``driver_memory``, they apply only to a JVM this call starts. A ``local`` master
    also leaves shuffle blocks uncompressed, and where the kernel offers transparent
    huge pages on request, its JVM (``-XX:+UseTransparentHugePages``, by default) and
    Python workers (``GLIBC_TUNABLES``) use them.

    ``master=None`` takes the master, the JVM's memory and options and any other
    setting from ``spark-submit`` (its JVM is up before this runs) or Spark's defaults
    file, and adds only what the engine needs; see :mod:`tickwheel.spark_job`."""
    if "PYSPARK_PYTHON" not in os.environ:
        # Workers of a local master run this interpreter; tickwheel-spark-python
        # starts it with the installed PySpark's bytecode instead of its zips.
        local = launcher() if master is not None and master.startswith("local") else None
        os.environ["PYSPARK_PYTHON"] = local or sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    is_local = master is not None and master.startswith("local")
    huge_pages = is_local and _huge_pages_on_request()
    if java_options is None and is_local:
        java_options = " ".join(
            option for option in (LOCAL_JAVA_OPTIONS,
                                  _HUGE_PAGE_JAVA_OPTION if huge_pages else "",
                                  archive_options()) if option)
    builder = SparkSession.builder
    if master is not None:  # an embedded session; spark-submit's user chooses these
        builder = (builder.master(master).appName(app_name)
                   .config("spark.driver.memory", driver_memory)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false"))
    builder = (builder
               .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000")
               .config("spark.python.daemon.module", "tickwheel.pipeline._spark_daemon"))
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if is_local:
        # Shuffle blocks never leave this machine, so compressing them (lz4, the
        # chunks' marshal'd rows every micro-batch) only spent CPU on the cores the
        # workers need: a 1M-event run took 10% less time cold and 16% warm without
        # it (three pairs of runs on local[2]).
        builder = builder.config("spark.shuffle.compress", "false")
    with contextlib.ExitStack() as launch:
        if jvm_log is not None:
            launch.enter_context(_console_output_to(jvm_log))
        if huge_pages:
            launch.enter_context(_environment_variable(
                "GLIBC_TUNABLES", _with_huge_page_malloc(os.environ.get("GLIBC_TUNABLES"))))
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def _console_output_to(path: Path) -> Iterator[None]:
    """Point this process's stdout and stderr file descriptors at ``path`` for a while:
    a child started meanwhile (the JVM) keeps them, this process gets its own back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


@dataclass(frozen=True, slots=True)
class SparkRunResult:
    """What a run left in the outputs and the state (summed over shards)."""

    rows_in: int
    rows_applied: int
    quarantined: int
    held: int  # read, not yet applied: the watermark has not passed them
    pending: int
    ignored_cancels: int
    watermark_ms: int
    batches: int
    seconds: float
    shards: list[ShardStatus] = field(default_factory=list)

    def quarantined_by_reason(self) -> dict[str, int]:
        return _summed(s.quarantined_by_reason for s in self.shards)

    def outcomes_by_outcome(self) -> dict[str, int]:
        return _summed(s.outcomes_by_outcome for s in self.shards)


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for name, n in one.items():
            total[name] = total.get(name, 0) + n
    return dict(sorted(total.items()))


# A shard's state lives in the state store; between micro-batches a Python worker
# keeps the object it saved (see `_worker_state`), found by the token saved with the
# state. A token is used once: a batch that fails and runs again finds no entry and
# reloads the state. Spark hands a shard's next batch to any worker, so each worker
# also keeps the seen-id set it saved last with its log head (see `_seen_log`): a
# worker that saved an earlier state of the shard reads only the log entries since.

# Tags the state's snapshot blob; a blob without it is a whole shard (seen ids
# included), as saved before the seen-id log.
_WITH_SEEN_LOG = "shard+seen-log"


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection while a shard works through a micro-batch, or while the
    rows of an input batch are parsed and cut into chunks.

    A batch allocates hundreds of thousands of objects that live past it (held rows,
    pending operations, the chunks' rows), so the collector would run dozens of times,
    walking the whole shard each time: a third of the shard's time, measured; parsing
    took 9.8 instead of 14.2 µs a row without it. Nothing a batch makes is garbage
    only through a cycle worth collecting at once, and the collector resumes after the
    batch. Only in the Python workers, never in the driver or a user's process.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_WORKER_HEAP_SETTLED = False


def _settle_worker_heap() -> None:
    """Once per Python worker: collect, then freeze what the worker holds by then.

    PySpark's daemon runs a full collection after every task a worker finishes. A
    worker has imported pandas, pyarrow and PySpark's SQL modules by the time it runs
    our code, and each of those collections walked their ~60k objects again: about a
    tenth of the workers' time in a profile of a cold run. Frozen objects are never
    walked: a collection in such a worker took 9 ms instead of 55 ms. Nor are they
    collected, hence the collection first; what is frozen is modules and the like,
    alive for the worker's life anyway.
    """
    global _WORKER_HEAP_SETTLED
    if _WORKER_HEAP_SETTLED:
        return
    _WORKER_HEAP_SETTLED = True
    gc.collect()
    gc.freeze()


def _processor_class() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class ShardProcessor(StatefulProcessor):
        def __init__(self, labels: list[int], lateness_ms: int,
                     dedupe_retention_ms: int | None, release_at_held_rows: int) -> None:
            self.shard_of_label = {label: shard for shard, label in enumerate(labels)}
            self.lateness_ms = lateness_ms
            self.dedupe_retention_ms = dedupe_retention_ms
            self.release_at_held_rows = release_at_held_rows

        def init(self, handle: StatefulProcessorHandle) -> None:
            _settle_worker_heap()
            self.handle = handle
            self.token = handle.getValueState("token", "token string")
            self.snapshot = handle.getValueState("snapshot", "snapshot binary")
            self.seen = handle.getMapState("seen", "entry int",
                                           "added binary, forgotten binary")
            self.heads: dict[int, LogHead] = {}

        # Spark's method and argument names.
        def handleInputRows(self, key: Any, rows: Iterator[Any],  # noqa: N802
                            timerValues: TimerValues) -> Iterator[Any]:  # noqa: N803
            with _collector_paused():
                shard = self._load(self.shard_of_label[int(key[0])])
                watermark = timerValues.getCurrentWatermarkInMs()
                chunks: list[tuple[int, bytes, bytes, int | None]] = []
                end_of_input = False
                for frame in rows:
                    for low, ts, own, shared in zip(
                            frame["low"].tolist(), frame["ts"].tolist(),
                            frame["own"].tolist(), frame["shared"].tolist(), strict=True):
                        if own or shared:
                            chunks.append((low, own, shared, None if ts == _NO_TOP else ts))
                        elif low == _END_MARKER:
                            end_of_input = True
                        else:
                            # A watermark marker: the watermark the next micro-batch
                            # would have, now, so the run needs no batch after this one.
                            watermark = max(watermark, ts - self.lateness_ms)
                # Oldest rows first, released in the middle of the micro-batch (up to
                # the oldest row a chunk still to come can hold) whenever the shard
                # holds many: its memory follows that bound, not the micro-batch (all
                # the input there is, by default). See _RELEASE_AT_HELD_ROWS.
                chunks.sort(key=lambda chunk: chunk[0])
                quarantine: list[Quarantined] = []
                outcomes: list[OutcomeRow] = []
                for i, (_, own, shared, top) in enumerate(chunks):
                    quarantine.extend(shard.take(_decompressed(own), _decompressed(shared),
                                                 watermark, top))
                    if i + 1 < len(chunks) and len(shard.held) >= self.release_at_held_rows:
                        done, duplicates = shard.release(watermark, below_ms=chunks[i + 1][0])
                        outcomes.extend(done)
                        quarantine.extend(duplicates)
                if end_of_input:
                    # After every chunk of the batch: the input's latest row is known,
                    # and every shard took the same tops.
                    end = shard.end_of_input_ms()
                    if end is not None:
                        watermark = max(watermark, end)
                out = self._finish(shard, watermark, quarantine, outcomes)
            yield out

        def handleExpiredTimer(self, key: Any, timerValues: TimerValues,  # noqa: N802, N803
                               expiredTimerInfo: ExpiredTimerInfo,  # noqa: N803
                               ) -> Iterator[Any]:
            with _collector_paused():
                shard = self._load(self.shard_of_label[int(key[0])])
                if shard.timer_ms == expiredTimerInfo.getExpiryTimeInMs():
                    shard.timer_ms = None  # fired timers are gone
                out = self._finish(shard, timerValues.getCurrentWatermarkInMs(), [], [])
            yield out

        def close(self) -> None:
            pass

        def _load(self, shard_id: int) -> Shard:
            shard, head = self._loaded(shard_id)
            shard.resolver.track_seen_changes()
            self.heads[shard_id] = head
            return shard

        def _loaded(self, shard_id: int) -> tuple[Shard, LogHead]:
            if not self.token.exists():
                return Shard(shard_id, self.lateness_ms, self.dedupe_retention_ms), LogHead()
            saved_token = self.token.get()
            assert saved_token is not None
            cached = _worker_state.SHARDS.pop(saved_token[0], None)
            # The set held for the seen-id log is about to change in place: no later
            # load may take it for the head it was saved with.
            held = _worker_state.SEEN.pop(shard_id, None)
            if cached is not None:
                return cached
            shards = _worker_state.SHARDS
            for stale in [t for t, (s, _) in shards.items() if s.shard == shard_id]:
                del shards[stale]  # an older state of this shard, holding that set
            saved = self.snapshot.get()
            assert saved is not None, "a token is saved with its snapshot"
            blob = pickle.loads(saved[0])
            if blob[0] != _WITH_SEEN_LOG:
                return Shard.restore(blob), LogHead(complete=False)
            _, snapshot, tokens, ids_logged = blob
            head = LogHead(tuple(tokens), ids_logged)
            return Shard.restore(snapshot, load_seen(self.seen, head, held)), head

        def _save(self, shard: Shard) -> None:
            token = uuid.uuid4().hex
            seen = shard.resolver.seen_op_ids
            head = save_seen(self.seen, self.heads.pop(shard.shard), token, seen,
                             *shard.resolver.take_seen_changes())
            blob = (_WITH_SEEN_LOG, shard.snapshot(with_seen=False), list(head.tokens),
                    head.ids_logged)
            self.snapshot.update((pickle.dumps(blob, protocol=5),))
            self.token.update((token,))
            shards = _worker_state.SHARDS
            while len(shards) >= _worker_state.SHARDS_LIMIT:
                shards.pop(next(iter(shards)))
            shards[token] = (shard, head)
            _worker_state.SEEN[shard.shard] = (seen, head)

        def _finish(self, shard: Shard, watermark: int, quarantine: list[Quarantined],
                    outcomes: list[OutcomeRow]) -> pd.DataFrame:
            """Release what the watermark allows (after ``outcomes``, released already in
            this call), and save the shard."""
            done, duplicates = shard.release(watermark)
            outcomes.extend(done)
            wake = shard.next_timer_ms()
            if wake != shard.timer_ms:
                if shard.timer_ms is not None:
                    self.handle.deleteTimer(shard.timer_ms)
                if wake is not None:
                    self.handle.registerTimer(wake)
                shard.timer_ms = wake
            status = shard.status(watermark)
            self._save(shard)
            return _frame(outcomes, quarantine + duplicates, status)

    return ShardProcessor


def _frame(outcomes: list[OutcomeRow], quarantine: list[Quarantined],
           status: ShardStatus) -> pd.DataFrame:
    """One row per handler call: the outcomes and the quarantined rows as Arrow IPC
    streams, and the shard's status. Rows of the contract's columns, one per outcome,
    cost a conversion per value in the worker (pandas to Arrow) and again in the JVM
    (Arrow to rows and back for the driver); blobs pass through both as bytes."""
    import pandas as pd

    return pd.DataFrame({
        "outcomes": pd.Series([_ipc(outcomes_table(outcomes)) if outcomes else None],
                              dtype=object),
        "quarantine": pd.Series([_ipc(quarantine_table(quarantine)) if quarantine else None],
                                dtype=object),
        "status": pd.Series([json.dumps(asdict(status))], dtype=object),
    })


def _ipc(table: pa.Table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=_CODEC)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _from_ipc(blobs: list[bytes | None], empty: pa.Table) -> pa.Table:
    import pyarrow as pa

    tables = [pa.ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in blobs if blob]
    return pa.concat_tables(tables) if tables else empty


#: How chunks' blobs and the processor's Arrow IPC streams travel. Everything a run
#: reads crosses the JVM three times as chunks (from the packers, through the shuffle,
#: to the shards) and its outcomes twice more (to the driver, as Arrow for
#: ``toArrow``): 94 MB and 42 MB for the 1M-event log, all copied, converted and
#: collected by the JVM. zstd (level 1) makes a chunk's marshal'd rows 6-8 times
#: smaller at about 2 ms per MB in the worker that packs them. With it, cold 1M-event
#: runs took 6.85 s against 7.74 s on local[2] and 11.0 s against 12.4 s on local[1],
#: warm ones 5.67 s against 6.34 s and 10.1 s against 11.0 s (medians of three and two
#: pairs of fresh processes on this 2-core machine).
_CODEC = "zstd"
#: A compressed blob starts with its size, which decompression needs.
_SIZE = struct.Struct("<Q")


def _compressed(blob: bytes) -> bytes:
    """``blob`` as it travels: compressed, its size first; empty stays empty (a
    control chunk's mark)."""
    if not blob:
        return blob
    import pyarrow as pa

    packed: bytes = pa.compress(blob, codec=_CODEC, asbytes=True)
    return _SIZE.pack(len(blob)) + packed


def _decompressed(blob: bytes) -> bytes:
    """The bytes :func:`_compressed` was given."""
    if not blob:
        return blob
    import pyarrow as pa

    (size,) = _SIZE.unpack_from(blob)
    out: bytes = pa.decompress(memoryview(blob)[_SIZE.size:], decompressed_size=size,
                               codec=_CODEC, asbytes=True)
    return out


def _chunk_batch(chunks: list[Chunk], labels: list[int]) -> pa.RecordBatch:
    import pyarrow as pa

    schema = pa.schema([("shard", pa.int32()), ("low", pa.int64()), ("ts", pa.int64()),
                        ("own", pa.binary()), ("shared", pa.binary())])
    shard_ids, lows, tops, own, shared = zip(*chunks, strict=True)
    # Every chunk of a slice holds the same shared rows (one bytes object): compressed
    # once.
    packed: dict[int, bytes] = {}
    for blob in shared:
        if id(blob) not in packed:
            packed[id(blob)] = _compressed(blob)
    return pa.RecordBatch.from_arrays(
        [pa.array([labels[s] for s in shard_ids], pa.int32()), pa.array(lows, pa.int64()),
         pa.array([_NO_TOP if top is None else top for top in tops], pa.int64()),
         pa.array([_compressed(blob) for blob in own], pa.binary()),
         pa.array([packed[id(blob)] for blob in shared], pa.binary())], schema=schema)


def _control_chunk(marker: dict[str, Any], shard: int) -> Chunk:
    if marker.get("end"):
        return (shard, _END_MARKER, _NO_TOP, b"", b"")
    return (shard, _WATERMARK_MARKER, int(marker["ts_ms"]), b"", b"")


def _local_file(uri: str) -> str:
    """The local path of a file Spark's file source listed (``file:/dir/name``, as
    Hadoop's paths print: not percent-encoded)."""
    if not uri.startswith("file:"):
        raise ValueError(f"input file {uri!r} is not on a local filesystem: the packers "
                         "read input files themselves, from the path Spark listed (on a "
                         "cluster, a directory mounted at the same path everywhere)")
    path = uri[len("file:"):]
    if path.startswith("//"):  # file://authority/path
        path = path[path.index("/", 2):] if "/" in path[2:] else "/"
    return path


def _packer(labels: list[int]) -> Any:
    """JSON Lines files (and end-of-input markers) to chunks, a slice of each file at
    a time, read from the paths Spark's file source listed."""
    shards = len(labels)

    def pack_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _settle_worker_heap()
        for batch in batches:
            for uri, is_control in zip(batch.column(0).to_pylist(),
                                       batch.column(1).to_pylist(), strict=True):
                yield from pack_file(_local_file(uri), is_control)

    def pack_file(path: str, is_control: bool) -> Iterator[pa.RecordBatch]:
        with open(path, "rb") as stream:
            for lines in json_lines(stream):
                with _collector_paused():
                    chunks: list[Chunk]
                    if is_control:
                        chunks = [_control_chunk(json.loads(line), shard)
                                  for line in lines if line.strip()
                                  for shard in range(shards)]
                    else:
                        chunks = pack(lines, shards)
                    out = _chunk_batch(chunks, labels) if chunks else None
                if out is not None:
                    yield out

    return pack_files


def _parquet_packer(labels: list[int]) -> Any:
    """Parquet files to chunks, read by the reference engine's reader: a Spark Parquet
    source would need one schema up front and fail the query on a file whose columns
    have other types, where the contract quarantines the rows."""
    shards = len(labels)

    def pack_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _settle_worker_heap()
        for batch in batches:
            for uri in batch.column(0).to_pylist():
                path = Path(_local_file(uri))
                content = path.read_bytes()
                with _collector_paused():
                    chunks = pack_rows(parquet_events(content, path.name), shards)
                    out = _chunk_batch(chunks, labels) if chunks else None
                if out is not None:
                    yield out

    return pack_files


#: The Spark contexts whose Python workers a run has already warmed up (see
#: SparkEngine._warm_up_python_workers); a stopped context leaves the set with its
#: last reference.
_WARMED_CONTEXTS: weakref.WeakSet[Any] = weakref.WeakSet()
_WARMED_LOCK = threading.Lock()


def _pass_through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def _write_atomically(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


class SparkEngine:
    """Runs the query over ``input_dir`` until the input read so far is processed.

    ``output_dir`` gets ``outcomes/`` and ``quarantine/`` (the contract's columns);
    ``checkpoint_dir`` holds Spark's checkpoint, the shard counters and the control
    input. Run it again on the same directories to go on where it stopped, after a
    crash too. ``shards`` is fixed by the first run of a checkpoint.
    """

    def __init__(self, spark: SparkSession, input_dir: Path, output_dir: Path,
                 checkpoint_dir: Path, lateness_ms: int = 10_000, shards: int | None = None,
                 dedupe_retention_ms: int | None = None,
                 max_files_per_trigger: int | None = None,
                 on_batch: Callable[[int, int, int], None] | None = None,
                 sink: OutcomeSink | None = None) -> None:
        """``on_batch(batch_id, outcomes, quarantined)`` is called after each
        micro-batch's outputs are written (progress). ``sink`` gets every outcome at
        least once: each micro-batch's once its files are written, delivered while the
        next batch runs, and at the start of a run those of batches not yet settled
        (``CHECKPOINT/delivered`` marks the last settled batch; see
        :mod:`tickwheel.pipeline.delivery`). :meth:`run` returns once they are
        settled; the caller closes the sink."""
        check_positive_int("lateness_ms", lateness_ms, minimum=0)
        if dedupe_retention_ms is not None:
            check_positive_int("dedupe_retention_ms", dedupe_retention_ms, minimum=0)
        if shards is not None:
            check_positive_int("shards", shards)
        if max_files_per_trigger is not None:
            check_positive_int("max_files_per_trigger", max_files_per_trigger)
        if not input_dir.is_dir():
            raise FileNotFoundError(f"input directory {input_dir} does not exist")
        self.spark = spark
        self.input_dir = input_dir
        self.output_dir = output_dir
        self.checkpoint_dir = checkpoint_dir
        self.lateness_ms = lateness_ms
        self.dedupe_retention_ms = dedupe_retention_ms
        self.max_files_per_trigger = max_files_per_trigger
        self.shards, self.labels = self._settle_shards(shards)
        self.on_batch = on_batch
        self.sink = sink
        self._delivery: BatchDelivery | None = None
        self.batches = 0

    def _settle_shards(self, shards: int | None) -> tuple[int, list[int]]:
        meta = self.checkpoint_dir / "tickwheel.json"
        if meta.exists():
            saved = json.loads(meta.read_text())
            if shards is not None and shards != saved["shards"]:
                raise ValueError(f"shards={shards} but the checkpoint {self.checkpoint_dir} "
                                 f"was made with shards={saved['shards']}")
            for name in ("lateness_ms", "dedupe_retention_ms"):
                # The shards' state holds these: a run cannot change them.
                if saved.get(name) != getattr(self, name):
                    raise ValueError(f"{name}={getattr(self, name)} but the checkpoint "
                                     f"{self.checkpoint_dir} was made with "
                                     f"{name}={saved.get(name)}")
            return int(saved["shards"]), [int(label) for label in saved["labels"]]
        if shards is None:
            shards = max(1, self.spark.sparkContext.defaultParallelism)
        labels = self._labels(shards)
        (self.checkpoint_dir / "control").mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"shards": shards, "labels": labels,
                                    "lateness_ms": self.lateness_ms,
                                    "dedupe_retention_ms": self.dedupe_retention_ms}))
        return shards, labels

    def _labels(self, shards: int) -> list[int]:
        """A grouping value per shard that Spark's hash partitioner puts in a partition
        of its own: shard numbers 0..n-1 would share partitions, and shards sharing a
        partition run one after the other."""
        from pyspark.sql import functions as F  # noqa: N812 (Spark's idiom)

        value = F.col("id").cast("int")
        found = (self.spark.range(0, 64 * shards)
                 .select(value.alias("label"), F.pmod(F.hash(value), F.lit(shards)).alias("p"))
                 .groupBy("p").agg(F.min("label").alias("label")).collect())
        labels = {int(row["p"]): int(row["label"]) for row in found}
        if len(labels) != shards:
            raise RuntimeError(f"no partition-distinct labels for {shards} shards")
        return [labels[p] for p in range(shards)]

    def _query_input(self) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812 (Spark's idiom)

        def listed(directory: Path, glob: str | None = None) -> DataFrame:
            """The files of ``directory`` (those matching ``glob``), listed only."""
            reader = self.spark.readStream.format("binaryFile").schema(
                _schema(BINARY_FILE_SCHEMA))
            if glob is not None:  # the input; the control directory takes no limit
                reader = reader.option("pathGlobFilter", glob)
                if self.max_files_per_trigger is not None:
                    reader = reader.option("maxFilesPerTrigger", self.max_files_per_trigger)
            return reader.load(str(directory))

        # The file sources list the files and keep the log of those read; the packers
        # read them, from the paths, and split them into lines as the reference
        # engine reads them. Without the content column the binaryFile source opens
        # no file: the bytes no longer cross the JVM (read, copied into an Arrow
        # batch, written to the packer), and no file is held whole. A text source
        # had made every line a JVM string and then an Arrow value, too.
        rows = listed(self.input_dir, "*.{jsonl,json}").select(
            "path", F.lit(False).alias("control"))
        control = listed(self.checkpoint_dir / "control").select(
            "path", F.lit(True).alias("control"))
        parquet = listed(self.input_dir, "*.parquet").select("path")
        chunk = _schema(CHUNK_SCHEMA)
        chunks = (rows.unionByName(control)
                  .mapInArrow(_packer(self.labels), chunk)
                  .unionByName(parquet.mapInArrow(_parquet_packer(self.labels), chunk))
                  .withColumn("event_time", F.timestamp_millis("ts"))
                  .withWatermark("event_time", f"{self.lateness_ms} milliseconds")
                  # Not passed on: Spark would drop rows at or below the watermark
                  # before the processor could quarantine them.
                  .select("shard", "low", "ts", "own", "shared"))
        return chunks.groupBy("shard").transformWithStateInPandas(
            _processor_class()(self.labels, self.lateness_ms, self.dedupe_retention_ms,
                               _RELEASE_AT_HELD_ROWS),
            _schema(OUTPUT_SCHEMA), "Append", "EventTime")

    def _write_batch(self, frame: DataFrame, batch_id: int) -> None:
        import pyarrow as pa

        table = frame.toArrow()
        name = f"batch-{batch_id:09d}.parquet"
        outcomes = _from_ipc(table["outcomes"].to_pylist(), outcomes_table([]))
        quarantine = _from_ipc(table["quarantine"].to_pylist(), quarantine_table([]))
        status = table.select(["status"])
        for sub, where in ((outcomes, self.output_dir / "outcomes"),
                           (quarantine, self.output_dir / "quarantine")):
            if sub.num_rows:
                _write_atomically(sub, where / name)
        if status.num_rows:
            _write_atomically(pa.table({"status": status["status"]}),
                              self.checkpoint_dir / "status" / name)
        if self._delivery is not None:
            self._delivery.submit(batch_id, outcomes)
        self.batches += 1
        if self.on_batch is not None:
            self.on_batch(batch_id, outcomes.num_rows, quarantine.num_rows)
        log.info("batch %d: %d outcomes, %d quarantined", batch_id, outcomes.num_rows,
                 quarantine.num_rows)

    def _run_query(self, final: bool) -> None:
        settings = {
            # One shuffle partition (and state store) per shard: Spark's default of 200
            # costs a state-store commit each per batch. A checkpoint keeps its own value.
            "spark.sql.shuffle.partitions": str(self.shards),
            # Shards apply rows up to the lateness bound themselves and the end-of-input
            # marker carries its own watermark, so a batch that only moves the watermark
            # has nothing to do.
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            # A state-store commit then writes the changes, not a new RocksDB checkpoint.
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
            # Spark keys its pools of Python workers by their environment, and this
            # setting adds a variable to the packers' (mapInArrow) but not to the
            # processor's: two daemons, and every cold worker importing pandas and
            # pyarrow twice over (about 1.5 s of CPU each on this 2-core machine). Off,
            # both stages share one pool; a failing worker prints Python's full
            # traceback instead of the user frames alone.
            "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
        }
        if self.spark.conf.get(CHECKPOINT_MANAGER_SETTING, None) is None:
            settings[CHECKPOINT_MANAGER_SETTING] = CHECKPOINT_MANAGER
        # The caller's session gets its own values back when the query ends, not when
        # it starts: the file sources make their logs on the query's thread, with the
        # session's settings of that moment.
        previous = {name: self.spark.conf.get(name, None) for name in settings}
        for name, value in settings.items():
            self.spark.conf.set(name, value)
        warm_up = self._warm_up_python_workers()
        try:
            writer = (self._query_input().writeStream
                      .foreachBatch(self._write_batch)
                      .option("checkpointLocation", str(self.checkpoint_dir / "query")))
            if final:
                if self.max_files_per_trigger is None:
                    # Listed with the input by the first micro-batch, which then takes
                    # all the input there is: it ends the input too (see
                    # _process_to_the_end).
                    self._write_marker({"end": True})
                query = writer.start()
                try:
                    self._process_to_the_end(query)
                finally:
                    query.stop()
            else:
                query = writer.trigger(availableNow=True).start()
                query.awaitTermination()
        finally:
            if warm_up is not None:
                warm_up.join()
            for name, old_value in previous.items():
                if old_value is None:
                    self.spark.conf.unset(name)
                else:
                    self.spark.conf.set(name, old_value)
        for progress in query.recentProgress:
            log.info("batch %s: %s rows, %s", progress.batchId, progress.numInputRows,
                     progress.durationMs)

    def _warm_up_python_workers(self) -> threading.Thread | None:
        """Start the session's Python workers while the query starts, on its first run.

        The first query of a session starts Spark's Python worker daemon when its
        first task asks for a worker, and every task of that stage waits for it
        (0.47 s on this 2-core machine, as the daemon imports pyarrow, pandas and
        PySpark's worker). A job of one empty task per core, run alongside the
        query's start and planning (about 2 s cold, most of it on one core), starts
        the daemon and a worker per core there instead: cold 1M-event runs on
        local[2] took 7.25 s against 7.70 s (medians of seven pairs; it won all
        seven). Later runs find the workers idle in the pool, and the job would only
        take a task slot, so it runs once per session. It must start after the
        query's settings are in place: Spark keys its worker pools by their
        environment, which those settings shape."""
        context = self.spark.sparkContext
        with _WARMED_LOCK:
            if context in _WARMED_CONTEXTS:
                return None
            _WARMED_CONTEXTS.add(context)
        def run() -> None:
            # The job is defined here too, off the run's own thread: on a cold JVM
            # that alone took 36 ms.
            started = time.perf_counter()
            try:
                slots = max(1, context.defaultParallelism)
                (self.spark.range(0, slots, 1, slots)
                 .mapInArrow(_pass_through, _schema("id long")).collect())
            except Exception:  # the query's own tasks start them anyway
                log.debug("warming up the Python workers failed", exc_info=True)
            else:
                log.debug("Python workers warmed up in %.2f s", time.perf_counter() - started)

        thread = threading.Thread(target=run, name="tickwheel-python-workers", daemon=True)
        thread.start()
        return thread

    def _process_to_the_end(self, query: StreamingQuery) -> None:
        """Everything the input holds, then the end-of-input marker, in one query.

        Ending the input in a query of its own, as an ``availableNow`` run must, cost
        that query's start (planning, the state stores, PySpark's transformWithState
        driver worker): 2.6 s of a 22.9 s cold 1M-event run on local[2], 1.6 s of a
        warm one. Here the marker is written while the query waits for input, and is
        its next micro-batch. ``processAllAvailable`` returns once a trigger found
        nothing new; a trigger that had already listed the control directory before
        the marker was written could return it early, so the shards' watermark says
        when the marker is in. (Spark documents it for tests because it never returns
        while data keeps arriving; a final run is told that the input is complete.)

        With all the input in one micro-batch (no ``max_files_per_trigger``), an
        end-of-input marker written before the query starts is listed with the input by
        the first micro-batch, and each shard, once it has taken the batch's chunks,
        moves just past the input's latest row (every chunk carries its slice's top,
        so every shard knows the same one): no second micro-batch, whose planning, tasks
        and commit took 0.5-0.6 s of a 1M-event run on either master. If rows came in
        after that listing, the shards are not past them, and a watermark marker
        follows as before.
        """
        query.processAllAvailable()
        if self.max_files_per_trigger is None and self._input_ended():
            return
        watermark = self._write_end_marker()
        if watermark is None:
            return
        for _ in range(_END_OF_INPUT_TRIES):
            query.processAllAvailable()
            state = self._shard_watermark()
            if state is not None and state[1] >= watermark:  # (latest row, watermark)
                return
        raise RuntimeError(
            f"the end-of-input marker was not applied after {_END_OF_INPUT_TRIES} passes")

    def _close_delivery(self, *, raise_failure: bool = True) -> None:
        if self._delivery is not None:
            delivery, self._delivery = self._delivery, None
            delivery.close(raise_failure=raise_failure)

    def statuses(self) -> list[ShardStatus]:
        """The latest counters of each shard."""
        import pyarrow.parquet as pq

        latest: dict[int, ShardStatus] = {}
        for path in sorted((self.checkpoint_dir / "status").glob("*.parquet")):
            for text in pq.read_table(path)["status"].to_pylist():
                status = ShardStatus(**json.loads(text))
                known = latest.get(status.shard)
                if known is None or status.seq > known.seq:
                    latest[status.shard] = status
        return [latest[s] for s in sorted(latest)]

    def _shard_watermark(self) -> tuple[int, int] | None:
        """The ``ts_ms`` of the latest row read and the watermark of the shard furthest
        behind; None before any row."""
        statuses = self.statuses()
        tops = [s.max_ts_ms for s in statuses if s.max_ts_ms is not None]
        if not tops:
            return None
        return max(tops), min(s.watermark_ms for s in statuses)

    def _input_ended(self) -> bool:
        """Whether every shard stands past the latest row read (or none was read)."""
        state = self._shard_watermark()
        return state is None or state[1] > state[0]

    def end_input(self) -> bool:
        """Move the watermark just past the latest row read: every row is applied and
        time stands at that row's ``ts_ms``, as in the reference engine. False if there
        was nothing to move. The next micro-batch applies the marker."""
        return self._write_end_marker() is not None

    def _write_end_marker(self) -> int | None:
        """Write the end-of-input marker; return the watermark it moves the shards to
        (None if there was nothing to move)."""
        state = self._shard_watermark()
        if state is None:
            return None
        end, watermark = state
        if watermark > end:
            return None
        # Within a long (the chunks' ts column): rows in the last lateness_ms below
        # 2**63 then stay held, and the run says so.
        ts = min(end + self.lateness_ms + 1, 2**63 - 1)
        self._write_marker({"ts_ms": ts})
        return ts - self.lateness_ms

    def _write_marker(self, marker: dict[str, Any]) -> None:
        path = self.checkpoint_dir / "control" / f"end-{uuid.uuid4().hex}.jsonl"
        tmp = path.with_name(f".{path.name}")
        tmp.write_text(json.dumps(marker) + "\n")
        os.replace(tmp, path)

    def run(self, final: bool = True) -> SparkRunResult:
        """Process what the input holds now; with ``final``, end the input too."""
        started = time.perf_counter()
        if self.sink is not None:
            self._delivery = BatchDelivery(self.sink, self.output_dir / "outcomes",
                                           self.checkpoint_dir / "delivered")
        try:
            self._run_query(final)
        except BaseException:
            self._close_delivery(raise_failure=False)  # the query's error comes first
            raise
        self._close_delivery()
        statuses = self.statuses()
        return SparkRunResult(
            rows_in=sum(s.rows_in for s in statuses),
            rows_applied=sum(s.rows_applied for s in statuses),
            quarantined=sum(s.quarantined for s in statuses),
            held=sum(s.held for s in statuses),
            pending=sum(s.pending for s in statuses),
            ignored_cancels=sum(s.ignored_cancels for s in statuses),
            watermark_ms=max((s.watermark_ms for s in statuses), default=0),
            batches=self.batches,
            seconds=time.perf_counter() - started,
            shards=statuses,
        )
