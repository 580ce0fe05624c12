"""Eureka's batcher: AcceptorExecutorTest, TaskExecutorsTest, TaskDispatchersTest."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import eventually
from tickwheel import (
    DispatcherClosed,
    DispatcherOverloaded,
    ManualClock,
    ProcessingResult,
    TaskDispatcher,
    create_batching_dispatcher,
    create_non_batching_dispatcher,
)
from tickwheel.dispatch._shaper import MAX_DELAY_MS, TrafficShaper

FAR = 10**12  # an expiry nobody reaches


class Recorder:
    """A processor that records what it saw and answers from a script."""

    def __init__(self, script: list[ProcessingResult] | None = None,
                 pause_s: float = 0.0) -> None:
        self.script = list(script or [])
        self.pause_s = pause_s
        self.batches: list[list[object]] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set once a call is inside process_batch

    def _answer(self) -> ProcessingResult:
        with self.lock:
            return self.script.pop(0) if self.script else ProcessingResult.SUCCESS

    def process(self, task: object) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[object]) -> ProcessingResult:
        self.entered.set()
        self.gate.wait(10)
        if self.pause_s:
            time.sleep(self.pause_s)
        with self.lock:
            self.batches.append(list(tasks))
        return self._answer()

    @property
    def seen(self) -> list[object]:
        with self.lock:
            return [t for b in self.batches for t in b]


def looked(d: TaskDispatcher[object], passes: int = 3) -> None:
    """Wait until the acceptor has made ``passes`` more passes over its queues: what
    it would hand out now, it has."""
    start = d.acceptor_passes
    assert eventually(lambda: d.acceptor_passes >= start + passes)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000)


@pytest.fixture
def closing() -> Iterator[list[TaskDispatcher[object]]]:
    made: list[TaskDispatcher[object]] = []
    yield made
    for d in made:
        d.close(timeout_s=5)


def batching(closing: list[TaskDispatcher[object]], processor: Recorder, clock: ManualClock,
             **kw: int) -> TaskDispatcher[object]:
    d: TaskDispatcher[object] = create_batching_dispatcher("test", processor, clock=clock,
                                                           **kw)  # type: ignore[arg-type]
    closing.append(d)
    return d


# -- AcceptorExecutorTest ----------------------------------------------------------------


def test_tasks_are_dispatched_to_workers(closing: list[TaskDispatcher[object]],
                                         clock: ManualClock) -> None:
    p = Recorder()
    d = create_non_batching_dispatcher("single", p, worker_count=2, clock=clock)
    closing.append(d)
    d.process("a", "task-a", FAR)
    assert eventually(lambda: p.seen == ["task-a"])
    assert d.stats().accepted == 1


def test_batch_size_is_constrained_by_max_batch_size(closing: list[TaskDispatcher[object]],
                                                     clock: ManualClock) -> None:
    p = Recorder()
    p.gate.clear()
    d = batching(closing, p, clock, max_batch_size=5, worker_count=1, max_batching_delay_ms=0)
    for i in range(6):
        d.process(i, i, FAR)
    p.gate.set()
    assert eventually(lambda: len(p.seen) == 6)
    assert max(len(b) for b in p.batches) <= 5


def test_a_new_task_overrides_the_old_one_and_keeps_its_place(
        closing: list[TaskDispatcher[object]], clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_batch_size=10, worker_count=1,
                 max_batching_delay_ms=100)
    d.process("x", "x-old", FAR)
    d.process("y", "y", FAR)
    d.process("x", "x-new", FAR)
    assert eventually(lambda: d.stats().pending == 2)
    clock.advance(100)  # the oldest has now waited max_batching_delay_ms
    assert eventually(lambda: len(p.seen) == 2)
    assert p.seen == ["x-new", "y"]
    assert d.stats().overridden == 1


def test_process_all_hands_over_in_order_and_overrides_like_process(
        closing: list[TaskDispatcher[object]], clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_batch_size=10, worker_count=1,
                 max_batching_delay_ms=100)
    assert d.process_all([("x", "x-old", FAR), ("y", "y", FAR), ("x", "x-new", FAR)]) == 3
    assert eventually(lambda: d.backlog == 2)
    assert p.seen == []  # still batching: the oldest has not waited long enough
    clock.advance(100)
    assert eventually(lambda: len(p.seen) == 2)
    assert p.seen == ["x-new", "y"]
    stats = d.stats()
    assert (stats.accepted, stats.overridden, d.backlog) == (3, 1, 0)


def test_process_all_is_refused_whole_when_the_acceptor_queue_cannot_take_it(
        closing: list[TaskDispatcher[object]], clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_buffer_size=10, max_batch_size=10, worker_count=1)
    limit = 100_000  # the acceptor queue's bound: max(10 * max_buffer_size, 100_000)
    with pytest.raises(DispatcherOverloaded, match="no room for 100001 more"):
        d.process_all((i, i, FAR) for i in range(limit + 1))
    assert d.stats().accepted == 0 and d.backlog == 0  # nothing half-queued
    assert d.process_all([]) == 0
    d.close(timeout_s=5)
    with pytest.raises(DispatcherClosed):
        d.process_all([("late", "late", FAR)])


def test_a_task_with_an_unhashable_id_or_a_bad_expiry_is_refused_before_it_is_queued(
        closing: list[TaskDispatcher[object]], clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_batch_size=10, worker_count=1,
                 max_batching_delay_ms=0)
    with pytest.raises(TypeError, match=r"task_id must be hashable, got list \['x'\]"):
        d.process(["x"], "t", FAR)
    with pytest.raises(TypeError, match="expiry_ms must be a number of milliseconds"):
        d.process("a", "t", "5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expiry_ms must be a number of milliseconds"):
        d.process("a", "t", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expiry_ms must be a finite number"):
        d.process("a", "t", float("nan"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="task 1: task_id must be hashable"):
        d.process_all([("ok", "ok", FAR), ({}, "t", FAR)])
    with pytest.raises(TypeError, match="task 2: expiry_ms must be a number"):
        d.process_all([("ok", "ok", FAR), ("b", "b", FAR), ("c", "c", True)])
    with pytest.raises(ValueError, match="task 0: not enough values to unpack"):
        d.process_all([("short", "tuple")])  # type: ignore[list-item]
    assert d.stats().accepted == 0 and d.backlog == 0  # nothing half-queued
    # A float expiry is a deadline in milliseconds, rounded up as timers round theirs.
    d.process("f", "f", FAR + 0.5)  # type: ignore[arg-type]
    assert eventually(lambda: p.seen == ["f"])
    stats = d.stats()
    assert (stats.accepted, stats.tasks["success"], stats.expired) == (1, 1, 0)


def test_republished_tasks_are_handled_first(closing: list[TaskDispatcher[object]],
                                             clock: ManualClock) -> None:
    p = Recorder([ProcessingResult.TRANSIENT_ERROR])
    d = create_non_batching_dispatcher("single", p, worker_count=1, clock=clock,
                                       network_failure_retry_ms=0)
    closing.append(d)
    p.gate.clear()
    for t in ("a", "b", "c"):
        d.process(t, t, FAR)
    p.gate.set()
    assert eventually(lambda: len(p.seen) == 4)
    assert p.seen == ["a", "a", "b", "c"]  # the failed task went back to the front
    assert d.stats().replayed == 1


def test_when_the_buffer_overflows_the_oldest_task_is_removed(
        closing: list[TaskDispatcher[object]], clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_buffer_size=3, max_batch_size=3, worker_count=1,
                 max_batching_delay_ms=1_000)
    p.gate.clear()
    d.process("warm", "warm", FAR)  # occupies the only worker (it waits at the gate)
    clock.advance(1_000)
    assert eventually(lambda: d.stats().batch_size.count == 1)
    for t in ("a", "b", "c", "d"):
        d.process(t, t, FAR)
    assert eventually(lambda: d.stats().queue_overflows == 1)
    p.gate.set()
    assert eventually(lambda: len(p.seen) == 4)
    assert p.seen == ["warm", "b", "c", "d"]


def test_a_batch_waits_up_to_the_batching_delay(closing: list[TaskDispatcher[object]],
                                                clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_batch_size=10, worker_count=1,
                 max_batching_delay_ms=500)
    for i in range(3):
        d.process(i, i, FAR)
    looked(d)  # with the clock stopped nothing may go out
    assert p.seen == []
    clock.advance(499)
    looked(d)
    assert p.seen == []
    clock.advance(1)
    assert eventually(lambda: p.seen == [0, 1, 2])
    assert p.batches == [[0, 1, 2]]  # one batch: the delay filled it


def test_a_full_batch_goes_out_without_waiting_for_the_delay(
        closing: list[TaskDispatcher[object]], clock: ManualClock) -> None:
    # Beyond Eureka, which waits for the delay even when a batch is full.
    p = Recorder()
    d = batching(closing, p, clock, max_batch_size=4, worker_count=1,
                 max_batching_delay_ms=60_000)
    for i in range(4):
        d.process(i, i, FAR)
    assert eventually(lambda: p.seen == [0, 1, 2, 3])


def test_expired_tasks_are_dropped(closing: list[TaskDispatcher[object]],
                                   clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_batch_size=10, worker_count=1,
                 max_batching_delay_ms=100)
    d.process("stale", "stale", clock.now_ms())  # already expired at drain
    d.process("soon", "soon", clock.now_ms() + 50)  # expires while it waits
    d.process("ok", "ok", FAR)
    clock.advance(100)
    assert eventually(lambda: p.seen == ["ok"])
    assert d.stats().expired == 2


# -- TaskExecutorsTest -------------------------------------------------------------------


def test_success_is_processed_once(closing: list[TaskDispatcher[object]],
                                   clock: ManualClock) -> None:
    p = Recorder()
    d = batching(closing, p, clock, max_batch_size=2, worker_count=2,
                 max_batching_delay_ms=60_000)
    d.process(1, 1, FAR)
    d.process(2, 2, FAR)
    assert eventually(lambda: sorted(p.seen) == [1, 2])  # type: ignore[type-var]
    looked(d)
    assert len(p.seen) == 2
    assert d.stats().batches["success"] >= 1 and d.stats().replayed == 0


def test_a_transient_error_is_reprocessed_once(closing: list[TaskDispatcher[object]],
                                               clock: ManualClock) -> None:
    p = Recorder([ProcessingResult.TRANSIENT_ERROR])
    d = batching(closing, p, clock, max_batch_size=2, worker_count=1,
                 max_batching_delay_ms=60_000, network_failure_retry_ms=100)
    d.process(1, 1, FAR)
    d.process(2, 2, FAR)
    assert eventually(lambda: len(p.seen) == 2)
    looked(d)
    assert len(p.seen) == 2  # the shaper holds the retry back until the clock moves
    clock.advance(100)
    assert eventually(lambda: len(p.seen) == 4)
    assert p.batches == [[1, 2], [1, 2]]
    s = d.stats()
    assert (s.replayed, s.batches["transient_error"], s.batches["success"]) == (2, 1, 1)


def test_a_permanent_error_is_never_retried(closing: list[TaskDispatcher[object]],
                                            clock: ManualClock) -> None:
    p = Recorder([ProcessingResult.PERMANENT_ERROR])
    d = batching(closing, p, clock, max_batch_size=2, worker_count=1,
                 max_batching_delay_ms=60_000)
    d.process(1, 1, FAR)
    d.process(2, 2, FAR)
    assert eventually(lambda: d.stats().dropped == 2)
    clock.advance(10_000)
    looked(d)
    assert len(p.seen) == 2 and d.stats().replayed == 0


def test_a_processor_that_raises_counts_as_permanent_and_the_worker_survives(
        closing: list[TaskDispatcher[object]], clock: ManualClock) -> None:
    class Flaky(Recorder):
        def process_batch(self, tasks: list[object]) -> ProcessingResult:
            if tasks == ["boom"]:
                raise RuntimeError("processor bug")
            return super().process_batch(tasks)

    p = Flaky()
    d = batching(closing, p, clock, max_batch_size=1, worker_count=1, max_batching_delay_ms=0)
    d.process("boom", "boom", FAR)
    assert eventually(lambda: d.stats().processor_errors == 1)
    d.process("after", "after", FAR)  # the same (only) worker is still alive
    assert eventually(lambda: p.seen == ["after"])
    assert d.stats().batches["permanent_error"] == 1


# -- TaskDispatchersTest -----------------------------------------------------------------


@pytest.mark.parametrize("batch", [True, False])
def test_work_spreads_across_all_workers(closing: list[TaskDispatcher[object]],
                                         batch: bool) -> None:
    p = Recorder(pause_s=0.002)
    d: TaskDispatcher[object]
    if batch:
        d = create_batching_dispatcher("spread", p, worker_count=3, max_batch_size=5,
                                       max_batching_delay_ms=0)
    else:
        d = create_non_batching_dispatcher("spread", p, worker_count=3)
    closing.append(d)
    n = 600 if batch else 300
    for i in range(n):
        d.process(i, i, FAR)
    assert eventually(lambda: len(p.seen) == n, 30)
    shares = d.work_per_worker
    assert sum(shares) == n
    # Real threads on a loaded machine: every worker takes a real share (a generous
    # bound, as real-clock tests have), none is left idle while others do it all.
    assert min(shares) >= 0.5 * n / 3, shares


# -- the traffic shaper ------------------------------------------------------------------


class BackwardsClock:
    def __init__(self) -> None:
        self.now = 10_000
        self.realtime = False

    def now_ms(self) -> int:
        return self.now


def test_traffic_shaper_delays(clock: ManualClock) -> None:
    shaper = TrafficShaper(clock, congestion_retry_delay_ms=1_000, network_failure_retry_ms=100)
    assert shaper.transmission_delay() == 0
    shaper.register_failure(ProcessingResult.TRANSIENT_ERROR)
    assert shaper.transmission_delay() == 100
    clock.advance(40)
    assert shaper.transmission_delay() == 60
    shaper.register_failure(ProcessingResult.CONGESTION)  # congestion is checked first
    assert shaper.transmission_delay() == 1_000
    clock.advance(1_000)
    assert shaper.transmission_delay() == 0
    shaper.register_failure(ProcessingResult.SUCCESS)
    assert shaper.transmission_delay() == 0


def test_traffic_shaper_caps_delays_at_30_s(clock: ManualClock) -> None:
    shaper = TrafficShaper(clock, congestion_retry_delay_ms=10**9, network_failure_retry_ms=10**9)
    shaper.register_failure(ProcessingResult.CONGESTION)
    assert shaper.transmission_delay() == MAX_DELAY_MS == 30_000


def test_a_clock_that_goes_backwards_resets_the_delay() -> None:
    c = BackwardsClock()
    shaper = TrafficShaper(c, congestion_retry_delay_ms=1_000, network_failure_retry_ms=100)
    shaper.register_failure(ProcessingResult.CONGESTION)
    c.now -= 5_000
    assert shaper.transmission_delay() == 0


@pytest.mark.parametrize("failure_at", [-1, 0, -(2**70)])
def test_a_failure_at_any_clock_reading_backs_off(failure_at: int) -> None:
    # -1 once meant "no failure", so a congestion at time -1 was forgotten at once.
    c = BackwardsClock()
    c.now = failure_at
    shaper = TrafficShaper(c, congestion_retry_delay_ms=1_000, network_failure_retry_ms=100)
    shaper.register_failure(ProcessingResult.CONGESTION)
    assert shaper.transmission_delay() == 1_000
    shaper.register_failure(ProcessingResult.TRANSIENT_ERROR)
    c.now += 1_000
    assert shaper.transmission_delay() == 0


# -- the dispatcher's edges --------------------------------------------------------------


@pytest.mark.parametrize(("kw", "arg"), [({"max_buffer_size": 0}, "max_buffer_size"),
                                         ({"max_batch_size": 0}, "max_batch_size"),
                                         ({"max_batch_size": 20, "max_buffer_size": 10},
                                          "max_batch_size"),
                                         ({"worker_count": 0}, "worker_count"),
                                         ({"max_batching_delay_ms": -1},
                                          "max_batching_delay_ms")])
def test_bad_sizes_are_rejected(kw: dict[str, int], arg: str) -> None:
    with pytest.raises(ValueError, match=arg):
        create_batching_dispatcher("bad", Recorder(), **kw)  # type: ignore[arg-type]


def test_close_delivers_what_is_pending(clock: ManualClock) -> None:
    p = Recorder()
    d = create_batching_dispatcher("flush", p, max_batch_size=10, worker_count=2,
                                   max_batching_delay_ms=60_000, clock=clock)
    for i in range(7):
        d.process(i, i, FAR)
    assert eventually(lambda: d.stats().pending == 7)
    assert d.close(timeout_s=5) == 0  # the partial batch went out without the delay
    assert sorted(p.seen) == list(range(7))  # type: ignore[type-var]


def test_close_waits_for_a_batch_a_worker_took_but_has_not_counted(
        clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    # The queues are empty and nothing is in flight while a worker holds a batch it
    # has just taken: close must still wait for that batch, not report it undelivered.
    p = Recorder()
    d = create_batching_dispatcher("handoff", p, max_batch_size=10, worker_count=1,
                                   max_batching_delay_ms=0, clock=clock)
    acceptor = d._acceptor
    took, go_on = threading.Event(), threading.Event()
    request_batch = acceptor.request_batch

    def slow_hand(timeout_s: float) -> object:
        batch = request_batch(timeout_s)
        if batch is not None and batch[0].task != "warm-up":
            took.set()
            go_on.wait(10)
        return batch

    monkeypatch.setattr(acceptor, "request_batch", slow_hand)
    # The worker may be waiting in the unpatched method: one batch brings it back.
    d.process("warm-up", "warm-up", FAR)
    assert eventually(lambda: p.seen == ["warm-up"])
    for i in range(5):
        d.process(i, i, FAR)
    assert took.wait(10)
    s = d.stats()  # in no queue and not in flight: only the counters know of it
    assert (s.acceptor_queue, s.reprocess_queue, s.pending, s.in_flight) == (0, 0, 0, 0)
    undelivered: list[int] = []
    closing = threading.Thread(target=lambda: undelivered.append(d.close(timeout_s=10)))
    closing.start()
    closing.join(0.3)
    assert closing.is_alive()  # still waiting for the batch in the worker's hands
    go_on.set()
    closing.join(10)
    assert undelivered == [0] and p.seen == ["warm-up", 0, 1, 2, 3, 4]
    assert d.stats().late == 0


def test_close_reports_what_it_could_not_deliver_and_refuses_new_tasks(
        clock: ManualClock) -> None:
    p = Recorder([ProcessingResult.CONGESTION] * 100)
    d = create_batching_dispatcher("closing", p, max_batch_size=10, worker_count=2,
                                   max_batching_delay_ms=0, congestion_retry_delay_ms=60_000,
                                   clock=clock)
    for i in range(7):
        d.process(i, i, FAR)
    assert eventually(lambda: d.stats().replayed >= 1)  # congested: held back for 60 s
    started = time.monotonic()
    assert d.close(timeout_s=0.5) == 7
    assert time.monotonic() - started < 5
    with pytest.raises(DispatcherClosed):
        d.process("late", "late", FAR)
    assert d.close() == 0


def accounted(d: TaskDispatcher[object]) -> int:
    """Where every accepted task is (DispatcherStats' invariant)."""
    s = d.stats()
    return (s.tasks["success"] + s.dropped + s.expired + s.overridden + s.queue_overflows
            + s.abandoned + s.late + s.in_flight + s.acceptor_queue + s.reprocess_queue
            + s.pending)


@pytest.mark.parametrize("workers", [1, 8])
def test_close_gives_up_on_a_blocked_processor_within_its_timeout(
        clock: ManualClock, workers: int) -> None:
    p = Recorder([ProcessingResult.CONGESTION] * 100)
    p.gate.clear()  # every processor call blocks until the gate opens
    d = create_batching_dispatcher("blocked", p, max_batch_size=10, worker_count=workers,
                                   max_batching_delay_ms=0, clock=clock)
    for i in range(10 * workers + 25):
        d.process(i, i, FAR)
    assert eventually(lambda: d.stats().in_flight == 10 * workers)
    started = time.monotonic()
    assert d.close(timeout_s=1.0) == 10 * workers + 25  # in flight and still queued
    assert time.monotonic() - started < 1.8  # not a second timeout for the join
    s = d.stats()
    assert (s.in_flight, s.abandoned, s.late) == (10 * workers, 25, 0)
    assert accounted(d) == s.accepted
    p.gate.set()  # the processors answer CONGESTION after close: late, not requeued
    assert eventually(lambda: d.stats().late == 10 * workers)
    s = d.stats()
    assert (s.in_flight, s.reprocess_queue, s.replayed, s.abandoned) == (0, 0, 0, 25)
    assert accounted(d) == s.accepted == 10 * workers + 25
    assert d.close() == 0


def test_every_accepted_task_is_accounted_for_exactly_once(clock: ManualClock) -> None:
    p = Recorder([ProcessingResult.SUCCESS, ProcessingResult.PERMANENT_ERROR,
                  ProcessingResult.TRANSIENT_ERROR])
    d = create_batching_dispatcher("ledger", p, max_batch_size=5, worker_count=2,
                                   max_batching_delay_ms=0, network_failure_retry_ms=0,
                                   clock=clock)
    for i in range(40):
        d.process(i % 30, i, FAR if i != 3 else 0)  # ids repeat; one task already expired
    assert d.close(timeout_s=5) == 0
    s = d.stats()
    assert s.accepted == 40 and s.dropped >= 1 and s.expired == 1
    assert accounted(d) == 40


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1"])
def test_close_refuses_a_bad_timeout(clock: ManualClock, bad: object) -> None:
    d = create_batching_dispatcher("t", Recorder(), clock=clock)
    with pytest.raises((TypeError, ValueError), match="timeout_s"):
        d.close(timeout_s=bad)  # type: ignore[arg-type]
    assert d.close() == 0


def test_close_while_busy_lets_the_running_batch_finish(clock: ManualClock) -> None:
    p = Recorder(pause_s=0.2)
    with create_batching_dispatcher("busy", p, max_batch_size=2, worker_count=1,
                                    max_batching_delay_ms=0, clock=clock) as d:
        d.process(1, 1, FAR)
        d.process(2, 2, FAR)
        assert eventually(lambda: d.stats().batch_size.total == 2)
        assert p.entered.wait(10)  # the worker is inside process_batch now
    assert d.closed
    assert p.seen == [1, 2]


@pytest.mark.parametrize("batches", [True, False])
def test_close_ends_workers_whose_wait_for_work_would_not_end_on_its_own(
        clock: ManualClock, monkeypatch: pytest.MonkeyPatch, batches: bool) -> None:
    # A worker's timed wait for work has been seen to overrun its timeout by far; here
    # it is an hour, and close must still end every worker at once.
    from tickwheel.dispatch import _workers

    monkeypatch.setattr(_workers, "_POLL_S", 3600.0)
    name = f"idle-{batches}"
    d: TaskDispatcher[object] = (
        create_batching_dispatcher(name, Recorder(), worker_count=3, clock=clock,
                                   max_batching_delay_ms=0) if batches
        else create_non_batching_dispatcher(name, Recorder(), worker_count=3, clock=clock))
    try:
        d.process(1, 1, FAR)
        assert eventually(lambda: d.stats().tasks.get("success") == 1)
    finally:
        started = time.monotonic()
        assert d.close(timeout_s=30) == 0
    assert time.monotonic() - started < 10
    assert eventually(lambda: not [t for t in threading.enumerate()
                                   if f"Worker-{name}-" in t.name], timeout_s=5)
