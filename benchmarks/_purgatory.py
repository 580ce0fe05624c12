"""Purgatory workload: 1M operations watching 1-3 of 100k keys, on a virtual clock.

Rounds of ``ROUND`` operations: each is watched (``try_complete_else_watch``, 30 s
deadline), then ``ROUND`` key events (a key's version moves, ``check_and_complete``)
complete the operations that watch a touched key, then the clock passes the deadline
and the rest expire. Reported: watch+complete operations/s (the watch and event
phases), expiry/s, and memory before, at the peak and after everything resolved.

The naive baseline is what one writes without a purgatory: a dict of key -> list of
operations, scanned on every key event (completed operations stay in the lists of
their other keys until those are scanned: Kafka's behaviour before a purge), and a
heapq of deadlines for expiry.

The anchor is ``TimingWheelTimer`` schedule+cancel pairs at the same number pending,
measured in the same run: an operation is one timer entry plus its watchers.

Every run (engines, anchor, floor) makes its inputs first and freezes them
(``gc.freeze``), so the garbage collector, which stays on, walks what the system under
test holds and not the benchmark's 2M list slots of input.
"""

from __future__ import annotations

import gc
import heapq
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tickwheel import DelayedOperation, ManualClock, Purgatory, TimingWheelTimer

__all__ = ["PurgatoryResult", "run_purgatory"]

KEYS = 100_000
ROUND = 100_000
DEADLINE_MS = 30_000


class _VersionedOp(DelayedOperation):
    """Completes once any of its keys has moved past the version it registered at."""

    __slots__ = ("seen", "versions", "watch_keys")

    def __init__(self, versions: list[int], keys: tuple[int, ...]) -> None:
        super().__init__(DEADLINE_MS)
        self.versions = versions
        self.watch_keys = keys
        self.seen = [versions[k] for k in keys]

    def try_complete(self) -> bool:
        versions = self.versions
        for k, v in zip(self.watch_keys, self.seen):  # noqa: B905 - same length
            if versions[k] != v:
                return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass


class _NaiveOp:
    __slots__ = ("deadline", "done", "keys", "seen")

    def __init__(self, keys: tuple[int, ...], seen: list[int], deadline: int) -> None:
        self.keys = keys
        self.seen = seen
        self.deadline = deadline
        self.done = False


@dataclass(frozen=True)
class PurgatoryResult:
    name: str
    ops_per_s: float  # watch + complete
    expire_per_s: float
    completed_by_events: int
    expired: int
    mem_before: int
    mem_peak: int
    mem_after: int


