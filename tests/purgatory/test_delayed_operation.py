"""Kafka's DelayedOperationTest, and what tickwheel adds to it."""

from __future__ import annotations

import collections
import gc
import itertools
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.purgatory.conftest import MockOperation
from tickwheel import ManualClock, Outcome, Purgatory, TimingWheelTimer


def test_try_complete_runs_under_the_lock_in_try_complete_else_watch(
        purgatory: Purgatory) -> None:
    held: list[bool] = []

    class Op(MockOperation):
        def try_complete(self) -> bool:
            held.append(self.lock._is_owned())  # type: ignore[attr-defined]
            return False

    purgatory.try_complete_else_watch(Op(100_000), ["key"])
    assert held == [True]  # no key event while watching: one try, under the lock


def test_a_key_event_between_the_first_try_and_the_watch_is_not_missed(
        purgatory: Purgatory) -> None:
    """Kafka's reason for trying twice: the event's check_and_complete ran before the
    operation was watched, so only a second try can see what it signalled."""

    class Op(MockOperation):
        tries = 0

        def try_complete(self) -> bool:
            self.tries += 1
            if self.tries == 1:
                # Another thread, right after this try read the state: the state
                # changes and its key event comes, finding nobody to try.
                self.completable = True
                assert purgatory.check_and_complete("key") == 0
                return False
            return super().try_complete()

    op = Op(100_000)
    assert purgatory.try_complete_else_watch(op, ["other", "key"]) is True
    assert (op.tries, op.completions, op.outcome) == (2, 1, Outcome.COMPLETED)
    assert purgatory.watched == 0 and purgatory.num_delayed == 0


def test_an_operation_resolved_by_its_own_try_returning_false_is_left_nowhere(
        purgatory: Purgatory) -> None:
    """A try_complete that calls force_complete but returns False (or another thread
    resolving the operation meanwhile): the purgatory must notice, unwatch it and
    keep it out of the timer. (The compiled purgatory once raised TypeError here.)"""

    class Sloppy(MockOperation):
        def try_complete(self) -> bool:
            self.force_complete()
            return False

    op = Sloppy(100_000)
    assert purgatory.try_complete_else_watch(op, ["k", "j"]) is False
    assert (op.outcome, op.completions) == (Outcome.COMPLETED, 1)
    assert (purgatory.watched, purgatory.num_delayed, purgatory.num_keys) == (0, 0, 0)


def test_safe_try_complete_or_else_when_f_resolves_the_operation() -> None:
    op = MockOperation(100_000)
    assert op.safe_try_complete_or_else(op.force_complete) is False
    assert (op.outcome, op.completions) == (Outcome.COMPLETED, 1)


def test_duplicate_keys_are_watched_once(purgatory: Purgatory) -> None:
    op = MockOperation(100_000)
    purgatory.try_complete_else_watch(op, ("a", "b", "a"))
    assert op.keys == ("a", "b") and purgatory.watched == 2
    other = MockOperation(100_000)
    purgatory.try_complete_else_watch(other, ("c", "c"))
    assert other.keys == ("c",) and purgatory.watched == 3


def test_safe_try_complete_or_else() -> None:
    op = MockOperation(100_000)
    ran: list[bool] = []
    assert op.safe_try_complete_or_else(lambda: ran.append(True)) is False
    assert ran == [True]
    done = MockOperation(100_000)
    done.completable = True
    assert done.safe_try_complete_or_else(lambda: pytest.fail("must not run")) is True


def test_request_satisfaction(purgatory: Purgatory) -> None:
    r1, r2 = MockOperation(100_000), MockOperation(100_000)
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.try_complete_else_watch(r1, ["test1"]) is False
    assert purgatory.try_complete_else_watch(r2, ["test2"]) is False
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.check_and_complete("test2") == 0
    r1.completable = True
    assert purgatory.check_and_complete("test1") == 1
    assert purgatory.check_and_complete("test1") == 0
    r2.completable = True
    assert purgatory.check_and_complete("test2") == 1
    assert purgatory.check_and_complete("test2") == 0
    assert (r1.completions, r2.completions) == (1, 1)


def test_an_operation_that_can_complete_at_once_is_never_watched(purgatory: Purgatory) -> None:
    op = MockOperation(100_000)
    op.completable = True
    assert purgatory.try_complete_else_watch(op, ["k"]) is True
    assert (purgatory.watched, purgatory.num_delayed, purgatory.num_keys) == (0, 0, 0)
    assert op.outcome is Outcome.COMPLETED


