"""A brute-force reference for cron occurrences, built on zoneinfo alone.

It checks every day, takes every local time of a matching day whose fields match (from
the field sets a test generated, not from the parser under test), and maps each to an
instant by the stated rule: a time that occurs twice fires at its first occurrence
(fold=0), and a frequent spec's (a minute or hour field that starts with ``*``) at both
(fold=0 and fold=1); a time that does not exist fires at the first local minute (or
second) after it that exists, found by stepping one at a time. Slow and obviously right.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo


@dataclass(frozen=True)
class Fields:
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]  # 0 = Sunday
    dom_star: bool
    dow_star: bool
    every_pass: bool = False  # the minute or hour field starts with * (or ?)

    def day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        in_dom = d.day in self.days_of_month
        in_dow = (d.weekday() + 1) % 7 in self.days_of_week
        if not self.dom_star and not self.dow_star:
            return in_dom or in_dow
        return in_dom and in_dow


def _exists(naive: datetime, zone: ZoneInfo) -> bool:
    there = naive.replace(tzinfo=zone).astimezone(UTC).astimezone(zone)
    return there.replace(tzinfo=None, fold=0) == naive


def _ms(aware: datetime) -> int:
    return round(aware.timestamp() * 1000)


def occurrences(fields: Fields, zone: ZoneInfo, first_day: date, last_day: date,
                with_seconds: bool) -> list[int]:
    """Every occurrence whose local day is in [first_day, last_day], as epoch ms."""
    step = timedelta(seconds=1) if with_seconds else timedelta(minutes=1)
    found: set[int] = set()
    day = first_day
    while day <= last_day:
        if fields.day_matches(day):
            for h in sorted(fields.hours):
                for m in sorted(fields.minutes):
                    for s in sorted(fields.seconds):
                        at = datetime(day.year, day.month, day.day, h, m, s)
                        while not _exists(at, zone):  # in a gap: the first time after it
                            at += step
                        found.add(_ms(at.replace(tzinfo=zone, fold=0)))
                        if fields.every_pass:  # the second pass too, where it repeats
                            found.add(_ms(at.replace(tzinfo=zone, fold=1)))
        day += timedelta(days=1)
    return sorted(found)
