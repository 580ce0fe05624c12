"""asyncio on a timing wheel.

- :func:`new_event_loop` (and :class:`EventLoopPolicy` up to Python 3.13): a selector
  event loop whose ``call_later``/``call_at`` (and so ``asyncio.sleep``, ``timeout``,
  ``wait_for``) live on a hierarchical timing wheel.
- :func:`timeout`, :func:`timeout_at`, :func:`call_later`, :func:`call_at`: the same
  wheel for a loop you keep (the stock loop, uvloop), driven by one timer of that loop.
- :func:`call_recurring`: a :class:`~tickwheel.Schedule` on the running loop's wheel.
"""

import sys

from tickwheel.aio._handle import TimerHandle
from tickwheel.aio._loop import EventLoop, new_event_loop
from tickwheel.aio._recurring import RecurringHandle, call_recurring
from tickwheel.aio._scheduler import (
    SchedulerStats,
    WheelScheduler,
    call_at,
    call_later,
    scheduler_for,
)
from tickwheel.aio._shortcuts import LoopShortcuts
from tickwheel.aio._timeout import Timeout, timeout, timeout_at

if sys.version_info < (3, 14):
    from tickwheel.aio._loop import EventLoopPolicy

__all__ = [
    "EventLoop",
    "EventLoopPolicy",
    "LoopShortcuts",
    "RecurringHandle",
    "SchedulerStats",
    "Timeout",
    "TimerHandle",
    "WheelScheduler",
    "call_at",
    "call_later",
    "call_recurring",
    "new_event_loop",
    "scheduler_for",
    "timeout",
    "timeout_at",
]
if sys.version_info >= (3, 14):  # policies are deprecated there
    __all__.remove("EventLoopPolicy")

del sys
