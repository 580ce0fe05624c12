"""TaskDispatcher and its two factories (Eureka's ``TaskDispatchers``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tickwheel._clock import Clock, SystemClock
from tickwheel._histogram import HistogramSnapshot
from tickwheel._validate import check_delay_ms, check_positive_int, check_timeout
from tickwheel.dispatch._acceptor import AcceptorExecutor
from tickwheel.dispatch._shaper import TrafficShaper
from tickwheel.dispatch._types import DispatcherClosed, ProcessingResult, TaskProcessor
from tickwheel.dispatch._workers import WorkerPool

__all__ = [
    "DispatcherStats",
    "TaskDispatcher",
    "create_batching_dispatcher",
    "create_non_batching_dispatcher",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DispatcherStats:
    """A snapshot of a dispatcher's counters and gauges.

    Every accepted task is in exactly one place: ``accepted == tasks["success"] +
    dropped + expired + overridden + queue_overflows + abandoned + late + in_flight +
    backlog`` (the queues, the pending buffer and batches handed out but not yet taken),
    and ``backlog`` is 0 once the dispatcher is closed."""

    name: str
    accepted: int
    replayed: int
    expired: int
    overridden: int
    queue_overflows: int
    dropped: int  # after a permanent error (the processor said so, or raised)
    processor_errors: int
    batches: dict[str, int]  # executions by result
    tasks: dict[str, int]  # tasks by the result of their execution
    acceptor_queue: int
    reprocess_queue: int
    pending: int
    in_flight: int  # tasks inside the processor now
    abandoned: int  # never handed to the processor: still queued when close() gave up
    late: int  # came back from the processor after close(): counted, not requeued
    batch_size: HistogramSnapshot
    wait_ms: HistogramSnapshot


class TaskDispatcher(Generic[T]):
    """Accepts tasks by id, batches them, and runs them on worker threads."""

    def __init__(self, name: str, processor: TaskProcessor[T], *, batching: bool,
                 max_buffer_size: int, max_batch_size: int, worker_count: int,
                 max_batching_delay_ms: int, congestion_retry_delay_ms: int,
                 network_failure_retry_ms: int, clock: Clock | None) -> None:
        max_buffer_size = check_positive_int("max_buffer_size", max_buffer_size)
        max_batch_size = check_positive_int("max_batch_size", max_batch_size)
        if max_batch_size > max_buffer_size:
            raise ValueError(f"max_batch_size ({max_batch_size}) must not exceed "
                             f"max_buffer_size ({max_buffer_size})")
        worker_count = check_positive_int("worker_count", worker_count)
        for arg, value in (("max_batching_delay_ms", max_batching_delay_ms),
                           ("congestion_retry_delay_ms", congestion_retry_delay_ms),
                           ("network_failure_retry_ms", network_failure_retry_ms)):
            if check_delay_ms(arg, value) < 0:
                raise ValueError(f"{arg} must be >= 0, got {value}")
        self.name = name
        self._clock = SystemClock() if clock is None else clock
        self._lock = threading.Lock()
        self._closed = False
        shaper = TrafficShaper(self._clock, congestion_retry_delay_ms, network_failure_retry_ms)
        self._acceptor = AcceptorExecutor(
            name, max_buffer_size, max_batch_size, max_batching_delay_ms, shaper,
            self._clock, max_acceptor_queue=max(10 * max_buffer_size, 100_000))
        self._workers = WorkerPool(name, worker_count, self._acceptor, processor, batching)
        self._abandoned = 0

    def process(self, task_id: Hashable, task: T, expiry_ms: int) -> None:
        """Queue ``task``; ``expiry_ms`` is the clock time after which it is dropped.
        A task with the id of one still pending replaces it. An id that does not hash,
        or an expiry that is not a number of milliseconds, is refused here."""
        if self._closed:
            raise DispatcherClosed(f"dispatcher {self.name!r} is closed")
        self._acceptor.process(task_id, task, expiry_ms)

    def process_all(self, tasks: Iterable[tuple[Hashable, T, int]]) -> int:
        """``process`` each ``(task_id, task, expiry_ms)`` in order, as one hand-over
        (cheaper per task); all or none of them are queued, and a bad task is refused
        naming its position. Returns how many."""
        if self._closed:
            raise DispatcherClosed(f"dispatcher {self.name!r} is closed")
        batch = list(tasks)
        if batch:
            self._acceptor.process_all(batch)
        return len(batch)

    def close(self, timeout_s: float = 5.0) -> int:
        """Refuse new tasks and deliver what is pending (partial batches go out at
        once) for up to ``timeout_s``; then stop. Returns within ``timeout_s`` (plus
        scheduling) the number of accepted tasks not delivered: those still queued
        (``abandoned``) and those inside a processor (``in_flight``). A worker blocked
        in the processor is left to return on its own; its result is counted as
        ``late`` and nothing is requeued."""
        timeout = check_timeout("timeout_s", timeout_s)
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
        deadline = time.monotonic() + timeout
        self._acceptor.flush()
        while time.monotonic() < deadline and self._unsettled() > 0:
            time.sleep(0.002)
        # The acceptor thread runs no user code: it stops within a pass.
        self._acceptor.stop(max(0.05, deadline - time.monotonic()))
        in_flight = self._workers.abandon()
        held = self._acceptor.drop_held()
        self._abandoned = held
        self._workers.stop(deadline)
        if held or in_flight:
            log.warning("dispatcher %s closed with %d tasks undelivered (%d queued, %d "
                        "inside the processor)", self.name, held + in_flight, held, in_flight)
        return held + in_flight

    def _unsettled(self) -> int:
        """Accepted tasks not yet at an end: delivered, dropped by the processor,
        expired, overridden or dropped on overflow. Counted, not seen in the queues: a
        batch a worker has taken but not yet counted as in flight is in no queue."""
        a, w = self._acceptor, self._workers
        accepted = a.accepted  # first: the ends only grow while this reads them
        return accepted - (w.task_results[ProcessingResult.SUCCESS] + w.dropped + a.expired
                           + a.overridden + a.queue_overflows)

    def __enter__(self) -> TaskDispatcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def backlog(self) -> int:
        """Tasks accepted and not yet handed to a worker (the acceptor and reprocess
        queues and the pending buffer): the cheap gauge for backpressure."""
        a = self._acceptor
        return a.acceptor_queue_size + a.reprocess_queue_size + a.pending_size

    @property
    def acceptor_passes(self) -> int:
        """How many passes the acceptor thread has made over its queues: waiting for a
        few more tells that it has looked at what is queued now, where a sleep guesses."""
        return self._acceptor.passes

    @property
    def work_per_worker(self) -> list[int]:
        """Tasks each worker has executed (how evenly the work spreads)."""
        return list(self._workers.work_per_worker)

    def stats(self) -> DispatcherStats:
        a, w = self._acceptor, self._workers
        return DispatcherStats(
            name=self.name,
            accepted=a.accepted,
            replayed=a.replayed,
            expired=a.expired,
            overridden=a.overridden,
            queue_overflows=a.queue_overflows,
            dropped=w.dropped,
            processor_errors=w.processor_errors,
            batches={r.value: n for r, n in w.results.items()},
            tasks={r.value: n for r, n in w.task_results.items()},
            acceptor_queue=a.acceptor_queue_size,
            reprocess_queue=a.reprocess_queue_size,
            pending=a.pending_size,
            in_flight=w.in_flight,
            abandoned=self._abandoned + w.abandoned,
            late=w.late,
            batch_size=a.batch_sizes.snapshot(),
            wait_ms=a.wait_ms.snapshot(),
        )


def create_batching_dispatcher(
    name: str,
    processor: TaskProcessor[T],
    *,
    max_buffer_size: int = 10_000,
    max_batch_size: int = 250,
    worker_count: int = 20,
    max_batching_delay_ms: int = 500,
    congestion_retry_delay_ms: int = 1_000,
    network_failure_retry_ms: int = 100,
    clock: Clock | None = None,
) -> TaskDispatcher[T]:
    """Workers call ``processor.process_batch`` with up to ``max_batch_size`` tasks."""
    return TaskDispatcher(
        name, processor, batching=True, max_buffer_size=max_buffer_size,
        max_batch_size=max_batch_size, worker_count=worker_count,
        max_batching_delay_ms=max_batching_delay_ms,
        congestion_retry_delay_ms=congestion_retry_delay_ms,
        network_failure_retry_ms=network_failure_retry_ms, clock=clock)


def create_non_batching_dispatcher(
    name: str,
    processor: TaskProcessor[T],
    *,
    max_buffer_size: int = 10_000,
    worker_count: int = 20,
    max_batching_delay_ms: int = 500,
    congestion_retry_delay_ms: int = 1_000,
    network_failure_retry_ms: int = 100,
    clock: Clock | None = None,
) -> TaskDispatcher[T]:
    """Workers call ``processor.process`` with one task at a time."""
    return TaskDispatcher(
        name, processor, batching=False, max_buffer_size=max_buffer_size, max_batch_size=1,
        worker_count=worker_count, max_batching_delay_ms=max_batching_delay_ms,
        congestion_retry_delay_ms=congestion_retry_delay_ms,
        network_failure_retry_ms=network_failure_retry_ms, clock=clock)


