"""Purgatory: delayed operations watched by keys, completed early or expired.

``try_complete_else_watch(op, keys)`` tries the operation, watches it on every key and
puts it in the timer; ``check_and_complete(key)`` retries what watches a key after
something changed (a high watermark moved, bytes arrived, a heartbeat came); the timer
expires what nobody completed. Whatever resolves an operation, it leaves the timer and
the watch lists of all its keys at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from tickwheel._clock import Clock, SystemClock
from tickwheel._histogram import Histogram, HistogramSnapshot
from tickwheel._mutex import new_lock
from tickwheel._validate import Millis, check_positive_int
from tickwheel.purgatory._futures import DelayedFuture
from tickwheel.purgatory._operation import (
    DelayedOperation,
    Outcome,
    is_resolved,
    resolve,
    safe_try_complete,
)
from tickwheel.purgatory._reaper import Reaper
from tickwheel.purgatory._watchers import SHARDS, Watchers
from tickwheel.timers import TimerBase, TimerTask, TimingWheelTimer

__all__ = ["Purgatory", "PurgatoryStats"]

log = logging.getLogger(__name__)

#: Shards a purge visits per run: the purge is a safety net, kept cheap.
_PURGE_SHARDS_PER_RUN = 16
_REAPER_POLL_MS = 200


@dataclass(frozen=True, slots=True)
class PurgatoryStats:
    """A snapshot of a purgatory's counters."""

    name: str
    completed: int
    expired: int
    cancelled: int
    num_delayed: int
    watched: int
    num_keys: int
    purges: int
    purged: int
    errors: int
    expiry_lateness_ms: HistogramSnapshot


