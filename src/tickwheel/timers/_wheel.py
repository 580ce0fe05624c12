"""TimingWheel: one level of the hierarchical wheel; the next level is made on demand.

Times inside the wheel are counted in ticks of the finest level. A level whose slots
span ``unit`` ticks covers the ticks ``[current + unit, current + unit * size)`` where
``current`` is the timer's tick rounded down to a multiple of ``unit``; anything later
belongs to the overflow wheel, whose slot spans this level's whole interval (Kafka).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tickwheel.timers import _bucket
from tickwheel.timers._bucket import Bucket, position

if TYPE_CHECKING:
    from tickwheel.timers._base import TimerBase
    from tickwheel.timers._task import TimerEntry

__all__ = ["TimingWheel"]


class TimingWheel:
    __slots__ = ("buckets", "interval", "overflow", "shift", "size", "timer", "unit")

    def __init__(self, timer: TimerBase, unit: int, size: int) -> None:
        self.timer = timer
        self.unit = unit
        self.size = size
        self.interval = unit * size
        # With a power-of-two size (the default 256) every unit is a power of two too,
        # and placing a task takes shifts and masks instead of three integer divisions.
        self.shift = unit.bit_length() - 1 if size & (size - 1) == 0 else -1
        self.buckets = [Bucket(timer) for _ in range(size)]
        self.overflow: TimingWheel | None = None

    def next_level(self) -> TimingWheel:
        """The overflow wheel, made on first use: its slot spans this whole level."""
        overflow = self.overflow
        if overflow is None:
            overflow = self.overflow = TimingWheel(self.timer, self.interval, self.size)
        return overflow

    def place(self, task: TimerEntry, tick: int, current: int) -> Bucket | None:
        """Link ``task`` into the bucket of the first level, from this one up, that
        holds ``tick`` (> ``current``), making overflow levels as needed. Returns the
        bucket if its flush tick changed (it must enter the delay queue), else None.

        Above the first level, flushing a bucket demotes its tasks to finer levels.
        Nothing is allocated here but the levels themselves: placing is on the path of
        every schedule."""
        wheel = self
        while True:
            shift = wheel.shift
            if shift >= 0:
                # tick < start + interval, with start = current rounded down to a unit
                slot = tick >> shift
                if slot >= (current >> shift) + wheel.size:
                    wheel = wheel.next_level()
                    continue
                bucket = wheel.buckets[slot & (wheel.size - 1)]
                flush_at = slot << shift
            else:
                unit = wheel.unit
                if tick >= current - current % unit + wheel.interval:
                    wheel = wheel.next_level()
                    continue
                slot = tick // unit
                bucket = wheel.buckets[slot % wheel.size]
                flush_at = slot * unit
            # Bucket.append() and due_at(), inline: this is every schedule past the
            # first level.
            tasks = bucket._tasks
            n = len(tasks)
            positions = _bucket._positions  # rebound as it grows: read it afresh
            task._index = positions[n] if n < len(positions) else position(n)
            tasks.append(task)
            task._owner = bucket
            expiration = task._expiration
            if n == 0:
                bucket.earliest, bucket.earliest_known = expiration, True
            elif expiration < bucket.earliest:
                bucket.earliest = expiration
            # A slot is reused only once its previous span is flushed, so a bucket
            # holds one expiration at a time.
            if bucket.queued and bucket.expiration == flush_at:
                return None
            bucket.expiration = flush_at
            bucket.queued = True
            return bucket

    @property
    def levels(self) -> int:
        n = 1
        wheel = self.overflow
        while wheel is not None:
            n += 1
            wheel = wheel.overflow
        return n
