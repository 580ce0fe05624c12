"""The follow benchmark's report: delays overall, and the expiries' tail minute by
minute, so that start-up and the steady state can be told apart."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from benchmarks._follow import FollowRun, Minute, _cpu_s, _descendants, follow_table
from tests.conftest import eventually


def test_the_report_splits_the_expiries_tail_by_the_minute_their_files_were_written(
) -> None:
    run = FollowRun("spark", 5000, started_ms=1_000_000)
    for i in range(100):  # minute 1: slow start; minute 2: steady
        run.expiry_ms.append(20_000 if i == 0 else 3_000)
        run.expiry_written_ms.append(1_000_000 + 10 * i)
        run.expiry_ms.append(1_200)
        run.expiry_written_ms.append(1_060_000 + 10 * i)
    run.minutes = [Minute(1, 300, 10, 6_000, 1.5, 2.0, 200, 800, 300),
                   Minute(2, 290, 0, 3_000, 1.6, 9.0, 210, 900, 400, cpu_s=95.25)]
    table = follow_table([run])
    assert "| spark | 200 | 2,100 | 3,000 | 20,000 |" in table  # p50, p99, max overall
    assert "| spark | 1 | 100 | 20,000 | 300 |" in table
    assert "| spark | 2 | 100 | 1,200 | 290 |" in table
    # The state as saved, the checkpoint; the engine, its JVM, its workers; the CPU
    # seconds of them all in the minute.
    assert table.endswith("| 1.6 | 9.0 | 210 | 900 | 400 | 95.2 |")


def test_children_started_by_any_thread_count_as_the_engines() -> None:
    # The JVM starts its Python workers from threads other than its main one.
    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"])))
    thread.start()
    thread.join()
    try:
        assert started[0].pid in _descendants(os.getpid())
    finally:
        started[0].kill()
        started[0].wait()


def test_cpu_seconds_count_a_busy_child_and_nothing_for_a_gone_process() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        before = _cpu_s([busy.pid])
        assert eventually(lambda: _cpu_s([busy.pid]) >= before + 0.2, 60)
    finally:
        busy.kill()
        busy.wait()
    assert _cpu_s([busy.pid]) == 0.0  # reaped: nothing to read
