"""The service's recent past for its console: rows acknowledged, occurrences fired and
operations resolved per second, and the acknowledgement latency, sampled every few
seconds over the last 15 minutes from the service's own counters and histogram."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from tickwheel._histogram import HistogramSnapshot

__all__ = ["HISTORY_S", "SAMPLE_EVERY_S", "History", "Sample"]

#: How often a sample is taken, and how far back the samples reach.
SAMPLE_EVERY_S: Final = 5
HISTORY_S: Final = 15 * 60


@dataclass(frozen=True, slots=True)
class Sample:
    """The interval that ended at ``t_ms`` (wall clock): rates per second, and the
    acknowledgement latency's quantiles over the requests it answered (None: none)."""

    t_ms: int
    acked_per_s: float
    fired_per_s: float
    resolved_per_s: float
    ack_p50_ms: int | None
    ack_p99_ms: int | None

    def as_json(self) -> dict[str, Any]:
        return {"t_ms": self.t_ms, "acked_per_s": self.acked_per_s,
                "fired_per_s": self.fired_per_s, "resolved_per_s": self.resolved_per_s,
                "ack_p50_ms": self.ack_p50_ms, "ack_p99_ms": self.ack_p99_ms}


def _between(later: HistogramSnapshot, earlier: HistogramSnapshot | None,
             ) -> HistogramSnapshot:
    """What was recorded between two snapshots of one histogram (its maximum: the
    later one's, an upper bound)."""
    if earlier is None:
        return later
    counts = tuple(a - b for a, b in zip(later.counts, earlier.counts, strict=True))
    return HistogramSnapshot(later.bounds, counts, later.count - earlier.count,
                             later.total - earlier.total, later.maximum)


class History:
    """Samples of cumulative counters, kept for :data:`HISTORY_S`; :meth:`sample` is
    called every :data:`SAMPLE_EVERY_S` (any thread)."""

    def __init__(self, keep: int = HISTORY_S // SAMPLE_EVERY_S) -> None:
        self._samples: deque[Sample] = deque(maxlen=keep)
        self._last: tuple[int, int, int, int, HistogramSnapshot] | None = None
        self._lock = threading.Lock()

    def sample(self, now_ms: int, acked: int, fired: int, resolved: int,
               ack_ms: HistogramSnapshot) -> None:
        """Counters as they stand at ``now_ms``: totals since the start."""
        with self._lock:
            last = self._last
            self._last = (now_ms, acked, fired, resolved, ack_ms)
            if last is None or now_ms <= last[0]:
                return
            seconds = (now_ms - last[0]) / 1000
            window = _between(ack_ms, last[4])
            answered = window.count > 0
            self._samples.append(Sample(
                now_ms, round((acked - last[1]) / seconds, 3),
                round((fired - last[2]) / seconds, 3),
                round((resolved - last[3]) / seconds, 3),
                window.quantile(0.5) if answered else None,
                window.quantile(0.99) if answered else None))

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)
