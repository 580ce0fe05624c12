"""TimerHandle: asyncio's timer handle, as an entry of a timing wheel.

It is not a subclass of ``asyncio.TimerHandle``: that class is pure Python with ten
slots, and constructing one costs more than the whole schedule here. It has the same
API (``when()``, ``cancel()``, ``cancelled()``, ``get_context()``, ordering, hashing by
``when``) and links itself into the wheel's bucket, so that a cancel takes it out at
once instead of leaving it in a heap until a rebuild. uvloop makes the same choice.

The context: asyncio copies the caller's context into every handle. Most handles of a
busy loop are scheduled from equal contexts (sibling tasks that set no variable), so
the scheduler shares one snapshot among them and each run gets its own copy of it:
the callback sees the same variables and its changes stay its own, as with asyncio.
"""

from __future__ import annotations

import contextvars
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tickwheel.timers import TimerEntry

expose: Callable[[object], None] | None
try:
    from tickwheel.aio._gc import expose
except ImportError:  # built without a C compiler: handles are never hidden
    expose = None

if TYPE_CHECKING:
    import asyncio

__all__ = ["DebugTimerHandle", "TimerHandle"]

# TimerEntry._index of a cancelled handle (the timers' own CANCELLED mark).
_CANCELLED = -1


def _describe(callback: object, args: tuple[Any, ...] | None) -> str:
    name = getattr(callback, "__qualname__", None) or getattr(callback, "__name__", None)
    text = name if isinstance(name, str) else reprlib.repr(callback)
    if args is not None:
        text += "(" + ", ".join(reprlib.repr(arg) for arg in args) + ")"
    return text


class TimerHandle(TimerEntry):
    """What ``call_later`` and ``call_at`` return on a ``tickwheel.aio`` loop."""

    __slots__ = ("_args", "_callback", "_context", "_copy_context", "_when")

    def __init__(
        self,
        when: float,
        callback: Callable[..., object] | None,
        args: tuple[Any, ...] | None,
        context: contextvars.Context,
        copy_context: bool,
    ) -> None:
        super().__init__()
        self._when = when
        self._callback = callback
        self._args = args
        self._context = context
        # True when the context is a snapshot the scheduler may share: each run then
        # gets its own copy. An explicit context= is used as given, as asyncio does.
        self._copy_context = copy_context

    def when(self) -> float:
        """The loop time at which the callback is due."""
        return self._when

    def cancel(self) -> None:
        """Cancel the callback; a no-op if it already ran or was cancelled."""
        if self._index == _CANCELLED:
            return
        owner = self._owner
        while owner is not None and not owner.remove_task(self, True):
            owner = self._owner
        self._index = _CANCELLED
        expose_handle = expose
        if expose_handle is not None:
            # Out of the wheel: the collector must see it again (see WheelScheduler).
            expose_handle(self)
        # Drop the references at once, as asyncio does: a cancelled handle must not
        # keep a task or a large argument alive until its slot would have come round.
        self._callback = None
        self._args = None

    def cancelled(self) -> bool:
        return self._index == _CANCELLED

    def get_context(self) -> contextvars.Context:
        """The context the callback runs in (a copy of it, for a shared snapshot)."""
        return self._context

    def run(self) -> None:
        callback = self._callback
        if callback is None:
            return
        args = self._args
        context = self._context.copy() if self._copy_context else self._context
        if args is None:
            context.run(callback)
        else:
            context.run(callback, *args)

    def _run_in(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the callback as asyncio's ``Handle._run`` does: an exception goes to
        the loop's exception handler, except SystemExit and KeyboardInterrupt."""
        try:
            self.run()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            context: dict[str, object] = {
                "message": f"Exception in callback {_describe(self._callback, self._args)}",
                "exception": exc,
                "handle": self,
            }
            source = self._created_at()
            if source:
                context["source_traceback"] = source
            loop.call_exception_handler(context)

    def _created_at(self) -> list[Any] | None:
        return None

    def __hash__(self) -> int:
        return hash(self._when)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TimerHandle):
            return (self._when == other._when and self._callback == other._callback
                    and self._args == other._args
                    and self.cancelled() == other.cancelled())
        return NotImplemented

    def __lt__(self, other: object) -> bool:
        if isinstance(other, TimerHandle):
            return self._when < other._when
        return NotImplemented

    def __le__(self, other: object) -> bool:
        if isinstance(other, TimerHandle):
            return self._when < other._when or self == other
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        if isinstance(other, TimerHandle):
            return self._when > other._when
        return NotImplemented

    def __ge__(self, other: object) -> bool:
        if isinstance(other, TimerHandle):
            return self._when > other._when or self == other
        return NotImplemented

    def __repr__(self) -> str:
        info = ["TimerHandle"]
        cancelled = self.cancelled()
        if cancelled:
            info.append("cancelled")
        info.append(f"when={self._when}")
        if self._callback is not None:
            info.append(_describe(self._callback, self._args))
        source = self._created_at()
        if source:
            frame = source[-1]
            info.append(f"created at {frame[0]}:{frame[1]}")
        return "<" + " ".join(info) + ">"


class DebugTimerHandle(TimerHandle):
    """A handle made in debug mode: it also keeps the stack that scheduled it
    (``_source_traceback``, as asyncio's handles do), for reprs and error reports."""

    __slots__ = ("_source_traceback",)

    def __init__(
        self,
        when: float,
        callback: Callable[..., object] | None,
        args: tuple[Any, ...] | None,
        context: contextvars.Context,
        copy_context: bool,
        source_traceback: list[Any],
    ) -> None:
        super().__init__(when, callback, args, context, copy_context)
        self._source_traceback = source_traceback

    def _created_at(self) -> list[Any] | None:
        return self._source_traceback
