"""Deliver resolved operations to a user's processor through the batching dispatcher.

Each outcome is a task whose id is its ``op_id`` and registration time (an ``op_id``
names one operation at a time): a redelivery (after a restart, or a retry after
congestion) replaces the pending copy instead of doubling it, so the
processor sees each operation at most once per delivery run, and a processor that
stores outcomes by that id makes redelivery after a restart harmless.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from tickwheel._clock import Clock
from tickwheel.dispatch import (
    DispatcherOverloaded,
    DispatcherStats,
    ProcessingResult,
    TaskProcessor,
    create_batching_dispatcher,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow

__all__ = ["Delivery", "OutcomeSink", "deliver_outcomes"]

log = logging.getLogger(__name__)

_NEVER = 2**62
_CHECK_EVERY = 64  # outcomes handed over at once, between looks at the dispatcher's queues


@dataclass(frozen=True)
class Delivery:
    stats: DispatcherStats
    undelivered: int  # still pending when the timeout ran out (reported, not lost)
    failed: int = 0  # handed to a processor that raised (kept for redelivery)


class _Settling:
    """The user's processor, counting the outcomes it has settled (delivered, or
    refused for good: a permanent error, or no verdict, which the dispatcher also takes
    as permanent) apart from those it failed on (it raised: logged, and not settled, so
    that an engine delivers them again). Congestion and transient errors come back."""

    _RETRIED = (ProcessingResult.CONGESTION, ProcessingResult.TRANSIENT_ERROR)

    def __init__(self, processor: TaskProcessor[OutcomeRow]) -> None:
        self._processor = processor
        self._lock = threading.Lock()
        self.settled = 0
        self.failed = 0

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self._settle(lambda: self._processor.process(task), 1)

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        return self._settle(lambda: self._processor.process_batch(tasks), len(tasks))

    def _settle(self, call: Callable[[], ProcessingResult], n: int) -> ProcessingResult:
        try:
            result = call()
        except Exception:
            log.exception("the processor raised on %d outcomes: kept for redelivery", n)
            with self._lock:
                self.failed += n
            return ProcessingResult.PERMANENT_ERROR  # not retried in this run
        if result not in self._RETRIED:
            with self._lock:
                self.settled += n
        return result


class OutcomeSink:
    """A batching dispatcher that stays open across calls: an engine hands it each
    micro-batch's outcomes (:meth:`deliver`), the dispatcher batches across them, and
    :meth:`flush` waits until the processor has settled every one (the Spark engine
    flushes before a micro-batch commits, so a crash can only lead to a batch being
    delivered again, never to one being skipped; a processor that keeps outcomes by
    ``op_id`` and registration time absorbs the repeat). :meth:`close` flushes too."""

    def __init__(
        self,
        processor: TaskProcessor[OutcomeRow],
        *,
        name: str = "outcomes",
        max_buffer_size: int = 10_000,
        max_batch_size: int = 250,
        worker_count: int = 4,
        max_batching_delay_ms: int = 50,
        congestion_retry_delay_ms: int = 1_000,
        network_failure_retry_ms: int = 1_000,
        clock: Clock | None = None,
    ) -> None:
        in_flight = worker_count * max_batch_size
        if max_buffer_size < 2 * (in_flight + _CHECK_EVERY):
            raise ValueError(
                f"max_buffer_size ({max_buffer_size}) must be at least twice worker_count "
                f"* max_batch_size + {_CHECK_EVERY} ({2 * (in_flight + _CHECK_EVERY)}), so "
                f"that the batches in flight always fit back after congestion")
        self._settling = _Settling(processor)
        self._dispatcher = create_batching_dispatcher(
            name, self._settling, max_buffer_size=max_buffer_size,
            max_batch_size=max_batch_size, worker_count=worker_count,
            max_batching_delay_ms=max_batching_delay_ms,
            congestion_retry_delay_ms=congestion_retry_delay_ms,
            # A receiver that fails at once (500s, refused connections) is tried again
            # a second later, not ten times a second: an outage costs it, and this
            # process, a few requests a second.
            network_failure_retry_ms=network_failure_retry_ms, clock=clock)
        # The dispatcher drops its oldest task when its buffer overflows (Eureka's
        # choice for replication, where a newer task supersedes it); outcomes must not
        # be dropped, so the sink keeps what is queued and buffered below the buffer's
        # size, with room for every batch in flight to come back after congestion.
        self._window = max_buffer_size // 2 - in_flight
        self.offered = 0
        self._cancelled = threading.Event()

    @property
    def failed(self) -> int:
        """Outcomes handed to a processor that raised."""
        return self._settling.failed

    def cancel(self) -> None:
        """Stop waiting: :meth:`deliver` raises and :meth:`flush` returns False from now
        on (a stop that cannot wait for a stuck processor)."""
        self._cancelled.set()

    def deliver(self, outcomes: Iterable[OutcomeRow]) -> None:
        """Hand outcomes over; blocks while the dispatcher's acceptor is behind
        (backpressure into the engine instead of an unbounded queue)."""
        chunk: list[tuple[Hashable, OutcomeRow, int]] = []
        for outcome in outcomes:
            # An op_id names one operation at a time; with a dedupe retention it can
            # name a later one too, registered at another ts_ms.
            chunk.append(((outcome.op_id, outcome.resolved_ms - outcome.latency_ms),
                          outcome, _NEVER))
            if len(chunk) == _CHECK_EVERY:
                self._hand_over(chunk)
                chunk = []
        if chunk:
            self._hand_over(chunk)

    def _hand_over(self, chunk: list[tuple[Hashable, OutcomeRow, int]]) -> None:
        self._wait_for_room()
        while True:
            try:
                self._dispatcher.process_all(chunk)
                break
            except DispatcherOverloaded:
                time.sleep(0.001)
        self.offered += len(chunk)

    def _wait_for_room(self) -> None:
        while self._dispatcher.backlog + _CHECK_EVERY > self._window:
            if self._cancelled.is_set():
                raise RuntimeError("the sink was cancelled while waiting for room")
            time.sleep(0.001)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the processor has settled every outcome handed over (or a newer
        copy replaced it, or it expired); False if ``timeout_s`` ran out first or the
        sink was closed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            stats = self._dispatcher.stats()
            done = self._settling.settled + self._settling.failed
            if done + stats.overridden + stats.expired >= self.offered:
                return True
            if self._dispatcher.closed or self._cancelled.is_set():
                return False  # what is still pending will not be settled now
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.001)

    def stats(self) -> DispatcherStats:
        return self._dispatcher.stats()

    def close(self, timeout_s: float = 60.0) -> Delivery:
        """Wait up to ``timeout_s`` for what is pending; say how much was not delivered."""
        undelivered = self._dispatcher.close(timeout_s)
        return Delivery(self._dispatcher.stats(), undelivered, self._settling.failed)

    def __enter__(self) -> OutcomeSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def deliver_outcomes(
    outcomes: Iterable[OutcomeRow],
    processor: TaskProcessor[OutcomeRow],
    *,
    name: str = "outcomes",
    max_buffer_size: int = 10_000,
    max_batch_size: int = 250,
    worker_count: int = 4,
    max_batching_delay_ms: int = 50,
    congestion_retry_delay_ms: int = 1_000,
    network_failure_retry_ms: int = 1_000,
    timeout_s: float = 60.0,
    clock: Clock | None = None,
) -> Delivery:
    """Hand every outcome to ``processor.process_batch`` in batches, retrying after
    congestion or transient errors; wait up to ``timeout_s`` for the last of them."""
    sink = OutcomeSink(processor, name=name, max_buffer_size=max_buffer_size,
                       max_batch_size=max_batch_size,
                       worker_count=worker_count, max_batching_delay_ms=max_batching_delay_ms,
                       congestion_retry_delay_ms=congestion_retry_delay_ms,
                       network_failure_retry_ms=network_failure_retry_ms, clock=clock)
    try:
        sink.deliver(outcomes)
    finally:
        delivery = sink.close(timeout_s)
    return delivery
