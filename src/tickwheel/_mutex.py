"""Mutex: a non-reentrant lock that costs less to take than ``threading.Lock``.

A timer takes its lock on every schedule and every cancel, and a purgatory several
times per operation, so what one lock cycle costs shows in every workload. On CPython
3.11 ``Lock.acquire()`` is called through the keyword-argument parser
(``PyArg_ParseTupleAndKeywords``).

Where the package was built with a C compiler, the lock is ``tickwheel._rawlock``'s
``RawLock``: ``acquire()`` and ``release()`` take no arguments and go straight to a
semaphore: less than half the instructions of the token below per lock cycle
(docs/timers.md#locking has the counts).

Without one (``native`` false), the lock is a ``queue.SimpleQueue`` holding one token:
a binary semaphore whose ``get`` and ``put`` are vectorcall methods with a fast path
that neither parses keywords nor reads a clock; ``get`` blocks (without the GIL) while
another thread holds the token, and it costs a compiled caller less than
``threading.Lock``. A pure-Python caller gets a plain ``threading.Lock`` instead
(``new_lock``), whose ``with`` runs in C.

Either way the lock's methods are bound once, so ``with mutex:`` is two direct calls.
``Mutex`` has ``acquire``/``release`` with ``threading.Lock``'s signature, so
``threading.Condition`` accepts it.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from typing import cast

__all__ = ["Mutex", "native", "new_lock"]

try:
    from tickwheel._rawlock import RawLock
except ImportError:  # built without a C compiler: the pure-Python token below
    RawLock = None  # type: ignore[assignment, misc]

#: True when Mutex uses the C lock.
native: bool = RawLock is not None


class _TokenLock:
    """The fallback: the lock is free while the queue holds its one token."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._token.put(True)

    def try_acquire(self) -> bool:
        try:
            return self._token.get(False)
        except queue.Empty:
            return False

    def acquire_for(self, seconds: float) -> bool:
        try:
            return self._token.get(True, seconds)
        except queue.Empty:
            return False

    def release(self) -> None:
        if not self._token.empty():
            raise RuntimeError("release unlocked lock")
        self._token.put(True)

    def locked(self) -> bool:
        return self._token.empty()


class Mutex:
    """A mutual-exclusion lock. Not reentrant: a thread that takes it twice blocks."""

    __slots__ = ("_enter", "_exit", "_lock")

    def __init__(self) -> None:
        # Bound once: calling a bound method skips the lookup on the lock's type that
        # every call through the lock would pay. ``with`` pairs each exit with an
        # enter, so the fallback's exit puts the token back without release()'s check.
        # ``get`` gets its ``block`` argument: called with none, CPython 3.11 takes the
        # slow keyword-parsing path.
        self._enter: Callable[[], bool]
        self._exit: Callable[[], None]
        lock: RawLock | _TokenLock
        if RawLock is not None:
            lock = RawLock()
            self._enter, self._exit = lock.acquire, lock.release
        else:
            lock = _TokenLock()
            self._enter = functools.partial(lock._token.get, True)
            self._exit = functools.partial(lock._token.put, True)
        self._lock = lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock; as ``threading.Lock.acquire``."""
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            return self._lock.try_acquire()
        if timeout < 0:
            if timeout != -1:
                raise ValueError("timeout value must be a non-negative number")
            return self._enter()
        return self._lock.acquire_for(timeout)

    def release(self) -> None:
        """Give the lock back; releasing a lock nobody holds raises RuntimeError."""
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._enter()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._exit()

    def __repr__(self) -> str:
        return f"<Mutex {'locked' if self.locked() else 'unlocked'}>"


# Whether this module runs compiled: mypyc sets __file__ to the extension module.
_compiled = not __file__.endswith(".py")


def new_lock() -> Mutex:
    """The lock a timer or a purgatory takes: a :class:`Mutex` in the compiled core, and
    a plain ``threading.Lock`` in pure Python, where ``with lock:`` then runs in C
    instead of through two Python-level calls per side (the token lock's speed-up holds
    only when the caller is compiled)."""
    if _compiled:
        return Mutex()
    # threading.Lock has every method of Mutex, with the same signatures.
    return cast(Mutex, threading.Lock())
