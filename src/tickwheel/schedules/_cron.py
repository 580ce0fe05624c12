"""Cron expressions: parsing, and the next matching local (wall) time.

Five fields (minute hour day-of-month month day-of-week) or six with seconds first, as
Quartz and Spring write them. Each field takes ``*``, ``?`` (the same as ``*``), values,
names (``jan``-``dec``, ``sun``-``sat``), lists, ranges and steps (``*/15``,
``10-50/20``, ``5/10``); day-of-week 7 is Sunday, as 0. Day-of-month and day-of-week
follow Vixie cron: when both are restricted (neither starts with ``*``), a day matching
either matches; otherwise both must.

This module knows naive local times only; :mod:`tickwheel.schedules._zone` maps them to
instants with the daylight-saving rule.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["CronExpression", "CronSyntaxError"]

_MONTHS = {name: i for i, name in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
    start=1)}
_DAYS = {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}

_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# (name, lowest, highest, names) for each field, seconds first.
_FIELDS = (
    ("second", 0, 59, None),
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 6, _DAYS),
)

# Datetime's range ends in year 9999; a search that reaches it finds nothing.
_LAST_YEAR = 9999
_ONE_SECOND = timedelta(seconds=1)


class CronSyntaxError(ValueError):
    """A cron expression that cannot be parsed, or can never match; the message names
    the field."""


@dataclass(frozen=True, slots=True)
class CronExpression:
    """A parsed cron expression: the allowed values of each field, sorted."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days_of_month: tuple[int, ...]
    months: tuple[int, ...]
    days_of_week: tuple[int, ...]  # 0 = Sunday
    dom_restricted: bool
    dow_restricted: bool
    #: The minute or the hour field starts with ``*`` or ``?``: a frequent job, which
    #: fires in both passes of a repeated hour (cron's rule: only jobs at a fixed time
    #: of day are held to one pass).
    every_pass: bool = False

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        if not isinstance(text, str):
            raise TypeError(f"cron must be a string, got {type(text).__name__}")
        stripped = text.strip()
        fields = _MACROS.get(stripped.lower(), stripped).split()
        if stripped.startswith("@") and stripped.lower() not in _MACROS:
            raise CronSyntaxError(
                f"cron {text!r}: unknown macro; use one of {', '.join(sorted(_MACROS))}")
        if len(fields) == 5:
            fields = ["0", *fields]
        elif len(fields) != 6:
            raise CronSyntaxError(
                f"cron {text!r}: expected 5 fields (minute hour day-of-month month "
                f"day-of-week) or 6 with seconds first, got {len(fields)}")
        parsed = [_parse_field(field, spec, text) for field, spec in zip(fields, _FIELDS,
                                                                         strict=True)]
        dow = tuple(sorted({0 if d == 7 else d for d in parsed[5]}))
        expr = cls(
            text=stripped,
            seconds=parsed[0], minutes=parsed[1], hours=parsed[2],
            days_of_month=parsed[3], months=parsed[4], days_of_week=dow,
            dom_restricted=not fields[3].startswith(("*", "?")),
            dow_restricted=not fields[5].startswith(("*", "?")),
            every_pass=fields[1].startswith(("*", "?")) or fields[2].startswith(("*", "?")),
        )
        expr._check_can_match()
        return expr

    def _check_can_match(self) -> None:
        if self.dow_restricted and self.dom_restricted:
            return  # either matches, and every weekday comes round in every month
        if self.dow_restricted:
            return  # every weekday comes round in every month
        # A day of the month that no allowed month has (30 February) never matches.
        longest = max(29 if m == 2 else calendar.monthrange(2001, m)[1] for m in self.months)
        if self.days_of_month[0] > longest:
            raise CronSyntaxError(
                f"cron {self.text!r}: day-of-month {self.days_of_month[0]} never falls in "
                f"month {','.join(map(str, self.months))}, so it can never fire")

    def _day_matches(self, year: int, month: int, day: int) -> bool:
        # Python's weekday(): Monday = 0; cron's: Sunday = 0.
        dow = (calendar.weekday(year, month, day) + 1) % 7
        in_dom = _contains(self.days_of_month, day)
        in_dow = _contains(self.days_of_week, dow)
        if self.dom_restricted and self.dow_restricted:
            return in_dom or in_dow
        return in_dom and in_dow

    def matches(self, local: datetime) -> bool:
        """Whether the naive local time ``local`` (whole seconds) matches."""
        return (_contains(self.seconds, local.second) and _contains(self.minutes, local.minute)
                and _contains(self.hours, local.hour) and _contains(self.months, local.month)
                and self._day_matches(local.year, local.month, local.day))

    def next_local(self, after: datetime) -> datetime | None:
        """The first naive local time strictly after ``after`` that matches, or None
        before year 10000. Each field jumps to its next allowed value, carrying into
        the next larger one, so the cost is a few steps, not one per second."""
        t = after.replace(microsecond=0) + _ONE_SECOND
        year, month, day = t.year, t.month, t.day
        hour, minute, second = t.hour, t.minute, t.second
        while year <= _LAST_YEAR:
            mi = bisect_left(self.months, month)
            if mi == len(self.months):
                year, month, day, hour, minute, second = year + 1, self.months[0], 1, 0, 0, 0
                continue
            if self.months[mi] != month:
                month, day, hour, minute, second = self.months[mi], 1, 0, 0, 0
            found_day = self._next_day(year, month, day)
            if found_day is None:
                month, day, hour, minute, second = month + 1, 1, 0, 0, 0
                if month > 12:
                    year, month = year + 1, 1
                continue
            if found_day != day:
                day, hour, minute, second = found_day, 0, 0, 0
            hi = bisect_left(self.hours, hour)
            if hi == len(self.hours):
                day, hour, minute, second = day + 1, 0, 0, 0
                year, month, day = _normalise(year, month, day)
                continue
            if self.hours[hi] != hour:
                hour, minute, second = self.hours[hi], 0, 0
            ni = bisect_left(self.minutes, minute)
            if ni == len(self.minutes):
                hour, minute, second = hour + 1, 0, 0
                if hour > 23:
                    day, hour = day + 1, 0
                    year, month, day = _normalise(year, month, day)
                continue
            if self.minutes[ni] != minute:
                minute, second = self.minutes[ni], 0
            si = bisect_left(self.seconds, second)
            if si == len(self.seconds):
                minute, second = minute + 1, 0
                if minute > 59:
                    hour, minute = hour + 1, 0
                    if hour > 23:
                        day, hour = day + 1, 0
                        year, month, day = _normalise(year, month, day)
                continue
            return datetime(year, month, day, hour, minute, self.seconds[si])
        return None

    def _next_day(self, year: int, month: int, day: int) -> int | None:
        last = calendar.monthrange(year, month)[1]
        for d in range(day, last + 1):
            if self._day_matches(year, month, d):
                return d
        return None


