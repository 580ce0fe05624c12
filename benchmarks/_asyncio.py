"""asyncio's timers on real loops and real time: the stock loop, tickwheel's loop,
uvloop, and uvloop with ``tickwheel.aio``'s wheel, all in one run.

  A1  schedule N ``call_later`` with random delays of 1-60 s, then cancel them all:
      pairs per second; and, in a separate pass under tracemalloc, the bytes each
      pending handle holds (the handle, its time, its context and the loop's slot).
  A2  N concurrent tasks, each ``async with timeout(30): await fut``, the futures set
      in random order: tasks per second, from the first task created to the last done.
  A3  N tasks in ``asyncio.sleep`` until deadlines spread over 1 s, which start once
      every task is asleep: wakes per second, from the first deadline to the last wake
      (a loop that keeps up scores N per second; one that cannot, its own rate).

"uvloop+tickwheel" keeps uvloop and puts its timers on ``tickwheel.aio``'s per-loop
wheel (``tickwheel.aio.call_later`` for A1, ``tickwheel.aio.timeout`` for A2); A3 has no
such variant, since ``asyncio.sleep`` always asks the loop itself. The garbage
collector stays on, as in a server; A1 also runs with it off, since its full
collections walk every pending handle and so grow with the number pending. Each
measurement runs in a fresh interpreter.
"""

from __future__ import annotations

import array
import asyncio
import functools
import gc
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks import child_env
from tickwheel import aio

__all__ = ["LOOPS", "Result", "available_loops", "run_asyncio"]

LOOPS = ("asyncio", "tickwheel", "uvloop", "uvloop+tickwheel")


@dataclass
class Result:
    loop: str
    workload: str
    n: int
    unit: str
    samples: list[float] = field(default_factory=list)

    @property
    def value(self) -> float:
        return statistics.median(self.samples)


def _noop() -> None:
    return None


def available_loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ["asyncio", "tickwheel"]
    return list(LOOPS)


#: The tickwheel loop with one shortcut off ("tickwheel/-NAME"), or all ("tickwheel/plain").
SHORTCUT_LOOPS = ("tickwheel/-bound_methods", "tickwheel/-direct_clock",
                  "tickwheel/-hidden_handles", "tickwheel/plain")


def _factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "asyncio":
        return asyncio.SelectorEventLoop
    if name == "tickwheel":
        return aio.new_event_loop
    if name in SHORTCUT_LOOPS:
        every = name != "tickwheel/plain"
        off = name.removeprefix("tickwheel/-")
        names = ("bound_methods", "direct_clock", "hidden_handles")
        shortcuts = aio.LoopShortcuts(**{n: every and n != off for n in names})
        return functools.partial(aio.new_event_loop, shortcuts=shortcuts)
    import uvloop

    return uvloop.new_event_loop


def _run(name: str, workload: Callable[[str, Any], Coroutine[Any, Any, float]],
         data: Any) -> float:
    with asyncio.Runner(loop_factory=_factory(name)) as runner:
        return runner.run(workload(name, data))


def _schedule(name: str) -> Callable[..., Any]:
    if name == "uvloop+tickwheel":
        return aio.call_later
    return asyncio.get_running_loop().call_later


def _timeout(name: str) -> Callable[[float], Any]:
    return aio.timeout if name == "uvloop+tickwheel" else asyncio.timeout


async def a1_pairs(name: str, delays: Sequence[float]) -> float:
    call_later = _schedule(name)
    start = time.perf_counter()
    handles = [call_later(delay, _noop) for delay in delays]
    for handle in handles:
        handle.cancel()
    return len(delays) / (time.perf_counter() - start)


async def a1_pairs_gc_off(name: str, delays: Sequence[float]) -> float:
    gc.collect()
    gc.disable()
    try:
        return await a1_pairs(name, delays)
    finally:
        gc.enable()


async def a1_bytes(name: str, delays: Sequence[float]) -> float:
    call_later = _schedule(name)
    handles: list[Any] = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        handles = [call_later(delay, _noop) for delay in delays]
        # The list that keeps the handles is the benchmark's, not the loop's.
        held = tracemalloc.get_traced_memory()[0] - before - _list_bytes(len(handles))
    finally:
        tracemalloc.stop()
    for handle in handles:
        handle.cancel()
    return held / len(delays)


def _list_bytes(n: int) -> int:
    tracemalloc.stop()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    probe = [None for _ in range(n)]
    size = tracemalloc.get_traced_memory()[0] - before
    del probe
    return size


