"""Timer workloads on a virtual clock, against asyncio, ``sched`` and a raw heapq floor.

How asyncio runs on virtual time: the loop's ``time`` is replaced by a function that
reads the benchmark's clock (``call_later`` computes its deadline from it), and expiry
is the loop's own ``_run_once``: before each call one ``call_soon`` of a no-op makes the
selector poll with a zero timeout, so nothing ever sleeps for real and every timer whose
deadline has passed runs inside that ``_run_once``, exactly as in a live loop.

Workloads (N pending timers, all callbacks a shared no-op):
  W1  schedule N with random delays in [1 ms, 60 s] (schedule rate), then advance the
      clock in 10 ms steps until all have run (expiry rate);
  W2  schedule N with a 30 s delay, cancel a random 99%, expire the rest (ops/s, where
      an op is one schedule or cancel);
  W3  steady state at N pending: cancel a random pending timer and schedule a new one,
      the clock advancing 1 ms every 100 pairs (pairs/s);
  W4  bytes per pending timer (tracemalloc, timer structure included).
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import random
import sched
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tickwheel import HashedWheelTimer, HeapTimer, ManualClock, TimerBase, TimingWheelTimer

__all__ = ["IMPLEMENTATIONS", "TIMER_WORKLOADS", "Result", "run_timers"]

STEP_MS = 10
W3_PAIRS = 200_000
SCHED_MAX_N = 10_000  # sched.scheduler.cancel is O(n): beyond this it would take hours


def _noop() -> None:
    return None


class Impl:
    name = "?"
    cancel_is_linear = False

    def make(self) -> None:
        raise NotImplementedError

    def schedule_many(self, delays: list[int]) -> list[Any]:
        raise NotImplementedError

    def cancel_many(self, handles: list[Any]) -> None:
        raise NotImplementedError

    def advance_to(self, t_ms: int) -> None:
        raise NotImplementedError

    def pending(self) -> int:
        raise NotImplementedError

    def steady(self, handles: list[Any], picks: list[int], delays: list[int]) -> None:
        """W3: for each pick, cancel handles[pick] and schedule a replacement."""
        raise NotImplementedError


class TickwheelImpl(Impl):
    def __init__(self, name: str, factory: Callable[[ManualClock], TimerBase]) -> None:
        self.name = name
        self.factory = factory

    def make(self) -> None:
        self.clock = ManualClock(0)
        self.timer = self.factory(self.clock)

    def schedule_many(self, delays: list[int]) -> list[Any]:
        schedule = self.timer.schedule
        noop = _noop
        return [schedule(d, noop) for d in delays]

    def cancel_many(self, handles: list[Any]) -> None:
        for h in handles:
            h.cancel()

    def advance_to(self, t_ms: int) -> None:
        self.clock.set(t_ms)
        self.timer.advance_clock(0)

    def pending(self) -> int:
        return self.timer.size

    def steady(self, handles: list[Any], picks: list[int], delays: list[int]) -> None:
        schedule = self.timer.schedule
        advance = self.timer.advance_clock
        clock = self.clock
        noop = _noop
        for i, (j, d) in enumerate(zip(picks, delays, strict=True)):
            handles[j].cancel()
            handles[j] = schedule(d, noop)
            if i % 100 == 0:
                clock.advance(1)
                advance(0)


class AsyncioImpl(Impl):
    name = "asyncio"
    loop: asyncio.AbstractEventLoop | None = None

    def make(self) -> None:
        if self.loop is not None:
            self.loop.close()
        self.now = 0.0
        loop = asyncio.new_event_loop()
        loop.time = lambda: self.now  # type: ignore[method-assign]
        self.loop = loop

    def schedule_many(self, delays: list[int]) -> list[Any]:
        assert self.loop is not None
        call_later = self.loop.call_later
        noop = _noop
        return [call_later(d / 1000.0, noop) for d in delays]

    def cancel_many(self, handles: list[Any]) -> None:
        for h in handles:
            h.cancel()

    def advance_to(self, t_ms: int) -> None:
        assert self.loop is not None
        self.now = t_ms / 1000.0
        self.loop.call_soon(_noop)
        self.loop._run_once()  # type: ignore[attr-defined]

    def pending(self) -> int:
        scheduled: list[asyncio.TimerHandle] = self.loop._scheduled  # type: ignore[union-attr]
        return sum(1 for h in scheduled if not h.cancelled())

    def steady(self, handles: list[Any], picks: list[int], delays: list[int]) -> None:
        assert self.loop is not None
        call_later = self.loop.call_later
        noop = _noop
        for i, (j, d) in enumerate(zip(picks, delays, strict=True)):
            handles[j].cancel()
            handles[j] = call_later(d / 1000.0, noop)
            if i % 100 == 0:
                self.advance_to(int(self.now * 1000) + 1)


class SchedImpl(Impl):
    name = "sched"
    cancel_is_linear = True

    def make(self) -> None:
        self.now = 0
        self.s = sched.scheduler(timefunc=lambda: self.now, delayfunc=lambda _: None)

    def schedule_many(self, delays: list[int]) -> list[Any]:
        enter = self.s.enter
        noop = _noop
        return [enter(d, 0, noop) for d in delays]

    def cancel_many(self, handles: list[Any]) -> None:
        for h in handles:
            self.s.cancel(h)

    def advance_to(self, t_ms: int) -> None:
        self.now = t_ms
        self.s.run(blocking=False)

    def pending(self) -> int:
        return len(self.s.queue)

    def steady(self, handles: list[Any], picks: list[int], delays: list[int]) -> None:
        enter = self.s.enter
        cancel = self.s.cancel
        noop = _noop
        for i, (j, d) in enumerate(zip(picks, delays, strict=True)):
            cancel(handles[j])
            handles[j] = enter(d, 0, noop)
            if i % 100 == 0:
                self.advance_to(self.now + 1)


class HeapqFloor(Impl):
    """The least a heap timer can do: ``[deadline, seq, fn]`` lists, cancel = clear fn."""

    name = "heapq floor"

    def make(self) -> None:
        self.now = 0
        self.heap: list[list[Any]] = []
        self.seq = itertools.count()

    def schedule_many(self, delays: list[int]) -> list[Any]:
        heap, seq, now, noop, push = self.heap, self.seq, self.now, _noop, heapq.heappush
        out = []
        for d in delays:
            entry = [now + d, next(seq), noop]
            push(heap, entry)
            out.append(entry)
        return out

    def cancel_many(self, handles: list[Any]) -> None:
        for h in handles:
            h[2] = None

    def advance_to(self, t_ms: int) -> None:
        self.now = t_ms
        heap, pop = self.heap, heapq.heappop
        while heap and heap[0][0] <= t_ms:
            fn = pop(heap)[2]
            if fn is not None:
                fn()

    def pending(self) -> int:
        return sum(1 for e in self.heap if e[2] is not None)

    def steady(self, handles: list[Any], picks: list[int], delays: list[int]) -> None:
        heap, seq, noop, push = self.heap, self.seq, _noop, heapq.heappush
        for i, (j, d) in enumerate(zip(picks, delays, strict=True)):
            handles[j][2] = None
            entry = [self.now + d, next(seq), noop]
            push(heap, entry)
            handles[j] = entry
            if i % 100 == 0:
                self.advance_to(self.now + 1)


def _timer(cls: Callable[..., TimerBase], **kw: Any) -> Callable[[ManualClock], TimerBase]:
    return lambda clock: cls(clock=clock, executor=None, **kw)


#: The workloads ``run_timers`` knows, by name.
TIMER_WORKLOADS = ("W1", "W2", "W3", "W4")

IMPLEMENTATIONS: dict[str, Callable[[], Impl]] = {
    "TimingWheelTimer": lambda: TickwheelImpl("TimingWheelTimer", _timer(TimingWheelTimer)),
    "HashedWheelTimer": lambda: TickwheelImpl("HashedWheelTimer", _timer(HashedWheelTimer)),
    "HeapTimer": lambda: TickwheelImpl("HeapTimer", _timer(HeapTimer)),
    "asyncio": AsyncioImpl,
    "sched": SchedImpl,
    "heapq floor": HeapqFloor,
}


@dataclass(frozen=True)
class Result:
    workload: str
    impl: str
    n: int
    gc: bool
    value: float  # ops/s, or bytes per timer for W4
    unit: str
    samples: tuple[float, ...]


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _expire_all(impl: Impl, until_ms: int) -> None:
    t = 0
    while t < until_ms:
        t += STEP_MS
        impl.advance_to(t)


def w1(impl: Impl, n: int, rng: random.Random) -> tuple[float, float]:
    delays = [rng.randint(1, 60_000) for _ in range(n)]
    impl.make()
    t_sched = _timed(lambda: impl.schedule_many(delays))
    t_exp = _timed(lambda: _expire_all(impl, 60_000 + STEP_MS))
    assert impl.pending() == 0, f"{impl.name}: W1 left timers pending"
    return n / t_sched, n / t_exp


def w2(impl: Impl, n: int, rng: random.Random) -> float:
    delays = [30_000] * n
    victims_idx = rng.sample(range(n), n * 99 // 100)
    impl.make()

    def run() -> None:
        handles = impl.schedule_many(delays)
        impl.cancel_many([handles[i] for i in victims_idx])
        _expire_all(impl, 30_000 + STEP_MS)

    elapsed = _timed(run)
    assert impl.pending() == 0, f"{impl.name}: W2 left timers pending"
    return (n + len(victims_idx)) / elapsed


def w3(impl: Impl, n: int, rng: random.Random) -> float:
    pairs = min(W3_PAIRS, max(n, 10_000))
    initial = [rng.randint(30_000, 60_000) for _ in range(n)]
    picks = [rng.randrange(n) for _ in range(pairs)]
    delays = [rng.randint(30_000, 60_000) for _ in range(pairs)]
    impl.make()
    handles = impl.schedule_many(initial)
    elapsed = _timed(lambda: impl.steady(handles, picks, delays))
    return pairs / elapsed


def w4(impl: Impl, n: int, rng: random.Random) -> float:
    delays = [rng.randint(30_000, 60_000) for _ in range(n)]
    impl.make()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = impl.schedule_many(delays)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # The caller's list of handles is not the timer's memory.
    own = after - before - (len(handles) * 8 + 56)
    return own / n


def run_timers(
    sizes: list[int],
    impls: list[str],
    workloads: list[str],
    repeat: int,
    gc_modes: list[bool],
    progress: Callable[[str], None],
) -> list[Result]:
    results: list[Result] = []
    for n in sizes:
        for gc_on in gc_modes:
            impl_objects = {name: IMPLEMENTATIONS[name]() for name in impls}
            samples: dict[tuple[str, str], list[float]] = {}
            # Repetitions are the outer loop: every implementation runs once per round,
            # so a machine that drifts during the run shifts all of them alike.
            for rep in range(repeat):
                for name, impl in impl_objects.items():
                    rng = random.Random(1_000 + rep)
                    if not gc_on:
                        gc.disable()
                    try:
                        if "W1" in workloads:
                            s, e = w1(impl, n, rng)
                            samples.setdefault((name, "W1 schedule"), []).append(s)
                            samples.setdefault((name, "W1 expire"), []).append(e)
                        skip = impl.cancel_is_linear and n > SCHED_MAX_N
                        if "W2" in workloads and not skip:
                            samples.setdefault((name, "W2 cancel 99%"), []).append(
                                w2(impl, n, rng))
                        if "W3" in workloads and not skip:
                            samples.setdefault((name, "W3 steady"), []).append(w3(impl, n, rng))
                    finally:
                        gc.enable()
                        impl.make()  # drop this repetition's timers
                        gc.collect()
                progress(f"N={n:,} gc={'on' if gc_on else 'off'} round {rep + 1}/{repeat}")
            for (name, workload), vals in samples.items():
                results.append(Result(workload, name, n, gc_on, statistics.median(vals),
                                      "ops/s", tuple(vals)))
        if "W4" in workloads:
            for name in impls:
                impl = IMPLEMENTATIONS[name]()
                results.append(Result("W4 bytes/timer", name, n, True,
                                      w4(impl, n, random.Random(7)), "bytes", ()))
                impl.make()
                gc.collect()
            progress(f"N={n:,} W4 done")
    return results
