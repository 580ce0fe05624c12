"""The pure-Python build (an install without a C compiler) keeps the timers small:
run from a copy of the sources without the compiled modules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tickwheel

_SCRIPT = """
import random, tracemalloc
import tickwheel
from tickwheel import ManualClock, TimingWheelTimer
assert not tickwheel.compiled
rng = random.Random(7)
n = 200_000
delays = [rng.randint(30_000, 60_000) for _ in range(n)]
clock = ManualClock(0)
timer = TimingWheelTimer(clock=clock, executor=None)
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
tasks = [timer.schedule(d, int) for d in delays]
per_task = (tracemalloc.get_traced_memory()[0] - before - 8 * n) / n
tracemalloc.stop()
# Cancel half at random (swap-removes reuse the shared positions), then expire the rest.
for i in rng.sample(range(n), n // 2):
    assert tasks[i].cancel()
clock.set(60_001)
while timer.advance_clock(0):
    pass
assert timer.size == 0 and timer.stats().expired == n - n // 2
print(per_task)
"""


def test_a_pending_pure_python_timer_takes_about_half_of_an_asyncio_handle(
        tmp_path: Path) -> None:
    package = Path(tickwheel.__file__).parent
    shutil.copytree(package, tmp_path / "tickwheel",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    # 114 B measured (asyncio's TimerHandle: 209 B): the task's 72 B, its expiration
    # (an int object) and its place in a bucket, whose index int is shared.
    assert float(result.stdout) < 125
