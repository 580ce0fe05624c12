"""stop_on_signals: SIGINT and SIGTERM as a ``threading.Event`` that a run checks
between its batches, for the command-line entry points.

A handler runs in the main thread between any two of its bytecodes, perhaps while that
thread holds the event's lock (inside ``Event.wait``), the console's, or stdout's
buffer: setting the event or printing there could deadlock, or fail as a reentrant
call. So the handler only puts the signal on a ``queue.SimpleQueue``, whose ``put`` is
reentrant, and a thread of its own announces it and sets the event.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["stop_on_signals"]


@contextlib.contextmanager
def stop_on_signals(announce: Callable[[str], None]) -> Iterator[threading.Event]:
    """An event that SIGINT or SIGTERM sets, after ``announce`` is called with the
    signal's name (on a thread of its own). A second SIGINT raises
    ``KeyboardInterrupt`` in the main thread at once. The previous handlers come back
    on exit."""
    stop = threading.Event()
    signals: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    requested = False

    def handle(signum: int, frame: object) -> None:
        nonlocal requested
        if requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        requested = True
        signals.put(signum)

    def relay() -> None:
        while (signum := signals.get()) is not None:
            announce(signal.Signals(signum).name)
            stop.set()

    relay_thread = threading.Thread(target=relay, name="tickwheel-signals", daemon=True)
    relay_thread.start()
    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        signals.put(None)
        relay_thread.join()
