"""The locks benchmark times each lock each way and tabulates it against
``threading.Lock``."""

from __future__ import annotations

from benchmarks._locks import lock_table, run_locks
from tickwheel import _mutex


def test_every_lock_is_timed_each_way_and_the_table_gives_the_ratio() -> None:
    results = run_locks(1_000, 2)
    timed = {(r.lock, r.way) for r in results}
    expected = {("threading.Lock", "acquire+release"), ("threading.Lock", "with"),
                ("tickwheel", "with")}
    if _mutex.native:
        expected.add(("tickwheel", "acquire+release"))
    assert timed == expected and all(r.ns > 0 for r in results)
    table = lock_table(results)
    assert "Mutex (" in table and table.count("\n") == 3
    assert ("RawLock (" in table) is _mutex.native
