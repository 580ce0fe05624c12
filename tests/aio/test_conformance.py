"""CPython's own asyncio tests pass on tickwheel's loop (python -m
tickwheel.aio.conformance), and the harness refuses what it cannot run."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

import pytest

#: CPython's asyncio tests need a few hundred MB; a runaway test fails with a
#: MemoryError and its name instead of taking the machine's memory.
_MEMORY_LIMIT = 4 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))


#: CPython's asyncio test modules in two halves of about equal running time, so that
#: two test processes share the suite: these, and every other default module.
_FIRST_HALF = ("test_tasks", "test_taskgroups", "test_sslproto", "test_futures",
               "test_sendfile", "test_base_events", "test_waitfor", "test_locks")


def _half(which: int) -> list[str]:
    from tickwheel.aio.conformance import DEFAULT_MODULES

    assert set(_FIRST_HALF) < set(DEFAULT_MODULES)
    return [m for m in DEFAULT_MODULES if (m in _FIRST_HALF) == (which == 1)]


@pytest.mark.slow
@pytest.mark.parametrize("which", [1, 2])
def test_cpythons_asyncio_tests_pass_on_the_wheel_loop(which: int) -> None:
    modules = _half(which)
    # -v names each test as it runs: a test that fails the run shows in the report.
    result = subprocess.run([sys.executable, "-m", "tickwheel.aio.conformance", "-v",
                             *modules],
                            capture_output=True, text=True, timeout=900, check=False,
                            preexec_fn=_limit_memory)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-8000:]
    created = [line for line in report.splitlines()
               if line.startswith("tickwheel.aio.EventLoop instances created:")]
    assert created and int(created[0].rsplit(":", 1)[1]) > 100
    assert "\nOK" in report


def test_the_harness_refuses_a_name_that_is_not_a_test_module() -> None:
    result = subprocess.run([sys.executable, "-m", "tickwheel.aio.conformance", "../etc"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "not a test_asyncio module name: ../etc" in result.stderr


def _ignore_sigint_and_limit_memory() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _limit_memory()


def test_the_harness_interrupts_the_main_thread_even_when_started_with_sigint_ignored(
) -> None:
    # A background job of a non-interactive shell inherits SIGINT ignored; test_runners'
    # interrupt tests would then wait forever (on any loop), allocating as they wait.
    result = subprocess.run(
        [sys.executable, "-m", "tickwheel.aio.conformance", "--loop", "stock", "-v",
         "test_runners"],
        capture_output=True, text=True, timeout=120, check=False,
        preexec_fn=_ignore_sigint_and_limit_memory)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-8000:]
    assert "test_interrupt_call_soon" in report and "skipped" not in report
