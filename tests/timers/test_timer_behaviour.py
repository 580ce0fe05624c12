"""What every timer does, whatever its data structure (run against all three)."""

from __future__ import annotations

import itertools
import logging
import math
import random
import threading

import pytest

from tests.conftest import tick_of
from tickwheel import ManualClock, TimerBase, TimerClosed, TimerTask


class Recorder(TimerTask):
    def __init__(self, delay_ms: int, name: str, out: list[str]) -> None:
        super().__init__(delay_ms)
        self.name = name
        self.out = out

    def run(self) -> None:
        self.out.append(self.name)


def test_task_runs_after_its_delay_and_not_before(timer: TimerBase, clock: ManualClock) -> None:
    ran: list[int] = []
    timer.schedule(50, lambda: ran.append(clock.now_ms()))
    clock.advance(49)
    timer.advance_clock(0)
    assert ran == [] or ran[0] >= 1_050
    clock.advance(1 + tick_of(timer))
    assert timer.advance_clock(0) or ran
    assert len(ran) == 1 and ran[0] >= 1_050


def test_delay_zero_or_negative_is_due_at_the_next_advance(timer: TimerBase,
                                                           clock: ManualClock) -> None:
    out: list[str] = []
    for d in (0, -5, -1_000_000):
        timer.schedule(d, out.append, str(d))
    assert out == []  # never inside add()
    assert len(timer) == 3
    assert timer.advance_clock(0) is True
    assert sorted(out) == ["-1000000", "-5", "0"]
    assert len(timer) == 0


def test_schedule_at_runs_at_the_deadline(timer: TimerBase, clock: ManualClock) -> None:
    out: list[int] = []
    task = timer.schedule_at(1_300, lambda: out.append(clock.now_ms()))
    assert task.delay_ms == 300
    clock.set(1_299)
    timer.advance_clock(0)
    assert out == []
    clock.set(1_300 + tick_of(timer))
    timer.advance_clock(0)
    assert len(out) == 1 and out[0] >= 1_300


def test_tasks_run_in_expiration_order_across_advances(timer: TimerBase,
                                                        clock: ManualClock) -> None:
    out: list[str] = []
    tick = tick_of(timer)
    for i in (5, 1, 4, 2, 3):
        timer.add(Recorder(i * 2 * tick, str(i), out))
    for _ in range(12):
        clock.advance(tick)
        timer.advance_clock(0)
    assert out == ["1", "2", "3", "4", "5"]


def test_cancel_removes_a_pending_task(timer: TimerBase, clock: ManualClock) -> None:
    out: list[str] = []
    a = timer.schedule(100, out.append, "a")
    b = timer.schedule(100, out.append, "b")
    assert len(timer) == 2
    assert a.cancel() is True
    assert a.cancelled() and not a.pending
    assert a.cancel() is False
    assert len(timer) == 1
    clock.advance(1_000)
    timer.advance_clock(0)
    assert out == ["b"]
    assert b.cancel() is False  # already ran
    assert not b.cancelled()
    s = timer.stats()
    assert (s.pending, s.scheduled, s.expired, s.cancelled) == (0, 2, 1, 1)


def test_adding_a_pending_task_again_moves_it(timer: TimerBase, clock: ManualClock) -> None:
    out: list[str] = []
    task = Recorder(100, "t", out)
    timer.add(task)
    clock.advance(50)
    timer.add(task)  # now due at 1_150 instead of 1_100
    assert len(timer) == 1
    clock.set(1_100 + tick_of(timer) - 1)
    timer.advance_clock(0)
    if clock.now_ms() < 1_150:
        assert out == []
    clock.set(1_150 + tick_of(timer))
    timer.advance_clock(0)
    assert out == ["t"]
    assert timer.stats().cancelled == 0  # a move is not a cancel


def test_a_cancelled_task_can_be_added_again(timer: TimerBase, clock: ManualClock) -> None:
    out: list[str] = []
    task = Recorder(10, "t", out)
    timer.add(task)
    task.cancel()
    timer.add(task)
    assert not task.cancelled()
    clock.advance(1_000)
    timer.advance_clock(0)
    assert out == ["t"]


