"""Schedule: intervals, cron, bounds, jitter, misfire plans and refused specs."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tickwheel.schedules import Misfire, Schedule, ScheduleError

HOUR = 3_600_000


def ms(*args: int, tz: object = UTC) -> int:
    return round(datetime(*args, tzinfo=tz).timestamp() * 1000)  # type: ignore[arg-type]


# -- intervals ---------------------------------------------------------------------------

def test_an_interval_is_aligned_to_its_anchor_and_counts_exact_milliseconds() -> None:
    s = Schedule(every_ms=1_000, anchor_ms=250)
    assert s.next_after(0) == 250
    assert s.next_after(250) == 1_250
    assert s.next_after(-1_000) == -750
    assert Schedule(every_ms=HOUR).next_after(ms(2026, 3, 8, 6, 59)) == ms(2026, 3, 8, 7)


def test_next_after_is_strictly_after() -> None:
    s = Schedule(cron="0 * * * *")
    t = ms(2026, 1, 1, 5)
    assert s.next_after(t) == t + HOUR
    assert s.first_at_or_after(t) == t


def test_bounds_are_inclusive_and_end_the_series() -> None:
    s = Schedule(every_ms=10, start_ms=100, end_ms=130)
    assert s.next_after(0) == 100
    assert s.next_after(120) == 130
    assert s.next_after(130) is None


# -- cron --------------------------------------------------------------------------------

@pytest.mark.parametrize(("cron", "after", "expected"), [
    ("*/15 * * * *", (2026, 1, 1, 0, 7), (2026, 1, 1, 0, 15)),
    ("0 9 * * mon-fri", (2026, 1, 2, 9, 0), (2026, 1, 5, 9, 0)),  # Friday -> Monday
    ("0 0 29 2 *", (2026, 1, 1), (2028, 2, 29)),                  # leap days only
    ("0 0 1 jan,JUL *", (2026, 2, 1), (2026, 7, 1)),
    ("30 0 0 * * *", (2026, 1, 1), (2026, 1, 1, 0, 0, 30)),        # seconds first
    ("@hourly", (2026, 1, 1, 0, 30), (2026, 1, 1, 1)),
    ("0 0 13 * 5", (2026, 2, 1), (2026, 2, 6)),                  # 13th or a Friday
    ("0 0 */10 * 5", (2026, 2, 1), (2026, 5, 1)),                # */ is "*": and
    ("0 0 * * 7", (2026, 1, 1), (2026, 1, 4)),                   # 7 is Sunday
])
def test_cron_fields(cron: str, after: tuple[int, ...], expected: tuple[int, ...]) -> None:
    assert Schedule(cron=cron).next_after(ms(*after)) == ms(*expected)


def test_a_cron_schedule_reads_its_fields_in_its_zone() -> None:
    s = Schedule(cron="0 2 * * *", tz="Asia/Shanghai")  # UTC+8
    assert s.next_after(ms(2026, 6, 1)) == ms(2026, 6, 1, 18)


def test_a_time_in_the_spring_forward_gap_fires_once_at_the_end_of_the_gap() -> None:
    s = Schedule(cron="*/20 2 * * *", tz="America/New_York")
    gap_end = ms(2026, 3, 8, 7)  # 03:00 EDT
    assert s.next_after(ms(2026, 3, 8, 6, 59)) == gap_end
    assert s.next_after(gap_end) == ms(2026, 3, 9, 6)  # 02:00 EDT the next day


def test_a_fixed_time_of_day_that_repeats_fires_once_at_its_first_occurrence() -> None:
    s = Schedule(cron="30 1 * * *", tz="America/New_York")
    first = ms(2026, 11, 1, 5, 30)  # 01:30 EDT; 01:30 EST is 06:30 UTC
    assert s.next_after(ms(2026, 11, 1)) == first
    assert s.next_after(first) == ms(2026, 11, 2, 6, 30)
    # Asked from inside the second pass, it does not go back to the first.
    assert s.next_after(ms(2026, 11, 1, 6, 15)) == ms(2026, 11, 2, 6, 30)


def test_a_time_after_the_repeated_hour_fires_when_asked_from_its_second_pass() -> None:
    s = Schedule(cron="30 2 * * *", tz="America/New_York")
    # 01:45 EST (06:45 UTC): 02:30 EST the same day is 45 minutes later, not tomorrow.
    assert s.next_after(ms(2026, 11, 1, 6, 45)) == ms(2026, 11, 1, 7, 30)


def test_a_frequent_job_fires_in_both_passes_of_a_repeated_hour() -> None:
    quarter = Schedule(cron="*/15 * * * *", tz="America/New_York")
    fires, t = [], ms(2026, 11, 1, 4, 50)  # 00:50 EDT
    for _ in range(10):
        t = quarter.next_after(t)
        fires.append(t)
    assert fires == [ms(2026, 11, 1, 5, m) for m in (0, 15, 30, 45)] + [  # 01:xx EDT
        ms(2026, 11, 1, 6, m) for m in (0, 15, 30, 45)] + [  # 01:xx EST
        ms(2026, 11, 1, 7, 0), ms(2026, 11, 1, 7, 15)]  # 02:00 EST: no silent hour
    hourly = Schedule(cron="@hourly", tz="America/New_York")
    day, t = [], ms(2026, 11, 1, 4) - 1  # the local day: 00:00 EDT to 00:00 EST
    while (t := hourly.next_after(t)) < ms(2026, 11, 2, 5):  # type: ignore[operator]
        day.append(t)
    assert len(day) == 25


def test_lord_howe_shifts_by_half_an_hour() -> None:
    s = Schedule(cron="15 2 * * *", tz="Australia/Lord_Howe")
    # 2026-10-04 02:00 -> 02:30 local: 02:15 does not exist, fires at 02:30 (+11).
    assert s.next_after(ms(2026, 10, 3, 12)) == ms(2026, 10, 3, 15, 30)


# -- refused specs -----------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "named"), [
    ({"cron": "0 0 30 2 *"}, "day-of-month"),
    ({"cron": "0 0 31 4,6,9,11 *"}, "day-of-month"),
    ({"cron": "0 25 * * *"}, "hour"),
    ({"cron": "0 0 * * fri-mon"}, "day-of-week"),
    ({"cron": "*/0 * * * *"}, "minute"),
    ({"cron": "0 0 L * *"}, "day-of-month"),
    ({"cron": "0 0 * * *", "tz": "Nowhere/City"}, "tz"),
    ({"cron": "0 0 * * *", "tz": "/etc/passwd"}, "tz"),
    ({"cron": "0 0 * * *", "tz": "localtime"}, "host's own zone"),
    ({"cron": "0 0 * * *", "tz": "posixrules"}, "host's own zone"),
    ({"cron": "0 0 * * *", "tz": "right/UTC"}, "not an IANA zone name"),
    ({"cron": "0 0 * * *", "tz": "posix/Europe/London"}, "not an IANA zone name"),
    ({"cron": "@fortnightly"}, "macro"),
    ({"cron": "1 2 3"}, "5 fields"),
    ({"every_ms": 0}, "every_ms"),
    ({"every_ms": 1.5}, "every_ms"),
    ({"every_ms": True}, "every_ms"),
    ({"every_ms": 10, "cron": "* * * * *"}, "exactly one"),
    ({}, "exactly one"),
    ({"every_ms": 10, "tz": "Europe/London"}, "tz"),
    ({"every_ms": 10, "jitter_ms": 11}, "jitter_ms"),
    ({"every_ms": 10, "max_runs": 0}, "max_runs"),
    ({"every_ms": 10, "misfire": "sometimes"}, "misfire"),
    ({"every_ms": 10, "start_ms": 5, "end_ms": 4}, "end_ms"),
    ({"every_ms": 100, "start_ms": 1, "end_ms": 99}, "never fire"),
    ({"cron": "0 0 1 1 *", "start_ms": 1, "end_ms": 1_000}, "never fire"),
    ({"every_ms": 10**20}, "every_ms"),
])
def test_a_bad_spec_is_refused_naming_the_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ScheduleError, match=named):
        Schedule(**fields)  # type: ignore[arg-type]


def test_tz_given_on_an_interval_is_refused_whatever_its_value() -> None:
    for tz in ("UTC", "Europe/London"):
        with pytest.raises(ScheduleError, match="tz applies to cron schedules only"):
            Schedule.from_fields({"every_ms": 1_000, "tz": tz})


@pytest.mark.parametrize("schedule", [
    Schedule(every_ms=5),
    Schedule(cron="*/5 * * * *", tz="Asia/Kolkata", jitter_ms=300, misfire="skip"),
    Schedule(every_ms=60_000, anchor_ms=7, start_ms=0, end_ms=10**9, max_runs=3,
             grace_ms=5, catchup_ms=50, misfire="all"),
])
def test_to_fields_gives_what_from_fields_takes_back(schedule: Schedule) -> None:
    fields = schedule.to_fields()
    assert json.loads(json.dumps(fields)) == fields  # JSON values only
    assert Schedule.from_fields(fields) == schedule
    assert "tz" not in Schedule(every_ms=5).to_fields()  # defaults are left out


def test_from_fields_refuses_an_unknown_field() -> None:
    with pytest.raises(ScheduleError, match="'every'"):
        Schedule.from_fields({"every": 5})
    assert Schedule.from_fields({"every_ms": 5, "tz": None}) == Schedule(every_ms=5)


# -- jitter ------------------------------------------------------------------------------

def test_jitter_is_stable_bounded_and_never_early() -> None:
    s = Schedule(every_ms=60_000, jitter_ms=30_000)
    delays = [s.jitter_for("job", t) for t in range(0, 600 * 60_000, 60_000)]
    assert all(0 <= d < 30_000 for d in delays)
    assert len(set(delays)) > 500  # spread, not a constant
    assert delays == [s.jitter_for("job", t) for t in range(0, 600 * 60_000, 60_000)]
    assert s.jitter_for("job", 0) != s.jitter_for("other", 0)
    assert s.fire_ms("job", 120_000) == 120_000 + s.jitter_for("job", 120_000)
    # Fixed across processes and versions: BLAKE2b of "job@0", not hash().
    assert s.jitter_for("job", 0) == int.from_bytes(
        __import__("hashlib").blake2b(b"job@0", digest_size=8).digest(), "big") % 30_000


# -- misfire plans -----------------------------------------------------------------------

def test_on_time_occurrences_all_fire() -> None:
    s = Schedule(every_ms=1_000, grace_ms=60_000)
    plan = s.plan(after_ms=0, now_ms=5_000)
    assert plan.fire == (1_000, 2_000, 3_000, 4_000, 5_000)
    assert (plan.skipped, plan.after_ms, plan.more, plan.finished) == (0, 5_000, False, False)


@pytest.mark.parametrize(("misfire", "fired", "skipped"), [
    (Misfire.LATEST, [6 * HOUR], 5),
    (Misfire.ALL, [h * HOUR for h in range(1, 7)], 0),
    (Misfire.SKIP, [], 6),
])
def test_an_outage_is_decided_by_the_misfire_policy(misfire: Misfire, fired: list[int],
                                                    skipped: int) -> None:
    s = Schedule(every_ms=HOUR, misfire=misfire)
    plan = s.plan(after_ms=0, now_ms=6 * HOUR + 30 * 60_000)
    assert list(plan.fire) == fired and plan.skipped == skipped
    assert plan.after_ms == 6 * HOUR and not plan.more


def test_latest_fires_nothing_missed_when_an_occurrence_on_time_follows() -> None:
    s = Schedule(every_ms=HOUR, grace_ms=10 * 60_000)
    plan = s.plan(after_ms=0, now_ms=3 * HOUR + 60_000)
    assert plan.fire == (3 * HOUR,) and plan.skipped == 2


def test_all_fires_only_within_the_catchup_window() -> None:
    s = Schedule(every_ms=HOUR, misfire="all", catchup_ms=3 * HOUR, grace_ms=0)  # type: ignore[arg-type]
    plan = s.plan(after_ms=0, now_ms=10 * HOUR)
    assert plan.fire == (7 * HOUR, 8 * HOUR, 9 * HOUR, 10 * HOUR) and plan.skipped == 6


def test_a_huge_catchup_is_decided_in_bounded_pieces_that_add_up() -> None:
    s = Schedule(cron="* * * * *", misfire="all", catchup_ms=10**12)  # type: ignore[arg-type]
    after, fired, pieces = 0, 0, 0
    now = 30 * 24 * HOUR
    while True:
        plan = s.plan(after_ms=after, now_ms=now, budget=5_000)
        assert len(plan.fire) <= 5_000
        fired += len(plan.fire)
        after, pieces = plan.after_ms, pieces + 1
        if not plan.more:
            break
    assert fired == 30 * 24 * 60 and pieces == 9


def test_an_interval_outage_of_a_year_is_counted_without_walking_it() -> None:
    s = Schedule(every_ms=1_000, misfire="skip", grace_ms=0)  # type: ignore[arg-type]
    plan = s.plan(after_ms=0, now_ms=365 * 24 * HOUR, budget=10)
    assert plan.fire == (365 * 24 * HOUR,) and plan.skipped == 365 * 24 * 3_600 - 1
    s = Schedule(every_ms=1_000, grace_ms=0)
    plan = s.plan(after_ms=0, now_ms=365 * 24 * HOUR + 500, budget=10)
    assert plan.fire == (365 * 24 * HOUR,) and plan.skipped == 365 * 24 * 3_600 - 1


def test_max_runs_ends_the_series_counting_fires_only() -> None:
    s = Schedule(every_ms=10, max_runs=3)
    plan = s.plan(after_ms=0, now_ms=25)
    assert plan.fire == (10, 20) and not plan.finished
    plan = s.plan(after_ms=20, now_ms=100, runs=2)
    assert plan.fire == (30,) and plan.finished and not plan.more


def test_the_end_bound_finishes_the_series() -> None:
    s = Schedule(every_ms=10, end_ms=30)
    plan = s.plan(after_ms=0, now_ms=1_000)
    assert plan.fire == (10, 20, 30) and plan.finished


def test_the_docs_examples_run() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "schedules.md").read_text()
    blocks = page.split("```python\n")[1:]
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block.split("```")[0], "docs/schedules.md", "exec"),
             {"t0": 1_767_225_600_000, "t1": 1_798_761_600_000})


@pytest.mark.parametrize(("fields", "words"), [
    ({"every_ms": 5_400_000}, "every 90 min"),
    ({"every_ms": 86_400_000}, "every 1 d"),
    ({"every_ms": 1_500}, "every 1,500 ms"),
    ({"every_ms": 60_000, "anchor_ms": 30_000}, "every 1 min from 1970-01-01 00:00:30 UTC"),
    ({"cron": "0 9 * * 1-5", "tz": "Europe/Paris", "max_runs": 3},
     "cron '0 9 * * 1-5' in Europe/Paris, at most 3 runs"),
    ({"cron": "*/5 * * * *", "end_ms": 0, "start_ms": -3_600_000, "jitter_ms": 30_000},
     "cron '*/5 * * * *' in UTC, from 1969-12-31 23:00:00 UTC, until 1970-01-01 00:00:00 "
     "UTC, up to 30 s late by jitter"),
])
def test_a_schedule_describes_itself_in_words(fields: dict[str, object], words: str) -> None:
    assert Schedule.from_fields(fields).describe() == words
