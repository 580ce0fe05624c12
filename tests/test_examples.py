"""The programs in examples/ run and say what they are for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(*args: str, cwd: Path | None = None, env_path: str | None = None) -> str:
    import os

    env = dict(os.environ)
    if env_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env_path, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_recurring_schedules_follow_their_zones_across_a_clock_change() -> None:
    out = _run(str(EXAMPLES / "recurring_schedule.py"), "--days", "3")
    assert "Sat 2026-03-28 09:00 UTC  coupons" in out  # 09:00 GMT
    assert "Sun 2026-03-29 08:00 UTC  coupons" in out  # 09:00 BST
    assert out.count("earnings") == 3 and "18:00 UTC  earnings" in out


def test_expired_sessions_are_each_dispatched_once() -> None:
    out = _run(str(EXAMPLES / "expired_sessions.py"), "--members", "200", "--seconds", "30")
    assert "every expiry delivered exactly once" in out
    assert "sessions expired 0," not in out


def test_idle_connections_time_out() -> None:
    out = _run(str(EXAMPLES / "idle_timeouts.py"), "--connections", "50", "--idle", "0.5")
    assert "every idle connection was closed by its timeout, none early" in out


def test_a_processor_gets_every_outcome_of_a_run(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    _run("-m", "tickwheel.cli", "generate", "--events", "5000", "--output", "events",
         cwd=tmp_path)
    out = _run("-m", "tickwheel.cli", "run", "--input", "events", "--output", "out",
               "--processor", "outcome_processor:CountByOutcome", cwd=tmp_path,
               env_path=str(EXAMPLES))
    assert "outcomes by kind: {'cancelled':" in out
    assert "0 refused by the processor" in out


@pytest.mark.slow
def test_the_service_example_runs_end_to_end() -> None:
    pytest.importorskip("aiohttp")
    out = _run(str(EXAMPLES / "service_with_client.py"))
    assert "heartbeat is paused" in out
    assert "expired  order-17" in out and "cancelled  order-18" in out
    assert "fired  heartbeat@" in out
