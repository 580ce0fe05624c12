from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest

from tickwheel import HashedWheelTimer, HeapTimer, ManualClock, TimerBase, TimingWheelTimer

TimerFactory = Callable[..., TimerBase]

TIMER_FACTORIES: dict[str, TimerFactory] = {
    "timing_wheel": lambda clock, **kw: TimingWheelTimer(clock=clock, **kw),
    "timing_wheel_tick10": lambda clock, **kw: TimingWheelTimer(tick_ms=10, wheel_size=8,
                                                                 clock=clock, **kw),
    "hashed_wheel": lambda clock, **kw: HashedWheelTimer(tick_ms=1, ticks_per_wheel=64,
                                                         clock=clock, **kw),
    "hashed_wheel_tick100": lambda clock, **kw: HashedWheelTimer(clock=clock, **kw),
    "heap": lambda clock, **kw: HeapTimer(clock=clock, **kw),
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=1_000)


@pytest.fixture(params=sorted(TIMER_FACTORIES))
def timer(request: pytest.FixtureRequest, clock: ManualClock) -> TimerBase:
    """Each timer on a manual clock, running due tasks inline in advance_clock."""
    t = TIMER_FACTORIES[request.param](clock, executor=None)
    yield t
    t.close()


def tick_of(timer: TimerBase) -> int:
    return int(getattr(timer, "tick_ms", 1))


def pytest_report_header() -> str:
    import tickwheel

    where = tickwheel.__file__
    return f"tickwheel {tickwheel.__version__}: compiled={tickwheel.compiled} ({where})"


def eventually(predicate: Callable[[], bool], timeout_s: float = 30.0, *,
               unless: Callable[[], bool] | None = None) -> bool:
    """Poll ``predicate`` until it holds (True), or ``timeout_s`` passes or ``unless``
    holds (False: a process waited on died, say). For real-time tests only, waiting on
    threads or processes, never on a timer a test could drive."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if unless is not None and unless():
            return predicate()
        time.sleep(0.005)
    return predicate()



def wait_for(condition: Callable[[], bool], what: str, child: subprocess.Popen[str],
             timeout_s: float = 180) -> None:
    """:func:`eventually` ``condition``, while ``child`` runs; an AssertionError that
    says which of the two failed (with what the child wrote, if it was kept)."""
    if eventually(condition, timeout_s, unless=lambda: child.poll() is not None):
        return
    if child.poll() is not None:
        raise AssertionError(f"the run stopped waiting for {what}: {child.stdout.read()}"
                             if child.stdout else f"the run stopped waiting for {what}")
    raise AssertionError(f"no {what} in {timeout_s} s")