def test_empty_keys_are_rejected(purgatory: Purgatory) -> None:
    with pytest.raises(ValueError, match="keys"):
        purgatory.try_complete_else_watch(MockOperation(10), [])


def test_a_string_as_the_keys_is_refused_not_watched_by_its_characters(
        purgatory: Purgatory) -> None:
    with pytest.raises(TypeError, match=r"not str 'topic-0': pass \['topic-0'\]"):
        purgatory.try_complete_else_watch(MockOperation(10), "topic-0")
    with pytest.raises(TypeError, match="not bytes"):
        purgatory.try_complete_else_watch(MockOperation(10), b"k")
    assert (purgatory.watched, purgatory.num_delayed) == (0, 0)


def test_an_operation_is_submitted_once(purgatory: Purgatory, clock: ManualClock) -> None:
    other = Purgatory("other", timer=TimingWheelTimer(clock=clock, executor=None),
                      reaper=False)
    op = MockOperation(100)
    assert purgatory.try_complete_else_watch(op, ["a"]) is False
    for again in (purgatory, other):
        with pytest.raises(RuntimeError, match="already submitted to purgatory 'mock'"):
            again.try_complete_else_watch(op, ["b"])
    assert op.keys == ("a",) and (purgatory.watched, other.watched) == (1, 0)
    op.completable = True
    assert purgatory.check_and_complete("a") == 1
    assert op.completions == 1 and (purgatory.watched, purgatory.num_delayed) == (0, 0)
    with pytest.raises(RuntimeError, match="submitted once"):
        purgatory.try_complete_else_watch(op, ["a"])  # done, but still not again
    other.close()


def test_request_expiry(purgatory: Purgatory, clock: ManualClock) -> None:
    r1, r2 = MockOperation(20), MockOperation(200)
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test2"])
    clock.advance(19)
    purgatory.advance_clock(0)
    assert not r1.is_completed
    clock.advance(1)
    purgatory.advance_clock(0)
    assert r1.outcome is Outcome.EXPIRED and (r1.completions, r1.expirations) == (1, 1)
    assert not r2.is_completed
    assert (purgatory.num_delayed, purgatory.watched, purgatory.num_keys) == (1, 1, 1)
    clock.advance(500)
    purgatory.advance_clock(0)
    assert r2.outcome is Outcome.EXPIRED
    stats = purgatory.stats()
    assert (stats.expired, stats.completed, stats.watched) == (2, 0, 0)
    assert stats.expiry_lateness_ms.count == 2
    assert stats.expiry_lateness_ms.maximum == 320  # r2 (due at 200) expired at 520


def test_request_purge_is_immediate(purgatory: Purgatory) -> None:
    r1, r2, r3 = MockOperation(100_000), MockOperation(100_000), MockOperation(100_000)
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert (purgatory.num_delayed, purgatory.watched, purgatory.num_keys) == (3, 6, 3)
    r2.completable = True
    r2.safe_try_complete()
    # Kafka: num_delayed drops at once but watched only after a purge; here both do.
    assert (purgatory.num_delayed, purgatory.watched) == (2, 4)
    r3.completable = True
    r3.safe_try_complete()
    assert (purgatory.num_delayed, purgatory.watched, purgatory.num_keys) == (1, 1, 1)
    r1.force_complete()
    assert (purgatory.num_delayed, purgatory.watched, purgatory.num_keys) == (0, 0, 0)


def test_cancel_for_key_returns_the_cancelled_operations(purgatory: Purgatory) -> None:
    a, b, c = MockOperation(10_000), MockOperation(10_000), MockOperation(10_000)
    purgatory.try_complete_else_watch(a, ["key"])
    purgatory.try_complete_else_watch(b, ["key", "other"])
    purgatory.try_complete_else_watch(c, ["key2"])
    cancelled = purgatory.cancel_for_key("key")
    assert set(cancelled) == {a, b}
    assert all(op.outcome is Outcome.CANCELLED and op.completions == 0 for op in cancelled)
    assert (purgatory.num_delayed, purgatory.watched, purgatory.num_keys) == (1, 1, 1)
    assert purgatory.stats().cancelled == 2


