"""Cron occurrences equal the brute-force reference's, in zones with every kind of
daylight-saving shift: hundreds of random specs over 2026, and 6-field specs second by
second around each transition."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tests.schedules.reference import Fields, occurrences
from tickwheel.schedules import Schedule

ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata",
         "Pacific/Chatham", "America/Santiago", "Asia/Shanghai", "UTC", "Europe/Berlin",
         "Asia/Tehran", "America/St_Johns", "Africa/Casablanca"]
MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
               "dec"]
DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
YEAR = 2026


def _field(rng: random.Random, low: int, high: int, dense: bool,
           names: list[str] | None = None, name_base: int = 0) -> tuple[str, set[int]]:
    """A random field's text and the set it means, worked out here independently."""
    forms = ["star", "step", "range", "range_step", "list", "one", "from_step"]
    weights = [3, 2, 2, 1, 3, 3, 1] if dense else [0, 1, 1, 1, 4, 4, 1]
    form = rng.choices(forms, weights)[0]

    def token(v: int) -> str:
        if names is not None and rng.random() < 0.3 and 0 <= v - name_base < len(names):
            return names[v - name_base].upper() if rng.random() < 0.5 else names[v - name_base]
        return str(v)

    if form == "star":
        return ("*" if rng.random() < 0.8 else "?"), set(range(low, high + 1))
    if form == "step":
        n = rng.randint(2, max(2, (high - low) // 2))
        return f"*/{n}", set(range(low, high + 1, n))
    if form in ("range", "range_step"):
        a = rng.randint(low, high)
        b = rng.randint(a, high)
        if form == "range":
            return f"{token(a)}-{token(b)}", set(range(a, b + 1))
        n = rng.randint(1, max(1, b - a + 1))
        return f"{token(a)}-{token(b)}/{n}", set(range(a, b + 1, n))
    if form == "from_step":
        a = rng.randint(low, high)
        n = rng.randint(1, max(1, (high - low) // 2))
        return f"{a}/{n}", set(range(a, high + 1, n))
    k = 1 if form == "one" else rng.randint(2, 4)
    values = sorted(rng.sample(range(low, high + 1), k))
    return ",".join(token(v) for v in values), set(values)


def random_spec(rng: random.Random, with_seconds: bool) -> tuple[str, Fields]:
    sec_text, secs = _field(rng, 0, 59, dense=False) if with_seconds else ("", {0})
    min_text, mins = _field(rng, 0, 59, dense=False)
    # Hours around the usual transition times more often: that is where DST bites.
    if rng.random() < 0.5:
        hours = set(rng.sample([0, 1, 2, 3, 23], rng.randint(1, 3)))
        hour_text = ",".join(map(str, sorted(hours)))
    else:
        hour_text, hours = _field(rng, 0, 23, dense=True)
    dom_text, doms = _field(rng, 1, 31, dense=rng.random() < 0.7)
    mon_text, months = _field(rng, 1, 12, dense=rng.random() < 0.8, names=MONTH_NAMES,
                              name_base=1)
    dow_text, dows = _field(rng, 0, 6, dense=rng.random() < 0.7, names=DAY_NAMES)
    if "0" in dow_text.split(",") and rng.random() < 0.5:
        dow_text = ",".join("7" if part == "0" else part for part in dow_text.split(","))
    # Keep the spec able to fire: a day-of-month no chosen month has is refused.
    if dom_text[0] not in "*?" and dow_text[0] in "*?" and min(doms) > 29:
        dom_text, doms = "1-28", set(range(1, 29))
    fields = Fields(frozenset(secs), frozenset(mins), frozenset(hours), frozenset(doms),
                    frozenset(months), frozenset(dows), dom_star=dom_text[0] in "*?",
                    dow_star=dow_text[0] in "*?",
                    every_pass=min_text[0] in "*?" or hour_text[0] in "*?")
    parts = [min_text, hour_text, dom_text, mon_text, dow_text]
    if with_seconds:
        parts.insert(0, sec_text)
    return " ".join(parts), fields


def _local_midnight_ms(day: date, zone: ZoneInfo) -> int:
    return round(datetime(day.year, day.month, day.day, tzinfo=zone).timestamp() * 1000)


def _chain(schedule: Schedule, from_ms: int, until_ms: int) -> list[int]:
    out: list[int] = []
    t = schedule.next_after(from_ms - 1)
    while t is not None and t < until_ms:
        out.append(t)
        t = schedule.next_after(t)
    return out


def _transition_days(zone: ZoneInfo) -> list[date]:
    days = []
    day = date(YEAR, 1, 1)
    while day.year == YEAR:
        a = datetime(day.year, day.month, day.day, tzinfo=zone).utcoffset()
        nxt = day + timedelta(days=1)
        b = datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).utcoffset()
        if a != b:
            days.append(day)
        day = nxt
    return days


@pytest.mark.parametrize("seed", range(300))
def test_five_field_specs_match_the_reference_over_a_year(seed: int) -> None:
    rng = random.Random(seed)
    zone_name = ZONES[seed % len(ZONES)]
    zone = ZoneInfo(zone_name)
    text, fields = random_spec(rng, with_seconds=False)
    first, last = date(YEAR, 1, 1), date(YEAR, 12, 31)
    expected = occurrences(fields, zone, first, last, with_seconds=False)
    schedule = Schedule(cron=text, tz=zone_name)
    got = _chain(schedule, _local_midnight_ms(first, zone),
                 _local_midnight_ms(last + timedelta(days=1), zone))
    assert got == expected, (text, zone_name)


@pytest.mark.parametrize("seed", range(60))
def test_six_field_specs_match_the_reference_second_by_second_around_transitions(
        seed: int) -> None:
    rng = random.Random(10_000 + seed)
    zones = [z for z in ZONES if _transition_days(ZoneInfo(z))]
    zone_name = zones[seed % len(zones)]
    zone = ZoneInfo(zone_name)
    text, fields = random_spec(rng, with_seconds=True)
    schedule = Schedule(cron=text, tz=zone_name)
    for day in _transition_days(zone):
        first, last = day - timedelta(days=1), day + timedelta(days=1)
        expected = occurrences(fields, zone, first, last, with_seconds=True)
        got = _chain(schedule, _local_midnight_ms(first, zone),
                     _local_midnight_ms(last + timedelta(days=1), zone))
        assert got == expected, (text, zone_name, day)


def _shifts(name: str) -> set[timedelta]:
    zone = ZoneInfo(name)
    out = set()
    for day in _transition_days(zone):
        nxt = day + timedelta(days=1)
        a = datetime(day.year, day.month, day.day, tzinfo=zone).utcoffset()
        b = datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).utcoffset()
        assert a is not None and b is not None
        out.add(abs(b - a))
    return out


def test_the_zones_cover_every_kind_of_shift() -> None:
    hour, half = timedelta(hours=1), timedelta(minutes=30)
    assert _shifts("America/New_York") == {hour}
    assert _shifts("Australia/Lord_Howe") == {half}
    assert _shifts("Pacific/Chatham") == {hour}
    assert _shifts("America/Santiago") == {hour}
    assert _shifts("Asia/Kolkata") == set()


@pytest.mark.parametrize("seed", range(120))
def test_the_next_occurrence_from_any_time_around_a_fall_back_is_the_references(
        seed: int) -> None:
    """From every minute of the hours around a repeated hour, either pass of it too:
    ``next_after`` equals the first reference occurrence after that instant."""
    rng = random.Random(20_000 + seed)
    zones = [z for z in ZONES if _transition_days(ZoneInfo(z))]
    zone_name = zones[seed % len(zones)]
    zone = ZoneInfo(zone_name)
    text, fields = random_spec(rng, with_seconds=False)
    schedule = Schedule(cron=text, tz=zone_name)
    for day in _transition_days(zone):
        last = day + timedelta(days=400)
        expected = occurrences(fields, zone, day - timedelta(days=1), last,
                               with_seconds=False)
        beyond = _local_midnight_ms(last + timedelta(days=1), zone)
        start = _local_midnight_ms(day, zone)
        for t in range(start, start + 6 * 3_600_000, 60_000):
            later = [o for o in expected if o > t]
            got = schedule.next_after(t)
            if later:
                assert got == later[0], (text, zone_name, t)
            else:  # none in the reference's window: the next lies beyond it
                assert got is None or got >= beyond, (text, zone_name, t)
