"""A fixed-bucket histogram of milliseconds, cheap enough for every timer run."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BOUNDS_MS", "Histogram", "HistogramSnapshot"]

# Upper bounds (inclusive) in ms; a last, open bucket catches the rest. Prometheus-like
# 1-2-5 steps: lateness is usually 0 or a tick, occasionally seconds under load.
BOUNDS_MS: tuple[int, ...] = (
    0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000,
)


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Counts per bucket: ``counts[i]`` holds values <= ``bounds[i]`` (and above the
    previous bound); ``counts[-1]`` holds values above the last bound."""

    bounds: tuple[int, ...]
    counts: tuple[int, ...]
    count: int
    total: int
    maximum: int

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> int:
        """The upper bound of the bucket holding quantile ``q`` (0..1); the maximum seen
        for the open bucket. 0 when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within [0, 1], got {q}")
        if self.count == 0:
            return 0
        rank = max(1, int(q * self.count + 0.999999))
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= rank:
                return min(self.bounds[i], self.maximum) if i < len(self.bounds) else self.maximum
        return self.maximum


class Histogram:
    """Thread-safe enough for counters: one lock, taken per record."""

    __slots__ = ("_count", "_counts", "_lock", "_max", "_total")

    def __init__(self) -> None:
        self._counts = [0] * (len(BOUNDS_MS) + 1)
        self._count = 0
        self._total = 0
        self._max = 0
        self._lock = threading.Lock()

    def record(self, value_ms: int) -> None:
        value_ms = max(value_ms, 0)
        i = bisect.bisect_left(BOUNDS_MS, value_ms)
        with self._lock:
            self._counts[i] += 1
            self._count += 1
            self._total += value_ms
            self._max = max(self._max, value_ms)

    def record_many(self, values: Iterable[int]) -> None:
        """Record a batch under one lock; timers record every run, so this stays cheap
        by bucketing each distinct value once (lateness takes few distinct values)."""
        distinct = Counter(values)
        if not distinct:
            return
        with self._lock:
            counts = self._counts
            for raw, n in distinct.items():
                value = max(raw, 0)
                counts[bisect.bisect_left(BOUNDS_MS, value)] += n
                self._count += n
                self._total += value * n
                self._max = max(self._max, value)

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            return HistogramSnapshot(
                BOUNDS_MS, tuple(self._counts), self._count, self._total, self._max
            )
