"""The engine's code that runs in Spark's Python workers: the packers, which read the
input files and cut their rows into chunks per partition, and the two stages'
stateful processors.

Each partition's state is a small head (a :class:`ValueState`: its counters, the rows
it holds back, its time) and its entries, a key stage's keys or an op stage's
operations, as a log of the entries each batch changed (a :class:`MapState` of chunks,
:class:`~tickwheel.pipeline.state.entry_log.EntryLog`), read when a call starts and
extended when it ends: a micro-batch that fails and runs again finds the state of the
last committed one, and a batch writes what it changed, not everything held. An op
partition keeps the op ids it has seen apart, in a :class:`MapState` of segments, one
per batch that saw new ids, each removed whole once its ids are past the dedupe
retention (:class:`~tickwheel.pipeline.state.seen_log.SeenLog`), so a running service
does not write every id it remembers on every batch.

A worker keeps the partitions it last ran in memory, each with the random token it
wrote beside the partition's state (:func:`_kept_partition`): when the same partition
comes back to it and the state holds the same token, the worker goes on from the
object it kept instead of reading and decoding the state, so the cost of a batch
follows its rows, not what the partition remembers. A token that differs (another
worker ran the partition since, or the batch that wrote it never committed) sends it
back to the state; an op partition's seen op ids are then caught up from the copy it
kept, if the segment it last read is still stored as it read it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tickwheel.pipeline.contract.events import (
    W_TS,
    Quarantined,
    Reason,
    compact_wire,
    is_quarantined,
    to_wire,
    wire_line,
)
from tickwheel.pipeline.contract.routing import partition_of, route
from tickwheel.pipeline.io.log_reader import json_lines, json_stream, open_input, parquet_events
from tickwheel.pipeline.io.outputs import (
    OutputWriter,
    outcomes_table,
    owner_metadata,
    quarantine_table,
)
from tickwheel.pipeline.semantics.partition import KeyPartition, OpPartition, PartitionChanges
from tickwheel.pipeline.semantics.row_times import times_of
from tickwheel.pipeline.spark._wire import (
    END,
    FORWARD,
    KEY_ROWS,
    NONE,
    decoded,
    encoded,
    frames,
    output_frames,
    quarantine_ipcs,
    status_json,
    view_changes,
)
from tickwheel.pipeline.state.collector import CollectorFreezer, collector_paused
from tickwheel.pipeline.state.entry_log import EntryLog
from tickwheel.pipeline.state.heads import decode_key_head, decode_op_head, encode_head
from tickwheel.pipeline.state.seen_log import SeenLog, SeenSegment

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle, TimerValues

__all__ = ["batch_writer", "key_processor", "local_file", "op_processor", "packer",
           "warm_worker"]

_PROGRESS_COLUMNS = {"grp": "int32", "ts": "int64", "rows": "object", "progress": "object",
                     "quarantine": "object", "status": "object"}


def local_file(uri: str) -> str:
    """The local path of a file Spark's file source listed (``file:/dir/name``, as
    Hadoop's paths print: not percent-encoded)."""
    if not uri.startswith("file:"):
        raise ValueError(f"{uri!r} is not on a local filesystem: the packers read the "
                         "checkpoint's markers and the input files themselves (on a "
                         "cluster, directories mounted at the same path everywhere)")
    path = uri[len("file:"):]
    if path.startswith("//"):  # file://authority/path
        path = path[path.index("/", 2):] if "/" in path[2:] else "/"
    return path


