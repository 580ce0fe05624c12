"""DelayedOperation: "do X at time T unless Y happens first", completed exactly once.

An operation is a timer task (its expiry) that is also watched by keys (its early
completion). Whoever resolves it first wins: ``try_complete`` seeing its condition met,
``force_complete`` from outside, the timer at the deadline, or a cancel. The winner is
decided under the operation's lock, and ``on_complete`` runs under that lock too, so
``on_complete`` and ``try_complete`` never overlap for one operation (Kafka runs
``onComplete`` outside the lock and can overlap them on expiry).
"""

from __future__ import annotations

import _thread
import enum
import logging
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from tickwheel._compat import provide_mypyc_attr
from tickwheel._validate import Millis
from tickwheel.timers import TimerTask

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr

    from tickwheel.purgatory._purgatory import Purgatory

provide_mypyc_attr(globals())

__all__ = ["DelayedOperation", "Outcome", "is_resolved", "resolve", "safe_try_complete"]

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """How an operation was resolved."""

    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@mypyc_attr(allow_interpreted_subclasses=True)
class DelayedOperation(TimerTask):
    """Subclass it and implement :meth:`try_complete`, :meth:`on_complete` and
    :meth:`on_expiration`.

    ``lock`` guards the operation's state; pass one lock to several operations to make
    them exclusive with each other (Kafka shares the consumer group's lock). It must be
    reentrant, because ``try_complete`` calls ``force_complete`` while holding it.
    """

    __slots__ = ("_done_callbacks", "_keys", "_op_lock", "_outcome", "_purgatory")

    def __init__(self, delay_ms: Millis, lock: threading.RLock | None = None) -> None:
        super().__init__(delay_ms)
        # _thread's RLock, which threading.RLock() returns through a Python-level
        # function call: every operation makes one.
        self._op_lock: threading.RLock = _thread.RLock() if lock is None else lock
        self._outcome: Outcome | None = None
        self._keys: tuple[Hashable, ...] = ()
        self._purgatory: Purgatory | None = None
        self._done_callbacks: list[Callable[[DelayedOperation], object]] | None = None

    # -- what subclasses implement -------------------------------------------------------

    def try_complete(self) -> bool:
        """Check the condition; if it is met, return ``self.force_complete()``."""
        raise NotImplementedError

    def on_complete(self) -> None:
        """The operation's work, run exactly once, whether completed or expired."""
        raise NotImplementedError

    def on_expiration(self) -> None:
        """Extra work after ``on_complete`` when the deadline passed first."""

    # -- the state machine ---------------------------------------------------------------

    @property
    def is_completed(self) -> bool:
        """True once the operation is resolved: completed, expired or cancelled
        (Kafka's ``isCompleted``). ``outcome`` says which."""
        return self._outcome is not None

    @property
    def outcome(self) -> Outcome | None:
        """None while pending."""
        return self._outcome

    @property
    def lock(self) -> threading.RLock:
        return self._op_lock

    @property
    def keys(self) -> tuple[Hashable, ...]:
        """The keys this operation is watched by (empty once resolved)."""
        return self._keys

    def force_complete(self) -> bool:
        """Complete now; True for exactly one caller over the operation's life."""
        return resolve(self, Outcome.COMPLETED)

    def safe_try_complete(self) -> bool:
        """``try_complete`` under the operation's lock."""
        return safe_try_complete(self)

    def safe_try_complete_or_else(self, f: Callable[[], object]) -> bool:
        """Under the lock: ``try_complete``; if that fails, ``f()`` and one more
        ``try_complete`` (Kafka: the purgatory watches the keys in ``f``, so no
        triggering event can slip between the two checks)."""
        with self._op_lock:
            if self._outcome is not None:
                return False
            if self.try_complete():
                return True
            f()
            return not is_resolved(self) and self.try_complete()

    def run(self) -> None:
        """The timer's expiry: complete (if nobody did first), then ``on_expiration``."""
        if resolve(self, Outcome.EXPIRED):
            self.on_expiration()

    def _dropped_by_close(self) -> None:
        # Its timer closed: nobody will expire it, so it ends cancelled and its
        # waiters are told.
        resolve(self, Outcome.CANCELLED)

    def cancel(self) -> bool:
        """Resolve the operation as cancelled: it leaves the timer and its watch lists
        and ``on_complete`` never runs. True if it was pending."""
        return resolve(self, Outcome.CANCELLED)

    def add_done_callback(self, fn: Callable[[DelayedOperation], object]) -> None:
        """Call ``fn(op)`` once the operation is resolved (at once if it is already)."""
        with self._op_lock:
            if self._outcome is None:
                if self._done_callbacks is None:
                    self._done_callbacks = []
                self._done_callbacks.append(fn)
                return
        fn(self)

    def __repr__(self) -> str:
        outcome = self._outcome
        state = outcome.value if outcome is not None else "pending"
        return f"<{type(self).__name__} delay_ms={self.delay_ms} {state}>"


# Module-level functions, not methods: DelayedOperation allows interpreted subclasses,
# so the compiled core reaches its methods through a Python-level lookup by name. The
# purgatory's hot paths call these directly instead.


def is_resolved(op: DelayedOperation) -> bool:
    """Whether ``op`` is resolved, read afresh. Code that has already checked
    ``op._outcome is None`` must ask again through this function: the type checker
    narrows the attribute to None until it is assigned in the same function, even
    across calls that resolve the operation (``try_complete``, another thread), and
    the compiled module then checks the value it reads against that narrowed type and
    raises TypeError."""
    return op._outcome is not None


def safe_try_complete(op: DelayedOperation) -> bool:
    """``op.try_complete()`` under the operation's lock, unless it is resolved."""
    # acquire/release rather than `with`: the compiled `with` looks up and calls
    # __enter__/__exit__ generically.
    lock = op._op_lock
    lock.acquire()
    try:
        if op._outcome is not None:
            return False
        return op.try_complete()
    finally:
        lock.release()


def resolve(op: DelayedOperation, outcome: Outcome, complete: bool = False) -> bool:
    """Resolve ``op`` once: True for the one caller that wins. ``on_complete`` runs
    unless the outcome is ``CANCELLED``, or always with ``complete`` (a purgatory's
    ``close()``: each operation still answers its caller)."""
    callbacks = None
    won = False
    lock = op._op_lock
    lock.acquire()
    try:
        if op._outcome is not None:
            return False
        op._outcome = outcome
        won = True
        # Leave the timer before the work runs, so it is never counted again.
        if op._owner is not None:
            TimerTask.cancel(op)
        callbacks, op._done_callbacks = op._done_callbacks, None
        if complete or outcome is not Outcome.CANCELLED:
            op.on_complete()
    finally:
        lock.release()
        # Outside the operation's lock: the purgatory takes shard locks to unwatch,
        # and a shard lock may be held by a thread waiting for this operation's lock.
        # In `finally`, so an `on_complete` that raises still leaves no trace.
        purgatory = op._purgatory
        if won and purgatory is not None:
            purgatory._resolved(op, outcome)
    if callbacks:
        for fn in callbacks:
            try:
                fn(op)
            except Exception:
                log.exception("done callback of %r raised", op)
    return True