def test_cancel_for_an_unknown_key_returns_nothing(purgatory: Purgatory) -> None:
    assert purgatory.cancel_for_key("nope") == []


def test_force_complete_is_true_exactly_once(purgatory: Purgatory, clock: ManualClock) -> None:
    op = MockOperation(10)
    purgatory.try_complete_else_watch(op, ["k"])
    assert op.force_complete() is True
    assert op.force_complete() is False
    assert op.cancel() is False
    clock.advance(100)
    purgatory.advance_clock(0)
    assert (op.completions, op.expirations) == (1, 0)


def test_a_shared_lock_makes_operations_exclusive(purgatory: Purgatory) -> None:
    group_lock = threading.RLock()
    a, b = MockOperation(1_000, group_lock), MockOperation(1_000, group_lock)
    assert a.lock is b.lock is group_lock
    purgatory.try_complete_else_watch(a, ["m1"])
    purgatory.try_complete_else_watch(b, ["m2"])
    with group_lock:
        a.completable = b.completable = True
        assert purgatory.check_and_complete("m1") == 1  # reentrant: same thread
    assert purgatory.check_and_complete("m2") == 1


def test_on_complete_that_raises_still_leaves_no_trace(purgatory: Purgatory) -> None:
    class Boom(MockOperation):
        def on_complete(self) -> None:
            raise RuntimeError("boom")

    op = Boom(1_000)
    purgatory.try_complete_else_watch(op, ["k1", "k2"])
    op.completable = True
    assert purgatory.check_and_complete("k1") == 0  # raised: logged and counted
    assert op.is_completed
    assert (purgatory.watched, purgatory.num_delayed, purgatory.stats().errors) == (0, 0, 1)


def test_done_callbacks_and_the_asyncio_bridge(purgatory: Purgatory, clock: ManualClock) -> None:
    import asyncio

    op = MockOperation(50)
    purgatory.try_complete_else_watch(op, ["k"])
    seen: list[Outcome | None] = []
    op.add_done_callback(lambda o: seen.append(o.outcome))

    async def main() -> Outcome:
        waiter = asyncio.ensure_future(purgatory.wait(op))
        await asyncio.sleep(0)
        assert not waiter.done()
        # Expire it from another thread, as a reaper would.
        def expire() -> None:
            clock.advance(50)
            purgatory.advance_clock(0)

        await asyncio.get_running_loop().run_in_executor(None, expire)
        return await asyncio.wait_for(waiter, 10)

    assert asyncio.run(main()) is Outcome.EXPIRED
    assert seen == [Outcome.EXPIRED]
    late: list[Outcome | None] = []
    op.add_done_callback(lambda o: late.append(o.outcome))  # already resolved: at once
    assert late == [Outcome.EXPIRED]


def test_delayed_future_completes_when_all_futures_are_done(purgatory: Purgatory) -> None:
    from concurrent.futures import Future

    futures: list[Future[int]] = [Future(), Future()]
    calls: list[list[int]] = []
    op = purgatory.watch_futures(futures, 1_000,
                                 lambda fs: calls.append([f.result() for f in fs]))
    futures[0].set_result(1)
    assert calls == [] and not op.is_completed
    futures[1].set_result(2)
    assert calls == [[1, 2]] and op.outcome is Outcome.COMPLETED
    assert purgatory.watched == 0


def test_delayed_future_fails_the_rest_on_timeout(purgatory: Purgatory,
                                                  clock: ManualClock) -> None:
    from concurrent.futures import Future

    futures: list[Future[int]] = [Future(), Future()]
    futures[0].set_result(1)
    calls: list[int] = []
    op = purgatory.watch_futures(futures, 100, lambda fs: calls.append(len(fs)))
    clock.advance(100)
    purgatory.advance_clock(0)
    assert op.outcome is Outcome.EXPIRED and calls == [2]
    assert futures[0].result() == 1
    with pytest.raises(TimeoutError):
        futures[1].result(timeout=0)


