"""call_recurring: a :class:`~tickwheel.schedules.Schedule` on the running loop's wheel.

The asyncio form of ``timer.schedule_recurring``: only the next occurrence waits on
the wheel; when it falls due, the misfire policy decides what fires, and each fire runs
the callback. A callback that returns an awaitable (a coroutine function) runs as a
task, and the next fire waits for it to finish, so runs never overlap. Exceptions go to
the loop's exception handler and the series goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from tickwheel.aio._handle import TimerHandle
from tickwheel.aio._scheduler import scheduler_for
from tickwheel.schedules import Catchup, Schedule
from tickwheel.schedules._series import Series

__all__ = ["RecurringHandle", "call_recurring"]


class RecurringHandle:
    """What :func:`call_recurring` returns: ``cancel()`` ends the series (a run in
    progress finishes; no other starts)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, schedule: Schedule, schedule_id: str,
                 callback: Callable[..., object], args: tuple[Any, ...],
                 wall_clock: Callable[[], float]) -> None:
        self._loop = loop
        self._callback = callback
        self._args = args
        self._wall_clock = wall_clock
        self._series = Series(schedule, schedule_id, self._wall_ms())
        self._cancelled = False
        self._timer: TimerHandle | None = None
        self._queue: list[int] = []
        self._plan: Catchup | None = None

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
        """The pending occurrence (epoch ms, before jitter); None once the series ended."""
        return None if self._cancelled else self._series.next_ms

    @property
    def finished(self) -> bool:
        return self._series.finished

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        self._cancelled = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wall_ms(self) -> int:
        return int(self._wall_clock() * 1000)

    def _arm(self, due_now: bool = False) -> None:
        fire = self._series.fire_ms()
        if self._cancelled or fire is None:
            return
        delay = 0.0 if due_now else max(0, fire - self._wall_ms()) / 1000
        self._timer = scheduler_for(self._loop).call_later(delay, self._wake, (), None)

    def _wake(self) -> None:
        self._timer = None
        if self._cancelled:
            return
        plan = self._series.due(self._wall_ms())
        if plan is None:
            self._arm()  # the wall clock is behind the loop's: wait for the rest
            return
        self._plan = plan
        self._queue = list(plan.fire)
        self._fire_queued()

    def _fire_queued(self) -> None:
        while self._queue and not self._cancelled:
            self._series.fired(self._queue.pop(0))
            try:
                result = self._callback(*self._args)
            except Exception as exc:
                self._report(exc)
                continue
            if inspect.isawaitable(result):
                running = asyncio.ensure_future(result, loop=self._loop)
                running.add_done_callback(self._awaited)
                return
        plan = self._plan
        assert plan is not None
        self._series.settle(plan, self._cancelled)
        self._arm(due_now=plan.more)

    def _awaited(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._report(future.exception())  # type: ignore[arg-type]
        self._fire_queued()

    def _report(self, exc: BaseException) -> None:
        self._loop.call_exception_handler({
            "message": f"recurring callback {self._callback!r} of "
                       f"{self._series.schedule.describe()} raised",
            "exception": exc,
        })

    def __repr__(self) -> str:
        series = self._series
        state = ("cancelled" if self._cancelled else "finished" if series.finished
                 else f"next={series.next_ms}")
        return (f"<RecurringHandle {series.schedule.describe()} runs={series.runs} "
                f"skipped={series.skipped} {state}>")


def call_recurring(schedule: Schedule, callback: Callable[..., object], *args: Any,
                   schedule_id: str = "",
                   wall_clock: Callable[[], float] = time.time) -> RecurringHandle:
    """Call ``callback(*args)`` at each occurrence of ``schedule`` on the running loop
    (its wheel: the loop's own on :class:`EventLoop`, else one per loop). A callback
    that returns an awaitable runs as a task, and the next fire waits for it.
    ``wall_clock`` reads epoch seconds (``time.time``; a test passes its own)."""
    if not isinstance(schedule, Schedule):  # before the loop: the caller's mistake first
        raise TypeError(f"schedule must be a Schedule, got {type(schedule).__name__}")
    handle = RecurringHandle(asyncio.get_running_loop(), schedule, schedule_id, callback,
                             args, wall_clock)
    handle._arm()
    return handle