def test_moving_a_task_between_timers(timer: TimerBase, clock: ManualClock) -> None:
    from tickwheel import HeapTimer

    other = HeapTimer(clock=clock, executor=None)
    out: list[str] = []
    task = Recorder(10, "t", out)
    other.add(task)
    timer.add(task)
    assert (len(other), len(timer)) == (0, 1)
    clock.advance(1_000)
    other.advance_clock(0)
    timer.advance_clock(0)
    assert out == ["t"]


def test_huge_delays_are_held_and_never_fire_early(timer: TimerBase, clock: ManualClock) -> None:
    out: list[str] = []
    timer.schedule(2**62, out.append, "2**62")
    timer.schedule_at(2**80, out.append, "beyond any clock")
    far = timer.schedule(365 * 24 * 3600 * 1000, out.append, "a year")
    for step in (1, 10**3, 10**6, 10**9, 10**10):  # all within the year
        clock.advance(step)
        timer.advance_clock(0)
    assert out == []
    assert len(timer) == 3
    clock.set(far.expiration_ms + tick_of(timer))
    timer.advance_clock(0)
    assert out == ["a year"]
    clock.set(2**62 + 1_000 + tick_of(timer))
    timer.advance_clock(0)
    assert out == ["a year", "2**62"]
    assert len(timer) == 1


