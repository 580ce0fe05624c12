"""Mutex: the timers' lock behaves as threading.Lock does where the timers rely on it."""

from __future__ import annotations

import threading

import pytest

from tickwheel._mutex import Mutex


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
