"""Errors a timer raises."""

from __future__ import annotations

__all__ = ["TimerClosed", "TimerRejected"]


class TimerClosed(RuntimeError):
    """A task was added to a timer after ``close()``."""


class TimerRejected(RuntimeError):
    """A timer refused a task because ``max_pending`` tasks are already pending."""

    def __init__(self, pending: int, limit: int) -> None:
        super().__init__(
            f"timer rejected the task: {pending} tasks pending, max_pending is {limit}"
        )
        self.pending = pending
        self.limit = limit
