"""The Spark engine: the pipeline as one Spark Structured Streaming query in two
stateful stages, partitioned so that the work per event does not grow with the
partition count.

1. Two sources: the input files, numbered once in the order they are listed, as a
   Python streaming data source whose offsets are those numbers
   (:mod:`tickwheel.pipeline.spark._source`; the input directory is listed as the
   reference engine lists it: Hadoop would take glob characters in a name as a
   pattern), and a file source, listing only, of ``CHECKPOINT/control/``, which holds
   end-of-input markers.
2. ``mapInArrow``: the packers read the input files (JSON Lines split
   into lines as the reference engine reads them, Parquet by its reader), parse each
   row once and cut every slice into chunks (see :mod:`tickwheel.pipeline.contract.routing`):
   updates and watches for the partitions of their keys, watches, cancels, ticks and
   malformed rows for the partition of their ``op_id``, and every key partition gets
   the slice's largest ``ts_ms``.
3. ``transformWithStateInPandas`` grouped by key partition (stage 1, a
   :class:`~tickwheel.pipeline.semantics.partition.KeyPartition` each): keys' values and the
   registrations of the operations watching them; it turns updates into progress rows
   for the partitions of those operations, and forwards stage 2's rows.
4. ``transformWithStateInPandas`` grouped by op-id partition (stage 2, an
   :class:`~tickwheel.pipeline.semantics.partition.OpPartition` each): the resolver's rules over
   watches, cancels and progress; outcomes out.
5. ``foreachBatch`` has the executors write the outcomes and the quarantined rows,
   each partition's to ``batch-<id>-<partition>.parquet`` (``mapInArrow``, so no output
   passes through the driver), atomically and named by batch id and partition, so a
   batch that runs again after a crash replaces its own files: exactly once. The
   driver writes the partitions' counters, then hands the batch's outcome files to an
   optional :class:`~tickwheel.pipeline.delivery.sink.OutcomeSink`.

Time is the input's own, carried in the data: both stages release rows below the
largest ``ts_ms`` read less the lateness bound, the same point in every partition (see
:mod:`tickwheel.pipeline.semantics.partition`), and neither uses Spark's watermark or timers. A
run with ``final=True`` ends the input once the query has read it: a marker moves the
release point just past the last row, so every row is applied and the outcomes are
the reference engine's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.contract.limits import (
    DEFAULT_BYTES_PER_TRIGGER,
    DEFAULT_LATENESS_MS,
    DEFAULT_MAX_FUTURE_MS,
    DEFAULT_STOP_TIMEOUT_MS,
    DEFAULT_TRIGGER_MS,
    MAX_FILES_PER_TRIGGER,
    MAX_LATENESS_MS,
    MAX_PARTITIONS,
    MAX_RETENTION_MS,
    MAX_TRIGGER_MS,
    OCCURRENCES_PER_BATCH,
)
from tickwheel.pipeline.delivery.batch_delivery import (
    BatchDelivery,
    Deliveries,
    DeliveryLag,
    deliveries,
)
from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.pipeline.engines.feed import IntakeFeed
from tickwheel.pipeline.engines.following import (
    FollowBatch,
    FollowCounts,
    FollowResult,
    wall_clock_ms,
)
from tickwheel.pipeline.io.compaction import batch_files, compact, settled_batch
from tickwheel.pipeline.io.files import read_bytes_nofollow, write_bytes_atomically
from tickwheel.pipeline.io.input_dir import (
    check_spark_paths,
    input_dir_problem,
    input_files,
    same_input,
)
from tickwheel.pipeline.io.log_reader import input_bytes
from tickwheel.pipeline.io.outputs import (
    OWNER_FILE,
    checkpoint_id,
    take_output,
    write_atomically,
)
from tickwheel.pipeline.semantics.partition import CommittedChanges, PartitionStatus
from tickwheel.pipeline.spark._input_log import (
    INPUT_GONE,
    changed_files,
    input_gone,
    skipped_files,
)
from tickwheel.pipeline.spark._input_log import (
    committed_inputs as committed_input_names,
)
from tickwheel.pipeline.spark._tasks import (
    batch_writer,
    key_processor,
    op_processor,
    packer,
    warm_worker,
)
from tickwheel.pipeline.spark._wire import (
    CHUNK_SCHEMA,
    FILE_SCHEMA,
    FRAME_BYTES,
    OUTPUT_SCHEMA,
    PROGRESS_SCHEMA,
    WRITTEN_SCHEMA,
    committed_view,
)
from tickwheel.pipeline.state.encoding import SPARK_CHECKPOINT_FORMAT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["CHECKPOINT_FORMAT", "SparkEngine", "SparkRunResult", "latest_statuses"]

log = logging.getLogger(__name__)

#: The checkpoint's layout and state, as this engine writes them; a checkpoint of any
#: other format is refused, naming both formats.
CHECKPOINT_FORMAT = SPARK_CHECKPOINT_FORMAT
#: Passes a run waits for one of its markers (end of input, or a catch-up's
#: ``continue``) to be applied: one is enough unless a trigger races with writing it.
_END_OF_INPUT_TRIES = 10


@dataclass(frozen=True, slots=True)
class SparkRunResult:
    """What a run left in the outputs and the state (summed over partitions)."""

    rows_in: int
    rows_applied: int
    quarantined: int
    held: int  # read, not yet applied: time has not passed them
    pending: int
    ignored_cancels: int
    release_ms: int | None
    batches: int
    seconds: float
    partitions: list[PartitionStatus] = field(default_factory=list)
    #: Recurring schedules held, and their occurrences passed over by misfire policies.
    schedules: int = 0
    skipped: int = 0
    #: Input files the last listing skipped (a name that is not UTF-8, a symlink out
    #: of the input directory or to nothing): not read until that changes.
    files_skipped: int = 0
    #: Outcomes a processor had not settled at the stop: the next start delivers them.
    undelivered: int = 0
    #: Changes seen to input files after they were listed (rows written since may be
    #: lost: files must land whole).
    files_changed: int = 0

    @property
    def state_bytes(self) -> int:
        """Bytes of the partitions' state as last saved, in Spark's state store."""
        return sum(s.state_bytes for s in self.partitions)

    def quarantined_by_reason(self) -> dict[str, int]:
        return _summed(s.quarantined_by_reason for s in self.partitions)

    def outcomes_by_outcome(self) -> dict[str, int]:
        return _summed(s.outcomes_by_outcome for s in self.partitions)


def _release_of(statuses: list[str]) -> int | None:
    """The release point of a micro-batch's op partitions: every row below it is
    applied in each of them."""
    points: list[int | None] = [found["release_ms"] for found in map(json.loads, statuses)
                                if found.get("stage") == "op"]
    known = [point for point in points if point is not None]
    return min(known) if known and len(known) == len(points) else None


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for name, n in one.items():
            total[name] = total.get(name, 0) + n
    return dict(sorted(total.items()))



#: Listings of the status files a reader makes before a file that vanishes each time
#: is an error, not a race with a running batch.
_STATUS_LISTINGS = 8


def latest_statuses(status_dir: Path) -> list[PartitionStatus]:
    """The latest counters of each partition of each stage in a checkpoint's status
    files, read while a running engine may write and forget them."""
    for _ in range(_STATUS_LISTINGS - 1):
        # A batch forgets a file a listing named only once a newer file holds every
        # partition: the next listing sees that one. A name that never reads (a
        # dangling link) fails the last listing.
        with contextlib.suppress(FileNotFoundError):
            return _read_statuses(status_dir)
    return _read_statuses(status_dir)


def _read_statuses(status_dir: Path) -> list[PartitionStatus]:
    import pyarrow.parquet as pq

    latest: dict[tuple[str, int], PartitionStatus] = {}
    for path in sorted(status_dir.glob("*.parquet")):
        for text in pq.read_table(path)["status"].to_pylist():
            status = PartitionStatus(**json.loads(text))
            known = latest.get((status.stage, status.partition))
            if known is None or status.seq >= known.seq:  # files in batch order
                latest[status.stage, status.partition] = status
    return [latest[k] for k in sorted(latest)]

class SparkEngine:
    """Runs the query over ``input_dir`` until the input read so far is processed.

    ``output_dir`` gets ``outcomes/`` and ``quarantine/`` (the contract's columns);
    ``checkpoint_dir`` holds Spark's checkpoint, the input files' numbers, the
    partitions' counters and the control input. Run it again on the same directories to go on
    where it stopped, after a crash too. ``partitions`` (of each stage) is fixed by
    the first run of a checkpoint.
    """

    def __init__(self, spark: SparkSession, input_dir: Path, output_dir: Path,
                 checkpoint_dir: Path, lateness_ms: int = DEFAULT_LATENESS_MS,
                 partitions: int | None = None,
                 dedupe_retention_ms: int | None = None,
                 max_files_per_trigger: int | None = None,
                 on_batch: Callable[[int, int, int], None] | None = None,
                 sink: OutcomeSink | Mapping[str, OutcomeSink] | None = None,
                 overwrite: bool = False,
                 clock: Callable[[], int] | None = None,
                 max_bytes_per_trigger: int | None = DEFAULT_BYTES_PER_TRIGGER,
                 max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
                 worker_cache: bool = True, feed: IntakeFeed | None = None,
                 on_commit: Callable[[CommittedChanges], object] | None = None) -> None:
        """``on_batch(batch_id, outcomes, quarantined)`` is called after each
        micro-batch's outputs are written (progress). ``on_commit`` gets what each
        micro-batch changed in the op partitions, as the local engine gives it (for a
        reader's view, such as :class:`~tickwheel.service.view.StateView`): the workers
        send their changes with their statuses, and a partition restored rather
        than kept in its worker (the first batch of a run) sends every entry it holds.
        ``sink`` gets every outcome at least once: each micro-batch's once its files are
        written, delivered while the next batch runs, and at the start of a run those of
        batches not yet settled (``CHECKPOINT/delivered`` marks the last settled batch; see
        :mod:`tickwheel.pipeline.delivery.batch_delivery`). :meth:`run` returns once they are
        settled; the caller closes the sink.

        ``output_dir`` must be empty, new, or hold the outputs of this checkpoint
        (:class:`~tickwheel.pipeline.io.outputs.OutputDirError` otherwise); ``overwrite``
        clears earlier outputs, and the checkpoint too when it is inside
        ``output_dir``.

        ``clock`` means what it means to the local engine: None, time moves with the rows
        alone; :func:`~tickwheel.pipeline.engines.following.wall_clock_ms`, time also follows
        the wall clock (``ts_ms`` are epoch milliseconds) in :meth:`follow`, which the
        input source reads into its offsets (so no other clock can be given): deadlines
        fire without new rows, and a row whose
        ``ts_ms`` is more than ``max_future_ms`` ahead of the clock is quarantined as
        ``future``. A checkpoint keeps the clock of its first run. ``feed`` is an intake's
        in this process (:class:`~tickwheel.pipeline.engines.feed.IntakeFeed`), with its
        ``floor_file``, which the input source reads: the clock then reads at most the
        floor plus the lateness bound, so that the rows the intake stamps are never
        late.

        Unless ``max_files_per_trigger`` is given, a micro-batch reads about
        ``max_bytes_per_trigger`` of input at most (None: all there is), since its
        outputs come to the driver: a run over more input than that takes several.

        With ``worker_cache`` (the default), a Python worker keeps the partitions it ran
        last and goes on from them while the state still holds what they wrote (see
        :mod:`tickwheel.pipeline.spark._tasks`); without, every call reads its partition
        from the state. Outcomes are the same either way."""
        check_positive_int("lateness_ms", lateness_ms, minimum=0, maximum=MAX_LATENESS_MS)
        check_positive_int("max_future_ms", max_future_ms, minimum=0, maximum=MAX_RETENTION_MS)
        if dedupe_retention_ms is not None:
            check_positive_int("dedupe_retention_ms", dedupe_retention_ms, minimum=0,
                               maximum=MAX_RETENTION_MS)
        if partitions is not None:
            check_positive_int("partitions", partitions, maximum=MAX_PARTITIONS)
        if max_files_per_trigger is not None:
            check_positive_int("max_files_per_trigger", max_files_per_trigger,
                               maximum=MAX_FILES_PER_TRIGGER)
        if max_bytes_per_trigger is not None:
            check_positive_int("max_bytes_per_trigger", max_bytes_per_trigger)
        problem = input_dir_problem(input_dir)
        if problem is not None:
            raise FileNotFoundError(problem)
        check_spark_paths(input_dir, checkpoint_dir, output_dir)
        self._owner = take_output(output_dir, overwrite=overwrite, checkpoint=checkpoint_dir)
        self.spark = spark
        self.input_dir = input_dir
        self.output_dir = output_dir
        self.checkpoint_dir = checkpoint_dir
        self.lateness_ms = lateness_ms
        self.dedupe_retention_ms = dedupe_retention_ms
        self.max_files_per_trigger = max_files_per_trigger
        self.max_bytes_per_trigger = (None if max_files_per_trigger is not None
                                      else max_bytes_per_trigger)
        if clock is not None and clock is not wall_clock_ms:
            raise ValueError("clock must be None or wall_clock_ms: the Spark engine's input "
                             "source reads the wall clock itself")
        self.clock = clock
        #: Whether time follows the wall clock, as a checkpoint records it.
        self.wall_clock = clock is not None
        self.max_future_ms = max_future_ms
        self.worker_cache = worker_cache
        if feed is not None and feed.floor_file is None:
            raise ValueError("the Spark engine's input source reads the time floor from a "
                             "file: give the feed a floor_file")
        self.feed = feed
        self.partitions, self.labels = self._settle_partitions(partitions)
        self.checkpoint_id = str(checkpoint_id(checkpoint_dir))
        # The outputs beside the checkpoint are its own from now on.
        output_dir.mkdir(parents=True, exist_ok=True)
        # Atomically: a torn marker after kill -9 would disown the outputs.
        write_bytes_atomically(json.dumps({"checkpoint": checkpoint_id(checkpoint_dir)}).encode(),
                               output_dir / OWNER_FILE)
        self.on_batch = on_batch
        self.on_commit = on_commit
        # Which reader's view the workers send their changes to (None: no view): a
        # worker sends every entry it holds to a view it has not sent them to.
        self._view_id = None if on_commit is None else uuid.uuid4().hex
        self.sink = sink
        self._delivery: BatchDelivery | Deliveries | None = None
        self.batches = 0
        self._skipped: dict[str, str] = {}  # input files skipped, as last reported
        # The (partition, seq) of the op partitions catching up when the driver last
        # asked for a micro-batch to go on with it.
        self._continued: tuple[tuple[int, int], ...] = ()
        self._changed: dict[str, int] = {}  # input files seen to change, as last reported
        self._input_gone: str | None = None  # why the input cannot be listed, as reported
        # What follow() reports each micro-batch to, and the run's totals so far.
        self._on_follow_batch: Callable[[FollowBatch], None] | None = None
        self._totals = FollowResult()
        self._counts = self._counts_now()

    def _settle_partitions(self, partitions: int | None) -> tuple[int, list[int]]:
        meta = self.checkpoint_dir / "tickwheel.json"
        if meta.exists():
            saved = json.loads(read_bytes_nofollow(meta))
            same_input(saved.get("input"), self.input_dir, self.checkpoint_dir)
            if saved.get("engine", "spark") != "spark":
                raise ValueError(f"the checkpoint {self.checkpoint_dir} belongs to the "
                                 f"{saved['engine']} engine: give the Spark engine its own")
            made = saved.get("format", 1)
            if made != CHECKPOINT_FORMAT:
                raise ValueError(f"the checkpoint {self.checkpoint_dir} was written in format "
                                 f"{made} by another version of tickwheel's Spark engine; "
                                 f"this one reads format {CHECKPOINT_FORMAT}: start a new "
                                 "checkpoint (--checkpoint, or --overwrite)")
            if partitions is not None and partitions != saved["partitions"]:
                raise ValueError(f"partitions={partitions} but the checkpoint "
                                 f"{self.checkpoint_dir} was made with "
                                 f"partitions={saved['partitions']}")
            saved.setdefault("clock", "event")
            mine = {"lateness_ms": self.lateness_ms,
                    "dedupe_retention_ms": self.dedupe_retention_ms,
                    "clock": self.clock_kind}
            for name, value in mine.items():
                # The partitions' state holds these, and the clock is a source of the
                # query: a run cannot change them.
                if saved.get(name) != value:
                    raise ValueError(f"{name}={value} but the checkpoint "
                                     f"{self.checkpoint_dir} was made with "
                                     f"{name}={saved.get(name)}")
            return int(saved["partitions"]), [int(label) for label in saved["labels"]]
        if partitions is None:
            partitions = max(1, self.spark.sparkContext.defaultParallelism)
        labels = self._labels(partitions)
        (self.checkpoint_dir / "control").mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(json.dumps({
            "format": CHECKPOINT_FORMAT, "id": uuid.uuid4().hex,
            "input": str(self.input_dir.resolve()), "partitions": partitions,
            "labels": labels, "lateness_ms": self.lateness_ms,
            "dedupe_retention_ms": self.dedupe_retention_ms,
            "clock": self.clock_kind}).encode(),
            meta)
        return partitions, labels

    def _labels(self, partitions: int) -> list[int]:
        """A grouping value per partition that Spark's hash partitioner puts in a
        shuffle partition of its own: numbers 0..n-1 would share some, and partitions
        sharing one run one after the other."""
        from pyspark.sql import functions as F  # noqa: N812 (Spark's idiom)

        value = F.col("id").cast("int")
        found = (self.spark.range(0, 64 * partitions)
                 .select(value.alias("label"),
                         F.pmod(F.hash(value), F.lit(partitions)).alias("p"))
                 .groupBy("p").agg(F.min("label").alias("label")).collect())
        labels = {int(row["p"]): int(row["label"]) for row in found}
        if len(labels) != partitions:
            raise RuntimeError(f"no distinct labels for {partitions} partitions")
        return [labels[p] for p in range(partitions)]

    def _query(self, follow: bool = False, max_bytes: int | None = None) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812 (Spark's idiom)

        from tickwheel.pipeline.spark._source import INPUT_FORMAT, InputSource, input_options

        no_path = F.lit(None).cast("string").alias("path")
        no_file = F.lit(None).cast("binary").alias("file")
        no_clock = F.lit(None).cast("long").alias("clock")
        self.spark.dataSource.register(InputSource)
        # With the wall clock, the source's offsets hold its readings (see _source), so
        # a micro-batch run again after a crash reads the same clock, and each input
        # file carries it, so that its packer can judge a row too far ahead of it.
        rows = (self.spark.readStream.format(INPUT_FORMAT)
                .options(**input_options(self.input_dir, self.checkpoint_dir,
                                         self.max_files_per_trigger, self.partitions,
                                         follow=follow, max_bytes=max_bytes,
                                         wall_clock=self.wall_clock,
                                         floor_file=(None if self.feed is None
                                                     else self.feed.floor_file),
                                         lateness_ms=self.lateness_ms))
                .load().select(no_path, "file", "clock"))
        control = (self.spark.readStream.format("binaryFile").schema(FILE_SCHEMA)
                   .load(str(self.checkpoint_dir / "control"))
                   .select("path", no_file, no_clock))
        sources = rows.unionByName(control)
        chunks = sources.mapInArrow(
            packer(self.labels, self.lateness_ms,
                   self.max_future_ms if self.wall_clock else None), CHUNK_SCHEMA)
        progress = chunks.groupBy("grp").transformWithStateInPandas(
            key_processor(self.labels, self.lateness_ms, self.checkpoint_id,
                          self.worker_cache),
            PROGRESS_SCHEMA, "Append", "None")
        return progress.groupBy("grp").transformWithStateInPandas(
            op_processor(self.labels, self.lateness_ms, self.dedupe_retention_ms,
                         self.checkpoint_id, self.wall_clock, self.worker_cache,
                         OCCURRENCES_PER_BATCH, self._view_id),
            OUTPUT_SCHEMA, "Append", "None")

    def _write_batch(self, frame: DataFrame, batch_id: int) -> None:
        import pyarrow as pa

        began = time.perf_counter()
        self._owner.check()  # a run that lost its checkpoint writes nothing more
        name = f"batch-{batch_id:09d}"
        for sub in ("outcomes", "quarantine"):
            # A batch run again after a crash replaces all its first attempt wrote: a
            # partition with nothing to write this time must leave no file behind.
            for stale in (self.output_dir / sub).glob(f"{name}-*.parquet"):
                stale.unlink(missing_ok=True)
        # The executors write the outputs; the driver gets statuses and counts.
        written = frame.mapInArrow(batch_writer(str(self.output_dir.absolute()), batch_id,
                                                self._owner.epoch),
                                   WRITTEN_SCHEMA).toArrow()
        for sub in ("outcomes", "quarantine"):
            # What a task attempt that failed, or was superseded, left half written.
            for tmp in (self.output_dir / sub).glob(f".{name}-*.tmp"):
                tmp.unlink(missing_ok=True)
        statuses = [s for s in written["status"].to_pylist() if s is not None]
        if self.on_commit is not None:
            self.on_commit(committed_view(
                batch_id, [v for v in written["view"].to_pylist() if v is not None],
                _release_of(statuses)))
        outcomes = sum(written["outcomes"].to_pylist())
        quarantined = sum(written["quarantined"].to_pylist())
        if statuses:
            write_atomically(pa.table({"status": pa.array(statuses, pa.string())}),
                             self.checkpoint_dir / "status" / f"{name}.parquet")
            if len(statuses) == 2 * self.partitions:
                self._forget_statuses_before(batch_id)
        self._owner.check()  # a stale owner does not let Spark commit what it wrote
        if self._delivery is not None:
            self._delivery.submit(batch_id, batch_files(self.output_dir / "outcomes",
                                                        batch_id))
        # Batches before this one have committed (and, with a sink, those up to its
        # mark are delivered): their files may merge.
        settled = settled_batch(batch_id - 1, self.checkpoint_dir / "delivered")
        for sub in ("outcomes", "quarantine"):
            compact(self.output_dir / sub, settled)
        self._report_skipped()
        self._report_changed()
        self.batches += 1
        rows_before = self._counts.rows_in
        self._counts = counts = self._counts_now()
        if self.on_batch is not None:
            self.on_batch(batch_id, outcomes, quarantined)
        totals = self._totals
        totals.batches += 1
        totals.rows_in += counts.rows_in - rows_before
        totals.outcomes += outcomes
        totals.quarantined += quarantined
        if self._on_follow_batch is not None:
            self._on_follow_batch(FollowBatch(
                batch_id, None, counts.rows_in - rows_before, outcomes, quarantined,
                counts.pending, counts.held, counts.release_ms, counts.clock_ms,
                time.perf_counter() - began))
        log.info("batch %d: %d outcomes, %d quarantined", batch_id, outcomes, quarantined)

    def _report_changed(self) -> None:
        """Warn of each input file the source saw change after it numbered it, once
        per change."""
        changed = changed_files(self.checkpoint_dir)
        for name, times in sorted(changed.items()):
            if self._changed.get(name) != times:
                log.warning("input file %r changed after it was listed: rows written since "
                            "may not be read (write input files whole, then rename them "
                            "into place)", str(self.input_dir / name))
        self._changed = changed

    def _report_skipped(self) -> None:
        """Warn of each input file the streaming source skips, once while it is (the
        source's own log goes to no user)."""
        skipped = skipped_files(self.checkpoint_dir)
        for name, why in sorted(skipped.items()):
            if name not in self._skipped:
                log.warning("skipping input file %r: %s", str(self.input_dir / name), why)
        self._skipped = skipped

    def _report_input_gone(self) -> None:
        """Warn when the streaming source finds the input directory gone, and when it
        is back (the source waits for it, as the local engine does)."""
        gone = input_gone(self.checkpoint_dir)
        if gone == self._input_gone:
            return
        if gone is not None:
            log.warning("%s: waiting for it to come back", gone)
        else:  # the source names it absolute
            log.warning("input directory %s is back", self.input_dir.absolute())
        self._input_gone = gone

    def _forget_statuses_before(self, batch_id: int) -> None:
        """Every partition reported in this batch: earlier statuses are superseded (a
        service would otherwise keep a file per batch forever)."""
        for path in (self.checkpoint_dir / "status").glob("batch-*.parquet"):
            if int(path.stem.split("-")[1]) < batch_id:
                path.unlink(missing_ok=True)

    def _settings(self, follow: bool = False) -> dict[str, str]:
        settings = {
            # One shuffle partition (and state store) per partition of each stage:
            # Spark's default of 200 costs a state-store commit each per batch. A
            # checkpoint keeps its own value.
            "spark.sql.shuffle.partitions": str(self.partitions),
            # Time is carried in the data: a batch without new input has nothing to do.
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            # A state-store commit then writes the changes, not a new RocksDB checkpoint.
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
            # Arrow batches into the Python workers by size as well as rows: the stages'
            # rows are blobs of up to BLOB_BYTES, and a batch of 20,000 of them would be
            # past what the JVM can hold, or past Arrow's 2 GiB.
            "spark.sql.execution.arrow.maxBytesPerBatch": str(FRAME_BYTES),
        }
        if follow:
            # A service runs a micro-batch a second: Spark's default keeps the state of
            # the last 100 for recovery, which only a restart from an old batch needs.
            settings["spark.sql.streaming.minBatchesToRetain"] = "20"
        return settings

    @contextlib.contextmanager
    def _session_settings(self, follow: bool = False) -> Iterator[None]:
        """The engine's settings for the query's life. The caller's session gets its own
        values back when the query ends, not when it starts: the file sources make
        their logs on the query's thread, with the session's settings of that moment."""
        settings = self._settings(follow)
        previous = {name: self.spark.conf.get(name, None) for name in settings}
        for name, value in settings.items():
            self.spark.conf.set(name, value)
        try:
            yield
        finally:
            for name, old_value in previous.items():
                if old_value is None:
                    self.spark.conf.unset(name)
                else:
                    self.spark.conf.set(name, old_value)

    @property
    def clock_kind(self) -> str:
        """``"wall"`` or ``"event"``: the clock as a checkpoint records it."""
        return "wall" if self.wall_clock else "event"

    def follow(self, stop: threading.Event, trigger_ms: int = DEFAULT_TRIGGER_MS,
               on_batch: Callable[[FollowBatch], None] | None = None,
               stop_timeout_ms: int = DEFAULT_STOP_TIMEOUT_MS) -> FollowResult:
        """Run as a service until ``stop`` is set: a micro-batch every ``trigger_ms``
        with the files that landed since the last (the source lists the input
        directory at each trigger), and, with the wall clock, time moving with it.
        ``on_batch`` gets each micro-batch's report (``files`` is None: the source
        reads them). Stops between micro-batches where it can; a batch cut short runs again on the
        next start, so its outcomes are written once either way. Delivery gets
        ``stop_timeout_ms`` after that; what it has not settled then, the next start
        delivers (``undelivered``)."""
        check_positive_int("trigger_ms", trigger_ms, maximum=MAX_TRIGGER_MS)
        check_positive_int("stop_timeout_ms", stop_timeout_ms, minimum=0,
                           maximum=MAX_TRIGGER_MS)
        self._on_follow_batch = on_batch
        self._totals = FollowResult()
        if self.sink is not None:
            self._delivery = deliveries(self.sink, self.output_dir / "outcomes",
                                        self.checkpoint_dir)
        # A marker a run stopped while the input was gone left: the source's first
        # listing says afresh.
        (self.checkpoint_dir / INPUT_GONE).unlink(missing_ok=True)
        try:
            with self._session_settings(follow=True):
                self._warm_workers()
                query = (self._query(follow=True, max_bytes=self.max_bytes_per_trigger)
                         .writeStream
                         .foreachBatch(self._write_batch)
                         .option("checkpointLocation", str(self.checkpoint_dir / "query"))
                         .trigger(processingTime=f"{trigger_ms} milliseconds")
                         .start())
                try:
                    while not stop.wait(min(trigger_ms, 1000) / 1000):
                        if not query.isActive:
                            break
                        self._report_input_gone()
                        self._go_on_catching_up()
                    self._stop_between_batches(query, trigger_ms)
                finally:
                    query.stop()
                failure = query.exception()
                if failure is not None:
                    raise RuntimeError(f"the query failed: {failure}")
        except BaseException:
            self._close_delivery(raise_failure=False, timeout_s=stop_timeout_ms / 1000)
            raise
        finally:
            self._on_follow_batch = None
        undelivered = self._close_delivery(timeout_s=stop_timeout_ms / 1000)
        counts = self._counts = self._counts_now()
        return replace(self._totals, pending=counts.pending, release_ms=counts.release_ms,
                       outcomes_by_outcome=counts.outcomes_by_outcome(),
                       quarantined_by_reason=counts.quarantined_by_reason(),
                       undelivered=undelivered)

    def _warm_workers(self) -> None:
        """Start the Python workers a service's first micro-batches need, before it
        takes input: Spark starts one when a task finds none free, and a new one
        imports pandas, pyarrow and the engine (docs/follow.md). A first-stage task
        holds two (the source's reader and a packer), hence two chained operators,
        one task per core; Spark reuses the workers for every later Python task."""
        cores = self.spark.sparkContext.defaultParallelism
        started = time.perf_counter()
        (self.spark.range(0, cores, 1, cores)
         .mapInArrow(warm_worker, "id long").mapInArrow(warm_worker, "id long")
         .collect())
        log.info("Python workers warmed in %.1f s", time.perf_counter() - started)

    def _stop_between_batches(self, query: StreamingQuery, trigger_ms: int) -> None:
        """Wait (a trigger at most) for the running micro-batch to finish, so that
        ``stop`` lands in the pause before the next one."""
        deadline = time.monotonic() + max(trigger_ms, 1000) / 1000 * 2
        while (query.isActive and query.status.get("isTriggerActive")
               and time.monotonic() < deadline):
            time.sleep(0.01)

    def _run_query(self, final: bool) -> None:
        # Input over the budget is read in several micro-batches; under it, in one,
        # without a budget: a file landing since would otherwise push one that was
        # there out of the micro-batch that ends the input.
        budget = self.max_bytes_per_trigger
        listed = input_files(self.input_dir, skipped=self._skipped)
        if budget is not None and sum(map(input_bytes, listed)) <= budget:
            budget = None
        with self._session_settings():
            writer = (self._query(max_bytes=budget).writeStream
                      .foreachBatch(self._write_batch)
                      .option("checkpointLocation", str(self.checkpoint_dir / "query")))
            if final and self.max_files_per_trigger is None and budget is None:
                # Listed with the input by the first micro-batch, which then takes
                # all the input there is: it ends the input too.
                self._write_marker({"end": True})
            query = writer.start()
            try:
                self._process_all(query, final)
            finally:
                query.stop()
        for progress in query.recentProgress:
            log.info("batch %s: %s rows, %s", progress.batchId, progress.numInputRows,
                     progress.durationMs)

    def _process_all(self, query: StreamingQuery, final: bool) -> None:
        """Everything the input holds, then, if ``final``, the end-of-input marker, then
        any catch-up of schedules to its end, in one query.
        ``processAllAvailable`` returns once a trigger finds nothing new, and a trigger
        that lists the control directory just before a marker lands returns early, so
        the partitions' counters say when the marker is in."""
        query.processAllAvailable()
        if final and not self._released_past_input() and self._write_end_marker() is not None:
            for _ in range(_END_OF_INPUT_TRIES):
                query.processAllAvailable()
                if self._released_past_input():
                    break
            else:
                raise RuntimeError("the end-of-input marker was not applied after "
                                   f"{_END_OF_INPUT_TRIES} passes")
        self._catch_up(query)

    def _catch_up(self, query: StreamingQuery) -> None:
        """Micro-batches without input until no op partition is catching up: each
        decides a bounded share of a catch-up (``OCCURRENCES_PER_BATCH``), so a run
        over a gap of millions of occurrences keeps its micro-batches, and their
        state, bounded. A pass that applied no marker (a trigger raced with writing
        it) counts towards the bound on passes."""
        idle = 0
        while True:
            waiting = self._catching_up()
            if not waiting:
                return
            if self._continue(waiting):
                idle = 0
            else:
                idle += 1
                if idle > _END_OF_INPUT_TRIES:
                    raise RuntimeError("a catch-up of schedules made no progress after "
                                       f"{_END_OF_INPUT_TRIES} passes")
            query.processAllAvailable()

    def delivery_lag(self) -> DeliveryLag | None:
        """How far delivery to the sink stands behind the engine (None without one)."""
        delivery = self._delivery
        return None if delivery is None else delivery.lag()

    def _close_delivery(self, *, raise_failure: bool = True,
                        timeout_s: float | None = None) -> int:
        """Stop delivering; how many outcomes are left for the next start."""
        if self._delivery is None:
            return 0
        delivery, self._delivery = self._delivery, None
        return delivery.close(raise_failure=raise_failure, timeout_s=timeout_s)

    def committed_inputs(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` (input file names) that a committed micro-batch read: no
        micro-batch reads them again, and they may be deleted."""
        return committed_input_names(self.checkpoint_dir, names)

    def statuses(self) -> list[PartitionStatus]:
        """The latest counters of each partition of each stage."""
        return latest_statuses(self.checkpoint_dir / "status")

    def _latest_row(self) -> int | None:
        tops = [s.top_ms for s in self.statuses() if s.stage == "key" and s.top_ms is not None]
        return max(tops, default=None)

    def _released_past_input(self) -> bool:
        """Whether every partition of stage 2 stands past the latest row read (or none
        is read yet); rows may still wait there on a catch-up (:meth:`_catching_up`)."""
        top = self._latest_row()
        if top is None:
            return True
        ops = [s for s in self.statuses() if s.stage == "op"]
        return len(ops) == self.partitions and all(
            s.release_ms is not None and s.release_ms > top for s in ops)

    def _write_end_marker(self) -> int | None:
        """Move time just past the latest row read, as the next micro-batch applies
        the marker: every row is applied and time stands at that row's ``ts_ms``, as in
        the reference engine. None if there is nothing to move."""
        top = self._latest_row()
        if top is None or self._released_past_input():
            return None
        end = min(top + 1, 2**63 - 1)
        self._write_marker({"end": True, "end_ms": end})
        return end

    def _catching_up(self) -> tuple[tuple[int, int], ...]:
        """The op partitions (and the call of each) whose statuses say a catch-up of
        schedules waits for them."""
        return tuple((s.partition, s.seq) for s in self.statuses()
                     if s.stage == "op" and s.catching_up)

    def _go_on_catching_up(self) -> None:
        """A micro-batch without input for a catch-up that waits: in event time only
        a landing file starts one, and an op partition decides a bounded share of a
        catch-up a call (``OCCURRENCES_PER_BATCH``). One marker per round of
        statuses: the next one waits for statuses newer than those that asked for
        the last."""
        waiting = self._catching_up()
        if waiting and self._continue(waiting):
            log.info("a catch-up goes on in %d partitions", len(waiting))

    def _continue(self, waiting: tuple[tuple[int, int], ...]) -> bool:
        """Write a ``continue`` marker for the partitions ``waiting`` (as
        :meth:`_catching_up` gives them) unless the last marker answered these same
        statuses; returns whether it wrote one."""
        if waiting == self._continued:
            return False
        self._continued = waiting
        self._write_marker({"continue": True}, "continue")
        return True

    def _write_marker(self, marker: dict[str, Any], kind: str = "end") -> None:
        write_bytes_atomically((json.dumps(marker) + "\n").encode(),
                               self.checkpoint_dir / "control" / f"{kind}-{uuid.uuid4().hex}.jsonl")

    def run(self, final: bool = True) -> SparkRunResult:
        """Process what the input holds now; with ``final``, end the input too."""
        if self.wall_clock:
            raise ValueError(f"the checkpoint {self.checkpoint_dir} follows the wall clock: "
                             "it runs in follow mode only")
        started = time.perf_counter()
        if self.sink is not None:
            self._delivery = deliveries(self.sink, self.output_dir / "outcomes",
                                        self.checkpoint_dir)
        try:
            self._run_query(final)
        except BaseException:
            self._close_delivery(raise_failure=False)  # the query's error comes first
            raise
        self._close_delivery()
        return self.result(started)

    def _counts_now(self) -> FollowCounts:
        """The counters the partitions' latest statuses give (a read of their files)."""
        result = self.result()
        key_pending = sum(s.pending for s in result.partitions if s.stage == "key")
        return FollowCounts(
            batches=result.batches, rows_in=result.rows_in,
            rows_applied=result.rows_applied, quarantined=result.quarantined,
            held=result.held, pending=result.pending, registrations=key_pending,
            ignored_cancels=result.ignored_cancels, schedules=result.schedules,
            skipped=result.skipped, release_ms=result.release_ms,
            clock_ms=wall_clock_ms() if self.wall_clock else None,
            state_bytes=result.state_bytes, files_skipped=result.files_skipped,
            files_changed=result.files_changed,
            by_reason=result.quarantined_by_reason(),
            by_outcome=result.outcomes_by_outcome())

    def counts(self) -> FollowCounts:
        """The counters after the last micro-batch: a snapshot, safe to read from any
        thread, with delivery's lag now."""
        lag = self.delivery_lag()
        return replace(self._counts,
                       delivery_behind_batches=None if lag is None else lag.batches,
                       delivery_lag_ms=None if lag is None else lag.lag_ms)

    @property
    def rows_read(self) -> int:
        """The rows read by the micro-batches committed so far."""
        return self._counts.rows_in

    def result(self, started: float | None = None) -> SparkRunResult:
        """What the outputs and the state say now (``seconds`` since ``started``, a
        ``time.perf_counter()`` reading)."""
        statuses = self.statuses()
        return SparkRunResult(
            rows_in=sum(s.rows_in for s in statuses),
            rows_applied=sum(s.rows_applied for s in statuses),
            quarantined=sum(s.quarantined for s in statuses),
            held=sum(s.held for s in statuses),
            pending=sum(s.pending for s in statuses if s.stage == "op"),
            ignored_cancels=sum(s.ignored_cancels for s in statuses),
            release_ms=max((s.release_ms for s in statuses if s.release_ms is not None),
                           default=None),
            batches=self.batches,
            seconds=0.0 if started is None else time.perf_counter() - started,
            partitions=statuses,
            schedules=sum(s.schedules for s in statuses),
            skipped=sum(s.skipped for s in statuses),
            files_skipped=len(skipped_files(self.checkpoint_dir)),
            files_changed=sum(changed_files(self.checkpoint_dir).values()),
        )
