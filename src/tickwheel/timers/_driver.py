"""The daemon thread that advances a timer in real time."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

__all__ = ["Driver"]

log = logging.getLogger(__name__)

# Kafka's reaper polls every 200 ms; the wait ends early when an earlier task arrives.
POLL_MS = 200


class _Advanceable(Protocol):
    def advance_clock(self, timeout_ms: int) -> bool: ...


class Driver:
    def __init__(self, name: str, timer: _Advanceable, realtime: bool) -> None:
        self._timer = timer
        self._realtime = realtime
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop_soon(self) -> None:
        """Ask the loop to end after its current pass, without waiting."""
        self._stop.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                progressed = self._timer.advance_clock(POLL_MS)
            except Exception:  # pragma: no cover - the timer catches task errors itself
                log.exception("timer driver: advance_clock failed")
                progressed = False
            # A manual clock moves only when someone moves it: poll it gently instead
            # of spinning (advance_clock never waits on such a clock).
            if not self._realtime and not progressed:
                self._stop.wait(0.001)