def _workload(n: int, seed: int) -> list[tuple[list[tuple[int, ...]], list[int]]]:
    rng = random.Random(seed)
    rounds = []
    for _ in range(max(1, n // ROUND)):
        keys = [tuple(rng.sample(range(KEYS), rng.randint(1, 3))) for _ in range(ROUND)]
        events = [rng.randrange(KEYS) for _ in range(ROUND)]
        rounds.append((keys, events))
    return rounds


Rounds = list[tuple[list[tuple[int, ...]], list[int]]]
Memory = Callable[[str], None]


def _run_tickwheel(rounds: Rounds, memory: Memory) -> tuple[float, float, int, int]:
    clock = ManualClock(0)
    purgatory = Purgatory("bench", timer=TimingWheelTimer(clock=clock, executor=None),
                          reaper=False)
    versions = [0] * KEYS
    memory("before")
    active = 0.0
    expiring = 0.0
    for keys, events in rounds:
        t0 = time.perf_counter()
        watch = purgatory.try_complete_else_watch
        for ks in keys:
            watch(_VersionedOp(versions, ks), ks)
        check = purgatory.check_and_complete
        for k in events:
            versions[k] += 1
            check(k)
        t1 = time.perf_counter()
        memory("peak")
        clock.advance(DEADLINE_MS)
        purgatory.advance_clock(0)
        t2 = time.perf_counter()
        active += t1 - t0
        expiring += t2 - t1
    gc.collect()
    memory("after")
    stats = purgatory.stats()
    assert stats.watched == 0 and stats.num_delayed == 0, "operations left behind"
    ops = stats.completed + stats.expired
    return ops / active, stats.expired / expiring, stats.completed, stats.expired


def _run_naive(rounds: Rounds, memory: Memory) -> tuple[float, float, int, int]:
    watchers: dict[int, list[_NaiveOp]] = {}
    heap: list[tuple[int, int, _NaiveOp]] = []
    versions = [0] * KEYS
    memory("before")
    now = 0
    seq = 0
    completed = expired = 0
    active = expiring = 0.0
    for keys, events in rounds:
        t0 = time.perf_counter()
        for ks in keys:
            op = _NaiveOp(ks, [versions[k] for k in ks], now + DEADLINE_MS)
            for k in ks:
                watchers.setdefault(k, []).append(op)
            heapq.heappush(heap, (op.deadline, seq, op))
            seq += 1
        for k in events:
            versions[k] += 1
            ops = watchers.get(k)
            if not ops:
                continue
            keep = []
            for op in ops:
                if op.done:
                    continue
                if any(versions[kk] != v for kk, v in zip(op.keys, op.seen, strict=True)):
                    op.done = True
                    completed += 1
                else:
                    keep.append(op)
            if keep:
                watchers[k] = keep
            else:
                del watchers[k]
        t1 = time.perf_counter()
        memory("peak")
        now += DEADLINE_MS
        while heap and heap[0][0] <= now:
            op = heapq.heappop(heap)[2]
            if not op.done:
                op.done = True
                expired += 1
        t2 = time.perf_counter()
        active += t1 - t0
        expiring += t2 - t1
    gc.collect()
    memory("after")
    # Completed operations still sit in the lists of keys nobody touched again.
    _LEFTOVER[0] = sum(len(v) for v in watchers.values())
    return (completed + expired) / active, expired / expiring, completed, expired


_LEFTOVER = [0]


def _anchor_pairs(n: int, seed: int) -> float:
    """TimingWheelTimer schedule+cancel pairs/s with ROUND pending."""
    rng = random.Random(seed)
    pairs = max(n - ROUND, ROUND)  # n may be just ROUND: still time some pairs
    delays = [rng.randint(1, DEADLINE_MS) for _ in range(ROUND + pairs)]
    first, rest = delays[:ROUND], delays[ROUND:]
    picks = [rng.randrange(ROUND) for _ in range(pairs)]  # random, as in timers W3
    _freeze()  # the inputs, as in the engines' runs
    clock = ManualClock(0)
    timer = TimingWheelTimer(clock=clock, executor=None)
    schedule = timer.schedule
    noop = _noop
    window: list[Any] = [schedule(d, noop) for d in first]
    t0 = time.perf_counter()
    for j, d in zip(picks, rest, strict=True):
        window[j].cancel()
        window[j] = schedule(d, noop)
    elapsed = time.perf_counter() - t0
    del window
    _thaw()
    return pairs / elapsed


def _floor_ops(rounds: Rounds, seed: int) -> float:
    """Operations/s of the operation's own code alone: construct it, call
    ``try_complete`` once, as the purgatory does when no key event comes while it
    watches (Kafka always tries twice), and free it, with no watching, no timer and no
    key events. ``ROUND`` operations are held at a time, as in the purgatory, and each
    new one takes the place of a random held one, which is freed: a purgatory frees an
    operation when it resolves, in the random order key events come, inside its timed
    phases. What any purgatory pays for this operation before its first watch or timer
    entry."""
    versions = [0] * KEYS
    keys = [ks for round_keys, _events in rounds for ks in round_keys]
    rng = random.Random(seed)
    picks = [rng.randrange(ROUND) for _ in keys]
    _freeze()  # the inputs just made, as in the engines' runs
    held: list[_VersionedOp | None] = [None] * ROUND
    t0 = time.perf_counter()
    for ks, j in zip(keys, picks, strict=True):
        op = _VersionedOp(versions, ks)
        op.try_complete()
        held[j] = op
    elapsed = time.perf_counter() - t0
    del held
    _thaw()
    return len(keys) / elapsed


def _noop() -> None:
    return None


ENGINES: dict[str, Callable[..., tuple[float, float, int, int]]] = {
    "Purgatory": _run_tickwheel,
    "naive dict of lists": _run_naive,
}


def run_purgatory(n: int, repeat: int, progress: Callable[[str], None]
                  ) -> tuple[list[PurgatoryResult], float, float]:
    """The engines' results, the anchor's pairs/s and the floor's ops/s (medians)."""
    results = []
    for name, engine in ENGINES.items():
        speeds: list[tuple[float, float, int, int]] = []
        for rep in range(repeat):
            rounds = _frozen_workload(n, seed=rep)
            speeds.append(engine(rounds, lambda _stage: None))
            del rounds
            _thaw()
            progress(f"{name}: rep {rep + 1}/{repeat}")
        # Memory in a separate pass: tracemalloc slows every allocation.
        rounds = _frozen_workload(n, seed=0)
        seen: dict[str, int] = {}
        tracemalloc.start()
        engine(rounds, lambda stage, seen=seen: _sample(seen, stage))
        tracemalloc.stop()
        del rounds
        _thaw()
        progress(f"{name}: memory pass done")
        results.append(PurgatoryResult(
            name,
            statistics.median(s[0] for s in speeds),
            statistics.median(s[1] for s in speeds),
            speeds[0][2], speeds[0][3], seen["before"], seen["peak"], seen["after"],
        ))
    anchors = []
    floors = []
    for rep in range(repeat):
        anchors.append(_anchor_pairs(n, rep))
        rounds = _frozen_workload(n, seed=rep)
        floors.append(_floor_ops(rounds, rep))
        del rounds
        _thaw()
        progress(f"anchor and floor: rep {rep + 1}/{repeat}")
    return results, statistics.median(anchors), statistics.median(floors)


def _frozen_workload(n: int, seed: int) -> Rounds:
    """The workload, moved out of the collector's sight (``gc.freeze``): its 2M list
    slots are the benchmark's input, and every full collection during a run would
    walk them, for every engine alike."""
    rounds = _workload(n, seed)
    _freeze()
    return rounds


def _freeze() -> None:
    gc.collect()
    gc.freeze()


def _thaw() -> None:
    gc.unfreeze()
    gc.collect()


def _sample(seen: dict[str, int], stage: str) -> None:
    now = tracemalloc.get_traced_memory()[0]
    seen[stage] = max(seen.get(stage, 0), now)


def leftover_entries() -> int:
    """Entries the naive baseline still held after its last run."""
    return _LEFTOVER[0]