def _contains(values: tuple[int, ...], value: int) -> bool:
    i = bisect_left(values, value)
    return i < len(values) and values[i] == value


def _normalise(year: int, month: int, day: int) -> tuple[int, int, int]:
    if day > calendar.monthrange(year, month)[1]:
        day, month = 1, month + 1
        if month > 12:
            year, month = year + 1, 1
    return year, month, day


def _parse_field(field: str, spec: tuple[str, int, int, dict[str, int] | None],
                 text: str) -> tuple[int, ...]:
    name, low, high, names = spec

    def refuse(why: str) -> CronSyntaxError:
        return CronSyntaxError(f"cron {text!r}: {name} field {field!r}: {why}")

    def value(token: str) -> int:
        if names is not None and token.lower() in names:
            return names[token.lower()]
        if not token.isdigit():
            raise refuse(f"{token!r} is not a number"
                         + (f" or a name ({', '.join(names)})" if names else ""))
        number = int(token)
        if name == "day-of-week" and number == 7:
            return 7  # Sunday, as 0; "*" and "n/step" end at Saturday
        if not low <= number <= high:
            raise refuse(f"{number} is outside {low}-{high}")
        return number

    allowed: set[int] = set()
    for part in field.split(","):
        if part == "":
            raise refuse("an empty list item")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise refuse(f"step {step_text!r} must be a whole number >= 1")
            step = int(step_text)
        if base in ("*", "?"):
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = value(a), value(b)
            if first > last or (name == "day-of-week" and first == 7 and last != 7):
                raise refuse(f"range {base!r} runs backwards")
        else:
            first = value(base)
            last = high if slash else first  # "5/10": from 5 to the end, every 10
        allowed.update(range(first, last + 1, step))
    if not allowed:
        raise refuse("matches nothing")
    return tuple(sorted(allowed))
