from __future__ import annotations

import time

import pytest

from tickwheel import Clock, ManualClock, SystemClock


def test_manual_clock_moves_only_when_told() -> None:
    c = ManualClock(start_ms=5)
    assert c.now_ms() == 5
    assert c.advance(10) == 15
    c.set(20)
    assert c.now_ms() == 20
    c.set(20)  # setting the same time is fine


@pytest.mark.parametrize("move", [lambda c: c.advance(-1), lambda c: c.set(19)])
def test_manual_clock_refuses_to_go_backwards(move: object) -> None:
    c = ManualClock(start_ms=20)
    with pytest.raises(ValueError, match="ms"):
        move(c)  # type: ignore[operator]
    assert c.now_ms() == 20


def test_manual_clock_takes_whole_milliseconds() -> None:
    with pytest.raises(TypeError, match="start_ms"):
        ManualClock(start_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ms"):
        ManualClock().advance("1")  # type: ignore[arg-type]


def test_system_clock_is_monotonic_milliseconds() -> None:
    c = SystemClock()
    a = c.now_ms()
    time.sleep(0.01)
    b = c.now_ms()
    assert 5 <= b - a < 5_000
    assert abs(a - time.monotonic_ns() // 1_000_000) < 1_000


def test_both_clocks_satisfy_the_protocol() -> None:
    clocks: list[Clock] = [SystemClock(), ManualClock()]
    assert [c.realtime for c in clocks] == [True, False]
    assert all(isinstance(c.now_ms(), int) for c in clocks)
