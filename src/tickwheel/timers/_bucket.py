"""Bucket: one slot of a wheel, the tasks due in it and the tick it is due at.

Kafka's bucket is an intrusive doubly linked list. Here it is an array with
swap-remove: each task knows its index, so removal is still O(1) and real (the last
task takes the removed one's place, no tombstone stays behind). The difference shows
with the garbage collector on: every full collection follows each object's references,
and ``prev``/``next`` pointers send it to two random places in memory per pending
task, where an array sends it along one (docs/timers.md#memory).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Final

from tickwheel.timers._task import CANCELLED, TaskOwner, TimerEntry

if TYPE_CHECKING:
    from tickwheel.timers._base import TimerBase

__all__ = ["Bucket", "position"]

#: Positions up to this are shared int objects (see :func:`position`).
_SHARED_POSITIONS: Final = 1 << 16
_positions: list[int] = list(range(256))
_serials = itertools.count()


def position(n: int) -> int:
    """``n`` as an int object shared by every bucket. In pure Python an int past 256
    is an object of its own, 28 bytes per pending task for its index alone; shared,
    the index costs a reference. Grown on demand, up to a bound (2.4 MB)."""
    global _positions
    positions = _positions
    if n < len(positions):
        return positions[n]
    if n < _SHARED_POSITIONS:
        # A new list, bound in one step: timers on other threads may be reading the
        # old one (still right, only shorter), and two threads growing it at once
        # must not append the same range twice.
        positions = _positions = list(range(min(2 * n + 1, _SHARED_POSITIONS)))
        return positions[n]
    return n



class Bucket(TaskOwner):
    """Tasks sharing one slot; ``expiration`` is the tick at which the slot is due,
    meaningful only while ``queued`` (the bucket is in its timer's delay queue). A
    flag rather than a sentinel tick: ticks are any int, negative ones included. No
    order is kept within a bucket: its tasks fall due in the same tick.

    Every mutation happens under the owning timer's lock; the bucket keeps a reference
    to its timer only to take that lock and keep the timer's counters exact on cancel.
    """

    __slots__ = ("_tasks", "_timer", "earliest", "earliest_known", "expiration", "queued",
                 "serial")

    def __init__(self, timer: TimerBase) -> None:
        self._tasks: list[TimerEntry] = []
        self._timer = timer
        self.expiration = 0
        self.queued = False
        # Breaks ties in the delay queue, where an id() would make the order of two
        # buckets due at one tick differ from run to run: a wheel's buckets are made
        # with it, and a level is made after the levels below it, so at one tick the
        # finer bucket, whose tasks expire first, flushes first.
        self.serial = next(_serials)
        # The least expiration among the tasks, while ``earliest_known``: kept on
        # append, and forgotten only when a task that holds it leaves, so that
        # :meth:`earliest_expiration` scans a bucket once per such removal, not per call.
        self.earliest = 0
        self.earliest_known = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def empty(self) -> bool:
        return not self._tasks

    @property
    def tasks(self) -> list[TimerEntry]:
        """The tasks in the bucket (the list itself: callers hold the timer's lock)."""
        return self._tasks

    def append(self, task: TimerEntry) -> None:
        """Hold ``task``. Caller holds the timer's lock."""
        tasks = self._tasks
        n = len(tasks)
        positions = _positions
        task._index = positions[n] if n < len(positions) else position(n)
        tasks.append(task)
        task._owner = self
        expiration = task._expiration
        if n == 0:
            self.earliest, self.earliest_known = expiration, True
        elif expiration < self.earliest:
            self.earliest = expiration

    def earliest_expiration(self) -> int | None:
        """The least expiration (ms) of the tasks held, or None when there are none.
        Caller holds the lock."""
        tasks = self._tasks
        if not tasks:
            return None
        if not self.earliest_known:
            self.earliest = min(task._expiration for task in tasks)
            self.earliest_known = True
        return self.earliest

    def unlink(self, task: TimerEntry) -> None:
        """Remove ``task`` (which must be in this bucket) in O(1). Caller holds the lock."""
        tasks = self._tasks
        last = tasks.pop()
        if last is not task:
            index = task._index
            tasks[index] = last
            last._index = index
        task._owner = None
        if task._expiration == self.earliest:
            self.earliest_known = False

    def drain(self) -> list[TimerEntry]:
        """Take every task out. Caller holds the lock."""
        out = self._tasks
        self._tasks = []
        for task in out:
            task._owner = None
        self.queued = False
        self.earliest_known = False
        return out

    def due_at(self, expiration: int) -> bool:
        """Mark the bucket due at ``expiration``; True if it must enter the delay queue
        (it was not queued, or queued for another tick). Caller holds the lock."""
        if self.queued and self.expiration == expiration:
            return False
        self.expiration = expiration
        self.queued = True
        return True

    def remove_task(self, task: TimerEntry, cancelling: bool) -> bool:
        timer = self._timer
        with timer._lock:
            if task._owner is not self:
                return False
            # unlink() and the timer's _on_removed(), inline: this is every cancel.
            tasks = self._tasks
            last = tasks.pop()
            if last is not task:
                index = task._index
                tasks[index] = last
                last._index = index
            task._owner = None
            if task._expiration == self.earliest:
                self.earliest_known = False
            timer._size -= 1
            if cancelling:
                timer._cancelled += 1
                task._index = CANCELLED
            return True