def test_try_complete_with_many_threads(purgatory: Purgatory) -> None:
    # Kafka: 100 operations, each completing on its 20th attempt; 20 concurrent
    # check_and_complete calls per key. No wakeup may be lost and on_complete runs once.
    attempts = 20

    class Counting(MockOperation):
        def __init__(self) -> None:
            super().__init__(100_000)
            self.tries = 0

        def try_complete(self) -> bool:
            self.tries += 1
            if self.tries >= attempts:
                return self.force_complete()
            return False

    ops = [Counting() for _ in range(100)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"key{i}"])
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(purgatory.check_and_complete, f"key{i}")
                   for _ in range(attempts) for i in range(len(ops))]
        total = sum(f.result(timeout=60) for f in futures)
    assert total == 100
    assert all(op.is_completed and op.completions == 1 for op in ops)
    assert (purgatory.watched, purgatory.num_delayed, purgatory.num_keys) == (0, 0, 0)


def test_no_wakeup_is_lost_while_operations_are_being_watched(purgatory: Purgatory) -> None:
    """Watching races key events: 3 threads watch operations, each on its own key, and
    announce each one as they start watching it; 2 threads move each announced key once
    and call check_and_complete on it, so the event lands before, during or after the
    watch. An operation completes once its key moved; with one event per key, none may
    be left pending (the case of the second try, and of the shard epochs that decide
    whether it runs)."""
    per_thread, watchers, signallers = 1_000, 3, 2
    total = per_thread * watchers
    versions = [0] * total
    announced: collections.deque[int] = collections.deque()
    made: list[MockOperation | None] = [None] * total

    class VersionOp(MockOperation):
        def __init__(self, key: int) -> None:
            super().__init__(10_000_000)
            self.key = key

        def try_complete(self) -> bool:
            current = versions[self.key]
            time.sleep(0)  # a slow check: others run between reading and deciding
            if current != 0:
                return self.force_complete()
            return False

    start = threading.Barrier(watchers + signallers)

    def watcher(n: int) -> None:
        start.wait(timeout=30)
        for key in range(n * per_thread, (n + 1) * per_thread):
            op = VersionOp(key)
            made[key] = op
            announced.append(key)
            purgatory.try_complete_else_watch(op, (key, f"other{key % 97}"))

    done = itertools.count(1)  # next() is atomic: counts keys signalled
    finished = threading.Event()

    def signaller() -> None:
        start.wait(timeout=30)
        deadline = time.monotonic() + 60
        while not finished.is_set() and time.monotonic() < deadline:
            try:
                key = announced.popleft()
            except IndexError:
                time.sleep(0)
                continue
            versions[key] = 1
            purgatory.check_and_complete(key)
            if next(done) == total:
                finished.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    try:
        threads = [threading.Thread(target=watcher, args=(n,)) for n in range(watchers)]
        threads += [threading.Thread(target=signaller) for _ in range(signallers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert all(versions), "every key was signalled once"
    lost = [op for op in made if op is None or not op.is_completed]
    assert not lost, f"{len(lost)} operations missed the key event that completes them"
    assert all(op is not None and op.completions == 1 for op in made)
    stats = purgatory.stats()
    assert (stats.completed, stats.watched, stats.num_delayed) == (total, 0, 0)


@pytest.mark.realtime
def test_complete_cancel_and_expire_race_resolve_each_operation_once() -> None:
    purgatory = Purgatory("race", timer=TimingWheelTimer(executor=None), reaper=True)
    ops = [MockOperation(random.Random(i).randint(0, 30)) for i in range(3_000)]
    # Watch them while they cannot complete yet, then let 16 threads race.
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"k{i % 50}", f"j{i % 7}"])
    for op in ops:
        op.completable = True
    start = threading.Barrier(16)

    def racer(n: int) -> None:
        start.wait(timeout=30)
        rng = random.Random(n)
        for _ in range(300):
            choice = rng.random()
            if choice < 0.4:
                purgatory.check_and_complete(f"k{rng.randrange(50)}")
            elif choice < 0.6:
                purgatory.cancel_for_key(f"j{rng.randrange(7)}")
            elif choice < 0.8:
                ops[rng.randrange(len(ops))].force_complete()
            else:
                purgatory.advance_clock(0)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # Whatever is left expires.
    deadline = time.monotonic() + 30
    while not all(op.is_completed for op in ops) and time.monotonic() < deadline:
        purgatory.advance_clock(50)
    purgatory.close()
    assert all(op.is_completed for op in ops)
    for op in ops:
        if op.outcome is Outcome.CANCELLED:
            assert (op.completions, op.expirations) == (0, 0)
        elif op.outcome is Outcome.EXPIRED:
            assert (op.completions, op.expirations) == (1, 1)
        else:
            assert (op.completions, op.expirations) == (1, 0)
    stats = purgatory.stats()
    assert stats.completed + stats.expired + stats.cancelled == len(ops)
    assert (stats.watched, stats.num_keys) == (0, 0)


