"""A few real-clock checks (driver thread, executors) with generous bounds."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import eventually
from tickwheel import HashedWheelTimer, HeapTimer, TimerBase, TimingWheelTimer

pytestmark = pytest.mark.realtime

REAL_TIMERS = [TimingWheelTimer, lambda: HashedWheelTimer(tick_ms=10), HeapTimer]


@pytest.mark.parametrize("make", REAL_TIMERS, ids=["timing_wheel", "hashed_wheel", "heap"])
def test_driver_thread_runs_tasks_on_time(make: object) -> None:
    # Kafka's SystemTimerReaperTest: the reaper alone expires the tasks.
    done = threading.Event()
    ran_at: list[float] = []
    start = time.monotonic()
    timer: TimerBase = make()  # type: ignore[operator]
    with timer:
        for delay in (20, 40, 60):
            timer.schedule(delay, lambda: (ran_at.append(time.monotonic() - start),
                                           len(ran_at) == 3 and done.set()))
        assert done.wait(10.0), "tasks did not run within 10 s"
    assert len(ran_at) == 3
    assert ran_at == sorted(ran_at)
    assert ran_at[0] >= 0.019  # never early


def _drivers(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"tickwheel-{name}-driver"]


@pytest.mark.parametrize("make", REAL_TIMERS, ids=["timing_wheel", "hashed_wheel", "heap"])
def test_a_timer_that_runs_its_own_tasks_starts_its_driver_at_the_first_add(
        make: object) -> None:
    # Netty's HashedWheelTimer starts its worker at the first newTimeout: a timer left
    # unstarted on the real clock would otherwise hold its tasks forever, silently.
    timer: TimerBase = make()  # type: ignore[operator]
    try:
        assert _drivers(timer.name) == []
        done = threading.Event()
        timer.schedule(5, done.set)
        assert done.wait(10.0), "the task did not run within 10 s"
        assert len(_drivers(timer.name)) == 1
    finally:
        timer.close()


def test_a_timer_its_caller_drives_starts_no_driver() -> None:
    from tickwheel import DelayedOperation, Outcome, Purgatory

    class Never(DelayedOperation):
        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            pass

    driven = TimingWheelTimer(name="driven")
    driven.advance_clock(0)  # its caller drives it
    bare = TimingWheelTimer(name="bare", executor=None)  # no executor to run tasks on
    reaped = Purgatory("reaped", timer=TimingWheelTimer(name="reaped"))  # its reaper drives
    owned_drivers = len(_drivers("timer"))
    manual = Purgatory("manual", reaper=False)  # its caller drives its own timer
    try:
        driven.schedule(1, lambda: None)
        bare.schedule(1, lambda: None)
        op = Never(1)
        reaped.try_complete_else_watch(op, ["k"])
        manual.try_complete_else_watch(Never(1), ["k"])
        eventually(lambda: op.outcome is not None, 10)
        assert op.outcome is Outcome.EXPIRED  # by the reaper
        assert [_drivers(n) for n in ("driven", "bare", "reaped")] == [[], [], []]
        assert len(_drivers("timer")) == owned_drivers
        assert driven.size == bare.size == manual.num_delayed == 1  # still held
    finally:
        driven.close()
        bare.close()
        reaped.close()
        manual.close()


def test_driver_wakes_for_an_earlier_task() -> None:
    timer = TimingWheelTimer()
    with timer:
        time.sleep(0.05)  # the driver is now waiting up to 200 ms with nothing pending
        done = threading.Event()
        t0 = time.monotonic()
        timer.schedule(1, done.set)
        assert done.wait(10.0)
    assert time.monotonic() - t0 < 5.0


def test_user_executor_runs_tasks_in_parallel() -> None:
    barrier = threading.Barrier(2, timeout=10)
    pool = ThreadPoolExecutor(max_workers=2)
    timer = TimingWheelTimer(executor=pool)
    ok: list[bool] = []
    with timer:
        for _ in range(2):
            timer.schedule(5, lambda: ok.append(barrier.wait() >= 0))
        eventually(lambda: len(ok) >= 2, 10)
    pool.shutdown()
    assert ok == [True, True]  # both ran at once, or the barrier would have broken


def test_close_while_busy_waits_for_running_tasks_and_drops_the_rest() -> None:
    timer = TimingWheelTimer()
    started = threading.Event()
    finished: list[int] = []

    def slow() -> None:
        started.set()
        time.sleep(0.2)
        finished.append(1)

    timer.start()
    timer.schedule(1, slow)
    for _ in range(100):
        timer.schedule(60_000, lambda: None)
    assert started.wait(10.0)
    assert timer.close() == 100
    assert finished == [1]  # the running task was allowed to finish


def test_close_from_inside_a_task_does_not_deadlock() -> None:
    timer = TimingWheelTimer()
    closed = threading.Event()
    timer.start()
    timer.schedule(1, lambda: (timer.close(), closed.set()))
    assert closed.wait(10.0)
    assert timer.closed
