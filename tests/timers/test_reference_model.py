"""Random schedule / cancel / advance sequences against a trivial reference model.

After every step, for every timer: each task fires exactly once unless cancelled,
never before its expiration, and no later than the first advance once the clock reads
expiration + tick; ``size`` is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel import HashedWheelTimer, HeapTimer, ManualClock, TimerBase, TimingWheelTimer

delays = st.one_of(
    st.integers(-50, 3),
    st.integers(0, 2_000),
    st.integers(0, 200_000),
    st.sampled_from([2**40, 2**62]),
)
steps = st.one_of(
    st.tuples(st.just("schedule"), delays),
    # Deadlines relative to the start (see check_against_model), around -1 and 0 too.
    st.tuples(st.just("schedule_at"), st.integers(-100, 300_000)),
    st.tuples(st.just("schedule_at_abs"), st.sampled_from([-2, -1, 0, 1, -2**40, 2**40])),
    st.tuples(st.just("cancel"), st.integers(0, 10_000)),
    st.tuples(st.just("advance"), st.one_of(st.integers(0, 300), st.integers(0, 30_000),
                                            st.sampled_from([2**41, 2**63]))),
    st.tuples(st.just("advance_clock"), st.just(0)),
)


@dataclass
class Expected:
    expiration: int
    added_at: int
    cancelled: bool = False
    runs: list[int] = field(default_factory=list)


def make_timers(clock: ManualClock, tick_ms: int, wheel_size: int) -> list[TimerBase]:
    return [
        TimingWheelTimer(tick_ms=tick_ms, wheel_size=wheel_size, clock=clock, executor=None),
        HashedWheelTimer(tick_ms=tick_ms, ticks_per_wheel=wheel_size, clock=clock,
                         executor=None),
        HeapTimer(clock=clock, executor=None),
    ]


@settings(max_examples=300, deadline=None)
@given(
    tick_ms=st.sampled_from([1, 2, 7, 100]),
    wheel_size=st.sampled_from([2, 3, 8, 256]),
    # Any int is a time: negative, zero and huge clocks too.
    start=st.one_of(st.integers(-10**6, 10**6), st.integers(-300, 300),
                    st.sampled_from([-2**62, -1, 0, 2**62])),
    ops=st.lists(steps, max_size=60),
)
def test_timers_match_the_reference_model(tick_ms: int, wheel_size: int, start: int,
                                          ops: list[tuple[str, int]]) -> None:
    clock = ManualClock(start_ms=start)
    for timer in make_timers(clock, tick_ms, wheel_size):
        check_against_model(timer, clock, ops, start)


def check_against_model(timer: TimerBase, clock: ManualClock, ops: list[tuple[str, int]],
                        start: int) -> None:
    clock.set(max(clock.now_ms(), start))
    tick = 1 if isinstance(timer, HeapTimer) else tick_ms_of(timer)
    model: list[Expected] = []
    tasks = []
    for op, arg in ops:
        now = clock.now_ms()
        if op in ("schedule", "schedule_at", "schedule_at_abs"):
            deadline = {"schedule": now + arg, "schedule_at": start + arg}.get(op, arg)
            exp = Expected(expiration=deadline, added_at=now)
            model.append(exp)
            fire = recorder(exp, clock)
            if op == "schedule":
                tasks.append(timer.schedule(arg, fire))
            else:
                tasks.append(timer.schedule_at(deadline, fire))
        elif op == "cancel" and tasks:
            i = arg % len(tasks)
            was_pending = not model[i].runs and not model[i].cancelled
            assert tasks[i].cancel() is was_pending
            model[i].cancelled = model[i].cancelled or was_pending
        elif op == "advance":
            clock.advance(arg)
        else:
            timer.advance_clock(0)
            assert_nothing_overdue(model, clock.now_ms(), tick)
        # The invariants, after every step.
        pending = 0
        for e in model:
            assert len(e.runs) <= 1, "ran twice"
            if e.cancelled:
                assert not e.runs, "ran after cancel"
                continue
            if e.runs:
                assert e.runs[0] >= e.expiration, "ran early"
            else:
                pending += 1
        assert timer.size == pending == len(timer)
    timer.advance_clock(0)
    assert_nothing_overdue(model, clock.now_ms(), tick)
    timer.close()


def recorder(e: Expected, clock: ManualClock) -> Callable[[], None]:
    return lambda: e.runs.append(clock.now_ms())


def assert_nothing_overdue(model: list[Expected], now: int, tick: int) -> None:
    """Right after an advance_clock, every task due by expiration + tick has run."""
    for e in model:
        if not e.cancelled and not e.runs:
            due_at_add = e.expiration <= e.added_at  # delay <= 0: the next advance runs it
            assert not due_at_add and now < e.expiration + tick, (
                f"late: expiration {e.expiration}, clock {now}, tick {tick}"
            )


def tick_ms_of(timer: TimerBase) -> int:
    return int(timer.tick_ms)  # type: ignore[attr-defined]
