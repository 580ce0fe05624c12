"""SIGINT and SIGTERM stop a command's run between its batches, from any moment."""

from __future__ import annotations

import subprocess
import sys

import pytest

PRELUDE = """
import os, signal, time
from tickwheel._signals import stop_on_signals
announce = lambda name: print(name, "announced", flush=True)
"""


def run(script: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PRELUDE + script], check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_sets_the_event_after_announcing_it_and_the_handlers_come_back(
        signum: str) -> None:
    # Whatever handled the signal before (a shell that started the run in the
    # background leaves SIGINT ignored), it comes back, both of them.
    assert run(f"""
before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
with stop_on_signals(announce) as stop:
    assert signal.getsignal(signal.{signum}) not in before
    os.kill(os.getpid(), signal.{signum})
    print("set" if stop.wait(30) else "not set")
after = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
print("restored:", after == before)
""") == [f"{signum} announced", "set", "restored: True"]


def test_a_signal_while_the_main_thread_holds_the_events_lock_still_sets_it() -> None:
    # A handler runs between any two bytecodes of the main thread: here, with the
    # event's lock held, as inside Event.wait. A handler that set the event itself
    # would wait for that lock forever.
    assert run("""
with stop_on_signals(announce) as stop:
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    print("set" if stop.wait(30) else "not set")
""") == ["SIGTERM announced", "set"]


def test_a_second_sigint_interrupts_at_once() -> None:
    assert run("""
with stop_on_signals(announce) as stop:
    os.kill(os.getpid(), signal.SIGINT)
    stop.wait(30)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # not reached: the handler raises in this thread
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted")
""") == ["SIGINT announced", "interrupted"]
