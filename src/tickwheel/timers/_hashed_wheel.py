"""HashedWheelTimer: Netty's single-level wheel with rounds.

The wheel has a power-of-two number of buckets, indexed with a mask. A timeout whose
deadline is more than one lap away waits in its bucket for whole rounds; every tick the
worker walks the current bucket and expires what is due. New timeouts go through a
queue and are moved into buckets at most 100,000 per tick, as in Netty.

Two departures from Netty, both invisible to a caller except as speed:
- Netty keeps ``remainingRounds`` per timeout and decrements it on every visit; here a
  timeout keeps its deadline tick and is due when that tick has been reached, the same
  test without a write per visit, which also makes a jump of many laps of virtual
  time exact in one pass over the buckets.
- Netty queues cancellations for its worker so that ``cancel()`` never takes a lock;
  here ``cancel()`` takes the timer's lock anyway (to keep ``size`` exact), so the
  timeout leaves its bucket at once and no tombstone stays behind. (Timeouts cancelled
  while still in the new-timeouts queue are skipped when the queue is drained, as in
  Netty.)
Ticks with nothing pending are skipped, where Netty's worker wakes for every one.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Executor

from tickwheel._clock import Clock
from tickwheel._validate import check_positive_int
from tickwheel.timers._base import DEFAULT_EXECUTOR, TimerBase, _DefaultExecutor
from tickwheel.timers._bucket import Bucket
from tickwheel.timers._errors import TimerRejected
from tickwheel.timers._task import TimerEntry

__all__ = ["HashedWheelTimer"]

#: Netty moves at most this many new timeouts into buckets per tick.
MAX_TRANSFER_PER_TICK = 100_000
_MAX_TICKS_PER_WHEEL = 1 << 30


class HashedWheelTimer(TimerBase):
    """Netty's ``HashedWheelTimer``."""

    kind = "hashed_wheel"

    def __init__(
        self,
        tick_ms: int = 100,
        ticks_per_wheel: int = 512,
        max_pending: int | None = None,
        clock: Clock | None = None,
        executor: Executor | _DefaultExecutor | None = DEFAULT_EXECUTOR,
        name: str | None = None,
    ) -> None:
        self._tick_ms = check_positive_int("tick_ms", tick_ms)
        wanted = check_positive_int("ticks_per_wheel", ticks_per_wheel)
        if wanted > _MAX_TICKS_PER_WHEEL:
            raise ValueError(
                f"ticks_per_wheel may not be greater than 2**30, got {ticks_per_wheel}"
            )
        self._max_pending = (
            None if max_pending is None else check_positive_int("max_pending", max_pending)
        )
        super().__init__(clock, executor, name)
        n = 1
        while n < wanted:
            n <<= 1
        self._mask = n - 1
        self._buckets = [Bucket(self) for _ in range(n)]
        self._timeouts: deque[TimerEntry] = deque()
        # The next tick to process; tick t may be processed once the clock reads
        # t * tick_ms.
        self._tick = self._clock.now_ms() // self._tick_ms

    @property
    def tick_ms(self) -> int:
        return self._tick_ms

    @property
    def ticks_per_wheel(self) -> int:
        return self._mask + 1

    @property
    def max_pending(self) -> int | None:
        return self._max_pending

    def _insert(self, task: TimerEntry, expiration: int, now_ms: int) -> None:
        limit = self._max_pending
        if limit is not None and self._size >= limit:
            raise TimerRejected(self._size + 1, limit)
        task._expiration = expiration
        task._owner = self
        self._timeouts.append(task)

    def remove_task(self, task: TimerEntry, cancelling: bool) -> bool:
        """Cancel a timeout still in the new-timeouts queue: the queue skips it."""
        with self._lock:
            if task._owner is not self:
                return False
            task._owner = None
            self._on_removed(task, cancelling)
            return True

    def _transfer(self, now_ms: int, due: list[TimerEntry]) -> None:
        """Move queued timeouts into buckets, at most MAX_TRANSFER_PER_TICK."""
        queue = self._timeouts
        tick_ms = self._tick_ms
        current = self._tick
        mask = self._mask
        buckets = self._buckets
        for _ in range(min(len(queue), MAX_TRANSFER_PER_TICK)):
            task = queue.popleft()
            if task._owner is not self:
                continue  # cancelled while queued, or already moved by a duplicate entry
            expiration = task._expiration
            if expiration <= now_ms:
                task._owner = None
                due.append(task)
                continue
            deadline_tick = -(-expiration // tick_ms)
            # A deadline already passed goes into the current bucket (Netty).
            buckets[max(deadline_tick, current) & mask].append(task)

    def _expire_bucket(self, bucket: Bucket, tick: int, due: list[TimerEntry]) -> None:
        tick_ms = self._tick_ms
        expired = [t for t in bucket.tasks if -(-t._expiration // tick_ms) <= tick]
        for task in expired:
            bucket.unlink(task)
        due.extend(expired)

    def _collect(self, now_ms: int) -> tuple[list[TimerEntry], bool]:
        due: list[TimerEntry] = []
        target = now_ms // self._tick_ms
        buckets = self._buckets
        mask = self._mask
        if self._tick > target:
            # This tick was processed already; still let out what is due right now.
            self._transfer(now_ms, due)
        while self._tick <= target:
            self._transfer(now_ms, due)
            if self._size - len(due) == 0 and not self._timeouts:
                self._tick = target + 1  # nothing pending: skip idle ticks
                break
            if target - self._tick > mask and not self._timeouts:
                # A lap or more of virtual time at once: each bucket is visited at least
                # once, so everything due by `target` expires in one pass.
                for bucket in buckets:
                    self._expire_bucket(bucket, target, due)
                self._tick = target + 1
                break
            self._expire_bucket(buckets[self._tick & mask], self._tick, due)
            self._tick += 1
        if due:
            self._account_due(due, now_ms)
        return due, bool(due)

    def _clear(self) -> list[TimerEntry]:
        dropped: list[TimerEntry] = []
        for task in self._timeouts:
            if task._owner is self:  # not cancelled, nor moved on by a duplicate entry
                task._owner = None
                dropped.append(task)
        self._timeouts.clear()
        for bucket in self._buckets:
            dropped.extend(bucket.drain())
        return dropped

    def _next_due_ms(self) -> int | None:
        if self._size == 0:
            return None
        return self._tick * self._tick_ms
