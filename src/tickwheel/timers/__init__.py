"""Timers: a hierarchical timing wheel, a hashed wheel with rounds, a heap baseline."""

from tickwheel.timers._base import DEFAULT_EXECUTOR, TimerBase, TimerStats
from tickwheel.timers._errors import TimerClosed, TimerRejected
from tickwheel.timers._hashed_wheel import HashedWheelTimer
from tickwheel.timers._heap import HeapTimer
from tickwheel.timers._recurring import RecurringTask
from tickwheel.timers._task import TimerEntry, TimerTask
from tickwheel.timers._timing_wheel import TimingWheelTimer

__all__ = [
    "DEFAULT_EXECUTOR",
    "HashedWheelTimer",
    "HeapTimer",
    "RecurringTask",
    "TimerBase",
    "TimerClosed",
    "TimerEntry",
    "TimerRejected",
    "TimerStats",
    "TimerTask",
    "TimingWheelTimer",
]
