"""TrafficShaper: back off after congestion or a transient error (Eureka)."""

from __future__ import annotations

import threading

from tickwheel._clock import Clock
from tickwheel.dispatch._types import ProcessingResult

__all__ = ["MAX_DELAY_MS", "TrafficShaper"]

#: Upper bound on either retry delay, whatever the configuration says.
MAX_DELAY_MS = 30_000


class TrafficShaper:
    """After ``CONGESTION`` hand out no work until ``congestion_retry_delay_ms`` has
    passed since the last congestion; after ``TRANSIENT_ERROR``, likewise with
    ``network_failure_retry_ms``. Congestion is checked first. A clock that moved
    backwards (a negative elapsed time) resets the delay rather than stalling."""

    def __init__(self, clock: Clock, congestion_retry_delay_ms: int,
                 network_failure_retry_ms: int) -> None:
        self._clock = clock
        self.congestion_retry_delay_ms = min(MAX_DELAY_MS, congestion_retry_delay_ms)
        self.network_failure_retry_ms = min(MAX_DELAY_MS, network_failure_retry_ms)
        # None: no failure to back off from (any int is a valid clock reading).
        self._last_congestion_ms: int | None = None
        self._last_network_failure_ms: int | None = None
        self._lock = threading.Lock()

    def register_failure(self, result: ProcessingResult) -> None:
        now = self._clock.now_ms()
        with self._lock:
            if result is ProcessingResult.CONGESTION:
                self._last_congestion_ms = now
            elif result is ProcessingResult.TRANSIENT_ERROR:
                self._last_network_failure_ms = now

    def transmission_delay(self) -> int:
        """Milliseconds to wait before handing out more work (0: go)."""
        now = self._clock.now_ms()
        with self._lock:
            if self._last_congestion_ms is not None:
                elapsed = now - self._last_congestion_ms
                if 0 <= elapsed < self.congestion_retry_delay_ms:
                    return self.congestion_retry_delay_ms - elapsed
                self._last_congestion_ms = None
            if self._last_network_failure_ms is not None:
                elapsed = now - self._last_network_failure_ms
                if 0 <= elapsed < self.network_failure_retry_ms:
                    return self.network_failure_retry_ms - elapsed
                self._last_network_failure_ms = None
        return 0
