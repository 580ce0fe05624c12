"""tickwheel.aio.EventLoop: asyncio's selector loop with its timers on a timing wheel."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import importlib.util
import math
import random
import sys
import threading
import weakref
from collections.abc import Callable
from fractions import Fraction

import pytest

import tickwheel.aio as aio
from tests.aio.conftest import VirtualSelector, stock, virtual_loop, wheel

# -- handles ------------------------------------------------------------------------


def test_call_later_returns_a_handle_with_asyncios_timer_handle_api(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    handle = loop.call_later(5, print, "x")
    assert handle.when() == 1005.0
    assert not handle.cancelled()
    assert "when=1005.0" in repr(handle) and "print('x')" in repr(handle)
    assert isinstance(handle.get_context(), contextvars.Context)
    handle.cancel()
    assert handle.cancelled()
    assert "cancelled" in repr(handle)
    handle.cancel()  # twice is harmless
    assert loop.timer_stats().pending == 0


def test_handles_order_and_hash_by_when(vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    early, late = loop.call_at(1001.0, print), loop.call_at(1002.0, print)
    assert early < late and late > early and early <= late and late >= early
    assert sorted([late, early]) == [early, late]
    twin = loop.call_at(1001.0, print)
    assert early == twin and hash(early) == hash(twin) and early <= twin
    assert early != late


def test_call_at_and_call_later_refuse_none(vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    with pytest.raises(TypeError, match="when cannot be None"):
        loop.call_at(None, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay must not be None"):
        loop.call_later(None, print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nan"):
        loop.call_at(float("nan"), print)
    with pytest.raises(ValueError, match="delay must be a number of seconds, got nan"):
        loop.call_later(float("nan"), print)
    with pytest.raises(TypeError, match="when must be a number of seconds, got str '1'"):
        loop.call_at("1", print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay must be a number of seconds, got bytes"):
        loop.call_later(b"1", print)  # type: ignore[arg-type]


def test_any_real_number_is_a_time_and_an_int_past_a_float_is_never(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    ran: list[str] = []
    never = loop.call_at(10**400, ran.append, "never")
    long_ago = loop.call_later(-(10**400), ran.append, "long ago")
    half = loop.call_later(Fraction(1, 2), ran.append, "half")
    assert never.when() == math.inf and long_ago.when() == -math.inf
    assert half.when() == loop.time() + 0.5
    loop.run_until_complete(asyncio.sleep(1.0))
    assert ran == ["long ago", "half"]
    assert not never.cancelled() and loop.timer_stats().pending == 1


def test_a_closed_loop_refuses_timers_and_cancels_its_pending_handles() -> None:
    loop, _ = virtual_loop(wheel)
    handle = loop.call_later(10, print)
    loop.close()
    assert handle.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_later(1, print)


# -- time ---------------------------------------------------------------------------


def _run_schedule(factory: object, delays: list[float]) -> list[tuple[int, float, float]]:
    loop, _ = virtual_loop(factory)  # type: ignore[arg-type]
    ran: list[tuple[int, float, float]] = []
    handles = [loop.call_later(d, lambda i=i: ran.append((i, loop.time(), handles[i].when())))
               for i, d in enumerate(delays)]
    loop.run_until_complete(asyncio.sleep(max(delays) + 0.01))
    loop.close()
    return ran


def test_a_handle_never_runs_early_nor_more_than_a_tick_after_the_stock_loop() -> None:
    rnd = random.Random(7)
    delays = [rnd.choice([0.0, -1.0, rnd.uniform(0, 0.01), rnd.uniform(0, 5), 0.0015])
              for _ in range(3000)]
    ours = _run_schedule(wheel, delays)
    theirs = _run_schedule(stock, delays)
    assert len(ours) == len(theirs) == len(delays)
    at_stock = {i: t for i, t, _ in theirs}
    for i, t, when in ours:
        assert t >= when, f"handle {i} ran {when - t} s early"
        assert t - at_stock[i] <= 0.001 + 1e-9, f"handle {i} ran {t - at_stock[i]} s late"


def test_due_handles_run_in_when_order_zero_and_negative_delays_included(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    order: list[float] = []
    for delay in (0.003, 0.001, -5, 0.0002, 0.0, 0.0021, 0.0001):
        loop.call_later(delay, order.append, delay)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert order == [-5, 0.0, 0.0001, 0.0002, 0.001, 0.0021, 0.003]


def test_zero_delay_runs_at_the_next_iteration_not_inside_call_later(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    ran: list[int] = []
    loop.call_later(0, ran.append, 1)
    assert ran == []
    loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(asyncio.sleep(0))
    assert ran == [1]


def test_loop_time_is_the_clock_so_a_replaced_time_moves_timers() -> None:
    loop = aio.new_event_loop()
    try:
        now = [50.0]
        loop.time = lambda: now[0]  # type: ignore[method-assign]
        ran: list[float] = []
        loop.call_at(60.0, lambda: ran.append(loop.time()))
        loop.run_until_complete(asyncio.sleep(0))
        assert ran == []
        now[0] = 60.0
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))
        assert ran == [60.0]
    finally:
        loop.close()


def test_a_subclass_that_overrides_time_is_the_clock_too() -> None:
    class Shifted(aio.EventLoop):
        def time(self) -> float:
            return super().time() + 1000.0

    loop = Shifted()
    try:
        handle = loop.call_later(1, print)
        assert handle.when() >= asyncio.SelectorEventLoop.time(loop) + 1000.0
    finally:
        loop.close()


def test_the_stock_clock_read_directly_is_the_stock_loops_time() -> None:
    loop = aio.new_event_loop()
    stock_loop = asyncio.SelectorEventLoop()
    try:
        before = stock_loop.time()
        when = loop.call_later(0, print).when()
        assert before <= when <= stock_loop.time()
    finally:
        loop.close()
        stock_loop.close()


def test_a_clock_that_goes_back_delays_handles_without_spinning() -> None:
    loop = aio.new_event_loop()
    try:
        now = [100.0]
        loop.time = lambda: now[0]  # type: ignore[method-assign]
        loop.run_until_complete(asyncio.sleep(0))
        now[0] = 90.0
        ran: list[float] = []
        loop.call_at(95.0, lambda: ran.append(loop.time()))
        for _ in range(5):
            loop.run_until_complete(asyncio.sleep(0))
        assert ran == [] and loop.timer_stats().fires <= 5
        assert loop.timer_stats().pending == 1
        now[0] = 95.0
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))
        assert ran == [95.0]
        stats = loop.timer_stats()
        assert (stats.pending, stats.expired, stats.cancelled) == (0, 1, 0)
    finally:
        loop.close()


def test_an_idle_loop_sleeps_until_the_wheels_next_bucket(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, selector = vloop
    ran: list[float] = []
    loop.call_later(5.0, ran.append, 1)
    loop.call_later(3600.0, ran.append, 2)
    selector.timeouts.clear()
    loop.run_until_complete(asyncio.sleep(5.0))
    assert ran == [1]
    assert len(selector.timeouts) <= 4
    assert max(t for t in selector.timeouts if t is not None) >= 4.999


def test_a_million_cancelled_timers_leave_nothing_behind(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    for i in range(100_000):
        loop.call_later(1 + i % 60, print).cancel()
    stats = loop.timer_stats()
    assert stats.pending == 0 and stats.cancelled == 100_000
    assert stats.arms < 100


# -- the cyclic collector ---------------------------------------------------------------

hides = pytest.mark.skipif(importlib.util.find_spec("tickwheel.aio._gc") is None,
                           reason="handles are hidden only where the package is compiled")


@hides
def test_a_running_loops_pending_handles_are_hidden_from_the_collector_until_they_leave(
        ) -> None:
    # A real clock: a virtual one set after the wheel was made reads as a clock that
    # went back, and its handles wait outside the wheel. Nothing here depends on timing.
    loop = aio.new_event_loop()
    early = loop.call_later(0.001, int)  # scheduled before the loop runs
    assert gc.is_tracked(early)
    seen: dict[str, object] = {}

    async def main() -> aio.TimerHandle:
        ran, cancelled, left = (loop.call_later(d, int) for d in (0.001, 2.0, 3600.0))
        seen["pending"] = [gc.is_tracked(h) for h in (ran, cancelled, left)]
        cancelled.cancel()
        seen["cancelled"] = gc.is_tracked(cancelled)
        await asyncio.sleep(0.01)
        seen["ran"] = gc.is_tracked(ran)
        seen["left"] = gc.is_tracked(left)
        return left

    try:
        left = loop.run_until_complete(main())
        assert seen == {"pending": [False, False, False], "cancelled": True, "ran": True,
                        "left": False}
        # Stopped, the loop may be dropped: every handle it still holds is seen again.
        assert gc.is_tracked(left) and not left.cancelled() and gc.is_tracked(early)
    finally:
        loop.close()


@hides
def test_the_count_of_hidden_handles_tells_a_stop_whether_to_walk_the_wheel() -> None:
    from tickwheel.aio import _gc

    loop = aio.new_event_loop()
    before = _gc.hidden()

    async def run(leave: int) -> int:
        # asyncio.timeout blocks that end, as a request's do: their handles leave.
        for _ in range(100):
            async with asyncio.timeout(30):
                await asyncio.sleep(0)
        for _ in range(leave):
            loop.call_later(3600.0, int)
        return _gc.hidden() - before

    try:
        assert loop.run_until_complete(run(0)) == 0  # nothing left hidden: no walk
        assert loop.run_until_complete(run(5)) == 5
        assert _gc.hidden() == before  # the stop showed the five again
    finally:
        loop.close()


@hides
def test_a_loop_stopped_by_keyboard_interrupt_shows_its_pending_handles_again() -> None:
    from tickwheel.aio import _gc

    loop = aio.new_event_loop()
    before = _gc.hidden()
    left: list[asyncio.TimerHandle] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    async def main() -> None:
        left.extend(loop.call_later(3600.0, int) for _ in range(3))
        assert _gc.hidden() - before == 3
        loop.call_soon(interrupt)
        await asyncio.sleep(3600.0)

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main())
        assert _gc.hidden() == before
        assert all(gc.is_tracked(handle) and not handle.cancelled() for handle in left)
    finally:
        loop.close()


@pytest.mark.parametrize("factory", [aio.new_event_loop, asyncio.SelectorEventLoop],
                         ids=["tickwheel-loop", "stock-loop-with-tickwheel-aio"])
def test_a_loop_dropped_unclosed_with_pending_handles_is_collected_as_the_stock_one(
        factory: Callable[[], asyncio.AbstractEventLoop],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def run_and_drop() -> weakref.ref[asyncio.AbstractEventLoop]:
        loop = factory()

        async def main() -> None:
            # A cycle through a pending handle: its callback holds a future, which
            # holds the loop, which holds the wheel, which holds the handle.
            aio.call_later(3600.0, loop.create_future().set_result, None)
            loop.call_later(3600.0, loop.create_future().set_result, None)

        loop.run_until_complete(main())
        return weakref.ref(loop)

    gone = run_and_drop()
    # The stock loop's __del__ closes its self-pipe, which the collector may have
    # finalized first (asyncio's own quirk, in any loop collected this way): that one
    # error is allowed, and nothing else.
    unraisable: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_value))
    with pytest.warns(ResourceWarning, match="unclosed event loop"):
        gc.collect()
    assert gone() is None
    assert all(isinstance(exc, ValueError) and "Invalid file descriptor" in str(exc)
               for exc in unraisable), unraisable


def test_handles_on_another_loops_wheel_are_never_hidden() -> None:
    # tickwheel.aio.call_later cannot see that loop stop, so its handles stay tracked.
    loop = asyncio.new_event_loop()

    async def main() -> bool:
        return gc.is_tracked(aio.call_later(3600.0, print))

    try:
        assert loop.run_until_complete(main()) is True
    finally:
        loop.close()


# -- asyncio on top -------------------------------------------------------------------


def test_sleep_timeout_timeout_at_wait_for_and_taskgroup_keep_their_times(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop

    async def main() -> list[float]:
        marks = []
        start = loop.time()
        await asyncio.sleep(0.25)
        marks.append(loop.time() - start)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await asyncio.sleep(10)
        marks.append(loop.time() - start)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout_at(loop.time() + 1):
                await asyncio.Event().wait()
        marks.append(loop.time() - start)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 2)
        marks.append(loop.time() - start)
        async with asyncio.TaskGroup() as group:
            for delay in (1, 3, 2):
                group.create_task(asyncio.sleep(delay))
        marks.append(loop.time() - start)
        return marks

    marks = loop.run_until_complete(main())
    expected = [0.25, 0.75, 1.75, 3.75, 6.75]
    for got, want in zip(marks, expected, strict=True):
        assert want <= got <= want + 0.001 * 5


# -- callbacks ------------------------------------------------------------------------


def test_a_callback_that_raises_goes_to_the_exception_handler_and_the_rest_run(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    ran: list[int] = []
    loop.call_later(1, ran.append, 1)
    loop.call_later(1, lambda: 1 / 0)
    loop.call_later(1, ran.append, 2)
    loop.run_until_complete(asyncio.sleep(1.01))
    assert sorted(ran) == [1, 2]
    assert len(errors) == 1 and isinstance(errors[0]["exception"], ZeroDivisionError)
    assert "Exception in callback" in str(errors[0]["message"])


def test_keyboard_interrupt_propagates_and_the_other_due_handles_still_run(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    ran: list[int] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    loop.call_at(1001.0, ran.append, 1)
    loop.call_at(1001.0005, interrupt)
    loop.call_at(1001.0007, ran.append, 2)
    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(asyncio.sleep(2))
    assert ran == [1]
    loop.run_until_complete(asyncio.sleep(0.01))
    assert ran == [1, 2]


def test_a_handle_cancelled_by_an_earlier_one_in_the_same_tick_does_not_run(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    ran: list[int] = []
    later = loop.call_at(1001.0009, ran.append, 2)
    loop.call_at(1001.0001, later.cancel)
    loop.run_until_complete(asyncio.sleep(2))
    assert ran == [] and later.cancelled()
    stats = loop.timer_stats()
    assert (stats.expired, stats.cancelled) == (2, 1)  # the canceller and the sleep ran


def test_each_callback_runs_in_the_context_of_its_schedule_and_keeps_its_changes(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    def look_and_set(tag: str) -> None:
        seen.append(f"{tag}:{var.get()}")
        var.set(tag)

    var.set("a")
    loop.call_later(1, look_and_set, "one")
    loop.call_later(2, look_and_set, "two")  # same variables: shares the snapshot
    var.set("b")
    loop.call_later(3, look_and_set, "three")
    loop.run_until_complete(asyncio.sleep(4))
    assert seen == ["one:a", "two:a", "three:b"]
    assert var.get() == "b"


def test_equal_but_distinct_values_are_not_shared_between_snapshots(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    var: contextvars.ContextVar[list[int]] = contextvars.ContextVar("var")
    first, second = [1], [1]
    seen: list[list[int]] = []
    var.set(first)
    loop.call_later(1, lambda: seen.append(var.get()))
    var.set(second)
    loop.call_later(1, lambda: seen.append(var.get()))
    loop.run_until_complete(asyncio.sleep(2))
    assert seen[0] is first and seen[1] is second


def test_an_explicit_context_is_used_as_given(
        vloop: tuple[aio.EventLoop, VirtualSelector]) -> None:
    loop, _ = vloop
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    context = contextvars.Context()
    handle = loop.call_later(1, var.set, "inside", context=context)
    assert handle.get_context() is context
    loop.run_until_complete(asyncio.sleep(2))
    assert context[var] == "inside"


# -- debug mode -----------------------------------------------------------------------


def test_debug_mode_refuses_coroutines_and_calls_from_other_threads() -> None:
    loop, _ = virtual_loop(wheel)
    loop.set_debug(True)

    async def coro() -> None:
        pass

    try:
        with pytest.raises(TypeError, match="coroutines cannot be used with call_later"):
            loop.call_later(1, coro)
        with pytest.raises(TypeError, match="callable object was expected by call_at"):
            loop.call_at(1, 42)  # type: ignore[arg-type]
        errors: list[BaseException] = []

        async def from_another_thread() -> None:
            def worker() -> None:
                try:
                    loop.call_later(1, print)
                except RuntimeError as exc:
                    errors.append(exc)
            thread = threading.Thread(target=worker)
            thread.start()
            thread.join()

        loop.run_until_complete(from_another_thread())
        assert len(errors) == 1 and "Non-thread-safe" in str(errors[0])
        handle = loop.call_later(1, print)
        assert handle._source_traceback[-1][0] == __file__  # type: ignore[attr-defined]
        assert f"created at {__file__}:" in repr(handle)
    finally:
        loop.close()


def test_debug_mode_reports_each_slow_handle_by_name(
        caplog: pytest.LogCaptureFixture) -> None:
    loop, selector = virtual_loop(wheel)
    loop.set_debug(True)
    loop.slow_callback_duration = 0.5

    def slow() -> None:
        selector.now += 1.0  # the callback "takes" a second of loop time

    try:
        loop.call_later(1, slow)
        with caplog.at_level("WARNING", logger="asyncio"):
            loop.run_until_complete(asyncio.sleep(2))
        assert any("Executing <TimerHandle" in r.message and "slow" in r.message
                   and "took 1.000 seconds" in r.message for r in caplog.records)
    finally:
        loop.close()


# -- installing it ----------------------------------------------------------------------


def test_runner_with_loop_factory_runs_on_the_wheel() -> None:
    async def main() -> str:
        await asyncio.sleep(0.001)
        return type(asyncio.get_running_loop()).__name__

    with asyncio.Runner(loop_factory=aio.new_event_loop) as runner:
        assert runner.run(main()) == "EventLoop"


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="policies are deprecated from 3.14")
def test_the_policy_makes_asyncio_run_use_the_wheel() -> None:
    async def main() -> bool:
        await asyncio.sleep(0.001)
        return isinstance(asyncio.get_running_loop(), aio.EventLoop)

    asyncio.set_event_loop_policy(aio.EventLoopPolicy())
    try:
        assert asyncio.run(main())
    finally:
        asyncio.set_event_loop_policy(None)


# -- the shortcuts, each switchable ------------------------------------------------------

def test_with_every_shortcut_off_the_loop_runs_the_same_callbacks_in_the_same_order(
        ) -> None:
    def run(shortcuts: aio.LoopShortcuts) -> list[int]:
        loop = aio.new_event_loop(shortcuts=shortcuts)
        ran: list[int] = []

        async def main() -> None:
            # Deadlines from one reading of the clock: the order cannot depend on how
            # long making the handles took (on a loaded machine, more than a tick).
            now = loop.time()
            handles = [loop.call_at(now + d / 1000, ran.append, i)
                       for i, d in enumerate((5, 1, 3, 2, 4, 6))]
            handles[2].cancel()
            await asyncio.sleep(0.03)

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
        return ran

    off = aio.LoopShortcuts(bound_methods=False, direct_clock=False, hidden_handles=False)
    assert run(aio.LoopShortcuts()) == run(off) == [1, 3, 4, 0, 5]


def test_bound_methods_off_leaves_call_later_the_classs_own_method() -> None:
    on, off = aio.new_event_loop(), aio.new_event_loop(
        shortcuts=aio.LoopShortcuts(bound_methods=False))
    try:
        assert "call_later" in vars(on) and "call_at" in vars(on)
        assert "call_later" not in vars(off) and "call_at" not in vars(off)
        assert off.call_later(3600.0, int).when() > off.time()
    finally:
        on.close()
        off.close()


def test_direct_clock_off_reads_every_time_through_loop_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reads = 0
    stock_time = asyncio.BaseEventLoop.time

    def counted(self: asyncio.BaseEventLoop) -> float:
        nonlocal reads
        reads += 1
        return stock_time(self)

    # The class's own method, replaced before the loops exist: still "the stock method"
    # to the shortcut, which then reads time.monotonic() without calling it.
    monkeypatch.setattr(asyncio.BaseEventLoop, "time", counted)
    for direct, expected in ((True, 0), (False, 100)):
        loop = aio.new_event_loop(shortcuts=aio.LoopShortcuts(direct_clock=direct))
        try:
            reads = 0
            for _ in range(100):
                loop.call_later(3600.0, int)
            assert reads == expected, direct
        finally:
            loop.close()


@hides
def test_hidden_handles_off_leaves_a_running_loops_handles_tracked() -> None:
    loop = aio.new_event_loop(shortcuts=aio.LoopShortcuts(hidden_handles=False))

    async def main() -> bool:
        return gc.is_tracked(loop.call_later(3600.0, int))

    try:
        assert loop.run_until_complete(main()) is True
    finally:
        loop.close()
