"""WheelScheduler: an asyncio loop's timers on a timing wheel, driven by one timer of
the loop itself.

The loop keeps exactly one of its own timer handles (the *sentinel*) armed at the
wheel's next due bucket. When it fires, the scheduler runs what is due in ``when``
order and arms it again. So the loop's selector sleeps until the wheel's next bucket
and never spins, a schedule or a cancel touches only the wheel, and the loop's own
``_run_once`` is used as it is: the same mechanism drives ``tickwheel.aio.EventLoop``
and, on any other loop (uvloop included), ``tickwheel.aio.timeout``.

Time: a handle due at ``when`` (seconds, a float) is held until the wheel's millisecond
``ceil(when * 1000)``, and it runs only once ``loop.time() >= when``: never early,
and at most one tick (1 ms) after asyncio's own heap would run it. The clock is read
through ``loop.time()`` every time, so a test that replaces it still moves time.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import logging
import math
import numbers
import reprlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from tickwheel._compat import provide_mypyc_attr
from tickwheel._histogram import HistogramSnapshot
from tickwheel.aio._handle import DebugTimerHandle, TimerHandle
from tickwheel.timers import TimerEntry, TimingWheelTimer

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr

provide_mypyc_attr(globals())

expose: Callable[[object], None] | None
hide: Callable[[object], None] | None
hidden: Callable[[], int] | None
try:
    from tickwheel.aio._gc import expose, hidden, hide
except ImportError:  # built without a C compiler: pending handles stay tracked
    expose = hide = hidden = None

__all__ = ["SchedulerStats", "WheelScheduler", "as_seconds", "call_at", "call_later",
           "scheduler_for"]

#: The millisecond a handle due at +/-inf (or past a float's range) is held at.
_FAR: Final = 1 << 62
#: ``_armed_ms`` while no sentinel is armed: later than any handle can be.
_IDLE: Final = 1 << 63
#: Sharing a context snapshot means comparing every variable by identity; past this
#: many variables a fresh copy is cheaper than the comparison.
_MAX_SHARED_VARS: Final = 8
_MISSING: Final = object()
#: Slow callbacks are reported where asyncio reports its own.
_asyncio_log: Final = logging.getLogger("asyncio")


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot of a loop's wheel: handles pending, scheduled, run and cancelled
    since it was made, how often the sentinel was armed and fired, and how late (in
    milliseconds past its due millisecond) each handle was taken out to run."""

    pending: int
    scheduled: int
    expired: int
    cancelled: int
    arms: int
    fires: int
    lateness_ms: HistogramSnapshot


class _LoopClock:
    """The wheel's clock: the loop's time in whole milliseconds."""

    __slots__ = ("_scheduler",)

    def __init__(self, scheduler: WheelScheduler) -> None:
        self._scheduler = scheduler

    @property
    def realtime(self) -> bool:
        # The wheel never waits on this clock itself: the loop's selector does.
        return False

    def now_ms(self) -> int:
        return math.floor(self._scheduler.time() * 1000.0)


def _expiration_ms(when: float) -> int:
    try:
        return math.ceil(when * 1000.0)
    except OverflowError:
        return _FAR if when > 0 else -_FAR
    except ValueError:
        raise ValueError(f"when must be a number of seconds, got {when!r}") from None


def as_seconds(value: object, name: str) -> float:
    """``value`` as seconds, a float: any real number. An int past a float's range
    (which the stock loop keeps as it is) is as far off as a float can say, +/-inf."""
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} "
                    f"{reprlib.repr(value)}")


def _same_variables(a: contextvars.Context, b: contextvars.Context) -> bool:
    """True if ``a`` and ``b`` hold the very same objects in the same variables.
    Identity, not ``==``: a callback must see its own objects, not equal ones."""
    n = len(a)
    if n != len(b):
        return False
    if n == 0:
        return True
    if n > _MAX_SHARED_VARS:
        return False
    for var, value in a.items():  # noqa: SIM110 (a loop compiles; all() makes a generator)
        if b.get(var, _MISSING) is not value:
            return False
    return True


def _when_of(entry: TimerEntry) -> float:
    return cast(TimerHandle, entry)._when


@mypyc_attr(native_class=False)
class _Anchor:
    """What the per-loop registry refers to weakly, since a compiled class takes no
    weak references: it lives exactly as long as its wheel, which holds it."""

    __slots__ = ("__weakref__", "scheduler")

    def __init__(self, scheduler: WheelScheduler) -> None:
        self.scheduler = scheduler


