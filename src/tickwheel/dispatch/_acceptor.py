"""AcceptorExecutor: Eureka's batcher, between the callers and the workers.

Callers append to the acceptor queue; workers hand failed batches back to the
reprocess queue. One acceptor thread drains both into the pending map (id -> holder)
plus a processing order, and hands work to workers that asked for it:

- a task whose id is already pending replaces the payload and keeps its place
  (``overridden``); when the buffer is full the oldest pending task is dropped
  (``queue_overflows``; Eureka drops one even when the new task only overrides);
- reprocessed tasks go back to the front, in their original order, unless expired or
  overridden by a newer task; if the buffer fills, the rest of them are dropped;
- expired tasks are dropped at drain and at dispatch (``expired``);
- a batch is handed out when the buffer is full, when the oldest pending task has
  waited ``max_batching_delay_ms`` or, going beyond Eureka (which waits for the delay
  even then), as soon as ``max_batch_size`` tasks are pending;
- the traffic shaper holds all work back after congestion or a transient error.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Hashable
from typing import Any

from tickwheel._clock import Clock
from tickwheel._histogram import Histogram
from tickwheel._validate import check_delay_ms
from tickwheel.dispatch._shaper import TrafficShaper
from tickwheel.dispatch._types import DispatcherOverloaded, ProcessingResult, TaskHolder

__all__ = ["AcceptorExecutor"]

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.010  # Eureka's acceptor polls every 10 ms when it has nothing to do


def _checked_expiry(task_id: Hashable, expiry_ms: object) -> int:
    """The task's expiry as an int, once its id is known to hash: a bad one found by the
    acceptor thread would be lost uncounted."""
    try:
        hash(task_id)
    except TypeError:
        raise TypeError(f"task_id must be hashable, got {type(task_id).__name__} "
                        f"{task_id!r}") from None
    return check_delay_ms("expiry_ms", expiry_ms)


class AcceptorExecutor:
    def __init__(
        self,
        name: str,
        max_buffer_size: int,
        max_batch_size: int,
        max_batching_delay_ms: int,
        shaper: TrafficShaper,
        clock: Clock,
        max_acceptor_queue: int,
    ) -> None:
        self.name = name
        self.max_buffer_size = max_buffer_size
        self.max_batch_size = max_batch_size
        self.max_batching_delay_ms = max_batching_delay_ms
        self.max_acceptor_queue = max_acceptor_queue
        self._shaper = shaper
        self._clock = clock
        self._acceptor_queue: deque[TaskHolder[Any]] = deque()
        self._reprocess_queue: deque[TaskHolder[Any]] = deque()
        self._pending: dict[Hashable, TaskHolder[Any]] = {}
        self._order: deque[Hashable] = deque()
        # Workers pull: a worker releases a permit and waits on the work queue; the
        # acceptor hands out one batch per permit it can take.
        self._batch_requests = threading.Semaphore(0)
        self._single_requests = threading.Semaphore(0)
        # None: no work, to wake a worker at shutdown (see release_workers).
        self._batch_queue: queue.SimpleQueue[list[TaskHolder[Any]] | None] = (
            queue.SimpleQueue())
        self._single_queue: queue.SimpleQueue[TaskHolder[Any] | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flushing = False
        self._counts_lock = threading.Lock()
        self.accepted = 0
        self.replayed = 0
        self.expired = 0
        self.overridden = 0
        self.queue_overflows = 0
        self.reprocess_overflows = 0
        self.passes = 0  # of the acceptor thread's loop, each a look at all its queues
        self.batch_sizes = Histogram()
        self.wait_ms = Histogram()
        self._thread = threading.Thread(target=self._run, name=f"TaskAcceptor-{name}",
                                        daemon=True)
        self._thread.start()

    # -- called by callers and workers ---------------------------------------------------

    def process(self, task_id: Hashable, task: Any, expiry_ms: int) -> None:
        expiry = _checked_expiry(task_id, expiry_ms)
        if len(self._acceptor_queue) >= self.max_acceptor_queue:
            raise DispatcherOverloaded(
                f"dispatcher {self.name!r}: acceptor queue holds {self.max_acceptor_queue} "
                "tasks; the acceptor thread is not keeping up")
        self._acceptor_queue.append(TaskHolder(task_id, task, expiry, self._clock.now_ms()))
        with self._counts_lock:
            self.accepted += 1
        self._wake.set()

    def process_all(self, tasks: list[tuple[Hashable, Any, int]]) -> None:
        """``process`` for many tasks at once: one clock read, one count and one wake-up
        for all of them (per task, those cost more than the queueing itself). All or
        nothing: a batch that does not fit in the acceptor queue is refused whole."""
        aq = self._acceptor_queue
        if len(aq) + len(tasks) > self.max_acceptor_queue:
            raise DispatcherOverloaded(
                f"dispatcher {self.name!r}: acceptor queue holds {len(aq)} of "
                f"{self.max_acceptor_queue} tasks, no room for {len(tasks)} more; "
                "the acceptor thread is not keeping up")
        now = self._clock.now_ms()
        holders: list[TaskHolder[Any]] = []
        add = holders.append
        try:
            for task_id, task, given in tasks:
                hash(task_id)
                expiry = given if type(given) is int else _checked_expiry(task_id, given)
                add(TaskHolder(task_id, task, expiry, now))
        except (TypeError, ValueError):
            # Checked again, slowly, for a message that names the task and the field.
            i = len(holders)
            try:
                task_id, _, expiry_ms = tasks[i]
                _checked_expiry(task_id, expiry_ms)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"task {i}: {exc}") from None
            raise
        aq.extend(holders)
        with self._counts_lock:
            self.accepted += len(tasks)
        self._wake.set()

    def reprocess(self, holders: list[TaskHolder[Any]], result: ProcessingResult) -> None:
        self._reprocess_queue.extend(holders)
        with self._counts_lock:
            self.replayed += len(holders)
        self._shaper.register_failure(result)
        self._wake.set()

    def request_batch(self, timeout_s: float) -> list[TaskHolder[Any]] | None:
        self._batch_requests.release()
        self._wake.set()
        try:
            return self._batch_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def request_single(self, timeout_s: float) -> TaskHolder[Any] | None:
        self._single_requests.release()
        self._wake.set()
        try:
            return self._single_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    # -- gauges --------------------------------------------------------------------------

    @property
    def acceptor_queue_size(self) -> int:
        return len(self._acceptor_queue)

    @property
    def reprocess_queue_size(self) -> int:
        return len(self._reprocess_queue)

    @property
    def pending_size(self) -> int:
        return len(self._pending)

    # -- lifecycle -----------------------------------------------------------------------

    def flush(self) -> None:
        """From now on hand out whatever is pending without waiting to fill a batch."""
        self._flushing = True
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        """Stop the acceptor thread: no more work is handed out."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def release_workers(self, count: int) -> None:
        """Wake ``count`` workers waiting for work, with none (after :meth:`stop`). Their
        timed waits alone cannot be relied on to end: at a shutdown under load, a
        worker was seen in ``SimpleQueue.get(timeout=0.1)`` for over 20 s, with other
        workers waiting on the same queue (CPython 3.11)."""
        for _ in range(count):
            self._batch_queue.put(None)
            self._single_queue.put(None)

    def drop_held(self) -> int:
        """Empty the queues and the buffer and return how many tasks they held (after
        ``stop``, once the workers hand nothing back)."""
        held = len(self._acceptor_queue) + len(self._reprocess_queue) + len(self._pending)
        self._acceptor_queue.clear()
        self._reprocess_queue.clear()
        self._pending.clear()
        self._order.clear()
        # Batches handed out but not yet taken by a worker are still ours too.
        while True:
            try:
                held += len(self._batch_queue.get_nowait() or ())
            except queue.Empty:
                break
        while True:
            try:
                held += self._single_queue.get_nowait() is not None
            except queue.Empty:
                break
        return held

    # -- the acceptor thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                # Cleared before looking, so news that comes while this pass works is
                # not lost (clearing after the wait would lose it: a 10 ms stall).
                self._wake.clear()
                self._drain_input_queues()
                now = self._clock.now_ms()
                handed = 0
                # Asked every pass (Eureka caches a schedule time and so ignores a
                # failure reported in the same millisecond as its last check).
                if self._shaper.transmission_delay() == 0:
                    handed = self._assign_batch_work(now) + self._assign_single_item_work(now)
                self.passes += 1
                if not handed:
                    # Nothing could go out (no worker asked, the batch is not ready, or
                    # the shaper holds back): wait for news instead of spinning.
                    self._wake.wait(_IDLE_WAIT_S)
            except Exception:  # pragma: no cover - a bug here must not kill the thread
                log.exception("dispatcher %s: acceptor loop failed", self.name)

    def _drain_input_queues(self) -> None:
        self._drain_reprocess_queue()
        self._drain_acceptor_queue()

    def _drain_reprocess_queue(self) -> None:
        now = self._clock.now_ms()
        rq = self._reprocess_queue
        pending = self._pending
        expired = overridden = 0
        # Newest first onto the front of the order: the batch keeps its original order.
        while rq and len(pending) < self.max_buffer_size:
            holder = rq.pop()
            if holder.expiry_ms <= now:
                expired += 1
            elif holder.id in pending:
                overridden += 1  # a newer task with the same id is already waiting
            else:
                pending[holder.id] = holder
                self._order.appendleft(holder.id)
        dropped = 0
        if rq and len(pending) >= self.max_buffer_size:
            dropped = len(rq)
            rq.clear()
        if expired or overridden or dropped:
            with self._counts_lock:
                self.expired += expired
                self.overridden += overridden
                self.queue_overflows += dropped
                self.reprocess_overflows += dropped

    def _drain_acceptor_queue(self) -> None:
        aq = self._acceptor_queue
        if not aq:
            return
        pending = self._pending
        order = self._order
        now = self._clock.now_ms()
        limit = self.max_buffer_size
        expired = overridden = overflows = 0
        popleft = aq.popleft
        while aq:
            holder = popleft()
            if holder.expiry_ms <= now:
                expired += 1
                continue
            task_id = holder.id
            if task_id in pending:
                pending[task_id] = holder  # the newer payload keeps the older's place
                overridden += 1
                continue
            if len(pending) >= limit:
                # Drop the oldest to make room (its id may have gone already).
                while order:
                    oldest = order.popleft()
                    if pending.pop(oldest, None) is not None:
                        overflows += 1
                        break
            pending[task_id] = holder
            order.append(task_id)
        with self._counts_lock:
            self.expired += expired
            self.overridden += overridden
            self.queue_overflows += overflows

    def _batch_ready(self, now: int) -> bool:
        order = self._order
        if not order:
            return False
        pending = self._pending
        if (self._flushing or len(pending) >= self.max_buffer_size
                or len(pending) >= self.max_batch_size):
            return True
        oldest = pending.get(order[0])
        return oldest is None or now - oldest.submit_ms >= self.max_batching_delay_ms

    def _take(self, count: int, now: int) -> list[TaskHolder[Any]]:
        order = self._order
        pending = self._pending
        out: list[TaskHolder[Any]] = []
        expired = 0
        while order and len(out) < count:
            holder = pending.pop(order.popleft(), None)
            if holder is None:
                continue
            if holder.expiry_ms <= now:
                expired += 1
                continue
            out.append(holder)
        if expired:
            with self._counts_lock:
                self.expired += expired
        return out

    def _assign_batch_work(self, now: int) -> int:
        handed = 0
        while self._batch_ready(now) and self._batch_requests.acquire(blocking=False):
            batch = self._take(self.max_batch_size, now)
            if not batch:
                self._batch_requests.release()  # nothing left after expiry: give it back
                break
            self.batch_sizes.record(len(batch))
            self.wait_ms.record_many([now - h.submit_ms for h in batch])
            self._batch_queue.put(batch)
            handed += 1
        return handed

    def _assign_single_item_work(self, now: int) -> int:
        handed = 0
        while self._order and self._single_requests.acquire(blocking=False):
            taken = self._take(1, now)
            if not taken:
                self._single_requests.release()
                break
            self.wait_ms.record(now - taken[0].submit_ms)
            self._single_queue.put(taken[0])
            handed += 1
        return handed
