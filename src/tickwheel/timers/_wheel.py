"""TimingWheel: one level of the hierarchical wheel; the next level is made on demand.

Times inside the wheel are counted in ticks of the finest level. A level whose slots
span ``unit`` ticks covers the ticks ``[current + unit, current + unit * size)`` where
``current`` is the timer's tick rounded down to a multiple of ``unit``; anything later
belongs to the overflow wheel, whose slot spans this level's whole interval (Kafka).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tickwheel.timers._bucket import Bucket

if TYPE_CHECKING:
    from tickwheel.timers._base import TimerBase

__all__ = ["TimingWheel"]


class TimingWheel:
    __slots__ = ("buckets", "interval", "overflow", "size", "timer", "unit")

    def __init__(self, timer: TimerBase, unit: int, size: int) -> None:
        self.timer = timer
        self.unit = unit
        self.size = size
        self.interval = unit * size
        self.buckets = [Bucket(timer) for _ in range(size)]
        self.overflow: TimingWheel | None = None

    def bucket_for(self, tick: int, current: int) -> tuple[Bucket, int]:
        """The bucket of the level that holds ``tick`` (> ``current``), creating
        overflow levels as needed, and the tick at which that bucket must be flushed
        (which, above the first level, demotes its tasks to finer levels)."""
        wheel = self
        while True:
            unit = wheel.unit
            start = current - current % unit
            if tick < start + wheel.interval:
                slot = tick // unit
                # A slot is reused only once its previous span is flushed, so a bucket
                # holds one expiration at a time.
                return wheel.buckets[slot % wheel.size], slot * unit
            if wheel.overflow is None:
                wheel.overflow = TimingWheel(wheel.timer, wheel.interval, wheel.size)
            wheel = wheel.overflow

    @property
    def levels(self) -> int:
        n = 1
        wheel = self.overflow
        while wheel is not None:
            n += 1
            wheel = wheel.overflow
        return n
