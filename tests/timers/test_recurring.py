"""schedule_recurring: a Schedule on each of the three timers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from tests.conftest import TIMER_FACTORIES, eventually, tick_of
from tickwheel import ManualClock, Schedule, TimerBase, TimerClosed
from tickwheel.timers import _recurring

HOUR = 3_600_000


def ms(*args: int) -> int:
    return round(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[arg-type]


def drive(timer: TimerBase, clock: ManualClock, until: int, step: int) -> None:
    while clock.now_ms() < until:
        clock.advance(min(step, until - clock.now_ms()))
        while timer.advance_clock(0):
            pass


def test_an_interval_fires_at_each_occurrence_and_never_early(timer: TimerBase,
                                                             clock: ManualClock) -> None:
    fired: list[int] = []
    task = timer.schedule_recurring(Schedule(every_ms=1_000, anchor_ms=500),
                                    lambda: fired.append(clock.now_ms()))
    assert task.next_occurrence_ms == 1_500 and len(timer) == 1
    drive(timer, clock, 10_600, 7)
    occurrences = list(range(1_500, 10_501, 1_000))
    assert len(fired) == len(occurrences) == task.runs
    assert all(at >= due for at, due in zip(fired, occurrences, strict=True))
    assert len(timer) == 1 and task.skipped == 0


def test_cron_in_a_zone_fires_23_times_on_the_spring_forward_day(timer: TimerBase) -> None:
    clock = ManualClock(ms(2026, 3, 8, 5))  # 00:00 EST
    t = type(timer)(clock=clock, executor=None)
    fired: list[int] = []
    t.schedule_recurring(Schedule(cron="0 * * * *", tz="America/New_York"),
                         lambda: fired.append(clock.now_ms()))
    drive(t, clock, ms(2026, 3, 9, 4), 60_000)  # to 00:00 EDT the next day
    t.close()
    assert len(fired) == 24  # 00:00 .. 23:00 less 02:00, plus 00:00 the next day
    assert len(set(fired)) == 24


def test_cancel_ends_the_series_even_from_inside_a_run(timer: TimerBase,
                                                       clock: ManualClock) -> None:
    fired: list[int] = []
    task = None

    def run() -> None:
        fired.append(clock.now_ms())
        if len(fired) == 3:
            assert task is not None
            task.cancel()

    task = timer.schedule_recurring(Schedule(every_ms=100), run)
    drive(timer, clock, 3_000, 10)
    assert len(fired) == 3 and task.cancelled() and len(timer) == 0
    assert task.next_occurrence_ms is None


def test_an_outage_fires_by_the_misfire_policy(timer: TimerBase, clock: ManualClock) -> None:
    latest = timer.schedule_recurring(Schedule(every_ms=HOUR), lambda: None)
    every = timer.schedule_recurring(Schedule(every_ms=HOUR, misfire="all"), lambda: None)  # type: ignore[arg-type]
    skip = timer.schedule_recurring(Schedule(every_ms=HOUR, misfire="skip"), lambda: None)  # type: ignore[arg-type]
    clock.advance(6 * HOUR + 30 * 60_000)  # a stall: nothing advanced the timer
    while timer.advance_clock(0):
        pass
    assert (latest.runs, latest.skipped) == (1, 5)
    assert (every.runs, every.skipped) == (6, 0)
    assert (skip.runs, skip.skipped) == (0, 6)
    for task in (latest, every, skip):
        assert task.next_occurrence_ms == 7 * HOUR


def test_runs_of_one_series_never_overlap(clock: ManualClock) -> None:
    with ThreadPoolExecutor(4) as pool:
        timer = TIMER_FACTORIES["timing_wheel"](clock, executor=pool)
        release = threading.Event()
        started = threading.Event()
        active, most, count = [0], [0], [0]
        lock = threading.Lock()

        def run() -> None:
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
                count[0] += 1
            started.set()
            release.wait(30)
            with lock:
                active[0] -= 1

        task = timer.schedule_recurring(Schedule(every_ms=100), run)
        timer.advance_clock(0)
        assert started.wait(30)
        for _ in range(5):  # occurrences fall due while the first run blocks
            clock.advance(100)
            timer.advance_clock(0)
        assert count[0] == 1 and len(timer) == 0  # the next is added only after it ends
        release.set()
        assert eventually(lambda: len(timer) == 1)  # the run ended and added the next
        timer.advance_clock(0)  # the five that fell due meanwhile, one after the other
        assert eventually(lambda: count[0] == 6 and len(timer) == 1)
        task.cancel()
        timer.close()
    assert most[0] == 1


def test_max_runs_and_the_end_finish_the_series(timer: TimerBase, clock: ManualClock) -> None:
    counted = timer.schedule_recurring(Schedule(every_ms=100, max_runs=3), lambda: None)
    bounded = timer.schedule_recurring(Schedule(every_ms=100, end_ms=1_500), lambda: None)
    drive(timer, clock, 5_000, 50)
    assert counted.runs == 3 and counted.finished and not counted.cancelled()
    assert bounded.runs == 6 and bounded.finished  # 1000 (now) .. 1500
    assert len(timer) == 0


def test_a_series_whose_occurrences_are_all_past_is_finished_at_once(
        timer: TimerBase, clock: ManualClock) -> None:
    task = timer.schedule_recurring(Schedule(every_ms=100, end_ms=500), lambda: None)
    assert task.finished and task.runs == 0 and len(timer) == 0


def test_a_raising_run_is_counted_and_the_series_goes_on(timer: TimerBase,
                                                         clock: ManualClock) -> None:
    def boom() -> None:
        raise RuntimeError("boom")

    task = timer.schedule_recurring(Schedule(every_ms=100), boom)
    drive(timer, clock, 1_550, 10)
    assert task.runs == 6 and timer.errors == 6 and len(timer) == 1


def test_jitter_delays_each_fire_within_its_bound(timer: TimerBase, clock: ManualClock) -> None:
    schedule = Schedule(every_ms=1_000, jitter_ms=800)
    fired: list[int] = []
    timer.schedule_recurring(schedule, lambda: fired.append(clock.now_ms()),
                             schedule_id="job-7")
    drive(timer, clock, 20_000, 1)
    expected = [o + schedule.jitter_for("job-7", o) for o in range(1_000, 20_000, 1_000)]
    expected = [e for e in expected if e <= 20_000]
    assert len(fired) == len(expected)
    assert all(e <= at <= e + tick_of(timer) for at, e in zip(fired, expected, strict=True))
    assert len({at % 1_000 for at in fired}) > 1  # not all at the same offset


class SteppingClock:
    """A real-time clock for the timer whose wall time a test sets."""

    def __init__(self) -> None:
        self.mono = 0
        self.wall = ms(2026, 1, 1) + 30_000

    @property
    def realtime(self) -> bool:
        return True

    def now_ms(self) -> int:
        return self.mono


def test_a_wall_clock_that_steps_back_fires_nothing_twice_or_early(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppingClock()
    monkeypatch.setattr(_recurring, "_wall_now", lambda: clock.wall)
    timer = TIMER_FACTORIES["heap"](clock, executor=None)  # type: ignore[arg-type]
    fired: list[int] = []
    timer.schedule_recurring(Schedule(every_ms=60_000), lambda: fired.append(clock.wall))

    def step(mono: int, wall: int) -> None:
        clock.mono += mono
        clock.wall += wall
        while timer.advance_clock(0):
            pass

    step(30_000, 30_000)
    assert fired == [ms(2026, 1, 1, 0, 1)]
    step(1_000, -120_000)  # the wall clock jumps back two minutes, to 23:59
    step(60_000, 60_000)   # 00:00: the task wakes by the timer's clock, too early
    assert len(fired) == 1
    step(60_000, 60_000)   # 00:01: that occurrence fired already
    assert len(fired) == 1
    step(60_000, 60_000)   # 00:02: the next occurrence
    assert fired[1:] == [ms(2026, 1, 1, 0, 2)]
    timer.close()


def test_a_closed_timer_refuses_a_schedule(timer: TimerBase) -> None:
    timer.close()
    with pytest.raises(TimerClosed):
        timer.schedule_recurring(Schedule(every_ms=10), lambda: None)


def test_schedule_recurring_takes_a_schedule(timer: TimerBase) -> None:
    with pytest.raises(TypeError, match="Schedule"):
        timer.schedule_recurring("* * * * *", lambda: None)  # type: ignore[arg-type]
