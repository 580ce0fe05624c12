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
from tickwheel.schedules._series import Series
from tickwheel.timers._task import TimerTask

if TYPE_CHECKING:
    from tickwheel.timers._base import TimerBase

__all__ = ["RecurringTask"]


class RecurringTask(TimerTask):
    """What ``schedule_recurring()`` returns: cancel it to end the series."""

    __slots__ = ("_args", "_cancelled_series", "_fn", "_series", "_stopped", "_timer",
                 "_wall")

    def __init__(self, timer: TimerBase, schedule: Schedule, schedule_id: str,
                 fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        super().__init__(0)
        clock = timer.clock
        self._wall: Callable[[], int] = _wall_now if clock.realtime else clock.now_ms
        self._series = Series(schedule, schedule_id, self._wall())
        self._timer = timer
        self._fn = fn
        self._args = args
        self._stopped = self._series.finished
        self._cancelled_series = False

    # -- what callers see -------------------------------------------------------------

    @property
    def schedule(self) -> Schedule:
        return self._series.schedule

    @property
    def runs(self) -> int:
        """Occurrences fired so far."""
        return self._series.runs

    @property
    def skipped(self) -> int:
        """Occurrences the misfire policy passed over."""
        return self._series.skipped

    @property
    def last_occurrence_ms(self) -> int | None:
        """The occurrence that ran last: inside a run, the one running (before its
        jitter); None before the first."""
        return self._series.last_ms

    @property
    def next_occurrence_ms(self) -> int | None:
        """The pending occurrence (wall time, before jitter); None once the series ended."""
        return None if self._stopped else self._series.next_ms

    @property
    def finished(self) -> bool:
        """True once the series ran out (its end, or ``max_runs``)."""
        return self._series.finished

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
        return None if self._stopped else self._deadline()

    def run(self) -> None:
        if self._stopped:
            return
        series = self._series
        plan = series.due(self._wall())
        if plan is None:
            self._arm()  # woke early by the wall clock: sleep for the rest
            return
        for occurrence in plan.fire:
            if self._stopped:
                break
            series.fired(occurrence)
            try:
                self._fn(*self._args)
            except Exception:
                self._timer._task_failed(self)
        series.settle(plan, self._stopped)
        if series.finished:
            self._stopped = True
            return
        self._arm(due_now=plan.more)

    def _arm(self, due_now: bool = False) -> None:
        if self._stopped:
            return
        deadline = self._timer.clock.now_ms() if due_now else self._deadline()
        if not self._timer.reschedule(self, deadline):
            self._stopped = True
            return
        # A cancel() that raced with the reschedule saw no pending task; undo it here.
        if self._stopped:
            TimerTask.cancel(self)

    def _deadline(self) -> int:
        fire = self._series.fire_ms()
        assert fire is not None, "a finished series has no deadline"
        return self._timer.clock.now_ms() + max(0, fire - self._wall())

    def __repr__(self) -> str:
        series = self._series
        state = ("cancelled" if self._cancelled_series else
                 "finished" if series.finished else f"next={series.next_ms}")
        return (f"<RecurringTask {series.schedule.describe()} runs={series.runs} "
                f"skipped={series.skipped} {state}>")


def _wall_now() -> int:
    return time.time_ns() // 1_000_000
