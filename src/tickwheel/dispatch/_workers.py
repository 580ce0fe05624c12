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
        self.busy = 0  # workers inside the processor right now
        self.work_per_worker = [0] * count
        kind = "Batch" if batching else "Single"
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"{kind}Worker-{name}-{i}",
                             daemon=True)
            for i in range(count)
        ]
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float) -> None:
        """Stop all workers within ``timeout_s`` in all (a worker inside a slow
        processor call is left to finish on its own, as a daemon thread)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
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
            with self._lock:
                self.busy += 1
            try:
                result = self._execute(holders)
                if result in (ProcessingResult.CONGESTION, ProcessingResult.TRANSIENT_ERROR):
                    acceptor.reprocess(holders, result)
            finally:
                with self._lock:
                    self.busy -= 1
            with self._lock:
                self.results[result] += 1
                self.task_results[result] += len(holders)
                self.work_per_worker[index] += len(holders)
            if result is ProcessingResult.PERMANENT_ERROR:
                with self._lock:
                    self.dropped += len(holders)
                log.warning("dispatcher %s: permanent error, dropping %d tasks",
                            acceptor.name, len(holders))

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
