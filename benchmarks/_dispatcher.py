"""Dispatcher throughput: 1M tasks end to end, 20% duplicate ids, batches of 250.

A producer thread submits tasks as fast as the dispatcher takes them (backing off
briefly on ``DispatcherOverloaded``); a processor counts what it receives. Reported:
tasks/s from the first submit until every task is accounted for (delivered,
overridden by a duplicate id, dropped on overflow or expired), and each count.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tickwheel import (
    DispatcherOverloaded,
    ProcessingResult,
    create_batching_dispatcher,
)

__all__ = ["DispatcherResult", "run_dispatcher"]


class _Counting:
    def __init__(self) -> None:
        self.delivered = 0
        self.lock = threading.Lock()

    def process(self, task: int) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[int]) -> ProcessingResult:
        with self.lock:
            self.delivered += len(tasks)
        return ProcessingResult.SUCCESS


@dataclass(frozen=True)
class DispatcherResult:
    tasks_per_s: float
    delivered: int
    overridden: int
    overflows: int
    expired: int
    batches: int
    mean_batch: float


def _once(n: int, seed: int, workers: int, batch: int, buffer: int) -> DispatcherResult:
    rng = random.Random(seed)
    # 20% of submissions reuse the id of a recent task (Eureka's replication of the
    # same instance's status): they override it while it waits.
    ids = list(range(n))
    for i in range(n):
        if i > 100 and rng.random() < 0.2:
            ids[i] = ids[i - rng.randint(1, 100)]
    processor = _Counting()
    far = 10**15
    d = create_batching_dispatcher("bench", processor, max_buffer_size=buffer,
                                   max_batch_size=batch, worker_count=workers,
                                   max_batching_delay_ms=5)
    start = time.perf_counter()
    process = d.process
    for i, task_id in enumerate(ids):
        while True:
            try:
                process(task_id, i, far)
                break
            except DispatcherOverloaded:
                time.sleep(0.0005)

    def accounted() -> int:
        s = d.stats()
        return processor.delivered + s.overridden + s.queue_overflows + s.expired

    while accounted() < n:
        time.sleep(0.001)
    elapsed = time.perf_counter() - start
    s = d.stats()
    d.close()
    batches = s.batch_size.count
    return DispatcherResult(n / elapsed, processor.delivered, s.overridden,
                            s.queue_overflows, s.expired, batches,
                            s.batch_size.total / batches if batches else 0.0)


def run_dispatcher(n: int, repeat: int, workers: int, batch: int, buffer: int,
                   progress: Callable[[str], None]) -> list[DispatcherResult]:
    out = []
    for rep in range(repeat):
        out.append(_once(n, rep, workers, batch, buffer))
        progress(f"dispatcher rep {rep + 1}/{repeat}: {out[-1].tasks_per_s / 1e3:,.0f}k tasks/s")
    return sorted(out, key=lambda r: r.tasks_per_s)


def median(results: list[DispatcherResult]) -> DispatcherResult:
    return results[len(results) // 2] if results else DispatcherResult(0, 0, 0, 0, 0, 0, 0)


