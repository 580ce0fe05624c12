"""TimingWheelTimer: Kafka's hierarchical timing wheel with a delay queue of buckets.

Schedule and cancel are O(1): a task is linked into the bucket of its slot, or unlinked
from it. Only buckets, not tasks, enter the heap (Kafka's ``DelayQueue``), so
``advance_clock`` jumps straight to the next bucket that is due and never walks idle
ticks. Flushing a due bucket re-inserts its tasks: those due run, the others drop to a
finer level (demotion).

Precision, better than Kafka's: a task's expiration is rounded *up* to a tick, so it
never runs early (Kafka rounds down and may run a task up to ``tick_ms - 1`` early)
and runs at the first ``advance_clock`` once the clock reads expiration + ``tick_ms``.
Times are Python ints: delays of 2**62 ms and deadlines past any clock's range are held
without overflow, in as many levels as they need.
"""

from __future__ import annotations

import heapq
from concurrent.futures import Executor

from tickwheel._clock import Clock
from tickwheel._validate import check_positive_int
from tickwheel.timers._base import DEFAULT_EXECUTOR, TimerBase, _DefaultExecutor
from tickwheel.timers._bucket import Bucket
from tickwheel.timers._task import TimerEntry
from tickwheel.timers._wheel import TimingWheel

__all__ = ["TimingWheelTimer"]

#: Slots per level. 256 beat 20 (Kafka's default) and 64 in the benchmark: fewer
#: levels means fewer demotions, and an empty slot costs only its sentinel.
DEFAULT_WHEEL_SIZE = 256


class TimingWheelTimer(TimerBase):
    """Kafka's hierarchical timing wheel (``SystemTimer`` + ``TimingWheel``)."""

    kind = "timing_wheel"

    def __init__(
        self,
        tick_ms: int = 1,
        wheel_size: int = DEFAULT_WHEEL_SIZE,
        clock: Clock | None = None,
        executor: Executor | _DefaultExecutor | None = DEFAULT_EXECUTOR,
        name: str | None = None,
    ) -> None:
        self._tick_ms = check_positive_int("tick_ms", tick_ms)
        # A one-slot level would cover no more than its own tick: every level above it
        # would too, and a far task could never be placed.
        self._wheel_size = check_positive_int("wheel_size", wheel_size, minimum=2)
        super().__init__(clock, executor, name)
        self._current = self._clock.now_ms() // self._tick_ms
        self._wheel = TimingWheel(self, 1, self._wheel_size)
        self._buckets0 = self._wheel.buckets
        size = self._wheel_size
        self._mask0 = size - 1 if size & (size - 1) == 0 else -1
        # Tasks due at once (delay <= 0, or re-inserted after their tick): they run at
        # the next advance_clock, never inside add().
        self._due = Bucket(self)
        self._queue: list[tuple[int, int, Bucket]] = []
        self._flushes = 0

    @property
    def tick_ms(self) -> int:
        return self._tick_ms

    @property
    def wheel_size(self) -> int:
        return self._wheel_size

    @property
    def bucket_flushes(self) -> int:
        """Buckets flushed so far: one per due bucket, never one per idle tick."""
        return self._flushes

    @property
    def levels(self) -> int:
        """Levels created so far (overflow wheels are made on demand)."""
        return self._wheel.levels

    def next_expiration_ms(self) -> int | None:
        """The earliest expiration of a pending task (clock ms), or None when none is
        pending. Exact, where :meth:`next_due_ms` gives the next bucket, whose flush may
        only demote its tasks: a caller that pays for each wake (a batch that writes its
        state) waits for this instead. It looks into the first buckets of the delay
        queue until one starts after the best found; a bucket scans its tasks only after
        the one due first in it leaves."""
        with self._lock:
            # Tasks already due may have expired after a task whose tick has not come.
            best = self._due.earliest_expiration()
            tick_ms = self._tick_ms
            queue = self._queue.copy()
            while queue:
                flush_at, _, bucket = heapq.heappop(queue)
                # A bucket's tasks expire after (flush_at - 1) ticks, and so do the
                # tasks of every bucket after it in the queue.
                if best is not None and (flush_at - 1) * tick_ms >= best:
                    break
                if not bucket.queued or bucket.expiration != flush_at:
                    continue  # stale
                earliest = bucket.earliest_expiration()
                if earliest is not None and (best is None or earliest < best):
                    best = earliest
            return best

    def pending_entries(self) -> list[TimerEntry]:
        """Every entry the timer holds, in no particular order, as a new list."""
        with self._lock:
            out: list[TimerEntry] = []
            seen: set[int] = set()
            for flush_at, serial, bucket in self._queue:
                # A stale queue entry, or the second of a bucket queued twice for a tick.
                if bucket.queued and bucket.expiration == flush_at and serial not in seen:
                    seen.add(serial)
                    out.extend(bucket.tasks)
            out.extend(self._due.tasks)
            return out

    def _insert(self, task: TimerEntry, expiration: int, now_ms: int) -> None:
        task._expiration = expiration
        tick_ms = self._tick_ms
        tick = -(-expiration // tick_ms) if tick_ms != 1 else expiration
        current = self._current
        if tick <= current or expiration <= now_ms:
            self._due.append(task)
            return
        size = self._wheel_size
        if tick < current + size:
            mask = self._mask0
            bucket = self._buckets0[tick & mask if mask >= 0 else tick % size]
            bucket.append(task)
            if not bucket.due_at(tick):
                return
        else:
            wheel = self._wheel
            placed = (wheel.overflow or wheel.next_level()).place(task, tick, current)
            if placed is None:
                return
            bucket = placed
        heapq.heappush(self._queue, (bucket.expiration, bucket.serial, bucket))

    def _collect(self, now_ms: int) -> tuple[list[TimerEntry], bool]:
        now_tick = now_ms // self._tick_ms
        queue = self._queue
        due: list[TimerEntry] = []
        flushed = False
        while queue and queue[0][0] <= now_tick:
            flush_at, _, bucket = heapq.heappop(queue)
            if not bucket.queued or bucket.expiration != flush_at:
                continue  # stale: the bucket was flushed, or re-queued for another tick
            flushed = True
            self._flushes += 1
            self._current = flush_at
            for task in bucket.drain():
                self._insert(task, task._expiration, now_ms)
        self._current = max(self._current, now_tick)
        due_bucket = self._due
        if not due_bucket.empty:
            due = due_bucket.drain()
            self._account_due(due, now_ms)
        return due, flushed or bool(due)

    def _clear(self) -> list[TimerEntry]:
        dropped: list[TimerEntry] = []
        for _, _, bucket in self._queue:
            dropped.extend(bucket.drain())  # a bucket queued twice is empty the second time
        self._queue.clear()
        dropped.extend(self._due.drain())
        return dropped

    def _next_due_ms(self) -> int | None:
        if not self._due.empty:
            return self._clock.now_ms()
        if self._queue:
            return self._queue[0][0] * self._tick_ms
        return None
