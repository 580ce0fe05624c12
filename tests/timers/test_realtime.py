"""A few real-clock checks (driver thread, executors) with generous bounds."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

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
        deadline = time.monotonic() + 10
        while len(ok) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
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
