"""The engine's code that runs in Spark's Python workers: the packers, which read the
listed input files and cut their rows into chunks per shard, and the shards' stateful
processor.

A shard's state lives in the state store; between micro-batches a Python worker
keeps the object it saved (see `_worker_state`), found by the token saved with the
state. A token is used once: a batch that fails and runs again finds no entry and
reloads the state. Spark hands a shard's next batch to any worker, so each worker
also keeps the seen-id set it saved last with its log head (see `_seen_log`): a
worker that saved an earlier state of the shard reads only the log entries since.
"""

from __future__ import annotations

import contextlib
import gc
import json
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tickwheel.pipeline import _worker_state
from tickwheel.pipeline._seen_log import LogHead, load_seen, save_seen
from tickwheel.pipeline._spark_manifest import read_manifest
from tickwheel.pipeline._spark_wire import (
    END_MARKER,
    NO_TOP,
    chunk_batch,
    control_chunk,
    decompressed,
    output_frame,
)
from tickwheel.pipeline.events import Quarantined
from tickwheel.pipeline.io import json_lines, parquet_events
from tickwheel.pipeline.resolver import OutcomeRow
from tickwheel.pipeline.shard import Chunk, Shard, pack, pack_rows

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.streaming.stateful_processor import (
        ExpiredTimerInfo,
        StatefulProcessorHandle,
        TimerValues,
    )

__all__ = ["RELEASE_AT_HELD_ROWS", "collector_paused", "local_file", "packer",
           "pass_through", "processor_class", "settle_worker_heap"]

#: Held rows at which a shard releases what it can in the middle of a micro-batch. A
#: worker of a cold 1M-event run on local[2] (all the input in one micro-batch) held
#: 724k rows per shard and peaked at 870 MB. At this many, a shard of that run
#: releases 6 times and its worker peaked at 540 MB; the cold run on local[2] was
#: faster in five pairs of five. Releasing after every chunk (19 times, 515 MB) cost
#: warm runs on local[1] 2 s: each release sorts what stays held and runs the
#: resolver once more, and one core pays that in full.
RELEASE_AT_HELD_ROWS = 100_000

# Tags the state's snapshot blob; a blob without it is a whole shard (seen ids
# included), as saved before the seen-id log.
_WITH_SEEN_LOG = "shard+seen-log"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
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


def settle_worker_heap() -> None:
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


def processor_class() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class ShardProcessor(StatefulProcessor):
        def __init__(self, labels: list[int], lateness_ms: int,
                     dedupe_retention_ms: int | None, release_at_held_rows: int) -> None:
            self.shard_of_label = {label: shard for shard, label in enumerate(labels)}
            self.lateness_ms = lateness_ms
            self.dedupe_retention_ms = dedupe_retention_ms
            self.release_at_held_rows = release_at_held_rows

        def init(self, handle: StatefulProcessorHandle) -> None:
            settle_worker_heap()
            self.handle = handle
            self.token = handle.getValueState("token", "token string")
            self.snapshot = handle.getValueState("snapshot", "snapshot binary")
            self.seen = handle.getMapState("seen", "entry int",
                                           "added binary, forgotten binary")
            self.heads: dict[int, LogHead] = {}

        # Spark's method and argument names.
        def handleInputRows(self, key: Any, rows: Iterator[Any],  # noqa: N802
                            timerValues: TimerValues) -> Iterator[Any]:  # noqa: N803
            with collector_paused():
                shard = self._load(self.shard_of_label[int(key[0])])
                watermark = timerValues.getCurrentWatermarkInMs()
                chunks: list[tuple[int, bytes, bytes, int | None]] = []
                end_of_input = False
                for frame in rows:
                    for low, ts, own, shared in zip(
                            frame["low"].tolist(), frame["ts"].tolist(),
                            frame["own"].tolist(), frame["shared"].tolist(), strict=True):
                        if own or shared:
                            chunks.append((low, own, shared, None if ts == NO_TOP else ts))
                        elif low == END_MARKER:
                            end_of_input = True
                        else:
                            # A watermark marker: the watermark the next micro-batch
                            # would have, now, so the run needs no batch after this one.
                            watermark = max(watermark, ts - self.lateness_ms)
                # Oldest rows first, released in the middle of the micro-batch (up to
                # the oldest row a chunk still to come can hold) whenever the shard
                # holds many: its memory follows that bound, not the micro-batch (all
                # the input there is, by default). See RELEASE_AT_HELD_ROWS.
                chunks.sort(key=lambda chunk: chunk[0])
                quarantine: list[Quarantined] = []
                outcomes: list[OutcomeRow] = []
                for i, (_, own, shared, top) in enumerate(chunks):
                    quarantine.extend(shard.take(decompressed(own), decompressed(shared),
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
            with collector_paused():
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
            return output_frame(outcomes, quarantine + duplicates, status)

    return ShardProcessor


def local_file(uri: str) -> str:
    """The local path of a file Spark's file source listed (``file:/dir/name``, as
    Hadoop's paths print: not percent-encoded)."""
    if not uri.startswith("file:"):
        raise ValueError(f"{uri!r} is not on a local filesystem: the packers read the "
                         "checkpoint's manifests and the input files they name "
                         "themselves (on a cluster, directories mounted at the same path "
                         "everywhere)")
    path = uri[len("file:"):]
    if path.startswith("//"):  # file://authority/path
        path = path[path.index("/", 2):] if "/" in path[2:] else "/"
    return path


def packer(labels: list[int]) -> Any:
    """Input files (and end-of-input markers) to chunks: each listed path is a manifest
    naming an input file (see `_spark_manifest`), or a control file. JSON Lines are
    read a slice at a time and split into lines as the reference engine reads them;
    Parquet by the reference engine's reader, since a Spark Parquet source would need
    one schema up front and fail the query on a file whose columns have other types,
    where the contract quarantines the rows."""
    shards = len(labels)

    def pack_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle_worker_heap()
        for batch in batches:
            for uri, is_control in zip(batch.column(0).to_pylist(),
                                       batch.column(1).to_pylist(), strict=True):
                path = local_file(uri)
                if is_control:
                    yield from pack_file(path, True)
                    continue
                with open(path, "rb") as stream:
                    target, kind = read_manifest(stream.read())
                if kind == "parquet":
                    yield from pack_parquet(Path(target))
                else:
                    yield from pack_file(target, False)

    def pack_file(path: str, is_control: bool) -> Iterator[pa.RecordBatch]:
        with open(path, "rb") as stream:
            for lines in json_lines(stream):
                with collector_paused():
                    chunks: list[Chunk]
                    if is_control:
                        chunks = [control_chunk(json.loads(line), shard)
                                  for line in lines if line.strip()
                                  for shard in range(shards)]
                    else:
                        chunks = pack(lines, shards)
                    out = chunk_batch(chunks, labels) if chunks else None
                if out is not None:
                    yield out

    def pack_parquet(path: Path) -> Iterator[pa.RecordBatch]:
        content = path.read_bytes()
        with collector_paused():
            chunks = pack_rows(parquet_events(content, path.name), shards)
            out = chunk_batch(chunks, labels) if chunks else None
        if out is not None:
            yield out

    return pack_files


def pass_through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches
