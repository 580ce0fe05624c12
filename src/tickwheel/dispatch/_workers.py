"""Worker threads: pull work from the acceptor, run the processor, report back."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from tickwheel.dispatch._acceptor import AcceptorExecutor
from tickwheel.dispatch._types import ProcessingResult, TaskHolder, TaskProcessor

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

_POLL_S = 0.1  # how often an idle worker rechecks for shutdown


class WorkerPool:
    """``count`` threads that run batches (or single tasks) through the processor.

    A processor that raises counts as ``PERMANENT_ERROR`` for that work and the worker
    carries on (in Eureka any exception kills the worker thread for good).
    """

    def __init__(self, name: str, count: int, acceptor: AcceptorExecutor,
                 processor: TaskProcessor[Any], batching: bool) -> None:
        self._acceptor = acceptor
        self._processor = processor
        self._batching = batching
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.results: dict[ProcessingResult, int] = dict.fromkeys(ProcessingResult, 0)
        self.task_results: dict[ProcessingResult, int] = dict.fromkeys(ProcessingResult, 0)
        self.dropped = 0
        self.processor_errors = 0
        self.in_flight = 0  # tasks inside the processor right now
        # After abandon(): work a worker still picks up is not run, and results that
        # come back are counted once, as late, and never requeued.
        self._abandoned = False
        self.abandoned = 0
        self.late = 0
        self.work_per_worker = [0] * count
        kind = "Batch" if batching else "Single"
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"{kind}Worker-{name}-{i}",
                             daemon=True)
            for i in range(count)
        ]
        for t in self._threads:
            t.start()

    def abandon(self) -> int:
        """From now on run nothing and requeue nothing; return the tasks inside the
        processor at this moment (they will count as ``late`` when they return)."""
        with self._lock:
            self._abandoned = True
            return self.in_flight

    def stop(self, deadline: float) -> None:
        """Stop the workers, waiting for them until the monotonic ``deadline``: a worker
        blocked in a slow processor call is abandoned, not joined (a daemon thread)."""
        self._stopping.set()
        self._acceptor.release_workers(len(self._threads))
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _run(self, index: int) -> None:
        acceptor = self._acceptor
        while not self._stopping.is_set():
            holders: list[TaskHolder[Any]]
            if self._batching:
                batch = acceptor.request_batch(_POLL_S)
                if batch is None:
                    continue
                holders = batch
            else:
                single = acceptor.request_single(_POLL_S)
                if single is None:
                    continue
                holders = [single]
            n = len(holders)
            with self._lock:
                if self._abandoned:
                    self.abandoned += n  # handed out just before close(): never run
                    break
                self.in_flight += n
            result = ProcessingResult.PERMANENT_ERROR
            try:
                result = self._execute(holders)
            finally:
                # Under the lock with the abandoned check, so that close() counts every
                # task once: requeued before it looks, or late after.
                with self._lock:
                    self.in_flight -= n
                    late = self._abandoned
                    if late:
                        self.late += n
                    else:
                        if result in (ProcessingResult.CONGESTION,
                                      ProcessingResult.TRANSIENT_ERROR):
                            acceptor.reprocess(holders, result)
                        self.results[result] += 1
                        self.task_results[result] += n
                        self.work_per_worker[index] += n
                        if result is ProcessingResult.PERMANENT_ERROR:
                            self.dropped += n
            if late:
                log.warning("dispatcher %s: %d tasks came back from the processor (%s) "
                            "after close; counted as late", acceptor.name, n, result.value)
                break
            if result is ProcessingResult.PERMANENT_ERROR:
                log.warning("dispatcher %s: permanent error, dropping %d tasks",
                            acceptor.name, n)

    def _execute(self, holders: list[TaskHolder[Any]]) -> ProcessingResult:
        try:
            if self._batching:
                result = self._processor.process_batch([h.task for h in holders])
            else:
                result = self._processor.process(holders[0].task)
        except Exception:
            with self._lock:
                self.processor_errors += 1
            log.exception("dispatcher %s: the processor raised; counted as a permanent "
                          "error", self._acceptor.name)
            return ProcessingResult.PERMANENT_ERROR
        if not isinstance(result, ProcessingResult):
            log.error("dispatcher %s: the processor returned %r, not a ProcessingResult; "
                      "counted as a permanent error", self._acceptor.name, result)
            return ProcessingResult.PERMANENT_ERROR
        return result
