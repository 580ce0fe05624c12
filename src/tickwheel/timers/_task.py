"""TimerTask: the unit of work a timer holds, and its own handle.

A task knows its owner (a bucket, a timer's queue) and its index there, so scheduling
allocates nothing besides the task and cancelling removes it in O(1): no tombstone
stays behind. ``_owner`` is ``None`` while the task is not pending.

A task is as small as it can be, since a timer holds millions and the garbage collector
walks every one of them on each full collection: the index doubles as the cancelled mark
(it means nothing once the task left its bucket), and a callback without arguments has
no slot for them, which keeps a no-argument task in a smaller allocation size class
(docs/timers.md#memory).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from tickwheel._compat import provide_mypyc_attr
from tickwheel._validate import Millis, check_delay_ms

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr

    from tickwheel.timers._base import TimerBase

provide_mypyc_attr(globals())

__all__ = ["CANCELLED", "ArgsCallbackTask", "CallbackTask", "PeriodicTask", "TaskOwner",
           "TimerEntry", "TimerTask", "callback_task"]

log = logging.getLogger(__name__)

#: ``TimerTask._index`` of a task whose last stay in a timer ended in a cancel.
CANCELLED: Final = -1


class TaskOwner:
    """Something that holds pending tasks (a bucket, a timer's queue) and can give one
    up. A concrete base rather than a Protocol so that the compiled core calls it
    directly."""

    __slots__ = ()

    def remove_task(self, task: TimerEntry, cancelling: bool) -> bool:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class TimerEntry:
    """What a timer links into its buckets: the expiration, the owner and the index
    there, and :meth:`run`. :class:`TimerTask` adds the public task API on top; other
    handle types (asyncio's timer handles in :mod:`tickwheel.aio`) add their own, with
    no slot they do not need."""

    __slots__ = ("_expiration", "_index", "_owner")

    def __init__(self) -> None:
        self._expiration: int = 0
        self._owner: TaskOwner | None = None
        # The position in the owning bucket while pending; CANCELLED once a cancel took
        # the entry out (set under the timer's lock, reset when it is added again).
        self._index: int = 0

    def run(self) -> None:
        """The work itself; subclasses override this."""
        raise NotImplementedError("TimerEntry subclasses must override run()")

    def _dropped_by_close(self) -> None:
        """Called once the entry's timer closed while it was pending (it is already
        marked cancelled): a hook for tasks that others wait on."""


@mypyc_attr(allow_interpreted_subclasses=True)
class TimerTask(TimerEntry):
    """A unit of delayed work. Subclass it and override :meth:`run`, or get one from
    ``timer.schedule()``.

    ``delay_ms`` is counted from the moment the task is added to a timer. Adding a task
    that is already pending in a timer moves it: it is removed first.
    """

    __slots__ = ("_delay_ms",)

    def __init__(self, delay_ms: Millis) -> None:
        super().__init__()
        self._delay_ms: int = check_delay_ms("delay_ms", delay_ms)

    @property
    def delay_ms(self) -> int:
        return self._delay_ms

    @property
    def expiration_ms(self) -> int:
        """The clock time at which the task is due, once added to a timer."""
        return self._expiration

    def cancelled(self) -> bool:
        """True once ``cancel()`` removed the task (a method, as asyncio's handles and
        futures have it)."""
        return self._index == CANCELLED

    @property
    def pending(self) -> bool:
        """True while the task waits in a timer."""
        return self._owner is not None

    def cancel(self) -> bool:
        """Remove the task from its timer; True if it was pending.

        Once a task is due it has been handed over for running and can no longer be
        cancelled (False is returned).
        """
        owner = self._owner
        # The owner can change under us (the timer moves the task between buckets while
        # demoting it); each owner re-checks under its timer's lock, so retry until we
        # win or the task is no longer pending.
        while owner is not None:
            if owner.remove_task(self, True):
                return True
            owner = self._owner
        return False

    def run(self) -> None:
        """The work itself; subclasses override this."""
        raise NotImplementedError("TimerTask subclasses must override run()")

    def __repr__(self) -> str:
        state = "pending" if self._owner is not None else (
            "cancelled" if self.cancelled() else "idle"
        )
        return f"<{type(self).__name__} delay_ms={self._delay_ms} {state}>"


@mypyc_attr(allow_interpreted_subclasses=True)
class CallbackTask(TimerTask):
    """What ``schedule()`` and ``schedule_at()`` return for ``fn`` without arguments:
    calls ``fn()``."""

    __slots__ = ("_fn",)

    def __init__(self, delay_ms: Millis, fn: Callable[[], object]) -> None:
        # Every slot set here rather than through the base classes' __init__: on the
        # path of every schedule, and each call is a frame in pure Python.
        self._expiration = 0
        self._owner = None
        self._index = 0
        self._delay_ms = delay_ms if type(delay_ms) is int else check_delay_ms(
            "delay_ms", delay_ms)
        self._fn = fn

    def run(self) -> None:
        self._fn()


@mypyc_attr(allow_interpreted_subclasses=True)
class ArgsCallbackTask(CallbackTask):
    """What ``schedule()`` and ``schedule_at()`` return for ``fn`` with arguments:
    calls ``fn(*args)``."""

    __slots__ = ("_args",)

    def __init__(self, delay_ms: Millis, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        super().__init__(delay_ms, fn)
        self._args = args

    def run(self) -> None:
        self._fn(*self._args)


def callback_task(delay_ms: Millis, fn: Callable[..., object], args: tuple[Any, ...]
                  ) -> CallbackTask:
    """The task that calls ``fn(*args)``: without an args slot when there are none."""
    return ArgsCallbackTask(delay_ms, fn, args) if args else CallbackTask(delay_ms, fn)


@mypyc_attr(allow_interpreted_subclasses=True)
class PeriodicTask(TimerTask):
    """What ``schedule_periodic()`` returns. Each run is scheduled only after the
    previous one has returned, so runs of one series never overlap; cancelling stops
    the series, even from inside a run."""

    __slots__ = ("_args", "_cancelled_series", "_fixed_rate", "_fn", "_period_ms", "_stopped",
                 "_timer")

    def __init__(
        self,
        timer: TimerBase,
        initial_delay_ms: int,
        period_ms: int,
        fixed_rate: bool,
        fn: Callable[..., object],
        args: tuple[Any, ...],
    ) -> None:
        super().__init__(initial_delay_ms)
        self._timer = timer
        self._period_ms = period_ms
        self._fixed_rate = fixed_rate
        self._fn = fn
        self._args = args
        self._stopped = False
        self._cancelled_series = False

    @property
    def period_ms(self) -> int:
        return self._period_ms

    def cancelled(self) -> bool:
        """True once ``cancel()`` stopped the series (even between two runs, when no
        run was pending)."""
        return self._cancelled_series

    def cancel(self) -> bool:
        was_running_series = not self._stopped
        self._stopped = True
        removed = super().cancel()
        self._cancelled_series = was_running_series or removed
        return self._cancelled_series

    def _dropped_by_close(self) -> None:
        self._stopped = True
        self._cancelled_series = True

    def run(self) -> None:
        if self._stopped:
            return
        try:
            self._fn(*self._args)
        finally:
            self._schedule_next()

    def _schedule_next(self) -> None:
        if self._stopped:
            return
        if self._fixed_rate:
            # Fixed rate keeps the original cadence; a run that falls behind is due at
            # once and catches up one run per advance_clock, never in an unbounded burst.
            next_expiration = self._expiration + self._period_ms
        else:
            next_expiration = self._timer.clock.now_ms() + self._period_ms
        if not self._timer.reschedule(self, next_expiration):
            self._stopped = True
            return
        # A cancel() that raced with the reschedule saw no pending task; undo it here.
        if self._stopped:
            TimerTask.cancel(self)
