"""Kafka's hierarchical timing wheel: TimerTest, TimingWheelTest and TimerTaskListTest."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import cast

import pytest

from tickwheel import ManualClock, TimerTask, TimingWheelTimer
from tickwheel.timers._bucket import Bucket


class Counted(TimerTask):
    def __init__(self, delay_ms: int, tag: int, out: list[int]) -> None:
        super().__init__(delay_ms)
        self.tag = tag
        self.out = out

    def run(self) -> None:
        self.out.append(self.tag)


@pytest.fixture
def wheel(clock: ManualClock) -> Iterator[TimingWheelTimer]:
    t = TimingWheelTimer(tick_ms=1, wheel_size=3, clock=clock, executor=None)
    yield t
    t.close()


def test_already_expired_tasks_run_at_the_next_advance(wheel: TimingWheelTimer) -> None:
    out: list[int] = []
    for i in range(-5, 0):
        wheel.add(Counted(i, i, out))
    assert wheel.size == 5
    wheel.advance_clock(0)
    assert sorted(out) == [-5, -4, -3, -2, -1]
    assert wheel.size == 0


def test_task_expiration_over_many_levels(wheel: TimingWheelTimer, clock: ManualClock) -> None:
    # Kafka's testTaskExpiration: three groups of delays; each task runs at its time.
    out: list[int] = []
    expected: dict[int, int] = {}
    for delay in list(range(5)) + list(range(10, 100, 7)) + list(range(100, 500, 37)):
        wheel.add(Counted(delay, delay, out))
        expected[delay] = 1_000 + delay
    ran_at: dict[int, int] = {}
    while wheel.size:
        clock.advance(1)
        before = len(out)
        wheel.advance_clock(0)
        for tag in out[before:]:
            ran_at[tag] = clock.now_ms()
    assert ran_at == {d: max(at, 1_001) for d, at in expected.items()}


def test_overflow_wheels_are_created_on_demand() -> None:
    t = TimingWheelTimer(tick_ms=1, wheel_size=20, clock=ManualClock(0), executor=None)
    assert t.levels == 1
    t.schedule(19, lambda: None)
    assert t.levels == 1
    t.schedule(399, lambda: None)  # 20 * 20 = 400 ms covered by two levels
    assert t.levels == 2
    t.schedule(7_999, lambda: None)
    assert t.levels == 3
    t.schedule(10 * 365 * 24 * 3600 * 1000, lambda: None)  # ten years
    assert t.levels == 9  # 20**8 < 3.2e11 ms < 20**9


def test_demotion_runs_a_far_task_exactly_at_its_expiration(clock: ManualClock) -> None:
    t = TimingWheelTimer(tick_ms=1, wheel_size=4, clock=clock, executor=None)
    ran: list[int] = []
    t.schedule(1_234, lambda: ran.append(clock.now_ms()))
    for _ in range(1_300):
        clock.advance(1)
        t.advance_clock(0)
    assert ran == [2_234]
    # It was demoted level by level: flushes > 1 but far fewer than the 1,234 ticks.
    assert 1 < t.bucket_flushes < 30


def test_no_idle_ticks_a_single_jump_flushes_only_due_buckets(clock: ManualClock) -> None:
    t = TimingWheelTimer(tick_ms=1, wheel_size=256, clock=clock, executor=None)
    ran: list[int] = []
    t.schedule(10**12, lambda: ran.append(clock.now_ms()))
    clock.advance(10**12)
    assert t.advance_clock(0)
    assert ran == [1_000 + 10**12]
    # One flush per level the task passes through, not 10**12 ticks.
    assert t.bucket_flushes <= t.levels


def test_buckets_due_at_one_tick_flush_finer_level_first_in_every_run() -> None:
    # A jump over a tick at which a first-level bucket and a second-level one are both
    # due: the finer bucket's tasks expire first, so they run first, in every run and
    # whatever the buckets' addresses (20 timers, each allocated anew).
    for _ in range(20):
        clock = ManualClock(0)
        t = TimingWheelTimer(tick_ms=1, wheel_size=256, clock=clock, executor=None)
        ran: list[str] = []
        clock.set(10_616)
        t.schedule_at(11_016, ran.append, "second level, due at 11,016")  # flush at 11,008
        clock.set(10_908)
        t.advance_clock(0)
        t.schedule_at(11_008, ran.append, "first level, due at 11,008")
        clock.set(11_016)
        t.advance_clock(0)
        assert ran == ["first level, due at 11,008", "second level, due at 11,016"]


def test_coarse_ticks_never_run_early_unlike_kafka(clock: ManualClock) -> None:
    # Kafka rounds the expiration down to its tick and may run up to tick_ms - 1 early.
    t = TimingWheelTimer(tick_ms=100, wheel_size=8, clock=clock, executor=None)
    ran: list[int] = []
    t.schedule(150, lambda: ran.append(clock.now_ms()))  # due at 1_150
    clock.set(1_100)
    t.advance_clock(0)
    clock.set(1_149)
    t.advance_clock(0)
    assert ran == []
    clock.set(1_200)
    t.advance_clock(0)
    assert ran == [1_200]  # at most one tick late


def test_next_expiration_is_the_earliest_task_where_the_next_bucket_is_not() -> None:
    clock = ManualClock(0)
    t = TimingWheelTimer(tick_ms=1, wheel_size=4, clock=clock, executor=None)
    t.schedule(14, lambda: None)  # level 1: the bucket of [12, 16), due at 12
    clock.set(10)
    t.advance_clock(0)
    late = t.schedule(3, lambda: None)  # level 0: due at 13
    assert t.next_due_ms() == 12  # a flush that would only demote
    assert t.next_expiration_ms() == 13
    late.cancel()
    assert t.next_expiration_ms() == 14
    t.close()
    assert t.next_expiration_ms() is None


@pytest.mark.parametrize("seed", range(5))
def test_next_expiration_and_pending_entries_match_the_pending_tasks_under_churn(
        seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(0)
    t = TimingWheelTimer(tick_ms=rng.choice([1, 7]), wheel_size=rng.choice([2, 4, 16]),
                         clock=clock, executor=None)
    pending: dict[int, tuple[int, TimerTask]] = {}
    for step in range(2_000):
        action = rng.random()
        if action < 0.5:
            delay = rng.choice([rng.randrange(-5, 50), rng.randrange(10_000)])
            task = t.schedule(delay, pending.pop, step)
            pending[step] = (clock.now_ms() + delay, task)
        elif action < 0.7 and pending:
            pending.pop(rng.choice(list(pending)))[1].cancel()
        else:
            clock.advance(rng.randrange(30))
            t.advance_clock(0)
        expected = min((when for when, _ in pending.values()), default=None)
        assert t.next_expiration_ms() == expected
        if step % 20 == 0:  # every pending task, once each
            listed = sorted(id(entry) for entry in t.pending_entries())
            assert listed == sorted(id(task) for _, task in pending.values())
    t.close()
    assert t.pending_entries() == []


@pytest.mark.parametrize(("tick_ms", "wheel_size", "arg"),
                         [(0, 20, "tick_ms"), (-1, 20, "tick_ms"), (1, 0, "wheel_size"),
                          (1, 1, "wheel_size")])
def test_bad_wheel_parameters_are_rejected(tick_ms: int, wheel_size: int, arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        TimingWheelTimer(tick_ms=tick_ms, wheel_size=wheel_size, executor=None)


# -- TimerTaskListTest: the bucket ------------------------------------------------------


def test_bucket_holds_moves_and_drains(clock: ManualClock) -> None:
    t = TimingWheelTimer(clock=clock, executor=None)
    a, b = Bucket(t), Bucket(t)
    tasks = [Counted(10, i, []) for i in range(10)]
    for task in tasks:
        a.append(task)
    assert len(a) == 10 and len(b) == 0
    for task in tasks[:5]:
        a.unlink(task)
        b.append(task)
    assert len(a) == 5 and len(b) == 5
    assert sorted(cast(Counted, x).tag for x in b.drain()) == [0, 1, 2, 3, 4]
    assert b.empty and all(not x.pending for x in tasks[:5])
    a.unlink(tasks[7])  # from the middle: the last task takes its place
    assert not tasks[7].pending
    a.unlink(tasks[9])  # the last one
    assert sorted(cast(Counted, x).tag for x in a.drain()) == [5, 6, 8]


def test_re_adding_tasks_moves_them_and_keeps_the_count_exact(clock: ManualClock) -> None:
    # Kafka's TimerTaskListTest: the shared task counter stays exact as tasks move.
    t = TimingWheelTimer(clock=clock, executor=None)
    out: list[int] = []
    tasks = [Counted(10, i, out) for i in range(10)]
    for task in tasks:
        t.add(task)
    assert t.size == 10
    for task in tasks[:5]:
        task._delay_ms = 20
        t.add(task)
    assert t.size == 10
    for task in tasks[5:]:
        task.cancel()
    assert t.size == 5
    clock.advance(25)
    t.advance_clock(0)
    assert sorted(out) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("tick_ms", [1, 3, 100])
@pytest.mark.parametrize("deadline", [-1, -2, 0, -256, -257])
def test_a_task_due_at_any_tick_runs_negative_ones_included(tick_ms: int, deadline: int) -> None:
    # A bucket due at tick -1 once looked "not queued" (the sentinel was -1) and never ran.
    clock = ManualClock(-10_000)
    timer = TimingWheelTimer(tick_ms=tick_ms, clock=clock, executor=None)
    ran: list[int] = []
    timer.schedule_at(deadline, lambda: ran.append(clock.now_ms()))
    clock.set(deadline - 1)
    timer.advance_clock(0)
    assert ran == []
    clock.set(10_000)
    timer.advance_clock(0)
    assert ran == [10_000]
    assert len(timer) == 0


def test_shared_bucket_positions_stay_exact_when_threads_grow_them_at_once() -> None:
    import random
    import threading

    from tickwheel.timers import _bucket

    seen: list[tuple[int, int]] = []

    def grow(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(2_000):
            n = rng.randrange(1 << 17)
            seen.append((n, _bucket.position(n)))

    threads = [threading.Thread(target=grow, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(n == got for n, got in seen)
    assert all(_bucket.position(n) == n for n in range(0, 1 << 17, 97))
    assert len(_bucket._positions) <= 1 << 16  # bounded; past it, plain ints


def test_a_bucket_keeps_its_earliest_expiration_and_rescans_only_when_that_task_leaves(
        ) -> None:
    clock = ManualClock(0)
    t = TimingWheelTimer(tick_ms=1, wheel_size=4, clock=clock, executor=None)
    tasks = {delay: t.schedule(delay, lambda: None) for delay in (200, 210, 220, 230)}
    bucket = tasks[200]._owner
    assert all(task._owner is bucket for task in tasks.values())  # one far bucket
    assert isinstance(bucket, Bucket)
    assert bucket.earliest_expiration() == 200
    tasks[220].cancel()  # not the earliest: nothing to learn again
    assert bucket.earliest_known
    assert t.next_expiration_ms() == 200
    tasks[200].cancel()
    assert not bucket.earliest_known
    assert t.next_expiration_ms() == 210
    assert bucket.earliest_known
    t.schedule(205, lambda: None)
    assert t.next_expiration_ms() == 205
    t.close()
