"""The local engine in follow mode: a service that reads an input directory as files
land in it and fires deadlines on time, in this process.

Each *batch* reads the files that landed since the last one and moves time: to the
largest ``ts_ms`` read less the lateness bound, as the Spark engine does (see
:mod:`tickwheel.pipeline.semantics.partition`; the engine here is its one partition of each
stage), and, with a wall clock, to the wall clock's time less the bound, whether or
not a row arrived. A deadline therefore fires once the wall clock is past it plus the
lateness bound; a row that arrives later than the bound is quarantined as late. A
wall clock that steps back holds time where it stands: time never goes back.

Exactly once, across crashes: a batch's plan (its files and its clock reading) is
written before it runs, and a restart runs a planned batch again from that plan, so it
makes the same outcomes and rewrites the same ``batch-<id>.parquet`` files. The state
(the partitions' heads and the batch id) is written whole after the outputs; the
partitions' entries that the batch changed, the op ids it saw and the names of the
files it read go to append-only logs, tagged with their batch. The engine decides;
:class:`~tickwheel.pipeline.state.local_checkpoint.LocalCheckpoint` stores.

Between batches :meth:`LocalFollowEngine.run` sleeps until the next trigger or until
the purgatory's timer says the next deadline falls due, whichever comes first, so a
deadline is not held back by the trigger interval.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.contract.events import (
    T_WATCH,
    W_DEADLINE,
    W_TS,
    W_TYPE,
    Quarantined,
    Reason,
    Wire,
    compact_wire,
    is_quarantined,
    to_wire,
    wire_line,
)
from tickwheel.pipeline.contract.limits import (
    DEFAULT_FOLLOW_BYTES_PER_BATCH,
    DEFAULT_LATENESS_MS,
    DEFAULT_MAX_FUTURE_MS,
    DEFAULT_STOP_TIMEOUT_MS,
    FOLLOW_DEDUPE_RETENTION_MS,
    MAX_FILES_PER_TRIGGER,
    MAX_LATENESS_MS,
    MAX_RETENTION_MS,
    MAX_TRIGGER_MS,
    OCCURRENCES_PER_BATCH,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.contract.routing import route
from tickwheel.pipeline.delivery.batch_delivery import BatchDelivery, Deliveries, deliveries
from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.pipeline.engines.feed import FileStat, IntakeFeed
from tickwheel.pipeline.engines.following import FollowBatch, FollowCounts, FollowResult
from tickwheel.pipeline.io.compaction import compact, settled_batch
from tickwheel.pipeline.io.files import write_bytes_atomically
from tickwheel.pipeline.io.input_dir import (
    input_dir_problem,
    input_files,
    input_names,
)
from tickwheel.pipeline.io.log_reader import (
    input_bytes,
    json_lines,
    json_stream,
    open_input,
    parquet_events,
)
from tickwheel.pipeline.io.outputs import (
    DEFAULT_CHECKPOINT,
    OWNER_FILE,
    checkpoint_id,
    outcomes_table,
    owner_metadata,
    quarantine_table,
    take_output,
    write_atomically,
)
from tickwheel.pipeline.semantics.key_stage import is_progress
from tickwheel.pipeline.semantics.partition import (
    CommittedChanges,
    KeyPartition,
    OpPartition,
    run_steps,
)
from tickwheel.pipeline.semantics.row_times import times_of
from tickwheel.pipeline.state.collector import CollectorFreezer, collector_paused
from tickwheel.pipeline.state.local_checkpoint import (
    BatchPlan,
    CheckpointSettings,
    LocalCheckpoint,
)

__all__ = ["LocalFollowEngine"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A following engine's objects stay out of the collector's walk this long at most
#: (:class:`~tickwheel.pipeline.state.collector.CollectorFreezer`): a full walk of a large
#: state stops the process, submit server included, for up to a second.
FOLLOW_THAW_EVERY_S = 600.0
# Input files read earlier that a listing checks for changes, in turn (a stat each).
_CHECKS_PER_LISTING = 256
#: Batches that deadlines call for come no closer together than this.
MIN_STEP_MS = 100


def _future_as_malformed(rows: list[Wire], limit: int) -> list[Wire]:
    """Rows whose ts_ms is past ``limit`` in the malformed rows' wire form, with the
    reason ``future``: the stages quarantine and count them as they do a bad row."""
    if all(is_quarantined(fields) or fields[W_TS] <= limit for fields in rows):
        return rows
    return [(wire_line(fields), Reason.FUTURE.value, fields[W_TS])
            if not is_quarantined(fields) and fields[W_TS] > limit else fields for fields in rows]


def _rows_of(path: Path) -> list[Wire]:
    """A file's rows in their wire form, read as the reference engine reads them."""
    opened = open_input(path)
    if opened is None:
        return []
    with opened as stream:
        if path.suffix == ".parquet":
            return [to_wire(row) for rows in parquet_events(stream) for row in rows]
        return [compact_wire(line) for lines in json_lines(json_stream(stream, path.name))
                for line in lines if line.strip()]


