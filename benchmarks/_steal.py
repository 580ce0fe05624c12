"""How much CPU the hypervisor took from this machine while a benchmark ran ("steal",
the eighth field of ``/proc/stat``'s ``cpu`` line): a virtual machine whose host is busy
runs every process late, which a latency benchmark would otherwise charge to what it
measures. Linux only; elsewhere nothing is measured and every share is None.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["StealSample", "StealSampler", "read_steal"]

_PROC_STAT: Final = Path("/proc/stat")
_STEAL_FIELD: Final = 7  # user nice system idle iowait irq softirq steal guest guest_nice


@dataclass(frozen=True, slots=True)
class StealSample:
    at: float  # time.time()
    steal: int  # jiffies, all CPUs
    total: int  # jiffies, all CPUs (guest time is inside user time already)


def read_steal(path: Path = _PROC_STAT) -> tuple[int, int] | None:
    """The jiffies stolen and all jiffies, from a ``/proc/stat``; None where there is
    none, or it has no steal field (kernels before 2.6.11) or is not numbers."""
    try:
        with path.open() as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) <= _STEAL_FIELD + 1:
        return None
    try:
        counts = [int(value) for value in fields[1:_STEAL_FIELD + 2]]
    except ValueError:
        return None
    return counts[_STEAL_FIELD], sum(counts)


class StealSampler:
    """Samples the machine's stolen CPU every ``every_s`` in a thread, from
    :meth:`start` to :meth:`stop`."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.every_s = every_s
        self.samples: list[StealSample] = []
        self._times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steal-sampler", daemon=True)

    @property
    def available(self) -> bool:
        return len(self.samples) >= 2

    def start(self) -> StealSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            read = read_steal()
            if read is None:
                return
            self.samples.append(StealSample(time.time(), *read))
            if self._stop.wait(self.every_s):
                read = read_steal()
                if read is not None:
                    self.samples.append(StealSample(time.time(), *read))
                return

    def share(self, start: float | None = None, end: float | None = None) -> float | None:
        """The share of the CPU stolen from the last sample at or before ``start`` to
        the first at or after ``end`` (the whole run where not given); call after
        :meth:`stop`."""
        if not self.available:
            return None
        if len(self._times) != len(self.samples):
            self._times = [sample.at for sample in self.samples]
        times = self._times
        first = 0 if start is None else max(0, bisect.bisect_right(times, start) - 1)
        last = len(times) - 1 if end is None else min(len(times) - 1,
                                                      bisect.bisect_left(times, end))
        if last <= first:
            return None
        before, after = self.samples[first], self.samples[last]
        total = after.total - before.total
        return (after.steal - before.steal) / total if total > 0 else None
