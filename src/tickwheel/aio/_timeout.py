"""Loop-agnostic timeouts: ``timeout`` and ``timeout_at`` on the running loop's wheel
(see ``scheduler_for``), for programs that keep their loop (the stock loop, uvloop).

``Timeout`` behaves as ``asyncio.Timeout`` (Python 3.12's rules for nesting and outside
cancellation): the block's ``CancelledError`` leaves it as ``TimeoutError``, and
``reschedule`` moves or removes the deadline.
"""

from __future__ import annotations

import asyncio
import enum
from types import TracebackType
from typing import Any, final

from tickwheel.aio._handle import TimerHandle
from tickwheel.aio._scheduler import as_seconds, scheduler_for

__all__ = ["Timeout", "timeout", "timeout_at"]

class _State(enum.Enum):
    CREATED = "created"
    ENTERED = "active"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    EXITED = "finished"


@final
class Timeout:
    """An async context manager that cancels its block at a deadline; made by
    :func:`timeout` and :func:`timeout_at`."""

    def __init__(self, when: float | None) -> None:
        self._state = _State.CREATED
        self._handle: TimerHandle | asyncio.Handle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._when = when

    def when(self) -> float | None:
        """The deadline in loop time, or None for no deadline."""
        return self._when

    def reschedule(self, when: float | None) -> None:
        """Move the deadline (None removes it)."""
        if self._state is not _State.ENTERED:
            if self._state is _State.CREATED:
                raise RuntimeError("Timeout has not been entered")
            raise RuntimeError(f"Cannot change state of {self._state.value} Timeout")
        self._when = when
        if self._handle is not None:
            self._handle.cancel()
        if when is None:
            self._handle = None
            return
        loop = asyncio.get_running_loop()
        if when <= loop.time():
            self._handle = loop.call_soon(self._on_timeout)
        else:
            self._handle = scheduler_for(loop).call_at(
                as_seconds(when, "when"), self._on_timeout, (), None)

    def expired(self) -> bool:
        """True once the deadline passed while the block ran."""
        return self._state in (_State.EXPIRING, _State.EXPIRED)

    def __repr__(self) -> str:
        info = [""]
        if self._state is _State.ENTERED:
            when = round(self._when, 3) if self._when is not None else None
            info.append(f"when={when}")
        return f"<Timeout [{self._state.value}]{' '.join(info)}>"

    async def __aenter__(self) -> Timeout:
        if self._state is not _State.CREATED:
            raise RuntimeError("Timeout has already been entered")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._state = _State.ENTERED
        self.reschedule(self._when)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._state is _State.EXPIRING:
            self._state = _State.EXPIRED
            assert self._task is not None
            # Only a cancel of our own, with no newer one pending, becomes a timeout.
            if (self._task.uncancel() <= self._cancelling and exc_type is not None
                    and issubclass(exc_type, asyncio.CancelledError)):
                raise TimeoutError from exc_val
        elif self._state is _State.ENTERED:
            self._state = _State.EXITED
        return None

    def _on_timeout(self) -> None:
        assert self._task is not None
        self._task.cancel()
        self._state = _State.EXPIRING
        self._handle = None


def timeout(delay: float | None) -> Timeout:
    """Like ``asyncio.timeout(delay)``, with the deadline on the running loop's wheel."""
    loop = asyncio.get_running_loop()
    return Timeout(loop.time() + delay if delay is not None else None)


def timeout_at(when: float | None) -> Timeout:
    """Like ``asyncio.timeout_at(when)``, with the deadline on the running loop's wheel."""
    return Timeout(when)
