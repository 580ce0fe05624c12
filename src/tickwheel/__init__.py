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
from tickwheel.schedules import Misfire, Schedule, ScheduleError
from tickwheel.timers import (
    HashedWheelTimer,
    HeapTimer,
    RecurringTask,
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
    "Misfire",
    "Outcome",
    "ProcessingResult",
    "Purgatory",
    "PurgatoryStats",
    "RecurringTask",
    "Schedule",
    "ScheduleError",
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


def _build_lines() -> list[str]:
    """What ``python -m tickwheel`` and ``tickwheel --version`` print: the release, the
    Python, and which core and lock this install runs."""
    import sys

    from tickwheel import _mutex

    lines = [f"tickwheel {__version__} on Python {sys.version.split()[0]}"]
    if compiled:
        lines.append("core: compiled (mypyc)")
    else:
        lines.append("core: pure Python (no C compiler at install, or "
                     "TICKWHEEL_PURE_PYTHON=1); reinstall where a C compiler exists for "
                     "the compiled core")
    if isinstance(_mutex.new_lock(), _mutex.Mutex):
        lock = "RawLock (C)" if _mutex.native else "the token lock (queue.SimpleQueue)"
    else:
        lock = "threading.Lock"
    lines.append(f"mutex: {lock}")
    return lines
