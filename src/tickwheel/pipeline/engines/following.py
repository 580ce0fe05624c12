"""FollowingEngine: what both engines that follow an input directory as a service
share, the local engine (:class:`~tickwheel.pipeline.engines.follow.LocalFollowEngine`)
and the Spark engine (:class:`~tickwheel.pipeline.spark.SparkEngine`), and the records
they report in.

``clock`` means one thing to both: None, time moves with the rows' ``ts_ms`` alone; or
:func:`wall_clock_ms`, time also follows the wall clock, so that deadlines fire without
new rows. An intake in the same process reaches the engine through the
:class:`~tickwheel.pipeline.engines.feed.IntakeFeed` given to it at construction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

__all__ = ["FollowBatch", "FollowCounts", "FollowResult", "FollowingEngine", "engine_status",
           "live_counts", "wall_clock_ms"]


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, as ``ts_ms`` counts them (it may step back)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class FollowBatch:
    """What one batch did."""

    batch_id: int
    files: int | None  # input files read (None: the Spark engine's source reads them)
    rows: int
    outcomes: int
    quarantined: int
    pending: int  # operations not yet resolved
    held: int  # rows read that time has not reached
    release_ms: int | None  # rows below it are applied
    clock_ms: int | None  # the wall clock's reading, if time follows one
    seconds: float

    @property
    def lag_ms(self) -> int | None:
        """How far time stands behind the wall clock's reading (the lateness bound,
        when the engine keeps up)."""
        if self.clock_ms is None or self.release_ms is None:
            return None
        return self.clock_ms - self.release_ms


@dataclass(frozen=True, slots=True)
class FollowCounts:
    """Counters and gauges of both stages after a batch; a
    :class:`~tickwheel.metrics.PipelineCounts` for the metrics export."""

    batches: int = 0
    rows_in: int = 0
    rows_applied: int = 0
    quarantined: int = 0
    held: int = 0  # rows read that time has not reached
    pending: int = 0  # operations
    registrations: int = 0  # of operations on keys (stage 1)
    ignored_cancels: int = 0
    schedules: int = 0  # recurring schedules held
    skipped: int = 0  # their occurrences passed over by misfire policies
    release_ms: int | None = None
    clock_ms: int | None = None
    state_bytes: int = 0  # the state file and its logs, as last saved
    files_skipped: int = 0  # input files the last listing skipped (see input_files)
    # Input files whose size or mtime differ from their read (appended to, rewritten):
    # rows written since their read are not read. Files must land whole, then be renamed.
    files_changed: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    by_outcome: dict[str, int] = field(default_factory=dict)
    # With a sink: batches whose outcomes are written and not yet settled by it, and
    # the age of the oldest of them (delivery never holds the engine).
    delivery_behind_batches: int | None = None
    delivery_lag_ms: int | None = None

    @property
    def lag_ms(self) -> int | None:
        """How far time stands behind the wall clock's last reading."""
        if self.clock_ms is None or self.release_ms is None:
            return None
        return self.clock_ms - self.release_ms

    def quarantined_by_reason(self) -> dict[str, int]:
        return dict(self.by_reason)

    def outcomes_by_outcome(self) -> dict[str, int]:
        return dict(self.by_outcome)


@dataclass(slots=True)
class FollowResult:
    """Totals of one :meth:`FollowingEngine.follow`."""

    batches: int = 0
    rows_in: int = 0
    outcomes: int = 0
    quarantined: int = 0
    pending: int = 0
    release_ms: int | None = None
    outcomes_by_outcome: dict[str, int] = field(default_factory=dict)
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    #: Outcomes a processor has not settled at the stop: the next start delivers them.
    undelivered: int = 0


class FollowingEngine(Protocol):
    """An engine that runs as a service over ``input_dir`` until told to stop."""

    @property
    def input_dir(self) -> Path: ...
    @property
    def output_dir(self) -> Path: ...
    @property
    def checkpoint_dir(self) -> Path: ...
    @property
    def lateness_ms(self) -> int: ...
    @property
    def dedupe_retention_ms(self) -> int | None: ...
    @property
    def clock(self) -> Callable[[], int] | None: ...

    def follow(self, stop: threading.Event, *, trigger_ms: int = ...,
               on_batch: Callable[[FollowBatch], None] | None = None,
               stop_timeout_ms: int = ...) -> FollowResult:
        """Batches until ``stop`` is set, each reported to ``on_batch`` (from the
        engine's thread); returns at a batch boundary, delivery given
        ``stop_timeout_ms`` to settle."""
        ...

    def counts(self) -> FollowCounts:
        """The counters after the last batch: a snapshot, safe from any thread."""
        ...

    @property
    def rows_read(self) -> int:
        """Rows read by the batches committed so far (cheap: read on every request)."""
        ...

    def committed_inputs(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` (input file names) that a committed batch read: no batch
        reads them again, and they may be deleted. Safe from another thread."""
        ...


def live_counts(engine: FollowingEngine) -> FollowCounts:
    """The engine's counts with its lag now, not at its last batch: a backlog shows."""
    counts = engine.counts()
    clock = engine.clock
    return counts if clock is None else replace(counts, clock_ms=clock())


def engine_status(engine: FollowingEngine) -> dict[str, Any]:
    """The engine's counts as JSON, with its lag now (``lag_ms``)."""
    counts = live_counts(engine)
    return {**asdict(counts), "lag_ms": counts.lag_ms}
