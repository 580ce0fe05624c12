"""Recurring schedules: intervals and cron in any IANA zone, with a stated DST rule.

Pure functions of time, shared by the timers, the asyncio integration and the pipeline.
"""

from tickwheel.schedules._cron import CronExpression, CronSyntaxError
from tickwheel.schedules._schedule import Catchup, Misfire, Schedule, ScheduleError
from tickwheel.schedules._zone import ZoneError

__all__ = [
    "Catchup",
    "CronExpression",
    "CronSyntaxError",
    "Misfire",
    "Schedule",
    "ScheduleError",
    "ZoneError",
]