@pytest.mark.slow
def test_memory_returns_to_baseline_after_a_million_operations_come_and_go(
        clock: ManualClock) -> None:
    purgatory = Purgatory("mem", timer=TimingWheelTimer(clock=clock, executor=None),
                          reaper=False)
    batch = 20_000

    def one_round() -> None:
        ops = [MockOperation(1_000) for _ in range(batch)]
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [i % 5_000, -(i % 777)])
        for op in ops[1::2]:
            op.completable = True
        for k in range(5_000):
            purgatory.check_and_complete(k)
        clock.advance(1_000)
        purgatory.advance_clock(0)  # the other half expires
        assert all(op.is_completed for op in ops)

    one_round()  # warm up: first-use allocations (wheel levels, shard dicts) stay
    gc.collect()
    baseline = sys.getallocatedblocks()
    for _ in range(49):  # 1M operations in all, 20k pending at a time
        one_round()
    gc.collect()
    left = sys.getallocatedblocks() - baseline
    stats = purgatory.stats()
    assert stats.completed + stats.expired == 1_000_000
    assert (stats.watched, stats.num_keys, stats.num_delayed) == (0, 0, 0)
    # A leak of one object per operation would leave ~1M blocks behind.
    assert left < 1_000, f"{left} memory blocks left behind"


@pytest.mark.realtime
def test_the_reaper_expires_on_a_real_clock_and_close_wakes_it() -> None:
    purgatory = Purgatory("reaped")  # SystemClock, its own timer and reaper thread
    op = MockOperation(30)
    done = threading.Event()
    op.add_done_callback(lambda _: done.set())
    purgatory.try_complete_else_watch(op, ["k"])
    assert done.wait(10), "the reaper did not expire the operation"
    assert op.outcome is Outcome.EXPIRED
    started = time.monotonic()
    purgatory.close()
    assert time.monotonic() - started < 2.0  # woken, not left to finish its 200 ms poll


# -- closing -----------------------------------------------------------------------------


def test_close_resolves_every_pending_operation_as_cancelled(clock: ManualClock) -> None:
    import asyncio

    timer = TimingWheelTimer(clock=clock, executor=None)
    purgatory = Purgatory("closing", timer=timer, reaper=False)
    ops = [MockOperation(1_000) for _ in range(4)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"k{i % 2}", "shared"])
    done = MockOperation(1_000)
    done.completable = True
    purgatory.try_complete_else_watch(done, ["k0"])  # completed at once: not pending
    seen: list[Outcome | None] = []
    ops[0].add_done_callback(lambda o: seen.append(o.outcome))

    async def main() -> Outcome:
        waiter = asyncio.ensure_future(purgatory.wait(ops[1]))
        await asyncio.sleep(0)
        assert purgatory.close() == 4
        return await asyncio.wait_for(waiter, 10)

    assert asyncio.run(main()) is Outcome.CANCELLED  # an outcome, not an exception
    assert seen == [Outcome.CANCELLED]
    assert all(op.outcome is Outcome.CANCELLED and op.completions == 1 for op in ops)
    assert done.outcome is Outcome.COMPLETED and done.completions == 1
    assert (purgatory.watched, purgatory.num_keys, len(timer)) == (0, 0, 0)
    assert purgatory.stats().cancelled == 4
    assert purgatory.close() == 0
    with pytest.raises(RuntimeError, match="closed"):
        purgatory.try_complete_else_watch(MockOperation(1), ["k"])
    clock.advance(5_000)
    timer.advance_clock(0)
    assert all(op.expirations == 0 and op.completions == 1 for op in ops)


def test_closing_a_bare_timer_cancels_its_operations() -> None:
    clock = ManualClock()
    timer = TimingWheelTimer(clock=clock, executor=None)
    op = MockOperation(100)
    seen: list[Outcome | None] = []
    op.add_done_callback(lambda o: seen.append(o.outcome))
    timer.add(op)
    assert timer.close() == 1
    assert op.outcome is Outcome.CANCELLED and op.cancelled
    assert seen == [Outcome.CANCELLED] and op.completions == 0  # cancelled: no on_complete