class LocalFollowEngine:
    """Follows ``input_dir``: :meth:`step` runs one batch, :meth:`follow` runs batches
    until told to stop (a :class:`~tickwheel.pipeline.engines.following.FollowingEngine`).

    ``clock`` is the wall clock (``ts_ms`` milliseconds, such as
    :func:`wall_clock_ms`); without one, time moves only as rows arrive. ``output_dir``
    gets ``outcomes/`` and ``quarantine/`` as ``batch-<id>.parquet`` files;
    ``checkpoint_dir`` (default ``OUTPUT/_checkpoint``) holds the state, so that a run
    on the same directories carries on where the last one stopped. ``sink`` gets every
    outcome at least once (see :class:`~tickwheel.pipeline.delivery.batch_delivery.BatchDelivery`).
    ``feed`` is what an intake in this process shares with the engine
    (:class:`~tickwheel.pipeline.engines.feed.IntakeFeed`): the clock's reading is held
    at most the lateness bound above its time floor, so that the rows the intake stamps
    are never late; a batch takes the rows it offers rather than parse their files
    again; and between two pieces of a batch's rows the engine gives way to it while it
    is busy. ``on_commit`` gets what
    each committed batch changed (and, at the start, every entry held), from the
    engine's thread: a reader's view (such as :class:`~tickwheel.service.view.StateView`)
    follows the state without touching it.
    """

    def __init__(self, input_dir: Path, output_dir: Path, *,
                 checkpoint_dir: Path | None = None,
                 lateness_ms: int = DEFAULT_LATENESS_MS,
                 dedupe_retention_ms: int | None = FOLLOW_DEDUPE_RETENTION_MS,
                 clock: Callable[[], int] | None = None,
                 sink: OutcomeSink | Mapping[str, OutcomeSink] | None = None,
                 overwrite: bool = False,
                 max_files_per_batch: int | None = None,
                 max_bytes_per_batch: int = DEFAULT_FOLLOW_BYTES_PER_BATCH,
                 max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
                 feed: IntakeFeed | None = None,
                 on_commit: Callable[[CommittedChanges], object] | None = None) -> None:
        check_positive_int("lateness_ms", lateness_ms, minimum=0, maximum=MAX_LATENESS_MS)
        if max_files_per_batch is not None:
            check_positive_int("max_files_per_batch", max_files_per_batch,
                               maximum=MAX_FILES_PER_TRIGGER)
        check_positive_int("max_bytes_per_batch", max_bytes_per_batch)
        check_positive_int("max_future_ms", max_future_ms, minimum=0, maximum=MAX_RETENTION_MS)
        if dedupe_retention_ms is not None:
            check_positive_int("dedupe_retention_ms", dedupe_retention_ms, minimum=0,
                               maximum=MAX_RETENTION_MS)
        problem = input_dir_problem(input_dir)
        if problem is not None:
            raise FileNotFoundError(problem)
        input_files(input_dir, warn=False)  # refuses what the engines cannot read alike
        checkpoint = output_dir / DEFAULT_CHECKPOINT if checkpoint_dir is None else checkpoint_dir
        # One owner at a time: taken before anything is read or written.
        self._owner = take_output(output_dir, overwrite=overwrite, checkpoint=checkpoint)
        self.input_dir = input_dir
        self.output_dir = output_dir
        self.checkpoint_dir = checkpoint
        self.lateness_ms = lateness_ms
        self.dedupe_retention_ms = dedupe_retention_ms
        self.clock = clock
        self.feed = feed
        self.on_commit = on_commit
        self.sink = sink
        self.max_future_ms = max_future_ms
        self.max_files_per_batch = max_files_per_batch
        self.max_bytes_per_batch = max_bytes_per_batch
        self.backlog = 0  # new input files left for the next batches by the budget
        self._deferred = False  # the last batch left files for the next ones
        # Each file read in this run: its (size, mtime) when read, to tell one that
        # changed afterwards; and how many did.
        self._read_stats: dict[str, FileStat] = {}
        self._files_changed = 0
        self._skipped: dict[str, str] = {}  # input files skipped (see input_files)
        self._input_gone = False  # the input directory was gone at the last listing
        # Rows handed over by an intake in this process, by input file, with the
        # (size, mtime) the file had then; taken when the file is read.
        self._checkpoint = LocalCheckpoint(
            checkpoint, input_dir,
            CheckpointSettings(lateness_ms, dedupe_retention_ms,
                               "event" if clock is None else "wall"))
        output_dir.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(json.dumps({"checkpoint": checkpoint_id(checkpoint)}).encode(),
                               output_dir / OWNER_FILE)
        restored = self._checkpoint.restore()
        if restored is None:
            self.keys = KeyPartition(0, 1, lateness_ms)
            self.ops = OpPartition(0, lateness_ms, dedupe_retention_ms)
        else:
            self.keys, self.ops = restored.keys, restored.ops
        # What the next commit writes: what changed from here on.
        self.ops.stage.track_seen_changes()
        self.keys.track_changes()
        self.ops.track_changes()
        self._follow_clock()
        self._delivery: BatchDelivery | Deliveries | None = None
        self._compact()
        # pyarrow's first tables import what it looks for (pandas, where installed),
        # a third of a second: here, not in the first batch, while a submit server in
        # this process answers requests.
        outcomes_table([])
        quarantine_table([])
        self._counts = FollowCounts()
        self._count()
        if on_commit is not None:  # what a reader starts from: every entry held
            on_commit(CommittedChanges(self.batch_id, self.ops.entries(), [], [],
                                       self.ops.release_ms))

    # -- the checkpoint ------------------------------------------------------------

    def _follow_clock(self) -> None:
        """On the wall clock, schedules notice their occurrences at its readings. A
        catch-up (after an outage, or a gap in the log) fires in batches of bounded
        size."""
        if self.clock is not None:
            self.ops.stage.schedules.clock_notices = True
        self.ops.fire_limit = OCCURRENCES_PER_BATCH

    @property
    def catching_up(self) -> bool:
        """Whether occurrences of schedules wait for the next batches to fire."""
        return self.ops.catching_up

    @property
    def batch_id(self) -> int:
        """The last batch committed (-1: none)."""
        return self._checkpoint.batch_id

    def _plan(self) -> BatchPlan | None:
        """The next batch: the one planned before a crash, or a new one (None when a
        batch would have nothing to do)."""
        batch_id = self.batch_id + 1
        planned = self._checkpoint.planned(batch_id)
        if planned is not None:
            log.info("running batch %d again from its plan", batch_id)
            return planned
        # The clock first: a file listed after it was written after it too, so its rows
        # are late only if they waited longer than the lateness bound to land.
        clock_ms = self._clock_reading()
        listed = self._listing()
        names: list[str] = []
        if listed is not None:
            self._check_read_files(listed)
            self._checkpoint.forget_files_gone(listed)
            names = self._within_budget(sorted(listed - self._checkpoint.files_read))
        # A batch that leaves files for later, or reads files an earlier one left, does
        # not move time by the clock (only its rows do): the clock has passed rows that
        # landed in time and wait in those files.
        holds = clock_ms is not None and (self.backlog > 0 or self._deferred)
        self._deferred = self.backlog > 0
        if not names and not self._clock_moves(clock_ms) and not self.catching_up:
            return None
        plan = BatchPlan(batch_id, names, clock_ms, holds)
        self._checkpoint.plan(plan)
        return plan

    def _clock_reading(self) -> int | None:
        """The clock, held within the lateness bound of the intake's floor: a row
        stamped before this reading and not yet listed is then not late."""
        if self.clock is None:
            return None
        now = self.clock()
        if self.feed is not None:
            now = min(now, self.feed.time_floor() + self.lateness_ms)
        return now

    def _within_budget(self, names: list[str]) -> list[str]:
        """The first of the new files, in name order, that the batch's budget holds
        (one at least); the rest wait for the next batches (``backlog``)."""
        limit = self.max_files_per_batch
        taken = names if limit is None else names[:limit]
        total = 0
        for i, name in enumerate(taken):
            total += input_bytes(self.input_dir / name)
            if total > self.max_bytes_per_batch and i > 0:
                taken = taken[:i]
                break
        self.backlog = len(names) - len(taken)
        return taken

    def _listing(self) -> set[str] | None:
        """The input files' names, or None while the input directory is gone (a
        remount, a move): what was seen is kept, so that the files coming back with it
        are not read again, and deadlines still fire on the wall clock meanwhile."""
        try:
            listed = input_names(self.input_dir, skipped=self._skipped)
        except FileNotFoundError as exc:
            if not self._input_gone:
                log.warning("%s: waiting for it to come back", exc)
                self._input_gone = True
            return None
        if self._input_gone:
            log.warning("input directory %s is back", self.input_dir)
            self._input_gone = False
        return set(listed)

    def _check_read_files(self, listed: set[str]) -> None:
        """Warn of (and count) each file read in this run that changed since: at most
        :data:`_CHECKS_PER_LISTING` of them a listing, in turn, so that a batch's cost
        does not grow with the files a long-running service has read."""
        stats = self._read_stats
        for _ in range(min(len(stats), _CHECKS_PER_LISTING)):
            name = next(iter(stats))
            before = stats.pop(name)
            if name not in listed:
                continue  # gone: nothing more to watch
            now = FileStat.of(self.input_dir / name)
            if now is not None and now != before:
                self._changed(name, "after it was read")
            stats[name] = before if now is None else now  # to the back: warned once per change

    def _changed(self, name: str, when: str) -> None:
        self._files_changed += 1
        log.warning("input file %r changed %s: rows written since are not read (write "
                    "input files whole, then rename them into place)",
                    str(self.input_dir / name), when)

    def _clock_moves(self, clock_ms: int | None) -> bool:
        if clock_ms is None:
            return False
        release = self.keys.release_ms
        return release is None or clock_ms - self.lateness_ms > release

    def _commit(self, batch_id: int, names: list[str], outcomes: list[OutcomeRow]) -> None:
        changes = self._checkpoint.commit(batch_id, names, self.keys, self.ops)
        if self.on_commit is not None:
            self.on_commit(CommittedChanges(batch_id, changes.entries, changes.seen,
                                            outcomes, self.ops.release_ms))

    # -- running -------------------------------------------------------------------

    def step(self) -> FollowBatch | None:
        """Run one batch, if there is new input or the wall clock has moved time;
        returns what it did."""
        started = time.perf_counter()
        plan = self._plan()
        if plan is None:
            return None
        batch_id, names, clock_ms, holds_time = plan
        rows: list[Wire] = []
        for name in names:
            path = self.input_dir / name
            before = FileStat.of(path)
            rows += self._offered_or_read(name, path, before)
            if before is not None:
                self._read_stats[name] = before
                if FileStat.of(path) != before:
                    self._changed(name, "while it was read")
        quarantine: list[Quarantined] = []
        if clock_ms is not None:
            rows = _future_as_malformed(rows, clock_ms + self.max_future_ms)
        by_key, by_op = route(rows, 1)
        top = max((fields[W_TS] for fields in rows if not is_quarantined(fields)), default=None)
        quarantine += self.keys.take(by_key[0], top, times_of(by_op[0]))
        end = None if clock_ms is None or holds_time else clock_ms - self.lateness_ms
        # Between two pieces of the release, a busy intake in this process gets its turn.
        give_way = None if self.feed is None else self.feed.give_way
        point, progress, runs = run_steps(self.keys.release_steps(end), give_way)
        quarantine += self.ops.take(by_op[0], progress)
        outcomes, duplicates = run_steps(self.ops.release_steps(point, [runs]), give_way)
        quarantine += duplicates
        # Both stages are in this process: stage 1 can learn what stage 2 resolved,
        # and keeps registrations only of operations still pending.
        stage = self.keys.stage
        for row in outcomes:
            stage.forget(row.op_id, row.resolved_ms - row.latency_ms, row.keys)
        self._owner.check()  # a run that lost its checkpoint writes nothing more
        self._write_outputs(batch_id, outcomes, quarantine)
        self._owner.check()  # nor commits what it wrote meanwhile
        self._commit(batch_id, names, outcomes)
        self._compact()
        self._count()
        if clock_ms is not None:
            self._counts = replace(self._counts, clock_ms=clock_ms)
        counts = self._counts
        batch = FollowBatch(batch_id, len(names), len(rows), len(outcomes), len(quarantine),
                            counts.pending, counts.held, counts.release_ms, clock_ms,
                            time.perf_counter() - started)
        log.info("batch %d: %d files, %d rows, %d outcomes, %d quarantined, %d pending",
                 batch_id, batch.files, batch.rows, batch.outcomes, batch.quarantined,
                 batch.pending)
        return batch

    def _offered_or_read(self, name: str, path: Path, stat: FileStat | None) -> list[Wire]:
        """The file's rows: as the feed's intake offered them, if the file has not
        changed since, else as read from it."""
        offered = None if self.feed is None else self.feed.take(name, stat)
        return _rows_of(path) if offered is None else offered

    def _write_outputs(self, batch_id: int, outcomes: list[OutcomeRow],
                       quarantine: list[Quarantined]) -> None:
        name = f"batch-{batch_id:09d}.parquet"
        table = outcomes_table(outcomes)
        # A batch run again after a crash replaces all its first attempt wrote, even
        # where it now writes nothing (its input may have changed meanwhile).
        written = {"outcomes": table if outcomes else None,
                   "quarantine": quarantine_table(quarantine) if quarantine else None}
        for sub, rows in written.items():
            path = self.output_dir / sub / name
            if rows is not None:
                write_atomically(rows, path, owner_metadata(self._owner.epoch))
            else:
                path.unlink(missing_ok=True)
        if self._delivery is not None and outcomes:
            self._delivery.submit(batch_id, table)

    def _compact(self) -> None:
        settled = settled_batch(self.batch_id, self.checkpoint_dir / "delivered")
        for sub in ("outcomes", "quarantine"):
            compact(self.output_dir / sub, settled)

    def next_wake_ms(self) -> int | None:
        """The wall-clock time at which a deadline next falls due, or None: the
        earliest deadline in the purgatory's timer, or of a watch that time has not
        reached yet (it expires as it is applied). The deadline, not the timer's next
        bucket: a wake at a bucket that only demotes its operations would cost a batch,
        and hold the real expiry back by the minimum step between batches."""
        if self.clock is None:
            return None
        due = self.ops.stage.next_deadline()
        for fields in self.ops.held:
            if not is_progress(fields) and fields[W_TYPE] == T_WATCH:
                deadline = max(fields[W_TS], fields[W_DEADLINE])
                due = deadline if due is None else min(due, deadline)
        return None if due is None else due + self.lateness_ms + 1

    def follow(self, stop: threading.Event, trigger_ms: int = 1000,
               on_batch: Callable[[FollowBatch], None] | None = None,
               min_step_ms: int = MIN_STEP_MS,
               stop_timeout_ms: int = DEFAULT_STOP_TIMEOUT_MS) -> FollowResult:
        """Run as a service, as the Spark engine's ``follow`` does, until ``stop`` is
        set: a batch every ``trigger_ms``, and one as soon as a deadline falls due, but
        not within ``min_step_ms`` of the last (a batch writes its state and files).
        Returns at a batch boundary, and within ``stop_timeout_ms`` of it however stuck
        the sink's processor is: what it has not settled then is delivered at the next
        start (``undelivered``)."""
        check_positive_int("trigger_ms", trigger_ms, maximum=MAX_TRIGGER_MS)
        check_positive_int("min_step_ms", min_step_ms, minimum=0, maximum=MAX_TRIGGER_MS)
        check_positive_int("stop_timeout_ms", stop_timeout_ms, minimum=0,
                           maximum=MAX_TRIGGER_MS)
        min_step_ms = min(min_step_ms, trigger_ms)
        result = FollowResult()
        if self.sink is not None:
            self._delivery = deliveries(self.sink, self.output_dir / "outcomes",
                                        self.checkpoint_dir)
        freezer = CollectorFreezer(FOLLOW_THAW_EVERY_S)
        try:
            while not stop.is_set():
                began = time.monotonic()
                with collector_paused():
                    batch = self.step()
                    # Frozen before the collector is back on: else its first young
                    # collection walks every object the batch made, holding the lock.
                    freezer.after_batch(time.monotonic())
                if batch is not None:
                    result.batches += 1
                    result.rows_in += batch.rows
                    result.outcomes += batch.outcomes
                    result.quarantined += batch.quarantined
                    if on_batch is not None:
                        on_batch(batch)
                wait_s = trigger_ms / 1000 - (time.monotonic() - began)
                if self.backlog or self.catching_up:  # the next batch at once
                    wait_s = min(wait_s, 0.0)
                wake = self.next_wake_ms()
                if wake is not None and self.clock is not None:
                    now = self.clock()
                    wait_s = min(wait_s, max((wake - now) / 1000, min_step_ms / 1000
                                             - (time.monotonic() - began)))
                if wait_s > 0:
                    stop.wait(wait_s)
        except BaseException:
            self._close_delivery(raise_failure=False, timeout_s=stop_timeout_ms / 1000)
            raise
        finally:
            gc.unfreeze()  # the process's objects go back to the collector
        result.undelivered = self._close_delivery(timeout_s=stop_timeout_ms / 1000)
        counts = self._counts
        result.pending = counts.pending
        result.release_ms = counts.release_ms
        result.outcomes_by_outcome = counts.outcomes_by_outcome()
        result.quarantined_by_reason = counts.quarantined_by_reason()
        return result

    def _close_delivery(self, *, raise_failure: bool = True,
                        timeout_s: float | None = None) -> int:
        """Stop delivering; how many outcomes are left for the next start."""
        if self._delivery is None:
            return 0
        delivery, self._delivery = self._delivery, None
        return delivery.close(raise_failure=raise_failure, timeout_s=timeout_s)

    def _count(self) -> None:
        ops, keys = self.ops.status(), self.keys.status()
        by_reason = dict(ops.quarantined_by_reason)
        for reason, n in keys.quarantined_by_reason.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
        self._counts = FollowCounts(
            batches=self.batch_id + 1, rows_in=keys.rows_in + ops.rows_in,
            rows_applied=keys.rows_applied + ops.rows_applied,
            quarantined=keys.quarantined + ops.quarantined, held=keys.held + ops.held,
            pending=ops.pending, registrations=keys.pending,
            ignored_cancels=ops.ignored_cancels, schedules=ops.schedules,
            skipped=ops.skipped, release_ms=ops.release_ms,
            state_bytes=self._checkpoint.state_bytes, by_reason=dict(sorted(by_reason.items())),
            by_outcome=dict(sorted(ops.outcomes_by_outcome.items())))

    def close(self) -> None:
        """Give up the checkpoint and the output directory (the process exiting does
        too): another run may take them."""
        self._owner.release()

    def __enter__(self) -> LocalFollowEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def committed_inputs(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` (input file names) whose batch has committed: no batch
        reads them again, and they may be deleted. Safe from another thread."""
        read = self._checkpoint.files_read
        return [name for name in names if name in read]

    @property
    def rows_read(self) -> int:
        """The rows read by the batches committed so far: a submit server asks on every
        request, so it is a field, where :meth:`counts` builds a snapshot."""
        return self._counts.rows_in

    def counts(self) -> FollowCounts:
        """The counters after the last batch: a snapshot, safe to read from any thread
        (the metrics export reads it while batches run), with the input files skipped
        at the last listing, which may have run no batch."""
        delivery = self._delivery
        lag = None if delivery is None else delivery.lag()
        return replace(self._counts, files_skipped=len(self._skipped),
                       files_changed=self._files_changed,
                       delivery_behind_batches=None if lag is None else lag.batches,
                       delivery_lag_ms=None if lag is None else lag.lag_ms)