class WheelScheduler:
    """One loop's timing wheel and its sentinel.

    The sentinel is armed with ``loop.call_at``, looked up at each arm, or with
    ``arm_at(loop, when, callback, context=...)`` when given (a subclass of a stock
    loop passes its base class's ``call_at``). The loop is held weakly: the wheel of a
    loop nobody uses any more must not keep it alive through the per-loop registry."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        arm_at: Callable[..., asyncio.TimerHandle] | None = None,
        *,
        direct_clock: bool = True,
    ) -> None:
        self._loop_ref = weakref.ref(loop)
        self._arm_at = arm_at
        # Shortcut (LoopShortcuts.direct_clock): loop.time() is read on every schedule,
        # and the stock method only returns time.monotonic() through a Python frame;
        # while it is neither overridden nor replaced on the instance, the clock is
        # read directly.
        attrs = getattr(loop, "__dict__", None)
        self._stock_time = (direct_clock and type(loop).time is asyncio.BaseEventLoop.time
                            and attrs is not None)
        self._loop_attrs: dict[str, object] = attrs if attrs is not None else {}
        self._timer = TimingWheelTimer(tick_ms=1, clock=_LoopClock(self), executor=None)
        # Held weakly, as the loop is: the sentinel holds the loop, and the loop's own
        # heap is what keeps the sentinel alive.
        self._sentinel: weakref.ref[asyncio.TimerHandle] | None = None
        self._armed_ms: int = _IDLE
        # Handles taken out due but found early by the float comparison (rounding, or a
        # replaced loop.time() that went back): a small heap by when.
        self._early: list[tuple[float, int, TimerHandle]] = []
        self._early_seq = 0
        self._last_context: contextvars.Context | None = None
        # The sentinel runs in a context of its own: copying the caller's on every arm
        # would cost a context per arm for nothing.
        self._fire_context = contextvars.Context()
        self._arms = 0
        self._fires = 0
        self._ran = 0
        # Handles cancelled after the wheel let them out (in a batch, or among the early
        # ones): the wheel counts only cancels of what it holds.
        self._cancelled_out = 0
        self.closed = False
        self._anchor = _Anchor(self)
        # hide() while a loop runs (see start_hiding), None otherwise.
        self._hide: Callable[[object], None] | None = None
        #: Called as ``check(callback, method)`` before each schedule when set: the
        #: loop's debug-mode checks, which return the stack that is scheduling.
        self.debug_check: Callable[[object, str], list[Any]] | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the event loop of this wheel is gone")
        return loop

    # -- scheduling -------------------------------------------------------------------

    def time(self) -> float:
        """``loop.time()``, read directly while it is the stock method."""
        if self._stock_time and "time" not in self._loop_attrs:
            return time.monotonic()
        return self._loop().time()

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
        source_traceback: list[Any] | None = None,
        now: float | None = None,
    ) -> TimerHandle:
        """Schedule ``callback(*args)`` at loop time ``when``; ``now`` is the loop's
        time if the caller has just read it."""
        if self.closed:
            raise RuntimeError("Event loop is closed")
        expiration = _expiration_ms(when)
        copy = context is None
        if context is None:
            context = contextvars.copy_context()
            last = self._last_context
            if last is not None and _same_variables(context, last):
                context = last
            else:
                self._last_context = context
        if source_traceback is None:
            handle = TimerHandle(when, callback, args, context, copy)
        else:
            handle = DebugTimerHandle(when, callback, args, context, copy, source_traceback)
        self._timer.add_at(handle, expiration,
                           None if now is None else math.floor(now * 1000.0))
        hide_handle = self._hide
        if hide_handle is not None:
            # Reachable from the running loop while it waits here, so no collection
            # could free it: walking it in each full collection is pure cost.
            hide_handle(handle)
        if expiration < self._armed_ms:
            self._arm(expiration, expiration / 1000.0)
        return handle

    def call_later(
        self,
        delay: object,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
    ) -> TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        seconds = delay if isinstance(delay, float) else as_seconds(delay, "delay")
        if math.isnan(seconds):
            raise ValueError(f"delay must be a number of seconds, got {delay!r}")
        now = self.time()
        return self.call_at(now + seconds, callback, args, context, None, now)

    def loop_call_at(self, when: object, callback: Callable[..., object], *args: Any,
                     context: contextvars.Context | None = None) -> TimerHandle:
        """``loop.call_at`` with the loop's own signature, for binding on the loop."""
        check = self.debug_check
        stack = None if check is None else check(callback, "call_at")
        if when is None:
            raise TypeError("when cannot be None")
        at = when if isinstance(when, float) else as_seconds(when, "when")
        return self.call_at(at, callback, args, context, stack)

    def loop_call_later(self, delay: object, callback: Callable[..., object], *args: Any,
                        context: contextvars.Context | None = None) -> TimerHandle:
        """``loop.call_later`` with the loop's own signature, for binding on the loop."""
        check = self.debug_check
        stack = None if check is None else check(callback, "call_later")
        if delay is None:
            raise TypeError("delay must not be None")
        seconds = delay if isinstance(delay, float) else as_seconds(delay, "delay")
        if math.isnan(seconds):
            raise ValueError(f"delay must be a number of seconds, got {delay!r}")
        now = self.time()
        return self.call_at(now + seconds, callback, args, context, stack, now)

    # -- the sentinel -----------------------------------------------------------------

    def _disarm(self) -> None:
        ref = self._sentinel
        self._sentinel = None
        sentinel = None if ref is None else ref()
        if sentinel is not None:
            sentinel.cancel()

    def _arm(self, ms: int, at: float) -> None:
        self._disarm()
        self._armed_ms = ms
        self._arms += 1
        loop = self._loop()
        arm_at = self._arm_at
        if arm_at is None:
            sentinel = loop.call_at(at, self._fire, context=self._fire_context)
        else:
            sentinel = arm_at(loop, at, self._fire, context=self._fire_context)
        self._sentinel = weakref.ref(sentinel)

    def _rearm(self) -> None:
        self._sentinel = None
        self._armed_ms = _IDLE
        if self.closed:
            return
        nxt = self._timer.next_due_ms()
        early = self._early
        if early and (nxt is None or early[0][0] * 1000.0 < nxt):
            first = early[0][0]
            self._arm(_expiration_ms(first), first)
        elif nxt is not None:
            self._arm(nxt, nxt / 1000.0)

    def _fire(self) -> None:
        """The sentinel's callback: run what is due, in ``when`` order, then re-arm."""
        self._fires += 1
        loop = self._loop_ref()
        if loop is None:
            return
        now = self.time()
        # The loop ran the sentinel, so its millisecond has come even where the float
        # product rounds below it; the comparison with `when` below keeps it exact.
        now_ms = max(math.floor(now * 1000.0), self._armed_ms)
        due = self._timer.take_due(now_ms)
        early = self._early
        while early and early[0][0] <= now:
            due.append(heapq.heappop(early)[2])
        if not due:
            self._rearm()
            return
        if len(due) > 1:
            due.sort(key=_when_of)
        i = 0
        n = len(due)
        # In debug mode each handle is timed, as the stock loop times each callback it
        # runs (otherwise its warning would name the sentinel for the whole batch).
        debug = self.debug_check is not None
        # One count read per fire: with nothing hidden (any wheel of another loop),
        # no handle taken out needs showing again.
        expose_handle = expose if hidden is not None and hidden() else None
        try:
            while i < n:
                handle = cast(TimerHandle, due[i])
                if expose_handle is not None:
                    expose_handle(handle)
                if handle._when > now:
                    break
                i += 1
                if handle.cancelled():
                    self._cancelled_out += 1
                    continue
                self._ran += 1
                if debug:
                    started = self.time()
                    handle._run_in(loop)
                    took = self.time() - started
                    if took >= loop.slow_callback_duration:
                        _asyncio_log.warning("Executing %r took %.3f seconds", handle, took)
                else:
                    handle._run_in(loop)
        finally:
            # Whatever did not run (not yet due, or left behind by SystemExit or
            # KeyboardInterrupt) waits for the next fire; cancelled ones are dropped.
            while i < n:
                handle = cast(TimerHandle, due[i])
                if expose_handle is not None:
                    expose_handle(handle)
                i += 1
                if handle.cancelled():
                    self._cancelled_out += 1
                else:
                    self._early_seq += 1
                    heapq.heappush(early, (handle._when, self._early_seq, handle))
            self._rearm()

    # -- the collector ----------------------------------------------------------------

    def start_hiding(self) -> None:
        """Shortcut (LoopShortcuts.hidden_handles): hide each new handle from the
        cyclic collector while it waits in the wheel (where the package is compiled).
        Only for a loop that is about to run, which calls :meth:`expose_pending` as it
        stops: a running loop is reachable from its own frame, and so is every handle
        in its wheel."""
        if not self.closed:
            self._hide = hide

    def expose_pending(self) -> None:
        """Stop hiding handles, and let the cyclic collector see those hidden so far.

        A hidden handle's references are invisible to the collector: a cycle through
        it (a pending ``sleep`` holds its task, which holds the loop, which holds this
        wheel) could never be freed. The loop calls this as it stops running, so a
        loop dropped without ``close()`` is collected as the stock loop is. It walks
        the wheel only while some handle is hidden (in any loop of the process)."""
        self._hide = None
        expose_handle = expose
        if expose_handle is None or hidden is None or hidden() == 0:
            # Nothing is hidden anywhere: the handles this run hid have all left the
            # wheel, as a run_until_complete's timeouts mostly have by its end.
            return
        for entry in self._timer.pending_entries():
            expose_handle(entry)

    # -- the rest ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._timer) + len(self._early)

    def stats(self) -> SchedulerStats:
        timer = self._timer.stats()
        return SchedulerStats(
            pending=timer.pending + len(self._early),
            scheduled=timer.scheduled,
            expired=self._ran,
            cancelled=timer.cancelled + self._cancelled_out,
            arms=self._arms,
            fires=self._fires,
            lateness_ms=timer.lateness_ms,
        )

    def close(self) -> int:
        """Drop every pending handle (each reports ``cancelled()``); return how many."""
        if self.closed:
            return 0
        self.expose_pending()
        self.closed = True
        self._disarm()
        dropped = self._timer.close()  # counted among the wheel's own cancels
        for _, _, handle in self._early:
            if not handle.cancelled():
                handle.cancel()
                dropped += 1
            self._cancelled_out += 1
        self._early.clear()
        return dropped


