"""RecurringTask: a :class:`~tickwheel.schedules.Schedule` run on a timer.

Only the next occurrence is pending. When it falls due the task asks the schedule's
misfire policy which occurrences to fire (one, normally; a catch-up after a stall),
runs ``fn`` once for each, one after the other, and only then adds the next: runs of
one series never overlap, and an exception in one run is logged and counted without
ending the series.

Schedules speak wall time (epoch ms); a timer's clock may be monotonic. On a real-time
clock the task reads the wall clock (``time.time_ns``) and maps the gap to the timer's
clock at every step, so a wall clock that steps moves the next fire with it; on any
other clock (a :class:`~tickwheel.ManualClock`) the clock's reading is the wall time.
Never early: a task that wakes before its occurrence (the wall clock stepped back) goes
back to sleep for the rest, and an occurrence already fired is never fired again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tickwheel.schedules import Schedule
from tickwheel.timers._task import TimerTask

if TYPE_CHECKING:
    from tickwheel.timers._base import TimerBase

__all__ = ["RecurringTask"]

#: Occurrences decided per wake-up in a catch-up; the rest follow at the next advance.
_CATCHUP_BUDGET = 1_024


class RecurringTask(TimerTask):
    """What ``schedule_recurring()`` returns: cancel it to end the series."""

    __slots__ = ("_after_ms", "_args", "_cancelled_series", "_finished", "_fn", "_id",
                 "_next_ms", "_runs", "_schedule", "_skipped", "_stopped", "_timer",
                 "_wall")

    def __init__(self, timer: TimerBase, schedule: Schedule, schedule_id: str,
                 fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        super().__init__(0)
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be a Schedule, got {type(schedule).__name__}")
        if not isinstance(schedule_id, str):
            raise TypeError(f"schedule_id must be a str, got {type(schedule_id).__name__}")
        self._timer = timer
        self._schedule = schedule
        self._id = schedule_id
        self._fn = fn
        self._args = args
        clock = timer.clock
        self._wall: Callable[[], int] = (
            _wall_now if clock.realtime else clock.now_ms)
        self._runs = 0
        self._skipped = 0
        self._stopped = False
        self._cancelled_series = False
        self._finished = False
        # Occurrences at or after the moment of scheduling belong to the series.
        self._after_ms = self._wall() - 1
        self._next_ms: int | None = schedule.next_after(self._after_ms)

    # -- what callers see -------------------------------------------------------------

    @property
    def schedule(self) -> Schedule:
        return self._schedule

    @property
    def runs(self) -> int:
        """Occurrences fired so far."""
        return self._runs

    @property
    def skipped(self) -> int:
        """Occurrences the misfire policy passed over."""
        return self._skipped

    @property
    def next_occurrence_ms(self) -> int | None:
        """The pending occurrence (wall time, before jitter); None once the series ended."""
        return None if self._stopped else self._next_ms

    @property
    def finished(self) -> bool:
        """True once the series ran out (its end, or ``max_runs``)."""
        return self._finished

    @property
    def cancelled(self) -> bool:
        return self._cancelled_series

    def cancel(self) -> bool:
        running = not self._stopped
        self._stopped = True
        removed = super().cancel()
        self._cancelled_series = running or removed
        return self._cancelled_series

    def _dropped_by_close(self) -> None:
        self._stopped = True
        self._cancelled_series = True

    # -- the series -------------------------------------------------------------------

    def first_deadline(self) -> int | None:
        """The timer-clock time of the first fire, None if the series has none left."""
        if self._next_ms is None:
            self._finished = self._stopped = True
            return None
        return self._deadline()

    def run(self) -> None:
        if self._stopped or self._next_ms is None:
            return
        now = self._wall()
        if now < self._schedule.fire_ms(self._id, self._next_ms):
            self._arm()  # woke early by the wall clock: sleep for the rest
            return
        plan = self._schedule.plan(self._after_ms, now, self._runs, _CATCHUP_BUDGET)
        self._skipped += plan.skipped
        for occurrence in plan.fire:
            if self._stopped:
                break
            self._after_ms = occurrence
            self._runs += 1
            try:
                self._fn(*self._args)
            except Exception:
                self._timer._task_failed(self)
        if not self._stopped:
            self._after_ms = plan.after_ms
        if plan.finished:
            self._finished = True
            self._stopped = True
            self._next_ms = None
            return
        self._next_ms = self._schedule.next_after(self._after_ms)
        if plan.more:
            self._arm(due_now=True)
        else:
            self._arm()

    def _arm(self, due_now: bool = False) -> None:
        if self._stopped:
            return
        if self._next_ms is None:
            self._finished = True
            self._stopped = True
            return
        deadline = self._timer.clock.now_ms() if due_now else self._deadline()
        if not self._timer.reschedule(self, deadline):
            self._stopped = True
            return
        # A cancel() that raced with the reschedule saw no pending task; undo it here.
        if self._stopped:
            TimerTask.cancel(self)

    def _deadline(self) -> int:
        assert self._next_ms is not None
        wait = self._schedule.fire_ms(self._id, self._next_ms) - self._wall()
        return self._timer.clock.now_ms() + max(0, wait)

    def __repr__(self) -> str:
        state = ("cancelled" if self._cancelled_series else
                 "finished" if self._finished else f"next={self._next_ms}")
        return (f"<RecurringTask {self._schedule.describe()} runs={self._runs} "
                f"skipped={self._skipped} {state}>")


def _wall_now() -> int:
    return time.time_ns() // 1_000_000
