"""tickwheel: delayed operations at any scale.

Timers (Kafka's hierarchical timing wheel, Netty's hashed wheel, a heap baseline) and
the purgatory of delayed operations built on them, all on an explicit clock, so that
everything time-dependent can run on a manual clock.
"""

from tickwheel._clock import Clock, ManualClock, SystemClock
from tickwheel._histogram import HistogramSnapshot
from tickwheel.dispatch import (
    DispatcherClosed,
    DispatcherOverloaded,
    DispatcherStats,
    ProcessingResult,
    TaskDispatcher,
    TaskProcessor,
    create_batching_dispatcher,
    create_non_batching_dispatcher,
)
from tickwheel.purgatory import (
    DelayedFuture,
    DelayedOperation,
    Outcome,
    Purgatory,
    PurgatoryStats,
)
from tickwheel.timers import (
    HashedWheelTimer,
    HeapTimer,
    TimerBase,
    TimerClosed,
    TimerRejected,
    TimerStats,
    TimerTask,
    TimingWheelTimer,
)

__version__ = "0.1.0"

__all__ = [
    "Clock",
    "DelayedFuture",
    "DelayedOperation",
    "DispatcherClosed",
    "DispatcherOverloaded",
    "DispatcherStats",
    "HashedWheelTimer",
    "HeapTimer",
    "HistogramSnapshot",
    "ManualClock",
    "Outcome",
    "ProcessingResult",
    "Purgatory",
    "PurgatoryStats",
    "SystemClock",
    "TaskDispatcher",
    "TaskProcessor",
    "TimerBase",
    "TimerClosed",
    "TimerRejected",
    "TimerStats",
    "TimerTask",
    "TimingWheelTimer",
    "compiled",
    "create_batching_dispatcher",
    "create_non_batching_dispatcher",
]


def _is_compiled() -> bool:
    from tickwheel.timers import _timing_wheel

    return not (_timing_wheel.__file__ or "").endswith(".py")


#: True when the timer core runs as a compiled (mypyc) extension, False in pure Python.
compiled: bool = _is_compiled()
