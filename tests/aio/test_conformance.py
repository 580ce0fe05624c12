"""CPython's own asyncio tests pass on tickwheel's loop (python -m
tickwheel.aio.conformance), and the harness refuses what it cannot run."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_cpythons_asyncio_tests_pass_on_the_wheel_loop() -> None:
    result = subprocess.run([sys.executable, "-m", "tickwheel.aio.conformance"],
                            capture_output=True, text=True, timeout=900, check=False)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-5000:]
    created = [line for line in report.splitlines()
               if line.startswith("tickwheel.aio.EventLoop instances created:")]
    assert created and int(created[0].rsplit(":", 1)[1]) > 300
    assert "\nOK" in report


def test_the_harness_refuses_a_name_that_is_not_a_test_module() -> None:
    result = subprocess.run([sys.executable, "-m", "tickwheel.aio.conformance", "../etc"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "not a test_asyncio module name: ../etc" in result.stderr