def warm_worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function that passes its rows on, run to start Python workers
    before a service's first micro-batches need them: a worker imports this module
    (and with it the pipeline's) to unpickle it, and pandas here, as the stages do."""
    import pandas  # noqa: F401 (kept by the worker, which Spark reuses)

    yield from batches


def batch_writer(output_dir: str, batch_id: int, owner_epoch: int) -> Any:
    """The ``mapInArrow`` function that writes a micro-batch's outputs, run in the
    executors over stage 2's rows: each task writes its partition's outcomes and
    quarantined rows to ``outcomes/`` and ``quarantine/`` as
    ``batch-<id>-<partition>.parquet`` (under a hidden name, fsync'd, renamed into
    place), and hands the driver only its statuses and counts. The outputs never pass
    through the driver, and a batch run again after a crash writes the same files
    again: its rows and their partitions are those of the first run. Each file's
    metadata names the epoch of the checkpoint's owner that wrote it."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None  # in a task
        name = f"batch-{batch_id:09d}-{context.partitionId():05d}"
        writers: dict[str, OutputWriter[Any]] = {}
        statuses: list[str] = []
        views: list[bytes] = []
        try:
            for batch in batches:
                for column, to_table in (("outcomes", outcomes_table),
                                         ("quarantine", quarantine_table)):
                    for blob in batch.column(column).to_pylist():
                        if not blob:
                            continue
                        writer = writers.get(column)
                        if writer is None:
                            writer = writers[column] = OutputWriter(
                                Path(output_dir) / column, to_table, name=f"{name}.parquet",
                                tmp_prefix=f".{name}.{context.attemptNumber()}.",
                                metadata=owner_metadata(owner_epoch))
                        writer.write_table(pa.ipc.open_stream(pa.py_buffer(blob)).read_all())
                statuses += [s for s in batch.column("status").to_pylist() if s is not None]
                views += [v for v in batch.column("view").to_pylist() if v is not None]
            for writer in writers.values():
                writer.close()
        except BaseException:
            for writer in writers.values():
                writer.abort()
            raise
        counts = [writers[c].rows if c in writers else 0 for c in ("outcomes", "quarantine")]
        zeros = [0] * (len(statuses) + len(views))
        nones: list[Any] = [None] * len(views)
        yield pa.RecordBatch.from_arrays(
            [pa.array([*statuses, *nones, None], pa.string()),
             pa.array([*zeros, counts[0]], pa.int64()),
             pa.array([*zeros, counts[1]], pa.int64()),
             pa.array([*[None] * len(statuses), *views, None], pa.binary())],
            names=["status", "outcomes", "quarantined", "view"])

    return write


def _chunk_batch(chunks: list[tuple[int, int, int, bytes]]) -> pa.RecordBatch:
    import pyarrow as pa

    groups, dests, tops, blobs = zip(*chunks, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(groups, pa.int32()), pa.array(dests, pa.int32()),
         pa.array(tops, pa.int64()), pa.array(blobs, pa.binary())],
        names=["grp", "dest", "ts", "rows"])


#: A slice of no rows and no row times, in a stage 1 partition's chunk.
_NO_ROWS: Final = encoded([[], []])


def packer(labels: list[int], lateness_ms: int, max_future_ms: int | None = None) -> Any:
    """Input files (and the driver's markers, and wall-clock readings) to chunks:
    every slice of input gives each stage 1 partition its rows and the slice's top,
    and stage 2's rows ride with stage 1's partition of the same number. A row of the
    clock (a wall-clock reading, in follow mode) ends the input up to that reading
    less the lateness bound: time moves without rows. An end-of-input marker ends it
    at the marker's time; a ``continue`` marker calls every partition with no rows, so
    that a catch-up goes on without input. With ``max_future_ms``, a file
    comes with the micro-batch's clock, and a row further ahead of it than that goes on
    as a malformed row, reason ``future``, which stage 2 quarantines and counts."""
    partitions = len(labels)

    def cut(rows: list[Any], clock: int | None) -> list[tuple[int, int, int, bytes]]:
        if max_future_ms is not None and clock is not None:
            limit = clock + max_future_ms
            if any(not is_quarantined(fields) and fields[W_TS] > limit for fields in rows):
                rows = [(wire_line(fields), Reason.FUTURE.value, fields[W_TS])
                        if not is_quarantined(fields) and fields[W_TS] > limit else fields
                        for fields in rows]
        top = max((fields[W_TS] for fields in rows if not is_quarantined(fields)), default=NONE)
        by_key, by_op = route(rows, partitions)
        chunks = [(labels[p], KEY_ROWS, top, encoded([by_key[p], times_of(by_op[p])]))
                  for p in range(partitions)]
        chunks += [(labels[q], FORWARD + q, NONE, encoded(by_op[q]))
                   for q in range(partitions) if by_op[q]]
        return chunks

    def pack_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            clocks = [ms for ms in batch.column(2).to_pylist() if ms is not None]
            if clocks:
                yield _chunk_batch([(labels[p], END, max(clocks) - lateness_ms, b"")
                                    for p in range(partitions)])
            for uri, file, clock in zip(batch.column(0).to_pylist(),
                                        batch.column(1).to_pylist(),
                                        batch.column(2).to_pylist(), strict=True):
                if uri is not None:  # a marker of the driver's
                    marker = json.loads(Path(local_file(uri)).read_text())
                    if marker.get("continue"):
                        # A catch-up goes on: every partition is called, with no rows.
                        yield _chunk_batch([(labels[p], KEY_ROWS, NONE, _NO_ROWS)
                                            for p in range(partitions)])
                        continue
                    end = int(marker.get("end_ms", NONE))
                    yield _chunk_batch([(labels[p], END, end, b"")
                                        for p in range(partitions)])
                    continue
                if file is None:  # a row of the clock
                    continue
                target = Path(os.fsdecode(file))
                opened = open_input(target)
                if opened is None:
                    continue
                with opened as stream:
                    if target.suffix == ".parquet":
                        for events in parquet_events(stream):
                            with collector_paused():
                                rows = [to_wire(row) for row in events]
                                out = _chunk_batch(cut(rows, clock)) if rows else None
                            if out is not None:
                                yield out
                        continue
                    for lines in json_lines(json_stream(stream, target.name)):
                        with collector_paused():
                            rows = [compact_wire(line) for line in lines if line.strip()]
                            out = _chunk_batch(cut(rows, clock)) if rows else None
                        if out is not None:
                            yield out
        _freeze_worker(time.monotonic())

    return pack_files


def _head_state(handle: StatefulProcessorHandle) -> Any:
    # The partition's head, how many chunks its entries' log holds, and the number its
    # seen ids' next segment takes (an op partition's; 0 for a key partition's).
    return handle.getValueState("head", "head binary, chunks long, segments long")


def _entries_state(handle: StatefulProcessorHandle) -> Any:
    # Each chunk with the digest of the log up to it (EntryLog.catch_up).
    return handle.getMapState("entries", "chunk long", "entries binary, digest binary")


def _read_entries(entries: Any, kept: EntryLog | None, chunks: int,
                  ) -> tuple[EntryLog, dict[Any, Any], bool]:
    """The log and its entries, read whole; or ``kept``, the log of a worker's older
    copy of the partition, caught up (True), with the entries written since."""
    if kept is not None:
        def digest_of(number: int) -> bytes | None:
            found = entries.getValue((number,))
            return None if found is None else found[1]

        def chunk_of(number: int) -> bytes:
            found = entries.getValue((number,))
            if found is None:
                raise ValueError(f"the partition's state lacks chunk {number} of its entries")
            chunk: bytes = found[0]
            return chunk

        later = kept.catch_up(chunks, digest_of, chunk_of)
        if later is not None:
            return kept, later, True
    log, held = EntryLog.read((key[0], value[0]) for key, value in entries.iterator())
    return log, held, False


def _save(part: KeyPartition | OpPartition, changes: PartitionChanges, log: EntryLog,
          head: Any, entries: Any, segments: int = 0) -> int:
    """Write the partition's head and the entries it changed (all of them, when the
    log is rewritten); returns the bytes of its state in the store."""
    write = log.record(changes.entries, part.live_entries(), part.entries, part.entry_bytes)
    if write.rewrite:
        entries.clear()
    for number, chunk in enumerate(write.chunks, write.first):
        entries.updateValue((number,), (chunk.blob, chunk.digest))
    saved = encode_head(changes.head)
    head.update((saved, log.chunks, segments))
    return len(saved) + log.bytes


def _token_state(handle: StatefulProcessorHandle) -> Any:
    return handle.getValueState("token", "token binary")


#: Partitions a worker process keeps from its last calls, by (checkpoint, stage,
#: partition): (the token written with their state, the objects). A worker that runs
#: several partitions in turn keeps the latest few.
_kept: dict[tuple[str, str, int], tuple[bytes, Any]] = {}
_KEPT_MAX = 4


def _kept_partition(where: tuple[str, str, int], token: Any, keep: bool = True,
                    ) -> tuple[Any, Any]:
    """``(fresh, stale)``: the objects kept for ``where`` as ``fresh`` if the state's
    token (a ``ValueState``) is the one they were kept with, else as ``stale``, to be
    caught up from the state or let go of (:func:`_discard`). Taken out of the
    worker's memory either way: a call that fails part way leaves nothing behind that
    the state does not match. Nothing when the worker keeps nothing (``keep``)."""
    if not keep:
        return None, None
    entry = _kept.pop(where, None)
    if entry is None:
        return None, None
    if not token.exists() or token.get()[0] != entry[0]:
        return None, entry[1]
    return entry[1], None


def _keep_partition(where: tuple[str, str, int], token: Any, objects: Any) -> None:
    """Write a new token beside the state just written, and keep ``objects`` with it."""
    mark = os.urandom(16)
    token.update((mark,))
    _kept[where] = (mark, objects)
    while len(_kept) > _KEPT_MAX:
        _discard(_kept.pop(next(iter(_kept)))[1])
    _freeze_worker(time.monotonic())


def _discard(objects: Any) -> None:
    """Let go of a kept partition. An op partition's purgatory is a web of reference
    cycles (each pending operation points back at its resolver): closed, it is freed
    at once, instead of at the collector's next full walk, which frozen objects wait
    for (:func:`_freeze_worker`)."""
    part = objects[0] if isinstance(objects, tuple) else objects
    if isinstance(part, OpPartition):
        part.stage.close()


#: At most how long a worker's objects stay out of the collector's walk: garbage in
#: reference cycles among them waits that long to be collected.
THAW_EVERY_S = 60.0
_freezer = CollectorFreezer(THAW_EVERY_S)


def _freeze_worker(now: float) -> None:
    """Take every object the worker holds out of the collector's walk at the end of
    each task, thawing once every :data:`THAW_EVERY_S` (:class:`CollectorFreezer`).

    PySpark's daemon runs a full collection after every task a reused worker finishes.
    The partitions kept in memory hold millions of entries, and a packer's modules
    (pandas, pyarrow) tens of thousands of objects: in follow mode at 5,000 events a second,
    the workers spent more CPU in those collections than in their tasks
    (docs/follow.md). A partition let go of is closed (:func:`_discard`), so its
    reference cycles do not wait for the thaw."""
    _freezer.after_batch(now)


def _seen_log(handle: StatefulProcessorHandle) -> Any:
    # An op partition's seen ids, in numbered segments (SeenLog).
    return handle.getMapState("seen", "segment long", "ids binary, digest binary, latest long")


def _read_seen(segments: Any, kept: SeenLog | None, next_segment: int) -> SeenLog:
    """The seen ids' log, read whole; or ``kept``, a worker's older copy of it, caught
    up with the segments written since."""
    if kept is not None:
        def segment_of(number: int) -> SeenSegment | None:
            found = segments.getValue((number,))
            return None if found is None else SeenSegment(found[0], found[1], int(found[2]))

        if kept.catch_up(next_segment, segment_of):
            return kept
    return SeenLog.read(((int(key[0]), SeenSegment(value[0], value[1], int(value[2])))
                         for key, value in segments.iterator()), next_segment)


def key_processor(labels: list[int], lateness_ms: int, checkpoint: str,
                  keep: bool = True) -> Any:
    """Stage 1's processor, grouped by the label of a key partition (``checkpoint``:
    the checkpoint's id, which the worker's kept partitions are filed under)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    partitions = len(labels)
    partition_of_label = {label: p for p, label in enumerate(labels)}

    class KeyProcessor(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.head = _head_state(handle)
            self.entries = _entries_state(handle)
            self.token = _token_state(handle)

        # Spark's method and argument names.
        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],  # noqa: N802
                            timerValues: TimerValues) -> Iterator[pd.DataFrame]:  # noqa: N803

            with collector_paused():
                p = partition_of_label[int(key[0])]
                where = (checkpoint, "key", p)
                kept: tuple[KeyPartition, EntryLog] | None
                kept, stale = _kept_partition(where, self.token, keep)
                if kept is not None:
                    part, log = kept
                elif self.head.exists():
                    head, chunks, _ = self.head.get()
                    log, held, caught_up = _read_entries(
                        self.entries, None if stale is None else stale[1], chunks)
                    if caught_up and stale[0].catch_up(decode_key_head(head), held):
                        part = stale[0]
                    else:
                        if caught_up:
                            log, held, _ = _read_entries(self.entries, None, chunks)
                        part = KeyPartition.from_state(decode_key_head(head), held.items())
                        part.track_changes()
                else:
                    log, part = EntryLog(), KeyPartition(p, partitions, lateness_ms)
                    part.track_changes()
                forwarded: list[tuple[int, bytes]] = []
                quarantine: list[Quarantined] = []
                end: int | None = None
                ended = False
                for frame in rows:
                    for dest, ts, blob in zip(frame["dest"].tolist(), frame["ts"].tolist(),
                                              frame["rows"].tolist(), strict=True):
                        if dest == KEY_ROWS:
                            key_rows, times = decoded(blob)
                            quarantine += part.take(key_rows, None if ts == NONE else ts,
                                                    times)
                        elif dest == END:
                            ended = True
                            if ts != NONE:
                                end = ts if end is None else max(end, ts)
                        else:
                            forwarded.append((dest - FORWARD, blob))
                if ended and end is None:  # after every chunk: the latest row is known
                    end = part.end_of_input_ms()
                point, progress, runs = part.release(end)
                by_op: list[list[Any]] = [[] for _ in range(partitions)]
                for row in progress:
                    by_op[partition_of(row[2], partitions)].append(row)
                out: list[tuple[Any, ...]] = [
                    (labels[q], NONE, blob, b"", None, None) for q, blob in forwarded]
                # The runs go to every stage 2 partition: its schedules read time from
                # every row of the log.
                out += [(labels[q], NONE, b"", encoded([rows_for_q, runs]), None, None)
                        for q, rows_for_q in enumerate(by_op) if rows_for_q or runs]
                # Late updates go to stage 2's partition of the same number, which
                # writes them out; the status comes last.
                out += [(labels[p], NONE, b"", b"", blob, None)
                        for blob in quarantine_ipcs(quarantine)]
                counted = part.status()  # counts the call: before saving
                saved = _save(part, part.changes(), log, self.head, self.entries)
                status = status_json(replace(counted, state_bytes=saved))
                if keep:
                    _keep_partition(where, self.token, (part, log))
                out.append((labels[p], NONE if point is None else point, b"", b"", None,
                            status))
            yield from frames(_PROGRESS_COLUMNS, out)

        def close(self) -> None:
            pass

    return KeyProcessor()


