"""Clocks: the only source of time for everything in tickwheel.

Every time-dependent class takes a ``clock=``. A :class:`ManualClock` never moves by
itself, so tests (and simulations) decide exactly when time passes and nothing ever
sleeps for real; :class:`SystemClock` is the monotonic clock for production.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, SupportsIndex

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """What a timer needs from a clock."""

    @property
    def realtime(self) -> bool:
        """True when waiting for the clock to move makes sense (it moves by itself)."""
        ...

    def now_ms(self) -> int:
        """The current time in whole milliseconds; never decreases."""
        ...


class SystemClock:
    """Monotonic wall time in milliseconds (``time.monotonic_ns``)."""

    __slots__ = ()

    @property
    def realtime(self) -> bool:
        return True

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to; thread-safe.

    Moving it backwards raises :class:`ValueError`: every timer relies on time never
    decreasing, and a silent jump back would make tasks fire early or twice.
    """

    __slots__ = ("_lock", "_now_ms")

    def __init__(self, start_ms: SupportsIndex = 0) -> None:
        self._now_ms = _whole_ms("start_ms", start_ms)
        self._lock = threading.Lock()

    @property
    def realtime(self) -> bool:
        return False

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: SupportsIndex) -> int:
        """Move forward by ``ms`` (>= 0) and return the new time."""
        step = _whole_ms("ms", ms)
        if step < 0:
            raise ValueError(f"ms must be >= 0 to advance a ManualClock, got {step}")
        with self._lock:
            self._now_ms += step
            return self._now_ms

    def set(self, ms: SupportsIndex) -> None:
        """Move to the absolute time ``ms``, which must not be before the current time."""
        target = _whole_ms("ms", ms)
        with self._lock:
            if target < self._now_ms:
                raise ValueError(
                    f"ms={target} would move a ManualClock backwards from {self._now_ms}"
                )
            self._now_ms = target

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"


def _whole_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of milliseconds, got {value!r}")
    return value