async def a2(name: str, order: Sequence[int]) -> float:
    loop = asyncio.get_running_loop()
    timeout = _timeout(name)
    futures = [loop.create_future() for _ in order]

    async def waiter(future: asyncio.Future[None]) -> None:
        async with timeout(30):
            await future

    start = time.perf_counter()
    tasks = [loop.create_task(waiter(future)) for future in futures]
    await asyncio.sleep(0)  # every task is inside its timeout now
    for i in order:
        futures[i].set_result(None)
    await asyncio.gather(*tasks)
    return len(order) / (time.perf_counter() - start)


async def a3(name: str, offsets: Sequence[float]) -> float:
    loop = asyncio.get_running_loop()
    # Deadlines count from `base`, set before any task runs, and every task must be
    # asleep by then: a task's first step (which calls sleep) runs only once the loop
    # gets to it, and with a million tasks that takes seconds. Otherwise most sleeps
    # would start past their deadline, and the rate would be that of starting tasks.
    # Starting one costs about what creating it did, so the lead is twice that, + 1 s.
    base = [0.0]
    last_wake = 0.0

    async def sleeper(offset: float) -> None:
        nonlocal last_wake
        await asyncio.sleep(base[0] + offset - loop.time())
        last_wake = loop.time()

    created = loop.time()
    tasks = [loop.create_task(sleeper(offset)) for offset in offsets]
    now = loop.time()
    base[0] = now + 2 * (now - created) + 1.0
    await asyncio.sleep(0)  # returns once every task has run its first step
    if loop.time() >= base[0]:
        raise RuntimeError(f"A3: the tasks were not all asleep by the first deadline "
                           f"({loop.time() - base[0]:.2f} s late); nothing was measured")
    await asyncio.gather(*tasks)
    return len(offsets) / max(last_wake - base[0], 1e-9)


_WORKLOADS: dict[str, tuple[str, str, Callable[[str, Any], Coroutine[Any, Any, float]]]] = {
    "A1": ("A1 schedule+cancel", "pairs/s", a1_pairs),
    "A1-gc-off": ("A1 schedule+cancel, gc off", "pairs/s", a1_pairs_gc_off),
    "A1-bytes": ("A1 bytes per pending handle", "bytes", a1_bytes),
    "A2": ("A2 tasks in timeout()", "tasks/s", a2),
    "A3": ("A3 sleep wakes", "wakes/s", a3),
}


def _data(workload: str, n: int, n_tasks: int) -> Any:
    # Inputs are arrays, which the collector does not walk: a list of a million floats
    # would add a million visits to every full collection, the same for every loop.
    rng = random.Random(20261125)
    if workload.startswith("A1"):
        return array.array("d", (rng.uniform(1.0, 60.0) for _ in range(n)))
    if workload == "A2":
        order = list(range(n_tasks))
        rng.shuffle(order)
        return array.array("q", order)
    return array.array("d", (rng.uniform(0.0, 1.0) for _ in range(n)))


def measure(loop: str, workload: str, n: int, n_tasks: int) -> float:
    """One measurement, in this process (the parent runs each in a fresh one)."""
    return _run(loop, _WORKLOADS[workload][2], _data(workload, n, n_tasks))


def run_asyncio(
    n: int,
    n_tasks: int,
    repeat: int,
    loops: list[str],
    workloads: list[str],
    progress: Callable[[str], None],
) -> list[Result]:
    """Every measurement runs in a fresh interpreter: what one loop left behind (a
    million finished tasks, a fragmented heap, the collector's generations) must not
    weigh on the next."""
    wanted = [w for w in _WORKLOADS if w.split("-")[0] in workloads]
    results: dict[tuple[str, str], Result] = {}
    for round_ in range(1, repeat + 1):
        # Each round runs every loop once, so slow drift of the machine hits all alike.
        for name in loops:
            for workload in wanted:
                if workload == "A3" and name == "uvloop+tickwheel":
                    continue
                if workload == "A1-bytes" and round_ > 1:
                    continue
                label, unit, _ = _WORKLOADS[workload]
                size = n_tasks if workload == "A2" else n
                out = subprocess.run(
                    [sys.executable, "-m", "benchmarks._asyncio", name, workload,
                     str(n), str(n_tasks)], capture_output=True, text=True, check=True,
                    env=child_env())
                value = float(out.stdout)
                key = (name, label)
                if key not in results:
                    results[key] = Result(name, label, size, unit)
                results[key].samples.append(value)
                shown = f"{value:,.0f} B" if unit == "bytes" else f"{value / 1e3:,.0f}k {unit}"
                progress(f"round {round_}: {name} {label}: {shown}")
    return list(results.values())


if __name__ == "__main__":
    loop_name, workload_name, n_arg, tasks_arg = sys.argv[1:5]
    print(measure(loop_name, workload_name, int(n_arg), int(tasks_arg)))
