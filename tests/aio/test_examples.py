"""The idle-timeout server example runs on tickwheel's loop and closes exactly the
quiet connections (real time, generous bounds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "idle_timeouts.py"


@pytest.mark.realtime
def test_idle_timeouts_example_closes_every_quiet_connection() -> None:
    result = subprocess.run([sys.executable, str(EXAMPLE), "--connections", "2000",
                             "--idle", "1"], capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tickwheel.aio._loop.EventLoop serving" in result.stdout
    assert "closed 1,800 for idleness, 200 by the client" in result.stdout
    assert "every idle connection was closed by its timeout" in result.stdout


def test_idle_timeouts_example_refuses_more_connections_than_the_file_limit() -> None:
    result = subprocess.run([sys.executable, str(EXAMPLE), "--connections", "10000000"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "--connections must be between 1 and" in result.stderr
