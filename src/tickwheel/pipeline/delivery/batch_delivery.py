"""Micro-batch outcomes to an :class:`~tickwheel.pipeline.delivery.sink.OutcomeSink`, off the
engine's thread, at least once, and never holding the engine back.

A thread of its own delivers batch N while the engine computes batch N+1. Up to
``max_behind`` batches wait for it in memory; when more come (a receiver that hangs,
answers 500 or is down for hours), later batches are not queued but read back from
their outcome files once delivery reaches them, so the engine goes on resolving and
writing its outputs, and memory stays bounded whatever the receiver does. Batches are
delivered in batch order either way.

A batch commits before its outcomes are settled, so delivery keeps its own mark: the
last batch whose outcomes the processor has settled. A run starts by delivering the
outcome files of every later batch, so a crash or a stop repeats deliveries and never
skips one. Outcome files are named by batch id (``batch-<id>``, or
``batch-<id>-<partition>`` for the Spark engine's executors, a file per partition: all
of a batch's files are delivered before its mark).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.pipeline.io._arrow import open_parquet
from tickwheel.pipeline.io.compaction import covered_batches
from tickwheel.pipeline.io.files import read_bytes_nofollow, write_bytes_atomically
from tickwheel.pipeline.io.outputs import outcome_rows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BatchDelivery", "DeliveryLag"]

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class DeliveryLag:
    """How far delivery stands behind the engine."""

    #: Batches with outcomes handed over and not yet settled.
    batches: int
    #: The age in wall milliseconds of the oldest of them (0 when there is none).
    lag_ms: int
    #: Whether later batches are read back from their files (more than ``max_behind``
    #: waited for delivery at some point, and it has not caught up since).
    from_files: bool


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BatchDelivery:
    """Delivers micro-batches' outcomes to ``sink`` on a thread of its own and records
    the last batch settled in ``mark`` (a file holding a batch id)."""

    def __init__(self, sink: OutcomeSink, outcomes_dir: Path, mark: Path,
                 max_behind: int = 2) -> None:
        if max_behind < 1:
            raise ValueError(f"max_behind must be at least 1, not {max_behind}")
        self.sink = sink
        self.outcomes_dir = outcomes_dir
        self.mark = mark
        self.max_behind = max_behind
        self.delivered_batches = 0
        self.caught_up_batches = 0  # batches delivered from their files at the start
        self.read_back_batches = 0  # batches delivered from their files, past max_behind
        # Once a batch's outcomes met a processor that raised, the mark stays where it
        # is for the rest of the run: the next start delivers from that batch on.
        self.held_back_from: int | None = None
        self._abandoned = False
        self._changed = threading.Condition()
        # Batches waiting in memory: (batch id, outcomes, wall ms handed over).
        self._queued: deque[tuple[int, pa.Table | list[Path], int]] = deque()
        # While set, every batch up to this id is read back from its files, so that
        # batches stay in order behind those that came before.
        self._behind_upto: int | None = None
        self._behind_since: int | None = None  # wall ms at which the first of them came
        self._current_since: int | None = None  # of the batch being delivered
        self._handed = self._settled = 0  # batches handed over by submit, and settled
        self._behind_count = 0  # batches handed over to be read back, not yet taken
        self._closing = False
        self._failure: BaseException | None = None
        # What the last run left unsettled, listed before this run writes a batch.
        self._last_delivered = self.last_settled()
        self._left_over = self._files_after(self._last_delivered)
        self._thread = threading.Thread(target=self._run, name="tickwheel-delivery",
                                        daemon=True)
        self._thread.start()

    def last_settled(self) -> int:
        """The mark: the last batch whose outcomes were settled (-1 for none)."""
        try:
            return int(read_bytes_nofollow(self.mark))
        except FileNotFoundError:
            return -1

    def submit(self, batch_id: int, outcomes: pa.Table | list[Path]) -> None:
        """Hand over a batch's outcomes, or its outcome files, after its files are
        written; never waits for delivery (past ``max_behind`` batches in memory, the
        batch is read back from its files later). Raises what stopped the thread."""
        self._raise_failure()
        with self._changed:
            self._handed += 1
            if self._behind_upto is not None or len(self._queued) >= self.max_behind:
                if self._behind_upto is None:
                    log.warning("delivery is %d batches behind: batch %d and later ones "
                                "are delivered from their files when it catches up",
                                len(self._queued), batch_id)
                    self._behind_since = _wall_ms()
                elif self._behind_since is None:
                    self._behind_since = _wall_ms()
                self._behind_upto = batch_id
                self._behind_count += 1
            else:
                self._queued.append((batch_id, outcomes, _wall_ms()))
            self._changed.notify()

    def lag(self) -> DeliveryLag:
        """How far delivery stands behind: safe to read from any thread."""
        with self._changed:
            since = [t for t in (self._current_since, self._behind_since) if t is not None]
            if self._queued:
                since.append(self._queued[0][2])
            oldest = min(since, default=None)
            return DeliveryLag(self._handed - self._settled,
                               0 if oldest is None else max(0, _wall_ms() - oldest),
                               self._behind_upto is not None)

    def close(self, *, raise_failure: bool = True, timeout_s: float | None = None) -> int:
        """Wait until every batch handed over is settled, or ``timeout_s`` (then stop
        waiting for the processor: what it has not settled stays for the next start);
        raise what stopped the thread (unless the caller is already failing for another
        reason). Returns how many outcomes are left undelivered."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("delivery did not finish within %.0f s: stopping without it",
                        timeout_s)
            self._abandoned = True  # what the cancel makes the thread raise is ours
            self.sink.cancel()
            self._thread.join(5)
        if raise_failure:
            self._raise_failure()
        return self.undelivered()

    def undelivered(self) -> int:
        """Outcomes in the files of batches after the mark: the next start delivers
        them."""
        rows = 0
        for paths in self._files_after(self.last_settled()).values():
            for path in paths:
                with open_parquet(path) as file:
                    rows += file.metadata.num_rows
        return rows

    def _raise_failure(self) -> None:
        if self._failure is not None and not self._abandoned:
            raise RuntimeError("delivering outcomes to the sink failed") from self._failure

    def _run(self) -> None:
        try:
            self._catch_up()
            while self._next():
                pass
        except BaseException as exc:  # raised in the engine's thread by submit/close
            log.exception("outcome delivery failed")
            self._failure = exc

    def _next(self) -> bool:
        """Deliver what comes next: a batch in memory, else the batches to read back
        from their files; False once closing with nothing left."""
        item: tuple[int, pa.Table | list[Path], int] | None = None
        with self._changed:
            while not self._queued and self._behind_upto is None and not self._closing:
                self._changed.wait()
            if self._queued:
                item = self._queued.popleft()
                self._current_since = item[2]
            elif self._behind_upto is not None:
                upto = self._behind_upto
                # Some of them wrote no outcome file: all count as settled once the
                # files up to ``upto`` are.
                taken, self._behind_count = self._behind_count, 0
                # From here the batch being read back stands for the oldest.
                self._current_since, self._behind_since = self._behind_since, None
            else:
                return False
        if item is not None:
            self._deliver(item[0], item[1])
            self._settled_one()
            return True
        for batch_id, paths in self._files_after(self._last_delivered, upto).items():
            with self._changed:
                self._current_since = _mtime_ms(paths)
            self._deliver(batch_id, paths)
            self.read_back_batches += 1
            self.delivered_batches += 1
        with self._changed:
            self._settled += taken
            self._current_since = None
            if self._behind_upto == upto:  # caught up: later batches wait in memory
                self._behind_upto = None
                log.info("delivery caught up with batch %d", upto)
        return True

    def _settled_one(self) -> None:
        self.delivered_batches += 1
        with self._changed:
            self._settled += 1
            self._current_since = None

    def _files_after(self, after: int, upto: int | None = None) -> dict[int, list[Path]]:
        """The outcome files of each batch after ``after`` (up to ``upto``), in batch
        order: single-batch files only (compaction merges settled batches alone)."""
        later: dict[int, list[Path]] = {}
        for path in sorted(self.outcomes_dir.glob("batch-*.parquet")):
            span = covered_batches(path)
            if (span is not None and span[0] == span[1] > after
                    and (upto is None or span[0] <= upto)):
                later.setdefault(span[0], []).append(path)
        return dict(sorted(later.items()))

    def _catch_up(self) -> None:
        for batch_id, paths in self._left_over.items():
            log.info("delivering batch %d again from %s: its outcomes were not settled "
                     "before the last run stopped", batch_id, ", ".join(p.name for p in paths))
            self._deliver(batch_id, paths)
            self.caught_up_batches += 1

    def _deliver(self, batch_id: int, outcomes: pa.Table | list[Path]) -> None:
        failed = self.sink.failed
        for table in ([_read(path) for path in outcomes]
                      if isinstance(outcomes, list) else [outcomes]):
            self.sink.deliver(outcome_rows(table))
        if not self.sink.flush():
            raise RuntimeError(f"the sink closed before batch {batch_id} was settled")
        self._last_delivered = max(self._last_delivered, batch_id)
        if self.sink.failed > failed and self.held_back_from is None:
            log.warning("the processor raised on outcomes of batch %d: they, and those of "
                        "every later batch, are delivered again at the next start",
                        batch_id)
            self.held_back_from = batch_id
        if self.held_back_from is None and batch_id > self.last_settled():
            write_bytes_atomically(str(batch_id).encode(), self.mark)


def _mtime_ms(paths: list[Path]) -> int | None:
    """When a batch's files were written: when it was handed over, near enough."""
    try:
        return min(os.stat(path, follow_symlinks=False).st_mtime_ns for path in paths) // 1_000_000
    except OSError:
        return None


def _read(path: Path) -> pa.Table:
    with open_parquet(path) as file:
        return file.read(use_threads=False)
