"""The lock timers and watcher shards take against ``threading.Lock``, uncontended, in
nanoseconds, called from Python: a cycle (``acquire()`` then ``release()``) of the C lock
under :class:`tickwheel._mutex.Mutex` (``tickwheel._rawlock.RawLock``, what compiled
code calls), and a ``with`` block on the ``Mutex`` itself."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tickwheel import _mutex
from tickwheel._mutex import Mutex

__all__ = ["LockResult", "lock_table", "run_locks"]


@dataclass(frozen=True, slots=True)
class LockResult:
    lock: str
    way: str  # "acquire+release" or "with"
    ns: float  # median nanoseconds per cycle


def _cycles(lock: Any, n: int) -> float:
    acquire, release = lock.acquire, lock.release
    start = time.perf_counter_ns()
    for _ in range(n):
        acquire()
        release()
    return (time.perf_counter_ns() - start) / n


def _blocks(lock: Any, n: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(n):
        with lock:
            pass
    return (time.perf_counter_ns() - start) / n


def run_locks(n: int, repeat: int) -> list[LockResult]:
    """Each round times every lock once each way, so that drift hits all alike."""
    # None when built without a C compiler.
    raw: Callable[[], Any] | None = getattr(_mutex, "RawLock", None)
    ways: list[tuple[str, str, Callable[[], Any], Callable[[Any, int], float]]] = [
        ("threading.Lock", "acquire+release", threading.Lock, _cycles),
        ("threading.Lock", "with", threading.Lock, _blocks),
        ("tickwheel", "with", Mutex, _blocks)]
    if raw is not None:
        ways.append(("tickwheel", "acquire+release", raw, _cycles))
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeat):
        for name, way, make, time_it in ways:
            samples.setdefault((name, way), []).append(time_it(make(), n))
    return [LockResult(name, way, statistics.median(values))
            for (name, way), values in samples.items()]


def lock_table(results: list[LockResult]) -> str:
    """One row per way; tickwheel's time with the anchor's divided by it (above 1:
    cheaper than ``threading.Lock``)."""
    lines = ["| way | threading.Lock | tickwheel |", "|---|---:|---:|"]
    for way, ours in (("acquire+release", "RawLock"), ("with", "Mutex")):
        cells = {r.lock: r.ns for r in results if r.way == way}
        anchor = cells["threading.Lock"]
        mine = cells.get("tickwheel")
        shown = "n/a (no C lock)" if mine is None else (
            f"{mine:,.0f} ns, {ours} ({anchor / mine:.2f}x)")
        lines.append(f"| {way} | {anchor:,.0f} ns | {shown} |")
    return "\n".join(lines)
