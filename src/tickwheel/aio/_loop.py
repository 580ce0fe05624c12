"""EventLoop: asyncio's selector event loop with its timers on a timing wheel.

Only ``call_at`` and ``call_later`` change: their handles go into the loop's
:class:`~tickwheel.aio._scheduler.WheelScheduler`, which keeps one timer of the base
loop armed at the wheel's next due bucket. Everything else (I/O, ``call_soon``, the
order in which one iteration runs ready callbacks) is the stock loop's own code.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import selectors
import sys
import traceback
from collections.abc import Callable
from typing import Any

from tickwheel.aio._handle import TimerHandle
from tickwheel.aio._scheduler import SchedulerStats, WheelScheduler, register
from tickwheel.aio._shortcuts import LoopShortcuts

__all__ = ["EventLoop", "EventLoopPolicy", "new_event_loop"]

_PACKAGE_DIR = os.path.dirname(__file__)

if sys.version_info >= (3, 14):  # asyncio's own is deprecated there, and inspect's equal
    from inspect import iscoroutinefunction
else:  # it also knows the marks of older coroutine functions (AsyncMock on 3.11)
    from asyncio import iscoroutinefunction
#: The stock loop's call_at, which arms the wheel's sentinel in the base loop's heap.
_BASE_CALL_AT = asyncio.SelectorEventLoop.call_at
_ALL_SHORTCUTS = LoopShortcuts()
#: Frames kept per scheduling stack in debug mode (asyncio keeps as many).
_DEBUG_STACK_DEPTH = 10


class EventLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``call_at`` and ``call_later`` live on a
    ``TimingWheelTimer``: O(1) to schedule and to cancel, with no cancelled handles
    left behind in a heap."""

    def __init__(self, selector: selectors.BaseSelector | None = None, *,
                 shortcuts: LoopShortcuts = _ALL_SHORTCUTS) -> None:
        self.shortcuts = shortcuts
        self._wheel = WheelScheduler(self, _BASE_CALL_AT, direct_clock=shortcuts.direct_clock)
        super().__init__(selector)
        register(self, self._wheel)
        cls = type(self)
        # Shortcut (LoopShortcuts.bound_methods): a Python method costs a frame on every
        # call; the scheduler's compiled methods take the same arguments, so the
        # instance binds them directly. A subclass that overrides either keeps its own.
        if shortcuts.bound_methods:
            if cls.call_at is EventLoop.call_at:
                self.call_at = self._wheel.loop_call_at  # type: ignore[method-assign]
            if cls.call_later is EventLoop.call_later:
                self.call_later = self._wheel.loop_call_later  # type: ignore[method-assign]

    # typeshed types these as returning asyncio.TimerHandle; the handle here has its
    # API without being a subclass (see _handle.py).
    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        return self._wheel.loop_call_at(when, callback, *args, context=context)

    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        return self._wheel.loop_call_later(delay, callback, *args, context=context)

    def run_forever(self) -> None:
        if self.is_running():
            super().run_forever()  # refused with the stock loop's error
            return
        if self.shortcuts.hidden_handles:
            self._wheel.start_hiding()
        try:
            super().run_forever()
        finally:
            # A loop that is not running may be dropped: its handles' references must
            # be the collector's to see again (see WheelScheduler.expose_pending).
            self._wheel.expose_pending()

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(enabled)
        self._wheel.debug_check = self._check_callable if enabled else None

    def _check_callable(self, callback: object, method: str) -> list[Any]:
        """What the stock loop checks in debug mode, through public API only; returns
        the scheduling stack (the caller's, outside this package) for the handle."""
        if self.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not self:
                raise RuntimeError("Non-thread-safe operation invoked on an event loop "
                                   "other than the current one")
        if asyncio.iscoroutine(callback) or iscoroutinefunction(callback):
            raise TypeError(f"coroutines cannot be used with {method}()")
        if not callable(callback):
            raise TypeError(f"a callable object was expected by {method}(), got {callback!r}")
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            frame = frame.f_back
        stack = traceback.StackSummary.extract(
            traceback.walk_stack(frame), limit=_DEBUG_STACK_DEPTH, lookup_lines=False)
        stack.reverse()
        return stack

    def close(self) -> None:
        super().close()  # refuses a running loop before the wheel is touched
        self._wheel.close()

    def timer_stats(self) -> SchedulerStats:
        """A snapshot of the loop's wheel: pending handles and what became of the rest."""
        return self._wheel.stats()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} running={self.is_running()} "
                f"closed={self.is_closed()} debug={self.get_debug()} "
                f"timers={len(self._wheel)}>")


def new_event_loop(*, shortcuts: LoopShortcuts = _ALL_SHORTCUTS) -> EventLoop:
    """A new :class:`EventLoop`, for ``asyncio.Runner(loop_factory=...)`` or, from
    Python 3.12, ``asyncio.run(main(), loop_factory=...)`` (``functools.partial`` it
    to pass ``shortcuts``)."""
    return EventLoop(shortcuts=shortcuts)


if sys.version_info < (3, 14):
    class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):
        """Makes :class:`EventLoop` the loop of ``asyncio.run`` and
        ``asyncio.new_event_loop`` (Python 3.11 to 3.13; policies are deprecated from
        3.14, where ``loop_factory=`` is the way)."""

        def new_event_loop(self) -> EventLoop:
            return EventLoop()
