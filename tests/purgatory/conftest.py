from __future__ import annotations

from collections.abc import Iterator

import pytest

from tickwheel import DelayedOperation, ManualClock, Purgatory, TimingWheelTimer


class MockOperation(DelayedOperation):
    """Kafka's MockDelayedOperation: completes once ``completable`` is set."""

    def __init__(self, delay_ms: int, lock: object | None = None) -> None:
        super().__init__(delay_ms, lock)  # type: ignore[arg-type]
        self.completable = False
        self.completions = 0
        self.expirations = 0

    def try_complete(self) -> bool:
        if self.completable:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions += 1

    def on_expiration(self) -> None:
        self.expirations += 1


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=0)


@pytest.fixture
def purgatory(clock: ManualClock) -> Iterator[Purgatory]:
    """The deterministic set-up: expirations run inside advance_clock(0)."""
    p = Purgatory("mock", timer=TimingWheelTimer(clock=clock, executor=None), reaper=False)
    yield p
    p.close()
