"""The heap baseline: lazy cancellation, with compaction so memory stays bounded."""

from __future__ import annotations

from tickwheel import HeapTimer, ManualClock


def test_cancelled_entries_are_compacted_away(clock: ManualClock) -> None:
    t = HeapTimer(clock=clock, executor=None)
    tasks = [t.schedule(10_000 + i, lambda: None) for i in range(10_000)]
    for task in tasks[:9_000]:
        task.cancel()
    assert t.size == 1_000
    assert t.compactions >= 1
    assert len(t._heap) <= 2 * t.size + 1_100  # stale entries stay bounded


def test_a_task_moved_within_the_heap_runs_once(clock: ManualClock) -> None:
    t = HeapTimer(clock=clock, executor=None)
    ran: list[int] = []
    task = t.schedule(100, ran.append, 1)
    for _ in range(3):
        t.add(task)  # same expiration each time: several entries look alike
    assert t.size == 1
    clock.advance(200)
    t.advance_clock(0)
    assert ran == [1] and t.size == 0