# -- one wheel per loop ------------------------------------------------------------------

# Both held weakly: a wheel holds its handles, whose callbacks hold tasks, which hold the
# loop, so a strong reference from here would keep every loop alive that was dropped
# with timers pending (or, through the loop's attributes, any loop at all). A wheel with
# handles pending is kept alive by its loop, through the sentinel armed there; a tickwheel
# loop holds its own. An idle wheel of another loop may go, and is made anew on next use.
_schedulers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[_Anchor]] = (
    weakref.WeakKeyDictionary())
# The last loop asked for and its wheel, as one tuple so that threads running loops of
# their own never see a loop paired with another loop's wheel. A program runs one loop
# per thread, and this spares the weak dictionary's lookup on every call.
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[_Anchor]] | None = None


def register(loop: asyncio.AbstractEventLoop, scheduler: WheelScheduler) -> None:
    """Make ``scheduler`` the wheel of ``loop`` (a tickwheel loop registers its own,
    and holds it)."""
    _schedulers[loop] = weakref.ref(scheduler._anchor)


def _held(ref: weakref.ref[_Anchor] | None) -> WheelScheduler | None:
    anchor = None if ref is None else ref()
    if anchor is None or anchor.scheduler.closed:
        return None
    return anchor.scheduler


def scheduler_for(loop: asyncio.AbstractEventLoop) -> WheelScheduler:
    """The wheel that holds ``loop``'s tickwheel timers. It is made on first use, and
    lives while the loop does and it has handles pending (a tickwheel loop's, as long
    as the loop): an idle wheel of another loop may be dropped and made anew, with its
    counters back at zero."""
    global _last
    last = _last
    if last is not None and last[0]() is loop:
        scheduler = _held(last[1])
        if scheduler is not None:
            return scheduler
    scheduler = _held(_schedulers.get(loop))
    if scheduler is None:
        scheduler = WheelScheduler(loop)
        register(loop, scheduler)
    _last = (weakref.ref(loop), weakref.ref(scheduler._anchor))
    return scheduler


# `int` is spelled out for the compiled build, whose `float` would refuse an int past
# a float's range at the call instead of reading it as +/-inf.
def call_later(delay: float | int | None, callback: Callable[..., object], *args: Any,
               context: contextvars.Context | None = None) -> TimerHandle:
    """``loop.call_later`` on the running loop's wheel."""
    return scheduler_for(asyncio.get_running_loop()).call_later(delay, callback, args, context)


def call_at(when: float | int | None, callback: Callable[..., object], *args: Any,
            context: contextvars.Context | None = None) -> TimerHandle:
    """``loop.call_at`` on the running loop's wheel."""
    scheduler = scheduler_for(asyncio.get_running_loop())
    if when is None:
        raise TypeError("when cannot be None")
    at = when if isinstance(when, float) else as_seconds(when, "when")
    return scheduler.call_at(at, callback, args, context)
