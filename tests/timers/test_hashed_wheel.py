"""Netty's HashedWheelTimer: HashedWheelTimerTest's behaviours, on a manual clock."""

from __future__ import annotations

import pytest

from tickwheel import HashedWheelTimer, ManualClock, TimerClosed, TimerRejected


def make(clock: ManualClock, **kw: object) -> HashedWheelTimer:
    return HashedWheelTimer(clock=clock, executor=None, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("wanted", "actual"), [(1, 1), (3, 4), (512, 512), (513, 1024)])
def test_ticks_per_wheel_rounds_up_to_a_power_of_two(clock: ManualClock, wanted: int,
                                                     actual: int) -> None:
    assert make(clock, ticks_per_wheel=wanted).ticks_per_wheel == actual


@pytest.mark.parametrize(("kw", "arg"), [({"tick_ms": 0}, "tick_ms"),
                                         ({"ticks_per_wheel": 0}, "ticks_per_wheel"),
                                         ({"ticks_per_wheel": 2**30 + 1}, "ticks_per_wheel"),
                                         ({"max_pending": 0}, "max_pending")])
def test_bad_parameters_are_rejected(clock: ManualClock, kw: dict[str, int], arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        make(clock, **kw)


def test_schedule_timeout_should_not_run_before_delay(clock: ManualClock) -> None:
    t = make(clock, tick_ms=100, ticks_per_wheel=8)
    ran: list[int] = []
    t.schedule(1_000, lambda: ran.append(clock.now_ms()))
    for _ in range(99):
        clock.advance(10)
        t.advance_clock(0)
    assert ran == []
    clock.advance(100)
    t.advance_clock(0)
    assert ran and ran[0] >= 2_000


def test_timeouts_beyond_one_lap_wait_their_rounds(clock: ManualClock) -> None:
    t = make(clock, tick_ms=10, ticks_per_wheel=4)  # one lap is 40 ms
    ran: list[tuple[int, int]] = []
    for delay in (30, 70, 150, 410):
        t.schedule(delay, lambda d=delay: ran.append((d, clock.now_ms())))
    while len(ran) < 4:
        clock.advance(10)
        t.advance_clock(0)
    assert [d for d, _ in ran] == [30, 70, 150, 410]
    assert all(d + 1_000 <= at < d + 1_000 + 10 for d, at in ran)


def test_a_jump_of_many_laps_lands_inside_a_tick_without_running_early(
        clock: ManualClock) -> None:
    t = make(clock, tick_ms=100, ticks_per_wheel=4)
    ran: list[int] = []
    t.schedule(1_050, lambda: ran.append(clock.now_ms()))  # due at 2_050
    clock.set(2_020)  # nine ticks (two laps) at once, short of the expiration
    t.advance_clock(0)
    assert ran == []
    clock.set(2_100)
    t.advance_clock(0)
    assert ran == [2_100]


def test_max_pending_rejects_back_to_back(clock: ManualClock) -> None:
    t = make(clock, max_pending=2)
    t.schedule(1_000, lambda: None)
    t.schedule(1_000, lambda: None)
    with pytest.raises(TimerRejected, match=r"3 tasks pending, max_pending is 2") as err:
        t.schedule(1, lambda: None)
    assert (err.value.pending, err.value.limit) == (3, 2)
    assert t.size == 2


def test_max_pending_accepts_again_after_a_cancel(clock: ManualClock) -> None:
    t = make(clock, max_pending=1)
    first = t.schedule(1_000, lambda: None)
    with pytest.raises(TimerRejected):
        t.schedule(1_000, lambda: None)
    first.cancel()
    t.schedule(1_000, lambda: None)
    assert t.size == 1


def test_max_pending_accepts_again_after_a_run(clock: ManualClock) -> None:
    t = make(clock, tick_ms=10, max_pending=1)
    t.schedule(10, lambda: None)
    with pytest.raises(TimerRejected):
        t.schedule(10, lambda: None)
    clock.advance(100)
    t.advance_clock(0)
    t.schedule(10, lambda: None)
    assert t.size == 1


def test_a_huge_delay_never_fires(clock: ManualClock) -> None:
    t = make(clock, tick_ms=1, ticks_per_wheel=8)
    ran: list[int] = []
    t.schedule(2**63 - 1, lambda: ran.append(1))  # Netty's Long.MAX_VALUE
    for step in (1, 10**6, 10**12, 10**15):
        clock.advance(step)
        t.advance_clock(0)
    assert ran == [] and t.size == 1


def test_close_cancels_pending_and_rejects_new(clock: ManualClock) -> None:
    t = make(clock)
    tasks = [t.schedule(1_000 * (i + 1), lambda: None) for i in range(3)]
    assert t.close() == 3
    assert not any(task.pending for task in tasks)
    with pytest.raises(TimerClosed):
        t.schedule(1, lambda: None)


def test_new_timeouts_move_into_buckets_at_most_100k_per_tick(clock: ManualClock) -> None:
    from tickwheel.timers._hashed_wheel import MAX_TRANSFER_PER_TICK

    t = make(clock, tick_ms=10, ticks_per_wheel=8)
    ran: list[int] = []
    n = MAX_TRANSFER_PER_TICK + 5
    for _ in range(n):
        t.schedule(25, ran.append, 1)
    t.advance_clock(0)  # one tick: at most 100k leave the queue
    assert len(t._timeouts) == 5
    clock.advance(30)
    t.advance_clock(0)
    assert len(ran) == n and t.size == 0


def test_cancel_while_queued_is_exact(clock: ManualClock) -> None:
    t = make(clock, tick_ms=10)
    task = t.schedule(50, lambda: None)
    assert task.cancel() and t.size == 0
    t.add(task)  # added again while its old queue entry is still there
    t.add(task)
    assert t.size == 1
    clock.advance(100)
    t.advance_clock(0)
    assert t.stats().expired == 1 and t.size == 0
