"""Bucket: one slot of a wheel, an intrusive doubly linked list with an expiration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tickwheel.timers._task import TimerTask

if TYPE_CHECKING:
    from tickwheel.timers._base import TimerBase

__all__ = ["Bucket"]


class _Root(TimerTask):
    """The sentinel of a bucket's circular list; never runs."""

    __slots__ = ()

    def run(self) -> None:  # pragma: no cover - a sentinel is never scheduled
        raise AssertionError("a bucket sentinel never runs")


class Bucket:
    """Tasks sharing one slot; ``expiration`` is the tick at which the slot is due
    (-1 while the bucket is not in its timer's delay queue).

    Every mutation happens under the owning timer's lock; the bucket keeps a reference
    to its timer only to take that lock and keep the timer's counters exact on cancel.
    """

    __slots__ = ("_root", "_timer", "expiration")

    def __init__(self, timer: TimerBase) -> None:
        root = _Root(0)
        root._prev = root
        root._next = root
        self._root = root
        self._timer = timer
        self.expiration = -1

    def __len__(self) -> int:
        n = 0
        node = self._root._next
        while node is not self._root:
            n += 1
            node = node._next  # type: ignore[union-attr]
        return n

    @property
    def empty(self) -> bool:
        return self._root._next is self._root

    def append(self, task: TimerTask) -> None:
        """Link ``task`` at the tail. Caller holds the timer's lock."""
        root = self._root
        tail = root._prev
        assert tail is not None
        task._prev = tail
        task._next = root
        tail._next = task
        root._prev = task
        task._owner = self

    def unlink(self, task: TimerTask) -> None:
        """Unlink ``task`` (which must be in this bucket). Caller holds the lock."""
        prev = task._prev
        nxt = task._next
        assert prev is not None and nxt is not None
        prev._next = nxt
        nxt._prev = prev
        task._prev = None
        task._next = None
        task._owner = None

    def drain(self) -> list[TimerTask]:
        """Take every task out, in insertion order. Caller holds the lock."""
        root = self._root
        out: list[TimerTask] = []
        node = root._next
        while node is not root:
            assert node is not None
            nxt = node._next
            node._prev = None
            node._next = None
            node._owner = None
            out.append(node)
            node = nxt
        root._prev = root
        root._next = root
        self.expiration = -1
        return out

    def remove_task(self, task: TimerTask, cancelling: bool) -> bool:
        timer = self._timer
        with timer._lock:
            if task._owner is not self:
                return False
            self.unlink(task)
            timer._on_removed(cancelling)
            return True
