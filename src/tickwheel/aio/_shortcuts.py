"""LoopShortcuts: the three places where :class:`~tickwheel.aio.EventLoop` goes around
the plain way for speed, each of which can be turned off.

Each is a shortcut, never a change of behaviour: with all three off the loop runs the
same callbacks at the same times, and CPython's asyncio tests pass either way. What each
costs and saves is in docs/asyncio.md (Shortcuts).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoopShortcuts"]


@dataclass(frozen=True, slots=True)
class LoopShortcuts:
    """Which shortcuts a loop takes (all by default).

    - ``bound_methods``: ``call_at`` and ``call_later`` are the scheduler's compiled
      methods, bound on the loop instance (no Python frame, no argument repacking).
      A subclass that overrides either keeps its own either way.
    - ``direct_clock``: while ``loop.time`` is the stock method (its body is
      ``time.monotonic()``), the scheduler calls ``time.monotonic()`` itself.
    - ``hidden_handles``: while the loop runs, each pending handle is untracked by the
      cyclic collector until it leaves the wheel (compiled installs only), so full
      collections do not walk a million pending handles.
    """

    bound_methods: bool = True
    direct_clock: bool = True
    hidden_handles: bool = True
