"""The expiration reaper: a daemon thread that advances a purgatory's clock."""

from __future__ import annotations

from tickwheel.timers._driver import Driver

__all__ = ["Reaper"]


class Reaper(Driver):
    """Calls ``purgatory.advance_clock(200)`` in a loop, as Kafka's
    ``ExpiredOperationReaper`` does: expiring due operations and purging."""
