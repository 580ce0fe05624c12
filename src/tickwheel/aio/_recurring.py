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

__all__ = ["RecurringHandle", "call_recurring"]

_CATCHUP_BUDGET = 1_024


class RecurringHandle:
    """What :func:`call_recurring` returns: ``cancel()`` ends the series (a run in
    progress finishes; no other starts)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, schedule: Schedule, schedule_id: str,
                 callback: Callable[..., object], args: tuple[Any, ...],
                 wall_clock: Callable[[], float]) -> None:
        self._loop = loop
        self._schedule = schedule
        self._id = schedule_id
        self._callback = callback
        self._args = args
        self._wall_clock = wall_clock
        self._runs = 0
        self._skipped = 0
        self._cancelled = False
        self._finished = False
        self._timer: TimerHandle | None = None
        self._running: asyncio.Future[Any] | None = None
        self._queue: list[int] = []
        self._plan: Catchup | None = None
        self._after_ms = self._wall_ms() - 1
        self._next_ms = schedule.next_after(self._after_ms)

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
        """The pending occurrence (epoch ms, before jitter); None once the series ended."""
        return None if self._cancelled or self._finished else self._next_ms

    @property
    def finished(self) -> bool:
        return self._finished

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
        if self._cancelled:
            return
        if self._next_ms is None:
            self._finished = True
            return
        delay = 0.0 if due_now else max(
            0, self._schedule.fire_ms(self._id, self._next_ms) - self._wall_ms()) / 1000
        self._timer = scheduler_for(self._loop).call_later(delay, self._wake, (), None)

    def _wake(self) -> None:
        self._timer = None
        if self._cancelled or self._next_ms is None:
            return
        now = self._wall_ms()
        if now < self._schedule.fire_ms(self._id, self._next_ms):
            self._arm()  # the wall clock is behind the loop's: wait for the rest
            return
        plan = self._schedule.plan(self._after_ms, now, self._runs, _CATCHUP_BUDGET)
        self._skipped += plan.skipped
        self._plan = plan
        self._queue = list(plan.fire)
        self._fire_queued()

    def _fire_queued(self) -> None:
        while self._queue and not self._cancelled:
            self._after_ms = self._queue.pop(0)
            self._runs += 1
            try:
                result = self._callback(*self._args)
            except Exception as exc:
                self._report(exc)
                continue
            if inspect.isawaitable(result):
                self._running = asyncio.ensure_future(result, loop=self._loop)
                self._running.add_done_callback(self._awaited)
                return
        self._after_plan()

    def _awaited(self, future: asyncio.Future[Any]) -> None:
        self._running = None
        if not future.cancelled() and future.exception() is not None:
            self._report(future.exception())  # type: ignore[arg-type]
        self._fire_queued()

    def _after_plan(self) -> None:
        plan = self._plan
        assert plan is not None
        if not self._cancelled:
            self._after_ms = plan.after_ms
        if plan.finished:
            self._finished = True
            self._next_ms = None
            return
        self._next_ms = self._schedule.next_after(self._after_ms)
        self._arm(due_now=plan.more)

    def _report(self, exc: BaseException) -> None:
        self._loop.call_exception_handler({
            "message": f"recurring callback {self._callback!r} of "
                       f"{self._schedule.describe()} raised",
            "exception": exc,
        })

    def __repr__(self) -> str:
        state = ("cancelled" if self._cancelled else "finished" if self._finished
                 else f"next={self._next_ms}")
        return (f"<RecurringHandle {self._schedule.describe()} runs={self._runs} "
                f"skipped={self._skipped} {state}>")


def call_recurring(schedule: Schedule, callback: Callable[..., object], *args: Any,
                   schedule_id: str = "",
                   wall_clock: Callable[[], float] = time.time) -> RecurringHandle:
    """Call ``callback(*args)`` at each occurrence of ``schedule`` on the running loop
    (its wheel: the loop's own on :class:`EventLoop`, else one per loop). A callback
    that returns an awaitable runs as a task, and the next fire waits for it.
    ``wall_clock`` reads epoch seconds (``time.time``; a test passes its own)."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule, got {type(schedule).__name__}")
    if not isinstance(schedule_id, str):
        raise TypeError(f"schedule_id must be a str, got {type(schedule_id).__name__}")
    handle = RecurringHandle(asyncio.get_running_loop(), schedule, schedule_id, callback,
                             args, wall_clock)
    handle._arm()
    return handle
