"""Mutex: the timers' lock behaves as threading.Lock does where the timers rely on it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tickwheel
from tickwheel._mutex import Mutex, native


def test_a_mutex_is_held_by_one_owner_at_a_time() -> None:
    m = Mutex()
    assert not m.locked()
    assert m.acquire()
    assert m.locked()
    assert not m.acquire(blocking=False)
    assert not m.acquire(timeout=0.01)
    m.release()
    assert not m.locked()
    assert m.acquire(blocking=False)
    m.release()


def test_with_takes_and_gives_back_even_on_error() -> None:
    m = Mutex()
    with pytest.raises(KeyError), m:
        assert m.locked()
        raise KeyError("boom")
    assert not m.locked()


def test_releasing_an_unlocked_mutex_raises_and_does_not_add_a_second_token() -> None:
    m = Mutex()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        m.release()
    assert m.acquire(blocking=False)
    assert not m.acquire(blocking=False)
    m.release()


def test_bad_acquire_arguments_are_rejected_as_lock_rejects_them() -> None:
    m = Mutex()
    with pytest.raises(ValueError, match="non-blocking"):
        m.acquire(blocking=False, timeout=1)
    with pytest.raises(ValueError, match="non-negative"):
        m.acquire(timeout=-5)
    assert not m.locked()


def test_a_blocked_acquirer_gets_the_mutex_once_it_is_released() -> None:
    m = Mutex()
    m.acquire()
    got = threading.Event()

    def take() -> None:
        with m:
            got.set()

    t = threading.Thread(target=take)
    t.start()
    assert not got.wait(0.05)  # blocked while we hold it
    m.release()
    assert got.wait(10)
    t.join(10)
    assert not m.locked()


def test_threads_never_overlap_inside_the_mutex() -> None:
    m = Mutex()
    inside = 0
    overlaps = 0
    total = 0

    def work() -> None:
        nonlocal inside, overlaps, total
        for _ in range(2_000):
            with m:
                inside += 1
                if inside != 1:
                    overlaps += 1
                total += 1
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert overlaps == 0
    assert total == 16_000


def test_a_condition_can_wait_on_a_mutex() -> None:
    m = Mutex()
    cond = threading.Condition(m)  # type: ignore[arg-type]
    ready: list[int] = []

    def produce() -> None:
        with cond:
            ready.append(1)
            cond.notify()

    with cond:
        t = threading.Thread(target=produce)
        t.start()
        assert cond.wait_for(lambda: ready, timeout=10)
        assert m.locked()  # wait() hands the mutex back before returning
    t.join(10)
    assert not m.locked()


def test_a_timed_acquire_of_a_held_mutex_gives_up_after_its_timeout() -> None:
    m = Mutex()
    m.acquire()
    t0 = time.monotonic()
    assert not m.acquire(timeout=0.05)
    assert time.monotonic() - t0 >= 0.04  # generous: never early by more than clock grain
    m.release()
    assert m.acquire(timeout=0.05)
    m.release()


def test_a_timed_acquire_waits_for_a_release_from_another_thread() -> None:
    m = Mutex()
    m.acquire()
    releaser = threading.Timer(0.02, m.release)  # Lock semantics: any thread may release
    releaser.start()
    assert m.acquire(timeout=30)
    releaser.join(10)
    m.release()


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_a_signal_handler_that_raises_interrupts_a_blocked_acquire() -> None:
    # As with threading.Lock, Ctrl-C must get a thread out of a lock it waits for.
    m = Mutex()
    m.acquire()

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            m.acquire()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert m.locked()  # still ours: the interrupted call took nothing
    m.release()
    assert not m.locked()


@pytest.mark.skipif(not native, reason="the C lock is built only where a C compiler exists")
def test_the_raw_lock_rejects_bad_arguments_with_clear_errors() -> None:
    from tickwheel._rawlock import RawLock

    with pytest.raises(TypeError, match="takes no arguments"):
        RawLock(1)  # type: ignore[call-arg]
    lock = RawLock()
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="non-negative"):
            lock.acquire_for(bad)
    with pytest.raises(TypeError):
        lock.acquire_for("soon")  # type: ignore[arg-type]
    assert not lock.locked()
    assert lock.acquire_for(float("inf"))  # free: taken at once, whatever the timeout
    assert not lock.try_acquire()
    assert not lock.acquire_for(0)
    lock.release()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()



def test_pure_python_timers_take_a_plain_threading_lock(tmp_path: Path) -> None:
    # A copy of the sources without the compiled modules: the install without a compiler.
    package = Path(tickwheel.__file__).parent
    shutil.copytree(package, tmp_path / "tickwheel",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    script = (
        "import threading, tickwheel\n"
        "from tickwheel import ManualClock, TimingWheelTimer\n"
        "assert not tickwheel.compiled\n"
        "clock = ManualClock(0)\n"
        "timer = TimingWheelTimer(clock=clock, executor=None)\n"
        "assert type(timer._lock) is type(threading.Lock())\n"
        "ran = []\n"
        "timer.schedule(5, ran.append, 1)\n"
        "clock.advance(5)\n"
        "timer.advance_clock(0)\n"
        "assert ran == [1]\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
