"""Series: where one run of a recurring schedule stands, whoever drives it.

The timers' ``RecurringTask`` and asyncio's ``RecurringHandle`` each wait for the next
occurrence their own way; this holds what they share: the cursor (the last occurrence
decided), the pending occurrence, and the counts, moved on by the misfire plan.
"""

from __future__ import annotations

from tickwheel.schedules._schedule import Catchup, Schedule

__all__ = ["Series"]

#: Occurrences decided per wake-up in a catch-up; the rest follow at once after.
CATCHUP_BUDGET = 1_024


class Series:
    """One run of ``schedule`` from ``now_ms`` on: occurrences at or after it belong to
    it. ``schedule_id`` seeds the jitter."""

    __slots__ = ("after_ms", "finished", "last_ms", "next_ms", "runs", "schedule",
                 "schedule_id", "skipped")

    def __init__(self, schedule: Schedule, schedule_id: str, now_ms: int) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be a Schedule, got {type(schedule).__name__}")
        if not isinstance(schedule_id, str):
            raise TypeError(f"schedule_id must be a str, got {type(schedule_id).__name__}")
        self.schedule = schedule
        self.schedule_id = schedule_id
        self.after_ms = now_ms - 1  # the last occurrence decided
        self.next_ms: int | None = schedule.next_after(self.after_ms)
        self.runs = 0
        self.skipped = 0
        self.finished = self.next_ms is None
        self.last_ms: int | None = None  # the occurrence that ran last (or runs now)

    def fire_ms(self) -> int | None:
        """When the pending occurrence fires (its jitter added); None once finished."""
        if self.next_ms is None:
            return None
        return self.schedule.fire_ms(self.schedule_id, self.next_ms)

    def due(self, now_ms: int) -> Catchup | None:
        """The misfire plan for what is due at ``now_ms``, or None if the pending
        occurrence's fire time is still ahead (never early)."""
        fire = self.fire_ms()
        if fire is None or now_ms < fire:
            return None
        plan = self.schedule.plan(self.after_ms, now_ms, self.runs, CATCHUP_BUDGET)
        self.skipped += plan.skipped
        return plan

    def fired(self, occurrence_ms: int) -> None:
        """An occurrence of the plan is about to run."""
        self.after_ms = self.last_ms = occurrence_ms
        self.runs += 1

    def settle(self, plan: Catchup, stopped: bool) -> None:
        """The plan's fires are done (or ``stopped`` cut them short): move on to the
        next occurrence, or finish."""
        if not stopped:
            self.after_ms = plan.after_ms
        if plan.finished:
            self.finished = True
            self.next_ms = None
            return
        self.next_ms = self.schedule.next_after(self.after_ms)
        if self.next_ms is None:
            self.finished = True
