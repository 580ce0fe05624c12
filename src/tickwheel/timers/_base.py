"""What the three timers share: the public API, counters, the executor and the driver.

Locking (CPython). Each timer has one lock (a :class:`~tickwheel._mutex.Mutex`, cheaper
to take than ``threading.Lock``); ``add``, ``cancel`` and the
collecting half of ``advance_clock`` take it, and nothing else runs under it: due tasks
are collected under the lock and run after it is released, so a task may schedule,
cancel or complete other work (the purgatory does) without deadlocking. Kafka uses a
read/write lock around the wheel plus a lock per bucket so that many producers add in
parallel; under the GIL adds never run in parallel anyway, so one lock buys the same
safety with one acquisition per operation instead of two (not measured against a
read/write lock: the standard library has none).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from tickwheel._clock import Clock, ManualClock, SystemClock
from tickwheel._histogram import Histogram, HistogramSnapshot
from tickwheel._mutex import new_lock
from tickwheel._validate import Millis, check_delay_ms
from tickwheel.schedules import Schedule
from tickwheel.timers._driver import Driver
from tickwheel.timers._errors import TimerClosed
from tickwheel.timers._recurring import RecurringTask
from tickwheel.timers._task import (
    CANCELLED,
    ArgsCallbackTask,
    CallbackTask,
    PeriodicTask,
    TaskOwner,
    TimerEntry,
    TimerTask,
    callback_task,
)

__all__ = ["DEFAULT_EXECUTOR", "TimerBase", "TimerStats"]

log = logging.getLogger(__name__)


class _DefaultExecutor:
    def __repr__(self) -> str:
        return "DEFAULT_EXECUTOR"


#: The default for ``executor=``: one worker thread owned (and shut down) by the timer.
DEFAULT_EXECUTOR: Final = _DefaultExecutor()

_running_tasks = threading.local()


@dataclass(frozen=True, slots=True)
class TimerStats:
    """A snapshot of a timer's counters. ``name`` is the timer's own, as every
    component's stats carry it; ``kind`` is which timer it is."""

    name: str
    kind: str
    pending: int
    scheduled: int
    expired: int
    cancelled: int
    errors: int
    lateness_ms: HistogramSnapshot


