"""Micro-batch outcomes to an :class:`~tickwheel.pipeline.delivery.sink.OutcomeSink`, off the
query's thread, at least once.

Delivering inside ``foreachBatch`` would hold the query for as long as the processor
takes, including the sink's pauses after congestion. Here a thread of its own delivers
batch N while Spark computes batch N+1, with at most ``max_behind`` batches queued
behind the one it is delivering (then ``foreachBatch`` waits: backpressure, not an
unbounded queue). A batch commits before its outcomes are settled, so the engine keeps
its own mark: the last batch whose outcomes the processor has settled. A run starts by
delivering the outcome files of every later batch, so a crash repeats deliveries and
never skips one. Outcome files are named by batch id (``batch-<id>``, or
``batch-<id>-<partition>`` for the Spark engine's executors, a file per partition: all
of a batch's files are delivered before its mark).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.pipeline.io._arrow import open_parquet
from tickwheel.pipeline.io.compaction import covered_batches
from tickwheel.pipeline.io.files import read_bytes_nofollow, write_bytes_atomically
from tickwheel.pipeline.io.outputs import outcome_rows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BatchDelivery"]

log = logging.getLogger(__name__)

class BatchDelivery:
    """Delivers micro-batches' outcomes to ``sink`` on a thread of its own and records
    the last batch settled in ``mark`` (a file holding a batch id)."""

    def __init__(self, sink: OutcomeSink, outcomes_dir: Path, mark: Path,
                 max_behind: int = 2, stopping: threading.Event | None = None) -> None:
        self.sink = sink
        self.outcomes_dir = outcomes_dir
        self.mark = mark
        self.delivered_batches = 0
        self.caught_up_batches = 0  # batches delivered from their files at the start
        # Once a batch's outcomes met a processor that raised, the mark stays where it
        # is for the rest of the run: the next start delivers from that batch on.
        self.held_back_from: int | None = None
        # Set when the run stops: a submit waiting for room gives up (the batch's files
        # and the mark cover it).
        self._stopping = stopping or threading.Event()
        self._abandoned = False
        self._work: queue.Queue[tuple[int, pa.Table | list[Path]] | None] = queue.Queue(
            max_behind)
        self._failure: BaseException | None = None
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
        """Queue a batch's outcomes, or its outcome files (read by the delivery
        thread), after its files are written; waits while ``max_behind`` batches are
        queued. Raises what stopped the thread."""
        self._raise_failure()
        while True:
            try:
                self._work.put((batch_id, outcomes), timeout=0.1)
                return
            except queue.Full:
                self._raise_failure()
                if self._stopping.is_set():
                    log.info("stopping: batch %d is left to the next start to deliver",
                             batch_id)
                    self.held_back_from = min(batch_id, self.held_back_from or batch_id)
                    return

    def close(self, *, raise_failure: bool = True, timeout_s: float | None = None) -> int:
        """Wait until every batch submitted is settled, or ``timeout_s`` (then stop
        waiting for the processor: what it has not settled stays for the next start);
        raise what stopped the thread (unless the caller is already failing for another
        reason). Returns how many outcomes are left undelivered."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._stopping.set()
        if self._thread.is_alive():
            while self._failure is None and self._thread.is_alive():
                try:
                    self._work.put(None, timeout=0.1)
                    break
                except queue.Full:
                    if deadline is not None and time.monotonic() >= deadline:
                        break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._thread.join(left)
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
        settled = self.last_settled()
        rows = 0
        for path in self.outcomes_dir.glob("batch-*.parquet"):
            span = covered_batches(path)
            if span is not None and span[0] == span[1] > settled:
                with open_parquet(path) as file:
                    rows += file.metadata.num_rows
        return rows

    def _raise_failure(self) -> None:
        if self._failure is not None and not self._abandoned:
            raise RuntimeError("delivering outcomes to the sink failed") from self._failure

    def _run(self) -> None:
        try:
            self._catch_up()
            while (item := self._work.get()) is not None:
                self._deliver(*item)
                self.delivered_batches += 1
        except BaseException as exc:  # raised in the query's thread by submit/close
            log.exception("outcome delivery failed")
            self._failure = exc

    def _catch_up(self) -> None:

        settled = self.last_settled()
        later: dict[int, list[Path]] = {}
        for path in sorted(self.outcomes_dir.glob("batch-*.parquet")):
            span = covered_batches(path)
            if span is not None and span[0] == span[1] > settled:
                later.setdefault(span[0], []).append(path)
        for batch_id, paths in sorted(later.items()):
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
        if self.sink.failed > failed and self.held_back_from is None:
            log.warning("the processor raised on outcomes of batch %d: they, and those of "
                        "every later batch, are delivered again at the next start",
                        batch_id)
            self.held_back_from = batch_id
        if self.held_back_from is None and batch_id > self.last_settled():
            write_bytes_atomically(str(batch_id).encode(), self.mark)


def _read(path: Path) -> pa.Table:
    with open_parquet(path) as file:
        return file.read(use_threads=False)