class Purgatory:
    """Kafka's ``DelayedOperationPurgatory``.

    The deterministic set-up for tests and simulations::

        clock = ManualClock()
        purgatory = Purgatory("produce", timer=TimingWheelTimer(clock=clock, executor=None),
                              reaper=False)
        ...
        clock.advance(100); purgatory.advance_clock(0)   # expirations run right here
    """

    def __init__(
        self,
        name: str,
        timer: TimerBase | None = None,
        clock: Clock | None = None,
        purge_interval: int = 1000,
        reaper: bool = True,
    ) -> None:
        self.name = name
        self._purge_interval = check_positive_int("purge_interval", purge_interval)
        self._owns_timer = timer is None
        if timer is None:
            timer = TimingWheelTimer(clock=SystemClock() if clock is None else clock)
        if reaper or self._owns_timer:
            timer.driven_by_caller()  # the reaper, or whoever calls advance_clock here
        self._timer = timer
        self._clock = timer.clock
        self._watchers = Watchers()
        self._counts_lock = new_lock()
        self._completed = 0
        self._expired = 0
        self._cancelled = 0
        self._errors = 0
        self._resolved_since_purge = 0
        self._purges = 0
        self._purged = 0
        self._next_purge_shard = 0
        self._lateness = Histogram()
        self._closed = False
        self._reaper: Reaper | None = None
        if reaper:
            self._reaper = Reaper(f"ExpirationReaper-{name}", self, self._clock.realtime)
            self._reaper.start()

    # -- the operations ------------------------------------------------------------------

    def try_complete_else_watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Try ``op``; if it cannot complete yet, watch it on every key and let the timer
        expire it. True if it completed during this call (by this caller)."""
        watch_keys: tuple[Hashable, ...]
        if type(keys) is tuple and _distinct_few(keys):
            watch_keys = keys  # the common case, checked without building a dict
        elif isinstance(keys, str | bytes):
            # Iterating would watch each character: refused rather than misread.
            raise TypeError(f"keys must be a collection of keys, not {type(keys).__name__} "
                            f"{keys!r}: pass [{keys!r}] to watch one key")
        else:
            watch_keys = tuple(dict.fromkeys(keys))
        if not watch_keys:
            raise ValueError("keys must not be empty: an operation must be watched by a key")
        if self._closed:
            raise RuntimeError(f"purgatory {self.name!r} is closed")
        submitted = op._purgatory
        if submitted is not None:
            # A second submission would replace its keys (the first ones would never be
            # unwatched) and move its timer task.
            raise RuntimeError(f"{op!r} was already submitted to purgatory "
                               f"{submitted.name!r}: an operation is submitted once")
        op._purgatory = self
        # Kafka's safeTryCompleteOrElse, inlined (no closure per operation): under the
        # operation's lock, try; watch every key; try again. The second try is for a key
        # event that came after the first try read the state but before its key was
        # watched: that event's check_and_complete found nobody to try. Such an event
        # moved the epoch of its key's shard, so when no epoch moved the second try is
        # skipped; an event after the watch finds the operation and tries it itself,
        # waiting for this lock.
        lock = op._op_lock
        lock.acquire()
        try:
            if op._outcome is not None:
                return False
            watchers = self._watchers
            before = watchers.epochs(watch_keys)
            if op.try_complete():
                return True
            op._keys = watch_keys
            after = 0
            for key in watch_keys:
                after += watchers.watch(key, op)
            if after != before and not is_resolved(op) and op.try_complete():
                return True
        finally:
            lock.release()
        if not is_resolved(op):
            self._timer.add(op)
            if is_resolved(op):
                TimerTask.cancel(op)
        if self._closed and not is_resolved(op):
            # close() ran while this was watched: it may have looked before the watch.
            resolve(op, Outcome.CANCELLED, complete=True)
        if is_resolved(op):
            # It completed while we were adding watchers, maybe after its completer had
            # unwatched the keys: make sure nothing is left behind.
            self._unwatch_all(op)
        return False

    def check_and_complete(self, key: Hashable) -> int:
        """Retry the operations watching ``key``; return how many this call completed."""
        completed = 0
        for op in self._watchers.snapshot(key):
            if op._outcome is not None:
                continue
            try:
                if safe_try_complete(op):
                    completed += 1
            except Exception:
                self._count_error()
                log.exception("purgatory %s: completing %r raised", self.name, op)
        return completed

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation]:
        """Cancel every operation watching ``key``; return those cancelled by this call
        (empty for an unknown key). A cancelled operation never runs ``on_complete``."""
        cancelled = []
        for op in self._watchers.remove_key(key):
            if op.cancel():
                cancelled.append(op)
        return cancelled

    def watch_futures(
        self,
        futures: Sequence[Future[Any]],
        timeout_ms: Millis,
        callback: Callable[[Sequence[Future[Any]]], object],
    ) -> DelayedFuture:
        """Run ``callback(futures)`` once all are done, or after ``timeout_ms`` with
        the ones still pending failed with ``TimeoutError`` (Kafka's
        ``DelayedFuturePurgatory``)."""
        op = DelayedFuture(timeout_ms, futures, callback)
        if not self.try_complete_else_watch(op, [op.key]):
            for f in op.futures:
                # Called at once if the future is already done.
                f.add_done_callback(lambda _f: self.check_and_complete(op.key))
        return op

    async def wait(self, op: DelayedOperation) -> Outcome:
        """Wait, without blocking the event loop, until ``op`` is resolved."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()

        def resolved(done: DelayedOperation) -> None:
            outcome = done.outcome
            assert outcome is not None
            # RuntimeError: the loop was closed meanwhile, so nobody is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set_result, future, outcome)

        op.add_done_callback(resolved)
        return await future

    # -- time ----------------------------------------------------------------------------

    def advance_clock(self, timeout_ms: Millis = 0) -> bool:
        """Expire what is due (see ``TimerBase.advance_clock``) and purge if it is time."""
        progressed = self._timer.advance_clock(timeout_ms)
        if self._resolved_since_purge >= self._purge_interval:
            self.purge()
        return progressed

    def purge(self) -> int:
        """Drop resolved operations left in watch lists from a slice of the shards."""
        with self._counts_lock:
            self._resolved_since_purge = 0
            first = self._next_purge_shard
            self._next_purge_shard = (first + _PURGE_SHARDS_PER_RUN) % SHARDS
        purged = self._watchers.purge_completed(first, _PURGE_SHARDS_PER_RUN)
        with self._counts_lock:
            self._purges += 1
            self._purged += purged
        if purged:
            log.debug("purgatory %s: purged %d watcher entries", self.name, purged)
        return purged

    # -- observing -----------------------------------------------------------------------

    @property
    def timer(self) -> TimerBase:
        return self._timer

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def watched(self) -> int:
        """Watcher entries across all keys."""
        return self._watchers.watched

    @property
    def num_delayed(self) -> int:
        """Operations in the timer (every task of the timer, if it is shared)."""
        return self._timer.size

    @property
    def num_keys(self) -> int:
        """Keys with at least one watcher."""
        return self._watchers.num_keys

    def stats(self) -> PurgatoryStats:
        return PurgatoryStats(
            name=self.name,
            completed=self._completed,
            expired=self._expired,
            cancelled=self._cancelled,
            num_delayed=self.num_delayed,
            watched=self.watched,
            num_keys=self.num_keys,
            purges=self._purges,
            purged=self._purged,
            errors=self._errors,
            expiry_lateness_ms=self._lateness.snapshot(),
        )

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> int:
        """Refuse new operations, resolve every pending one as ``CANCELLED`` and return
        how many. Their ``on_complete`` runs (each can still answer its caller: it sees
        ``outcome is Outcome.CANCELLED``) and ``wait()`` returns that outcome. Then stop
        the reaper and, if the purgatory made its timer, close it."""
        if self._closed:
            return 0
        self._closed = True
        if self._reaper is not None:
            self._reaper.stop_soon()
            self._timer.wake()
            self._reaper.stop()
        resolved = self._cancel_pending()
        if self._owns_timer:
            self._timer.close()
        if resolved:
            log.info("purgatory %s closed, cancelled %d pending operations", self.name,
                     resolved)
        return resolved

    def _cancel_pending(self) -> int:
        resolved = 0
        for op in self._watchers.operations():
            try:
                if resolve(op, Outcome.CANCELLED, complete=True):
                    resolved += 1
            except Exception:
                resolved += 1  # resolved all the same: on_complete raised after the win
                self._count_error()
                log.exception("purgatory %s: completing %r on close raised", self.name, op)
        return resolved

    def __enter__(self) -> Purgatory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Purgatory {self.name!r} delayed={self.num_delayed} watched={self.watched}>"

    # -- called by operations ------------------------------------------------------------

    def _resolved(self, op: DelayedOperation, outcome: Outcome) -> None:
        self._unwatch_all(op)
        with self._counts_lock:
            if outcome is Outcome.COMPLETED:
                self._completed += 1
            elif outcome is Outcome.EXPIRED:
                self._expired += 1
            else:
                self._cancelled += 1
            self._resolved_since_purge += 1
        if outcome is Outcome.EXPIRED:
            self._lateness.record(self._clock.now_ms() - op.expiration_ms)

    def _unwatch_all(self, op: DelayedOperation) -> None:
        watchers = self._watchers
        for key in op._keys:
            watchers.unwatch(key, op)

    def _count_error(self) -> None:
        with self._counts_lock:
            self._errors += 1


def _distinct_few(keys: tuple[Hashable, ...]) -> bool:
    """True for a tuple of one to three keys with no repeats."""
    n = len(keys)
    if n == 1:
        return True
    if n == 2:
        return bool(keys[0] != keys[1])
    if n == 3:
        a, b, c = keys
        return bool(a != b and c not in (a, b))
    return False


def _set_result(future: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)
