"""tickwheel.aio.timeout, timeout_at and call_later on a loop the program keeps: a
per-loop wheel driven by one timer of that loop, with asyncio.timeout's behaviour."""

from __future__ import annotations

import asyncio
import random

import pytest

import tickwheel.aio as aio
from tests.aio.conftest import VirtualSelector, stock, virtual_loop


@pytest.fixture
def sloop() -> tuple[asyncio.AbstractEventLoop, VirtualSelector]:
    loop, selector = virtual_loop(stock)
    yield loop, selector
    loop.close()


def _count_base_timers(loop: asyncio.AbstractEventLoop) -> list[float]:
    """Wrap the loop's own call_at to record every timer the wheel arms on it."""
    armed: list[float] = []
    base = loop.call_at

    def call_at(when: float, callback: object, *args: object,
                **kwargs: object) -> asyncio.TimerHandle:
        if getattr(callback, "__name__", "") == "_fire":
            armed.append(when)
        return base(when, callback, *args, **kwargs)  # type: ignore[arg-type]

    loop.call_at = call_at  # type: ignore[method-assign]
    return armed


def test_timeout_raises_timeout_error_out_of_the_block_at_its_deadline(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop

    async def main() -> tuple[aio.Timeout, float]:
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with aio.timeout(2.5) as cm:
                await asyncio.sleep(100)
        return cm, loop.time() - start

    cm, took = loop.run_until_complete(main())
    assert cm.expired()
    assert 2.5 <= took <= 2.502
    assert repr(cm) == "<Timeout [expired]>"


def test_a_block_that_finishes_in_time_is_left_alone_and_its_timer_cancelled(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop

    async def main() -> aio.Timeout:
        async with aio.timeout(10) as cm:
            assert repr(cm).startswith("<Timeout [active] when=")
            await asyncio.sleep(1)
        return cm

    cm = loop.run_until_complete(main())
    assert not cm.expired()
    assert aio.scheduler_for(loop).stats().pending == 0


def test_timeout_at_and_none_and_reschedule(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop

    async def main() -> list[float]:
        marks = []
        start = loop.time()
        async with aio.timeout(None) as cm:
            assert cm.when() is None
            await asyncio.sleep(1)
        with pytest.raises(TimeoutError):
            async with aio.timeout_at(loop.time() + 1) as cm:
                cm.reschedule(loop.time() + 3)
                await asyncio.sleep(10)
        marks.append(loop.time() - start)
        async with aio.timeout(1) as cm:
            cm.reschedule(None)
            await asyncio.sleep(2)
        marks.append(loop.time() - start)
        with pytest.raises(TimeoutError):
            async with aio.timeout(5) as cm:
                cm.reschedule(loop.time() - 1)  # in the past: expires at once
                await asyncio.sleep(10)
        marks.append(loop.time() - start)
        return marks

    marks = loop.run_until_complete(main())
    for got, want in zip(marks, [4.0, 6.0, 6.0], strict=True):
        assert want <= got <= want + 0.003


def test_nested_timeouts_only_the_one_that_expired_raises(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop

    async def main() -> tuple[bool, bool]:
        with pytest.raises(TimeoutError):
            async with aio.timeout(1) as outer:
                async with aio.timeout(10) as inner:
                    await asyncio.sleep(100)
        return outer.expired(), inner.expired()

    assert loop.run_until_complete(main()) == (True, False)


def test_an_outside_cancel_stays_a_cancel(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop

    async def victim() -> None:
        async with aio.timeout(10):
            await asyncio.sleep(100)

    async def main() -> None:
        task = asyncio.create_task(victim())
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    loop.run_until_complete(main())


def test_a_timeout_is_entered_once_and_only_inside_a_task(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop

    async def main() -> None:
        cm = aio.timeout(1)
        with pytest.raises(RuntimeError, match="not been entered"):
            cm.reschedule(5)
        async with cm:
            pass
        with pytest.raises(RuntimeError, match="already been entered"):
            async with cm:
                pass
        with pytest.raises(RuntimeError, match="finished"):
            cm.reschedule(5)

    loop.run_until_complete(main())


def test_many_timeouts_share_one_timer_of_the_loop(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop
    armed = _count_base_timers(loop)
    rnd = random.Random(3)
    n = 2000

    async def one(delay: float, deadline: float) -> bool:
        try:
            async with aio.timeout(deadline):
                await asyncio.sleep(delay)
        except TimeoutError:
            return False
        return True

    async def main() -> list[bool]:
        return await asyncio.gather(*(one(rnd.uniform(0, 10), rnd.uniform(0, 10))
                                      for _ in range(n)))

    results = loop.run_until_complete(main())
    assert 0 < sum(results) < n
    # One armed timer per due bucket at most, not one per timeout.
    assert 0 < len(armed) < n
    assert len(armed) == aio.scheduler_for(loop).stats().arms
    assert aio.scheduler_for(loop).stats().pending == 0


def test_call_later_and_call_at_on_a_loop_the_program_keeps(
        sloop: tuple[asyncio.AbstractEventLoop, VirtualSelector]) -> None:
    loop, _ = sloop
    ran: list[tuple[str, float]] = []

    async def main() -> None:
        start = loop.time()
        aio.call_later(2, lambda: ran.append(("later", loop.time() - start)))
        aio.call_at(start + 1, lambda: ran.append(("at", loop.time() - start)))
        aio.call_later(1.5, ran.append, ("cancelled", 0.0)).cancel()
        await asyncio.sleep(3)

    loop.run_until_complete(main())
    assert [name for name, _ in ran] == ["at", "later"]
    assert 1 <= ran[0][1] <= 1.001 and 2 <= ran[1][1] <= 2.001


def test_a_closed_loops_wheel_is_replaced_not_reused() -> None:
    loop, _ = virtual_loop(stock)

    async def schedule() -> aio.WheelScheduler:
        aio.call_later(100, print)
        return aio.scheduler_for(asyncio.get_running_loop())

    first = loop.run_until_complete(schedule())
    first.close()
    second = loop.run_until_complete(schedule())
    assert second is not first and len(second) == 1
    loop.close()


def test_on_a_tickwheel_loop_the_loops_own_wheel_is_used() -> None:
    loop = aio.new_event_loop()
    try:
        assert aio.scheduler_for(loop) is loop._wheel
    finally:
        loop.close()


def test_uvloop_runs_timeouts_on_the_wheel() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with aio.timeout(0.05) as cm:
                await asyncio.sleep(10)
        handle = aio.call_later(0.01, print)
        handle.cancel()
        return cm.expired(), loop.time() - start

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        expired, took = runner.run(main())
    assert expired
    assert 0.05 - 1e-6 <= took < 5.0  # real time: generous; uvloop's clock is in ms


@pytest.mark.parametrize("factory", [asyncio.new_event_loop, aio.new_event_loop],
                         ids=["stock", "tickwheel"])
def test_a_loop_that_used_the_wheel_is_freed_once_dropped(factory: object) -> None:
    import gc
    import weakref

    loop = factory()  # type: ignore[operator]

    async def main() -> None:
        async with aio.timeout(10):
            await asyncio.sleep(0.001)
        aio.call_later(100, print)

    loop.run_until_complete(main())
    loop.close()
    ref = weakref.ref(loop)
    del loop
    gc.collect()
    assert ref() is None