def test_a_task_that_raises_is_logged_counted_and_stops_nothing(
    timer: TimerBase, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    out: list[str] = []

    def boom() -> None:
        raise RuntimeError("boom")

    timer.schedule(1, boom)
    timer.schedule(1, out.append, "after")
    clock.advance(1_000)
    with caplog.at_level(logging.ERROR):
        timer.advance_clock(0)
    assert out == ["after"]
    assert timer.errors == 1 and timer.stats().errors == 1
    assert any("boom" in r.getMessage() or r.exc_info for r in caplog.records)
    timer.schedule(1, out.append, "still alive")
    clock.advance(1_000)
    timer.advance_clock(0)
    assert out == ["after", "still alive"]


def test_advance_clock_reports_whether_anything_was_due(timer: TimerBase,
                                                        clock: ManualClock) -> None:
    assert timer.advance_clock(0) is False
    timer.schedule(10, lambda: None)
    assert timer.advance_clock(0) is False
    clock.advance(1_000)
    assert timer.advance_clock(0) is True
    assert timer.advance_clock(0) is False


def test_advance_clock_never_waits_on_a_manual_clock(timer: TimerBase) -> None:
    import time

    timer.schedule(10_000, lambda: None)
    start = time.monotonic()
    assert timer.advance_clock(60_000) is False
    assert time.monotonic() - start < 1.0


def test_close_drops_pending_and_rejects_new_tasks(timer: TimerBase, clock: ManualClock) -> None:
    out: list[str] = []
    tasks = [timer.schedule(100 + i, out.append, str(i)) for i in range(5)]
    assert timer.close() == 5
    assert len(timer) == 0
    assert all(not t.pending for t in tasks)
    with pytest.raises(TimerClosed, match="closed"):
        timer.schedule(1, out.append, "late")
    clock.advance(1_000)
    timer.advance_clock(0)
    assert out == []
    assert timer.close() == 0  # idempotent


def test_close_cancels_what_is_pending_as_netty_stop_does(timer: TimerBase,
                                                          clock: ManualClock) -> None:
    out: list[str] = []
    pending = [timer.schedule(100 + i, out.append, str(i)) for i in range(3)]
    pending.append(timer.schedule(-1, out.append, "due"))  # due, but not collected yet
    pending.append(timer.schedule_periodic(10, out.append, "beat"))
    gone = timer.schedule(50, out.append, "gone")
    assert gone.cancel()
    moved = timer.schedule(70, out.append, "moved")
    timer.add(moved)  # added twice: one pending task, cancelled once
    assert timer.close() == 6
    for task in [*pending, moved]:
        assert task.cancelled() and not task.pending
        assert task.cancel() is False
    assert "cancelled" in repr(pending[0])
    s = timer.stats()
    assert (s.pending, s.cancelled, s.expired) == (0, 7, 0)
    clock.advance(1_000)
    timer.advance_clock(0)
    assert out == []


def test_context_manager_closes(clock: ManualClock) -> None:
    from tickwheel import TimingWheelTimer

    with TimingWheelTimer(clock=clock, executor=None) as t:
        t.schedule(5, lambda: None)
    assert t.closed
    assert len(t) == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_delays_are_rejected(timer: TimerBase, bad: float) -> None:
    with pytest.raises(ValueError, match="delay_ms"):
        timer.schedule(bad, lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deadline_ms"):
        timer.schedule_at(bad, lambda: None)  # type: ignore[arg-type]
    assert len(timer) == 0


@pytest.mark.parametrize("bad", ["10", None, True, [1]])
def test_non_numeric_delays_are_rejected(timer: TimerBase, bad: object) -> None:
    with pytest.raises(TypeError, match="delay_ms"):
        timer.schedule(bad, lambda: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay_ms"):
        TimerTask(bad)  # type: ignore[arg-type]


def test_float_delays_round_up_so_never_early(timer: TimerBase) -> None:
    assert timer.schedule(1.2, lambda: None).delay_ms == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("period", [0, -1, math.nan])
def test_bad_periods_are_rejected(timer: TimerBase, period: float) -> None:
    with pytest.raises(ValueError, match="period_ms"):
        timer.schedule_periodic(period, lambda: None)  # type: ignore[arg-type]


def test_periodic_fixed_rate_keeps_cadence(timer: TimerBase, clock: ManualClock) -> None:
    runs: list[int] = []
    tick = tick_of(timer)
    period = 10 * tick
    task = timer.schedule_periodic(period, lambda: runs.append(clock.now_ms()))
    for _ in range(10 * 10):
        clock.advance(tick)
        timer.advance_clock(0)
    assert len(runs) == 10
    assert all(r >= 1_000 + (i + 1) * period for i, r in enumerate(runs))
    assert task.cancel() is True
    for _ in range(50):
        clock.advance(tick)
        timer.advance_clock(0)
    assert len(runs) == 10
    assert len(timer) == 0


def test_periodic_fixed_rate_catches_up_one_run_per_advance(timer: TimerBase,
                                                            clock: ManualClock) -> None:
    runs: list[int] = []
    timer.schedule_periodic(10 * tick_of(timer), lambda: runs.append(clock.now_ms()))
    clock.advance(1_000 * tick_of(timer))  # a hundred periods at once
    timer.advance_clock(0)
    assert len(runs) == 1  # no unbounded burst inside one advance
    for _ in range(5):
        timer.advance_clock(0)
    assert len(runs) == 6


def test_periodic_fixed_delay_counts_from_the_end_of_a_run(timer: TimerBase,
                                                           clock: ManualClock) -> None:
    runs: list[int] = []
    tick = tick_of(timer)

    def slow() -> None:
        runs.append(clock.now_ms())
        clock.advance(7 * tick)  # the run itself takes time

    timer.schedule_periodic(10 * tick, slow, initial_delay_ms=0, fixed_rate=False)
    for _ in range(60):
        clock.advance(tick)
        timer.advance_clock(0)
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    assert len(runs) >= 3
    assert all(g >= 17 * tick for g in gaps)


def test_cancelling_a_periodic_task_from_inside_its_run(timer: TimerBase,
                                                        clock: ManualClock) -> None:
    runs: list[int] = []
    holder: list[TimerTask] = []

    def once() -> None:
        runs.append(1)
        assert holder[0].cancel() is True

    holder.append(timer.schedule_periodic(5, once))
    for _ in range(20):
        clock.advance(100)
        timer.advance_clock(0)
    assert runs == [1]
    assert len(timer) == 0


def test_periodic_task_survives_a_raising_run(timer: TimerBase, clock: ManualClock) -> None:
    runs: list[int] = []

    def flaky() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("first run fails")

    timer.schedule_periodic(10, flaky)
    for _ in range(10):
        clock.advance(100)
        timer.advance_clock(0)
    assert len(runs) >= 3
    assert timer.errors == 1


def test_tasks_may_schedule_and_cancel_from_inside_run(timer: TimerBase,
                                                       clock: ManualClock) -> None:
    out: list[str] = []
    victim = timer.schedule(500, out.append, "victim")

    def chain() -> None:
        out.append("chain")
        victim.cancel()
        timer.schedule(1, out.append, "child")

    timer.schedule(1, chain)
    for _ in range(5):
        clock.advance(200)
        timer.advance_clock(0)
    assert out == ["chain", "child"]


def test_stats_count_lateness(timer: TimerBase, clock: ManualClock) -> None:
    timer.schedule(10, lambda: None)
    clock.advance(510)
    timer.advance_clock(0)
    lateness = timer.stats().lateness_ms
    assert lateness.count == 1
    assert lateness.maximum == 500
    assert lateness.quantile(0.5) == 500


def test_cancel_from_many_threads_counts_exactly(timer: TimerBase, clock: ManualClock) -> None:
    tasks = [timer.schedule(1_000 + i, lambda: None) for i in range(2_000)]
    wins = [0] * 4

    def worker(k: int) -> None:
        for t in tasks:
            if t.cancel():
                wins[k] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert sum(wins) == 2_000
    assert len(timer) == 0
    assert timer.stats().cancelled == 2_000


def test_add_cancel_and_advance_from_many_threads_at_once(timer: TimerBase,
                                                          clock: ManualClock) -> None:
    runs: dict[int, int] = {}
    runs_lock = threading.Lock()
    tasks: list[TimerTask] = []
    tasks_lock = threading.Lock()
    cancelled: set[int] = set()
    stop = threading.Event()

    def ran(i: int) -> None:
        with runs_lock:
            runs[i] = runs.get(i, 0) + 1

    def adder(base: int) -> None:
        rng = random.Random(base)
        for i in range(base, base + 1_500):
            task = timer.schedule(rng.randint(0, 300), ran, i)
            with tasks_lock:
                tasks.append(task)

    def canceller(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1_500):
            with tasks_lock:
                if not tasks:
                    continue
                i = rng.randrange(len(tasks))
                task = tasks[i]
            if task.cancel():
                with runs_lock:
                    cancelled.add(int(task._args[0]))  # type: ignore[attr-defined]

    def advancer() -> None:
        while not stop.is_set():
            clock.advance(7)
            timer.advance_clock(0)

    threads = [threading.Thread(target=adder, args=(k * 10_000,)) for k in range(4)]
    threads += [threading.Thread(target=canceller, args=(k,)) for k in range(2)]
    mover = threading.Thread(target=advancer)
    mover.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stop.set()
    mover.join(timeout=60)
    clock.advance(10_000)
    timer.advance_clock(0)
    for _ in range(3):  # HashedWheelTimer moves at most 100k new timeouts per tick
        clock.advance(1_000)
        timer.advance_clock(0)
    assert len(timer) == 0
    assert all(n == 1 for n in runs.values()), "a task ran twice"
    assert not cancelled & set(runs), "a cancelled task ran"
    assert len(runs) + len(cancelled) == 6_000
    s = timer.stats()
    assert (s.scheduled, s.expired, s.cancelled) == (6_000, len(runs), len(cancelled))


def test_callbacks_with_and_without_arguments_run_and_cancel_alike(
        timer: TimerBase, clock: ManualClock) -> None:
    calls: list[tuple[object, ...]] = []
    plain = timer.schedule(10, lambda: calls.append(()))
    with_args = timer.schedule(10, lambda *a: calls.append(a), 1, "two")
    at = timer.schedule_at(clock.now_ms() + 10, lambda: calls.append(("at",)))
    gone = timer.schedule(10, lambda: calls.append(("never",)))
    assert gone.cancel() and gone.cancelled()
    assert not (plain.cancelled() or with_args.cancelled() or at.cancelled())
    clock.advance(1_000)
    timer.advance_clock(0)
    assert sorted(calls, key=repr) == sorted([(), (1, "two"), ("at",)], key=repr)
    assert not (plain.cancelled() or with_args.cancelled() or at.cancelled())
    assert gone.cancelled() and not gone.pending


@pytest.mark.parametrize("cls", ["TimingWheelTimer", "HashedWheelTimer", "HeapTimer"])
def test_a_timer_has_a_name_its_stats_carry(cls: str, clock: ManualClock) -> None:
    import tickwheel

    timer_cls = getattr(tickwheel, cls)
    named = timer_cls(clock=clock, executor=None, name="session-expiry")
    assert named.name == "session-expiry"
    stats = named.stats()
    assert (stats.name, stats.kind) == ("session-expiry", named.kind)
    assert timer_cls(clock=clock, executor=None).stats().name == named.kind
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        timer_cls(clock=clock, executor=None, name="")
    with pytest.raises(TypeError):
        timer_cls(clock=clock, executor=None, name=7)
    named.close()
    with pytest.raises(TimerClosed, match="'session-expiry' is closed"):
        named.schedule(5, print)
