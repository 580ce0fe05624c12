"""HeapTimer: the baseline every JDK and asyncio timer is built on.

A binary heap of ``(expiration, seq, task)``: O(log n) to schedule and to expire.
Cancellation is lazy, as in asyncio and ``ScheduledThreadPoolExecutor`` without
``removeOnCancel``: the entry stays in the heap and is skipped when it surfaces. When
stale entries outnumber live ones the heap is compacted, so memory stays bounded.
"""

from __future__ import annotations

import heapq
import itertools
from concurrent.futures import Executor

from tickwheel._clock import Clock
from tickwheel.timers._base import DEFAULT_EXECUTOR, TimerBase, _DefaultExecutor
from tickwheel.timers._task import TimerEntry

__all__ = ["HeapTimer"]

# Compaction is O(n); waiting for this many stale entries keeps it amortised O(1).
_MIN_STALE_TO_COMPACT = 1024


class HeapTimer(TimerBase):
    """A heap timer with lazy cancellation and compaction."""

    kind = "heap"

    def __init__(
        self,
        clock: Clock | None = None,
        executor: Executor | _DefaultExecutor | None = DEFAULT_EXECUTOR,
        name: str | None = None,
    ) -> None:
        super().__init__(clock, executor, name)
        self._heap: list[tuple[int, int, TimerEntry]] = []
        self._seq = itertools.count()
        self.compactions = 0

    def _insert(self, task: TimerEntry, expiration: int, now_ms: int) -> None:
        task._expiration = expiration
        task._owner = self
        heapq.heappush(self._heap, (expiration, next(self._seq), task))

    def remove_task(self, task: TimerEntry, cancelling: bool) -> bool:
        with self._lock:
            if task._owner is not self:
                return False
            task._owner = None
            self._on_removed(task, cancelling)
            heap = self._heap
            stale = len(heap) - self._size
            if stale > _MIN_STALE_TO_COMPACT and stale > self._size:
                self._compact()
            return True

    def _compact(self) -> None:
        seen: set[int] = set()
        live: list[tuple[int, int, TimerEntry]] = []
        for entry in self._heap:
            task = entry[2]
            # An entry is live if the task is still ours and at this expiration; a task
            # removed and added again can have two live-looking entries: keep one.
            if task._owner is self and task._expiration == entry[0] and id(task) not in seen:
                seen.add(id(task))
                live.append(entry)
        heapq.heapify(live)
        self._heap = live
        self.compactions += 1

    def _collect(self, now_ms: int) -> tuple[list[TimerEntry], bool]:
        heap = self._heap
        due: list[TimerEntry] = []
        while heap and heap[0][0] <= now_ms:
            expiration, _, task = heapq.heappop(heap)
            if task._owner is self and task._expiration == expiration:
                task._owner = None
                due.append(task)
        if due:
            self._account_due(due, now_ms)
        return due, bool(due)

    def _clear(self) -> list[TimerEntry]:
        dropped: list[TimerEntry] = []
        for _, _, task in self._heap:
            if task._owner is self:  # once: a task added twice has one live owner
                task._owner = None
                dropped.append(task)
        self._heap.clear()
        return dropped

    def _next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None
