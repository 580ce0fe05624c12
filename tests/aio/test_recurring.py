"""call_recurring: a Schedule on the running loop, on virtual time."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

import tickwheel.aio as aio
from tests.aio.conftest import stock, virtual_loop, wheel
from tickwheel import Schedule


@pytest.mark.parametrize("factory", [wheel, stock], ids=["tickwheel loop", "stock loop"])
def test_each_occurrence_fires_once_and_never_early(factory: Any) -> None:
    loop, _selector = virtual_loop(factory)
    fired: list[float] = []

    async def main() -> aio.RecurringHandle:
        handle = aio.call_recurring(Schedule(every_ms=250), lambda: fired.append(loop.time()),
                                    wall_clock=loop.time)
        await asyncio.sleep(2.1)
        handle.cancel()
        await asyncio.sleep(1)
        return handle

    handle = loop.run_until_complete(main())
    loop.close()
    # 1000.0 (now) .. 1002.0, every 0.25 s; none before its time.
    due = [1000 + 0.25 * k for k in range(9)]
    assert len(fired) == 9 == handle.runs and handle.cancelled()
    assert all(at >= d - 1e-9 for at, d in zip(fired, due, strict=True))
    assert handle.next_occurrence_ms is None


def test_a_coroutine_callback_runs_as_a_task_and_runs_never_overlap() -> None:
    loop, _ = virtual_loop(wheel)
    active, most, starts = [0], [0], []

    async def job() -> None:
        active[0] += 1
        most[0] = max(most[0], active[0])
        starts.append(loop.time())
        await asyncio.sleep(0.7)  # longer than the interval
        active[0] -= 1

    async def main() -> aio.RecurringHandle:
        handle = aio.call_recurring(Schedule(every_ms=500, misfire="skip", grace_ms=0),  # type: ignore[arg-type]
                                    job, wall_clock=loop.time)
        await asyncio.sleep(3.05)
        handle.cancel()
        await asyncio.sleep(1)
        return handle

    handle = loop.run_until_complete(main())
    loop.close()
    assert most[0] == 1
    assert all(b - a >= 0.7 - 1e-9 for a, b in itertools.pairwise(starts))
    assert handle.skipped > 0 and handle.runs == len(starts)


def test_a_raising_callback_goes_to_the_exception_handler_and_the_series_goes_on() -> None:
    loop, _ = virtual_loop(wheel)
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))

    def boom() -> None:
        raise RuntimeError("boom")

    async def main() -> aio.RecurringHandle:
        handle = aio.call_recurring(Schedule(every_ms=100), boom, wall_clock=loop.time)
        await asyncio.sleep(0.45)
        handle.cancel()
        return handle

    handle = loop.run_until_complete(main())
    loop.close()
    assert handle.runs == 5 and len(seen) == 5
    assert isinstance(seen[0]["exception"], RuntimeError)


def test_max_runs_finishes_the_series() -> None:
    loop, _ = virtual_loop(wheel)

    async def main() -> aio.RecurringHandle:
        handle = aio.call_recurring(Schedule(every_ms=100, max_runs=3), lambda: None,
                                    wall_clock=loop.time)
        await asyncio.sleep(1)
        return handle

    handle = loop.run_until_complete(main())
    loop.close()
    assert handle.runs == 3 and handle.finished and handle.next_occurrence_ms is None


def test_call_recurring_needs_a_schedule_and_a_running_loop() -> None:
    with pytest.raises(TypeError, match="Schedule"):
        aio.call_recurring("@hourly", print)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        aio.call_recurring(Schedule(every_ms=10), print)