class TimerBase(TaskOwner):
    """The common API of :class:`TimingWheelTimer`, :class:`HashedWheelTimer` and
    :class:`HeapTimer`."""

    kind: str = "timer"

    def __init__(
        self,
        clock: Clock | None,
        executor: Executor | _DefaultExecutor | None,
        name: str | None = None,
    ) -> None:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a non-empty string, got {type(name).__name__}")
        if name == "":
            raise ValueError("name must be a non-empty string, got ''")
        self._name: str = self.kind if name is None else name
        self._clock: Clock = SystemClock() if clock is None else clock
        # The two clocks tickwheel ships are compiled classes: reading them directly
        # spares every schedule a generic method call through the Clock protocol.
        # Exact types only: a subclass may read time its own way.
        clock_type = type(self._clock)
        self._manual: ManualClock | None = (
            self._clock if clock_type is ManualClock else None)  # type: ignore[assignment]
        self._system = clock_type is SystemClock
        self._lock = new_lock()
        # Condition needs only acquire() and release(), which Mutex has with Lock's
        # signature; typeshed names the lock types it expects.
        self._cond = threading.Condition(self._lock)  # type: ignore[arg-type]
        self._waiting_until: int | None = None
        self._closed = False
        self._size = 0
        self._scheduled = 0
        self._expired = 0
        self._cancelled = 0
        self._errors = 0
        self._errors_lock = threading.Lock()
        self._lateness = Histogram()
        self._driver: Driver | None = None
        self._owns_executor = isinstance(executor, _DefaultExecutor)
        # Netty's lazy start: a timer that runs its tasks itself (its own executor, a
        # real clock) starts its driver at the first add, unless someone drives it.
        self._autostart = self._owns_executor and self._clock.realtime
        self._executor: Executor | None
        if isinstance(executor, _DefaultExecutor):
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"tickwheel-{self._name}"
            )
        else:
            self._executor = executor

    # -- what each timer implements (called with self._lock held) --------------------

    def _insert(self, task: TimerEntry, expiration: int, now_ms: int) -> None:
        """Hold ``task`` (not pending anywhere) until ``expiration``; a task already
        due at ``now_ms`` must run at the next ``advance_clock``."""
        raise NotImplementedError

    def _collect(self, now_ms: int) -> tuple[list[TimerEntry], bool]:
        """Take out every task due at ``now_ms``; the flag says whether anything was
        processed at all (a bucket flushed counts, even if it only demoted tasks)."""
        raise NotImplementedError

    def _clear(self) -> list[TimerEntry]:
        """Take out everything pending (each task once, its owner unset)."""
        raise NotImplementedError

    def _next_due_ms(self) -> int | None:
        """The clock time at which something may next be due, None if nothing pends."""
        raise NotImplementedError

    # -- the public API ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """The timer's name: its stats, logs and threads carry it (default: its kind)."""
        return self._name

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def size(self) -> int:
        """Tasks pending, exact at every moment."""
        return self._size

    def __len__(self) -> int:
        return self._size

    @property
    def errors(self) -> int:
        """Tasks whose ``run()`` raised."""
        return self._errors

    @property
    def closed(self) -> bool:
        return self._closed

    def _now(self) -> int:
        manual = self._manual
        if manual is not None:
            return manual._now_ms
        if self._system:
            return time.monotonic_ns() // 1_000_000
        return self._clock.now_ms()

    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` to run ``task.delay_ms`` from now (moving it if pending)."""
        now = self._now()
        self._add(task, now + task._delay_ms, now)

    def schedule(self, delay_ms: Millis, fn: Callable[..., object], *args: Any) -> TimerTask:
        """Run ``fn(*args)`` after ``delay_ms``; a delay <= 0 is due at once."""
        task = ArgsCallbackTask(delay_ms, fn, args) if args else CallbackTask(delay_ms, fn)
        manual = self._manual
        now = manual._now_ms if manual is not None else self._now()
        # A new task is pending nowhere: no move to retry, unlike add().
        self._add_if_free(task, now + task._delay_ms, now)
        return task

    def schedule_at(self, deadline_ms: Millis, fn: Callable[..., object], *args: Any) -> TimerTask:
        """Run ``fn(*args)`` once the clock reads ``deadline_ms``."""
        deadline = check_delay_ms("deadline_ms", deadline_ms)
        now = self._now()
        task = callback_task(deadline - now, fn, args)
        self._add(task, deadline, now)
        return task

    def schedule_periodic(
        self,
        period_ms: Millis,
        fn: Callable[..., object],
        *args: Any,
        initial_delay_ms: Millis | None = None,
        fixed_rate: bool = True,
    ) -> TimerTask:
        """Run ``fn(*args)`` every ``period_ms``, first after ``initial_delay_ms``
        (default: one period). Fixed rate keeps the cadence of the first expiration;
        otherwise each run is scheduled ``period_ms`` after the previous one ended.
        Cancel the returned task to stop the series."""
        period = check_delay_ms("period_ms", period_ms)
        if period <= 0:
            raise ValueError(f"period_ms must be > 0, got {period_ms!r}")
        initial = period if initial_delay_ms is None else check_delay_ms(
            "initial_delay_ms", initial_delay_ms
        )
        task = PeriodicTask(self, initial, period, bool(fixed_rate), fn, args)
        now = self._clock.now_ms()
        self._add(task, now + initial, now)
        return task

    def schedule_recurring(self, schedule: Schedule, fn: Callable[..., object], *args: Any,
                           schedule_id: str = "") -> RecurringTask:
        """Run ``fn(*args)`` at each occurrence of ``schedule`` from now on; runs never
        overlap, and none is early. ``schedule_id`` seeds the jitter. Cancel the
        returned task to end the series (docs/schedules.md)."""
        task = RecurringTask(self, schedule, schedule_id, fn, args)
        deadline = task.first_deadline()
        if deadline is not None:
            self._add(task, deadline, self._clock.now_ms())
        return task

    def reschedule(self, task: TimerEntry, expiration_ms: int) -> bool:
        """Add ``task`` due at the absolute ``expiration_ms``; False if the timer is
        closed (used by periodic tasks, which then end their series quietly)."""
        try:
            self._add(task, expiration_ms, self._clock.now_ms())
        except TimerClosed:
            return False
        return True

    def add_at(self, entry: TimerEntry, expiration_ms: int, now_ms: int | None = None) -> None:
        """Hold ``entry`` until the clock reads ``expiration_ms`` (moving it if pending).

        The primitive under ``schedule_at``, for handle types that carry their own
        callback (``tickwheel.aio``'s timer handles); ``take_due`` hands them back. A
        caller that has just read the clock passes the reading as ``now_ms``."""
        self._add(entry, expiration_ms, self._now() if now_ms is None else now_ms)

    def take_due(self, now_ms: int | None = None) -> list[TimerEntry]:
        """Take out what is due at ``now_ms`` (default: the clock's reading) without
        running it: the caller runs it, in its own order and with its own error
        handling. Never waits."""
        with self._lock:
            due, _ = self._collect(self._now() if now_ms is None else now_ms)
        return due

    def next_due_ms(self) -> int | None:
        """The clock time at which something may next be due (a wheel's next bucket,
        which may only demote its tasks), or None when nothing is pending."""
        with self._lock:
            return self._next_due_ms()

    def advance_clock(self, timeout_ms: Millis = 0) -> bool:
        """Run what is due at the clock's current time; True if anything was due.

        On a real-time clock with nothing due, wait up to ``timeout_ms`` for the next
        task to fall due (Kafka's ``advanceClock(timeoutMs)``). On a manual clock it
        never waits: time moves only when the caller moves the clock.
        """
        timeout = check_delay_ms("timeout_ms", timeout_ms)
        clock = self._clock
        with self._lock:
            self._autostart = False  # driven by this caller: no driver of its own
            due, progressed = self._collect(clock.now_ms())
            if not progressed and timeout > 0 and clock.realtime and not self._closed:
                now = clock.now_ms()
                until = now + timeout
                nxt = self._next_due_ms()
                if nxt is not None and nxt < until:
                    until = nxt
                if until > now:
                    self._waiting_until = until
                    self._cond.wait((until - now) / 1000.0)
                    self._waiting_until = None
                due, progressed = self._collect(clock.now_ms())
        if due:
            self._dispatch(due)
        return progressed

    def wake(self) -> None:
        """Wake a thread waiting in ``advance_clock`` (it returns after one more pass)."""
        with self._lock:
            self._cond.notify_all()

    def start(self) -> None:
        """Start a daemon thread that advances the clock in real time. A timer with its
        own executor on a real clock starts it at its first add unless something
        drives it (``advance_clock`` called before, or a purgatory's reaper)."""
        if not self._start_driver():
            raise TimerClosed(f"timer {self._name!r} is closed")

    def _start_driver(self) -> bool:
        """Start the driver unless it runs already; False if the timer is closed."""
        with self._lock:
            self._autostart = False
            if self._closed:
                return False
            if self._driver is not None:
                return True
            self._driver = Driver(f"tickwheel-{self._name}-driver", self, self._clock.realtime)
            # Started under the lock: a close() in between would join an unstarted thread.
            self._driver.start()
        return True

    def driven_by_caller(self) -> None:
        """Say that the caller advances this timer (as a purgatory's reaper does): it
        starts no driver of its own at its first add."""
        with self._lock:
            self._autostart = False

    def close(self) -> int:
        """Stop the timer; cancel what is pending and return how many (Netty's
        ``stop()``): each of those tasks reports ``cancelled()`` and never runs, and a
        delayed operation among them is resolved as cancelled, so nothing waits on it.

        Tasks already due and handed to the executor still run; the timer's own
        executor is shut down after them.
        """
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
            tasks = self._clear()
            for task in tasks:
                task._index = CANCELLED
            dropped = len(tasks)
            self._cancelled += dropped
            self._size = 0
            self._cond.notify_all()
        for task in tasks:
            try:
                task._dropped_by_close()
            except Exception:
                self._task_failed(task)
        if dropped:
            log.info("timer %r closed, cancelled %d pending tasks", self._name, dropped)
        if self._driver is not None:
            self._driver.stop()
        if self._owns_executor and self._executor is not None:
            # From inside a task the executor cannot wait for itself.
            inside = getattr(_running_tasks, "timer", None) is self
            self._executor.shutdown(wait=not inside)
        return dropped

    def __enter__(self) -> TimerBase:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> TimerStats:
        return TimerStats(
            name=self._name,
            kind=self.kind,
            pending=self._size,
            scheduled=self._scheduled,
            expired=self._expired,
            cancelled=self._cancelled,
            errors=self._errors,
            lateness_ms=self._lateness.snapshot(),
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {state} pending={self._size}>"

    # -- shared machinery -------------------------------------------------------------

    def _add(self, task: TimerEntry, expiration: int, now_ms: int) -> None:
        # Adding a pending task moves it: take it out of wherever it is, then retry.
        while not self._add_if_free(task, expiration, now_ms):
            owner = task._owner
            if owner is not None:
                owner.remove_task(task, False)

    def _add_if_free(self, task: TimerEntry, expiration: int, now_ms: int) -> bool:
        with self._lock:
            if self._closed:
                raise TimerClosed(f"cannot add {task!r}: timer {self._name!r} is closed")
            if task._owner is not None:
                return False  # another thread added it meanwhile; move it again
            task._index = 0  # no longer marked cancelled; a bucket sets its own index
            self._insert(task, expiration, now_ms)
            self._size += 1
            self._scheduled += 1
            waiting = self._waiting_until
            if waiting is not None and expiration < waiting:
                self._cond.notify()
            if not self._autostart:
                return True
            self._autostart = False
        self._start_driver()
        return True

    def _on_removed(self, task: TimerEntry, cancelling: bool) -> None:
        """A pending task left the timer without running (lock held)."""
        self._size -= 1
        if cancelling:
            self._cancelled += 1
            task._index = CANCELLED

    def _account_due(self, due: list[TimerEntry], now_ms: int) -> None:
        """Counters for tasks just taken out to run (lock held)."""
        n = len(due)
        self._size -= n
        self._expired += n
        self._lateness.record_many([now_ms - t._expiration for t in due])

    def _dispatch(self, due: list[TimerEntry]) -> None:
        executor = self._executor
        if executor is None:
            self._run_all(due)
            return
        try:
            if self._owns_executor:
                # One hand-over per advance, not per task: a Future per task would cost
                # more than most tasks do.
                executor.submit(self._run_all, due)
            else:
                for task in due:
                    executor.submit(self._run_one, task)
        except RuntimeError:
            # The executor was shut down while these were being handed over.
            log.warning("timer %r: executor refused %d due tasks; running them inline",
                        self._name, len(due))
            self._run_all(due)

    def _run_all(self, due: list[TimerEntry]) -> None:
        _running_tasks.timer = self
        try:
            for task in due:
                try:
                    task.run()
                except Exception:
                    self._task_failed(task)
        finally:
            _running_tasks.timer = None

    def _run_one(self, task: TimerEntry) -> None:
        try:
            task.run()
        except Exception:
            self._task_failed(task)

    def _task_failed(self, task: TimerEntry) -> None:
        with self._errors_lock:
            self._errors += 1
        log.exception("timer %r: task %r raised", self._name, task)
