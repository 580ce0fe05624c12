"""The well-known Python cron libraries, held against the same reference: neither
follows the stated daylight-saving rule, which is why tickwheel has its own cron module
(docs/schedules.md). A version of either that does is worth a second look."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tests.schedules.reference import Fields, occurrences
from tests.schedules.test_dst_against_reference import _local_midnight_ms, _transition_days

ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Pacific/Chatham",
         "America/Santiago"]
SPECS = [(m, h) for h in ("*", "*/2", 0, 1, 2, 3) for m in (0, 15, 30, 45)]


def _fields(minute: int, hour: int | str) -> Fields:
    hours = range(24) if hour == "*" else range(0, 24, 2) if hour == "*/2" else [hour]
    return Fields(frozenset({0}), frozenset({minute}), frozenset(hours),  # type: ignore[arg-type]
                  frozenset(range(1, 32)), frozenset(range(1, 13)), frozenset(range(7)),
                  dom_star=True, dow_star=True, every_pass=isinstance(hour, str))


def _differences(next_of: object) -> tuple[int, int]:
    """(specs x transition windows that differ from the reference, windows compared)."""
    differ = total = 0
    for name in ZONES:
        zone = ZoneInfo(name)
        for minute, hour in SPECS:
            for day in _transition_days(zone):
                first, last = day - timedelta(days=1), day + timedelta(days=1)
                expected = occurrences(_fields(minute, hour), zone, first, last, False)
                start = datetime(first.year, first.month, first.day, tzinfo=zone)
                end = _local_midnight_ms(last + timedelta(days=1), zone)
                got = next_of(f"{minute} {hour} * * *", start - timedelta(seconds=1), end)  # type: ignore[operator]
                total += 1
                differ += got != expected
    return differ, total


def _collect(iterator: object, end: int) -> list[int]:
    out = []
    for t in iterator:  # type: ignore[attr-defined]
        at = round(t.timestamp() * 1000)
        if at >= end:
            return out
        out.append(at)
    return out


def test_croniter_differs_from_the_stated_rule() -> None:
    croniter = pytest.importorskip("croniter").croniter
    differ, total = _differences(
        lambda text, start, end: _collect(croniter(text, start).all_next(datetime), end))
    assert total == 240 and differ > 0


def test_cronsim_differs_from_the_stated_rule_for_hourly_specs() -> None:
    cronsim = pytest.importorskip("cronsim")
    differ, total = _differences(
        lambda text, start, end: _collect(cronsim.CronSim(text, start), end))
    assert total == 240 and differ > 0


def test_tickwheel_matches_the_reference_on_the_same_windows() -> None:
    from tickwheel import Schedule

    def chain(text: str, start: datetime, end: int) -> list[int]:
        schedule = Schedule(cron=text, tz=str(start.tzinfo))
        out, t = [], schedule.next_after(round(start.timestamp() * 1000))
        while t is not None and t < end:
            out.append(t)
            t = schedule.next_after(t)
        return out

    assert _differences(chain) == (0, 240)