def op_processor(labels: list[int], lateness_ms: int, dedupe_retention_ms: int | None,
                 checkpoint: str, wall_clock: bool = False, keep: bool = True,
                 fire_limit: int | None = None, view: str | None = None) -> Any:
    """Stage 2's processor, grouped by the label of an op-id partition. With
    ``wall_clock``, schedules notice their occurrences at the clock's readings (see
    :mod:`tickwheel.pipeline.semantics.schedule_book`). With ``fire_limit``, a call
    fires about that many occurrences of a catch-up and says in its status that it is
    catching up (:attr:`OpPartition.fire_limit`). Without ``keep``, every call reads
    its partition from the state (the worker keeps nothing). With ``view`` (the id of
    a reader's view), each call also sends what it changed for it
    (:func:`view_changes`), and every entry it holds where that view has not had them:
    a partition restored rather than kept, or kept from an earlier query."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    partition_of_label = {label: p for p, label in enumerate(labels)}

    class OpProcessor(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.head = _head_state(handle)
            self.entries = _entries_state(handle)
            self.seen_log = _seen_log(handle)
            self.token = _token_state(handle)

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],  # noqa: N802
                            timerValues: TimerValues) -> Iterator[pd.DataFrame]:  # noqa: N803
            with collector_paused():
                q = partition_of_label[int(key[0])]
                where = (checkpoint, "op", q)
                kept: tuple[OpPartition, SeenLog, EntryLog, str | None] | None
                kept, stale = _kept_partition(where, self.token, keep)
                if kept is not None:
                    part, seen, log, viewed = kept
                elif self.head.exists():
                    head, chunks, segments = self.head.get()
                    seen = _read_seen(self.seen_log, None if stale is None else stale[1],
                                      segments)
                    log, held, caught_up = _read_entries(
                        self.entries, None if stale is None else stale[2], chunks)
                    if caught_up and stale[0].catch_up(decode_op_head(head), held, seen.ids):
                        part = stale[0]
                    else:
                        if stale is not None:
                            _discard(stale)
                        if caught_up:
                            log, held, _ = _read_entries(self.entries, None, chunks)
                        part = OpPartition.from_state(decode_op_head(head), held.items(), seen.ids)
                        part.stage.track_seen_changes()
                        part.track_changes()
                else:
                    if stale is not None:
                        _discard(stale)
                    seen, log = SeenLog(), EntryLog()
                    part = OpPartition(q, lateness_ms, dedupe_retention_ms)
                    part.stage.track_seen_changes()
                    part.track_changes()
                if wall_clock:
                    part.stage.schedules.clock_notices = True
                part.fire_limit = fire_limit
                point: int | None = None
                quarantine: list[Quarantined] = []
                passed: list[tuple[bytes | None, str | None]] = []
                progress: list[Any] = []
                runs: list[list[int]] = []
                for frame in rows:
                    for ts, blob, made, late, status in zip(
                            frame["ts"].tolist(), frame["rows"].tolist(),
                            frame["progress"].tolist(), frame["quarantine"].tolist(),
                            frame["status"].tolist(), strict=True):
                        if blob:
                            quarantine += part.take(decoded(blob), [])
                        if made:
                            made_rows, made_runs = decoded(made)
                            progress += made_rows
                            runs.append(made_runs)
                        if late is not None or status is not None:
                            passed.append((late, status))  # from stage 1's partition
                        if status is not None and ts != NONE:
                            point = ts if point is None else max(point, ts)
                part.take([], progress)
                outcomes, duplicates = part.release(point, runs)
                status = part.status()  # counts the call: before saving
                changes = part.changes()
                write = seen.record(changes.seen, part.stage.now, dedupe_retention_ms)
                if write.merged:
                    self.seen_log.clear()
                else:
                    for number in write.removed:
                        self.seen_log.removeKey((number,))
                if write.segment is not None:
                    self.seen_log.updateValue((write.number,), tuple(write.segment))
                saved = _save(part, changes, log, self.head, self.entries, seen.next)
                status = replace(status, state_bytes=saved + seen.bytes)
                sent = None
                if view is not None:  # all it holds, where the view has not had it
                    whole = kept is None or viewed != view
                    sent = view_changes(changes, outcomes, part.entries() if whole else None)
                if keep:
                    _keep_partition(where, self.token, (part, seen, log, view))
                else:
                    part.stage.close()
                out = output_frames(outcomes, quarantine + duplicates, [status], passed, sent)
            yield from out

        def close(self) -> None:
            pass

    return OpProcessor()
