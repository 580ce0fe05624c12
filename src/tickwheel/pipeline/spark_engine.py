"""The Spark engine: the purgatory as a Spark Structured Streaming job.

Needs ``pip install 'tickwheel[spark]'`` (PySpark, pandas, protobuf, pyarrow) and a
JVM. One query:

1. binary file sources, listing files only, over ``CHECKPOINT/manifest/``, where the
   driver publishes one manifest per input file (it lists the input directory itself,
   as the reference engine does: Hadoop would take glob characters in a name as a
   pattern), and over ``CHECKPOINT/control/``, which only ever holds end-of-input
   markers; the packers read the files the manifests name, JSON Lines split into lines
   as the reference engine reads them and Parquet by the reference engine's reader;
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

import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tickwheel._validate import check_positive_int
from tickwheel.pipeline._spark_manifest import MANIFEST_DIR, publish
from tickwheel.pipeline._spark_session import LOCAL_JAVA_OPTIONS, spark_session
from tickwheel.pipeline._spark_tasks import (
    RELEASE_AT_HELD_ROWS,
    packer,
    pass_through,
    processor_class,
)
from tickwheel.pipeline._spark_wire import (
    BINARY_FILE_SCHEMA,
    CHUNK_SCHEMA,
    OUTPUT_SCHEMA,
    from_ipc,
    spark_schema,
)
from tickwheel.pipeline.delivery import BatchDelivery
from tickwheel.pipeline.io import (
    OWNER_FILE,
    check_spark_paths,
    checkpoint_id,
    outcomes_table,
    prepare_output,
    quarantine_table,
)
from tickwheel.pipeline.limits import (
    DEFAULT_LATENESS_MS,
    MAX_FILES_PER_TRIGGER,
    MAX_LATENESS_MS,
    MAX_RETENTION_MS,
    MAX_SHARDS,
)
from tickwheel.pipeline.shard import ShardStatus
from tickwheel.pipeline.sink import OutcomeSink

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["LOCAL_JAVA_OPTIONS", "SparkEngine", "SparkRunResult", "spark_session"]

log = logging.getLogger(__name__)

# The checkpoint is always a local directory. Spark's default manager writes it
# through Hadoop's FileContext, whose rename asks for each path's link status, and
# without Hadoop's native library that runs ``readlink`` in a new process: four per
# file written, about 500 per cold 1M-event run, on the driver's path between
# batches. The FileSystem manager renames with rename(2), atomic on a local disk:
# 1.1-2.1 s less for a cold 1M-event run on local[2] (three pairs of runs).
CHECKPOINT_MANAGER_SETTING = "spark.sql.streaming.checkpointFileManagerClass"
CHECKPOINT_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                      "FileSystemBasedCheckpointFileManager")
#: The checkpoint's layout and state, as this engine writes them. 2: the input is
#: listed by tickwheel (``CHECKPOINT/manifest``), not by Spark's file sources.
CHECKPOINT_FORMAT = 2
#: Passes a final run waits for its end-of-input marker: one is enough unless a
#: trigger raced with writing it.
_END_OF_INPUT_TRIES = 10


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


#: The Spark contexts whose Python workers a run has already warmed up (see
#: SparkEngine._warm_up_python_workers); a stopped context leaves the set with its
#: last reference.
_WARMED_CONTEXTS: weakref.WeakSet[Any] = weakref.WeakSet()
_WARMED_LOCK = threading.Lock()


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
                 checkpoint_dir: Path, lateness_ms: int = DEFAULT_LATENESS_MS,
                 shards: int | None = None,
                 dedupe_retention_ms: int | None = None,
                 max_files_per_trigger: int | None = None,
                 on_batch: Callable[[int, int, int], None] | None = None,
                 sink: OutcomeSink | None = None, overwrite: bool = False) -> None:
        """``on_batch(batch_id, outcomes, quarantined)`` is called after each
        micro-batch's outputs are written (progress). ``sink`` gets every outcome at
        least once: each micro-batch's once its files are written, delivered while the
        next batch runs, and at the start of a run those of batches not yet settled
        (``CHECKPOINT/delivered`` marks the last settled batch; see
        :mod:`tickwheel.pipeline.delivery`). :meth:`run` returns once they are
        settled; the caller closes the sink.

        ``output_dir`` must be empty, new, or hold the outputs of this checkpoint
        (:class:`~tickwheel.pipeline.io.OutputDirError` otherwise); ``overwrite``
        clears earlier outputs, and the checkpoint too when it is inside
        ``output_dir``."""
        check_positive_int("lateness_ms", lateness_ms, minimum=0, maximum=MAX_LATENESS_MS)
        if dedupe_retention_ms is not None:
            check_positive_int("dedupe_retention_ms", dedupe_retention_ms, minimum=0,
                               maximum=MAX_RETENTION_MS)
        if shards is not None:
            check_positive_int("shards", shards, maximum=MAX_SHARDS)
        if max_files_per_trigger is not None:
            check_positive_int("max_files_per_trigger", max_files_per_trigger,
                               maximum=MAX_FILES_PER_TRIGGER)
        if not input_dir.is_dir():
            raise FileNotFoundError(f"input directory {input_dir} does not exist")
        check_spark_paths(input_dir, checkpoint_dir)
        prepare_output(output_dir, overwrite=overwrite, checkpoint=checkpoint_dir,
                       checkpoint_id=checkpoint_id(checkpoint_dir))
        self.spark = spark
        self.input_dir = input_dir
        self.output_dir = output_dir
        self.checkpoint_dir = checkpoint_dir
        self.lateness_ms = lateness_ms
        self.dedupe_retention_ms = dedupe_retention_ms
        self.max_files_per_trigger = max_files_per_trigger
        self.shards, self.labels = self._settle_shards(shards)
        # The outputs beside the checkpoint are its own from now on.
        output_dir.mkdir(parents=True, exist_ok=True)
        # Atomically: a torn marker after kill -9 would disown the outputs.
        owner = output_dir / OWNER_FILE
        tmp = owner.with_name(f".{owner.name}.tmp")
        tmp.write_text(json.dumps({"checkpoint": checkpoint_id(checkpoint_dir)}))
        os.replace(tmp, owner)
        self.on_batch = on_batch
        self.sink = sink
        self._delivery: BatchDelivery | None = None
        self.batches = 0

    def _settle_shards(self, shards: int | None) -> tuple[int, list[int]]:
        meta = self.checkpoint_dir / "tickwheel.json"
        if meta.exists():
            saved = json.loads(meta.read_text())
            made = saved.get("format", 1)
            if made != CHECKPOINT_FORMAT:
                raise ValueError(f"the checkpoint {self.checkpoint_dir} was written in format "
                                 f"{made} by another version of tickwheel's Spark engine; "
                                 f"this one reads format {CHECKPOINT_FORMAT}: start a new "
                                 "checkpoint (--checkpoint, or --overwrite)")
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
        meta.write_text(json.dumps({"format": CHECKPOINT_FORMAT, "id": uuid.uuid4().hex,
                                    "shards": shards, "labels": labels,
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

        def listed(directory: Path, limit: int | None = None) -> DataFrame:
            """The files of ``directory``, listed only."""
            reader = self.spark.readStream.format("binaryFile").schema(
                spark_schema(BINARY_FILE_SCHEMA))
            if limit is not None:
                reader = reader.option("maxFilesPerTrigger", limit)
            return reader.load(str(directory))

        # The file sources list the manifests of the input files (see
        # _spark_manifest) and the control files, and keep the log of those read; the
        # packers read the files themselves. Without the content column the
        # binaryFile source opens no file: the bytes never cross the JVM, and no file
        # is held whole.
        rows = listed(self.checkpoint_dir / MANIFEST_DIR, self.max_files_per_trigger).select(
            "path", F.lit(False).alias("control"))
        control = listed(self.checkpoint_dir / "control").select(
            "path", F.lit(True).alias("control"))
        chunk = spark_schema(CHUNK_SCHEMA)
        chunks = (rows.unionByName(control)
                  .mapInArrow(packer(self.labels), chunk)
                  .withColumn("event_time", F.timestamp_millis("ts"))
                  .withWatermark("event_time", f"{self.lateness_ms} milliseconds")
                  # Not passed on: Spark would drop rows at or below the watermark
                  # before the processor could quarantine them.
                  .select("shard", "low", "ts", "own", "shared"))
        return chunks.groupBy("shard").transformWithStateInPandas(
            processor_class()(self.labels, self.lateness_ms, self.dedupe_retention_ms,
                               RELEASE_AT_HELD_ROWS),
            spark_schema(OUTPUT_SCHEMA), "Append", "EventTime")

    def _write_batch(self, frame: DataFrame, batch_id: int) -> None:
        import pyarrow as pa

        table = frame.toArrow()
        name = f"batch-{batch_id:09d}.parquet"
        outcomes = from_ipc(table["outcomes"].to_pylist(), outcomes_table([]))
        quarantine = from_ipc(table["quarantine"].to_pylist(), quarantine_table([]))
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
        published = publish(self.input_dir, self.checkpoint_dir)
        log.info("%d new input files", published)
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
                 .mapInArrow(pass_through, spark_schema("id long")).collect())
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
