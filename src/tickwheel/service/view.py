"""What the engine holds, as the service's readers see it: schedules by id (paged in id
order), pending operations by id and by deadline, and the operations resolved while
their ids are remembered.

The engine gives the view each committed batch's changes
(:class:`~tickwheel.pipeline.semantics.partition.CommittedChanges`), so a read never
touches the engine's own state, nor walks a whole state: a page looks at most
:data:`MAX_SCANNED` schedules, and a lookup is one dictionary read. A read reflects at
least every row with ``ts_ms`` up to :attr:`StateView.as_of_ms`.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from sortedcontainers import SortedDict, SortedSet

from tickwheel.pipeline.contract.events import OutcomeKind
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.semantics.partition import CommittedChanges
from tickwheel.pipeline.semantics.resolver import WatchFields
from tickwheel.pipeline.semantics.schedule_book import (
    SCHEDULE_ENTRY,
    SCHEDULE_KEY,
    SeriesEntry,
    schedule_of,
    upcoming_fires,
)

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "MAX_RESOLVED",
    "MAX_SCANNED",
    "RECENT_OUTCOMES",
    "UPCOMING",
    "OperationView",
    "PageError",
    "RecentOutcome",
    "SchedulePage",
    "ScheduleView",
    "StateView",
    "ViewStats",
]

log = logging.getLogger(__name__)

#: Schedules a page holds by default, and at most.
DEFAULT_PAGE: Final = 100
MAX_PAGE: Final = 1_000
#: Schedules one page looks at, at most: a filter that matches few of them answers a
#: shorter page with a cursor to go on from, rather than walk every schedule.
MAX_SCANNED: Final = 10_000
#: Fire times a schedule's own read lists.
UPCOMING: Final = 5
#: Resolved operations remembered, at most (the oldest go first): the dedupe retention
#: bounds them too, as the engine forgets their ids.
MAX_RESOLVED: Final = 1_000_000
#: The newest outcomes kept for the console.
RECENT_OUTCOMES: Final = 50
#: Changes applied under one hold of the lock: a batch that changed a million schedules
#: (all due on the hour) does not hold readers up for its whole length.
_APPLY_CHUNK: Final = 10_000

ScheduleState = Literal["running", "paused"]


class PageError(ValueError):
    """A page's arguments are malformed (a bad cursor, state or limit)."""


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as a reader sees it (``upcoming`` only where asked for)."""

    schedule_id: str
    state: ScheduleState
    spec: Mapping[str, Any]
    next_fire_ms: int | None
    runs: int
    skipped: int
    last_fired_ms: int | None
    upcoming: tuple[int, ...] | None = None
    target: str | None = None
    payload: str | None = None  # JSON text

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "schedule_id": self.schedule_id, "state": self.state, "spec": dict(self.spec),
            "summary": schedule_of(self.spec).describe(), "next_fire_ms": self.next_fire_ms,
            "runs": self.runs, "skipped": self.skipped, "last_fired_ms": self.last_fired_ms}
        _carried(body, self.target, self.payload)
        if self.upcoming is not None:
            body["upcoming"] = list(self.upcoming)
        return body


@dataclass(frozen=True, slots=True)
class OperationView:
    """One operation: pending (its watch's fields) or resolved (its outcome)."""

    op_id: str
    state: Literal["pending", "resolved"]
    watched_ms: int | None = None
    deadline_ms: int | None = None
    keys: tuple[str, ...] = ()
    condition: str | None = None
    targets: Any = None
    min_total: int | None = None
    outcome: str | None = None
    resolved_ms: int | None = None
    target: str | None = None
    payload: str | None = None  # JSON text

    def as_json(self) -> dict[str, Any]:
        if self.state == "resolved":
            return {"op_id": self.op_id, "state": self.state, "outcome": self.outcome,
                    "resolved_ms": self.resolved_ms}
        body: dict[str, Any] = {
            "op_id": self.op_id, "state": self.state, "watched_ms": self.watched_ms,
            "deadline_ms": self.deadline_ms, "keys": list(self.keys),
            "condition": self.condition}
        if self.targets:  # the conditions that count updates per key
            body["targets"] = self.targets
        if self.min_total:
            body["min_total"] = self.min_total
        _carried(body, self.target, self.payload)
        return body


def _carried(body: dict[str, Any], target: str | None, payload: str | None) -> None:
    """A schedule's or operation's target and payload, where it has them."""
    if target is not None:
        body["target"] = target
    if payload is not None:
        body["payload"] = json.loads(payload)


@dataclass(frozen=True, slots=True)
class RecentOutcome:
    """One of the newest outcomes: an operation resolved, or an occurrence fired."""

    op_id: str
    outcome: str
    resolved_ms: int
    latency_ms: int

    def as_json(self) -> dict[str, Any]:
        return {"op_id": self.op_id, "outcome": self.outcome,
                "resolved_ms": self.resolved_ms, "latency_ms": self.latency_ms}


@dataclass(frozen=True, slots=True)
class SchedulePage:
    """Schedules in id order; ``next_cursor`` goes on after them (None: no more)."""

    schedules: list[ScheduleView]
    next_cursor: str | None
    as_of_ms: int | None

    def as_json(self) -> dict[str, Any]:
        return {"schedules": [s.as_json() for s in self.schedules],
                "next_cursor": self.next_cursor, "as_of_ms": self.as_of_ms}


@dataclass(frozen=True, slots=True)
class ViewStats:
    schedules: int
    paused: int
    pending: int
    resolved: int
    as_of_ms: int | None
    batch_id: int | None
    #: Occurrences fired and operations resolved, in all, since the view started.
    fired: int = 0
    resolved_total: int = 0
    #: The pending operations due first: (deadline_ms, op_id).
    next_deadlines: tuple[tuple[int, str], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"schedules": self.schedules, "paused": self.paused, "pending": self.pending,
                "resolved": self.resolved, "as_of_ms": self.as_of_ms,
                "batch_id": self.batch_id, "fired": self.fired,
                "resolved_total": self.resolved_total,
                "next_deadlines": [{"deadline_ms": d, "op_id": o}
                                   for d, o in self.next_deadlines]}


def _cursor(schedule_id: str) -> str:
    return base64.urlsafe_b64encode(schedule_id.encode()).decode().rstrip("=")


def _after(cursor: str) -> str:
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_",
                               validate=True)
        return raw.decode()
    except (binascii.Error, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise PageError("cursor: not one this service gave") from exc


# A schedule as held: (spec, next_ms, runs, skipped, paused, target, payload,
# last_fired_ms), a tuple for its size: a million of them are held. The payload is the
# engine's own string, not a copy.
_Held = tuple[dict[str, Any], int | None, int, int, bool, str | None, str | None, int | None]
_SPEC, _NEXT, _RUNS, _SKIPPED, _PAUSED, _TARGET, _PAYLOAD, _LAST_FIRED = range(8)
# A pending operation as held: (watched_ms, deadline_ms, keys, condition, targets,
# min_total, target, payload).
_Pending = tuple[int, int, tuple[str, ...], str, Any, int | None, str | None, str | None]


class StateView:
    """The state of a following engine as of its last committed batch: give it every
    batch's :class:`CommittedChanges` (:meth:`apply`), from the engine's thread; any
    thread reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._schedules: SortedDict = SortedDict()  # schedule id -> _Held
        self._paused: SortedSet = SortedSet()
        self._pending: dict[str, _Pending] = {}
        self._deadlines: SortedSet = SortedSet()  # (deadline_ms, op_id) of the pending
        self._resolved: dict[str, tuple[str, int]] = {}  # op id -> (outcome, resolved_ms)
        self._specs: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
        self._recent: deque[RecentOutcome] = deque(maxlen=RECENT_OUTCOMES)
        #: Last fires read back (:meth:`remember`) of schedules not in the view yet.
        self._fired_before: dict[str, int] = {}
        self.fired = 0
        self.resolved_total = 0
        self.as_of_ms: int | None = None
        self.batch_id: int | None = None

    # -- the engine's side ---------------------------------------------------------

    def apply(self, changes: CommittedChanges) -> None:
        """Take one committed batch's changes (or, at a start, every entry held)."""
        entries = changes.entries
        for start in range(0, max(len(entries), 1), _APPLY_CHUNK):
            with self._lock:
                for key, entry in entries[start:start + _APPLY_CHUNK]:
                    if key.startswith(SCHEDULE_KEY):
                        self._schedule_changed(key[1:], entry)
                    else:
                        self._operation_changed(key, entry)
        self._outcomes(changes.outcomes)
        with self._lock:
            resolved = self._resolved
            for op_id, first_ms in changes.seen:
                if first_ms is None:
                    resolved.pop(op_id, None)
            if changes.release_ms is not None:  # never back: a batch may report fewer
                as_of = changes.release_ms - 1
                self.as_of_ms = as_of if self.as_of_ms is None else max(self.as_of_ms, as_of)
            self.batch_id = changes.batch_id

    def remember(self, outcomes: Iterable[tuple[str, str, int, int]]) -> None:
        """Outcomes resolved before this view started, oldest first (``(op_id, outcome,
        resolved_ms, latency_ms)``, as :func:`~tickwheel.pipeline.io.outputs.recent_outcomes`
        reads them from the outputs): the operations' outcomes and the schedules' last
        fires, which a restart would otherwise forget. Given after the engine's first
        changes (every entry it holds), before its first batch."""
        fired = OutcomeKind.FIRED.value
        with self._lock:
            schedules, resolved = self._schedules, self._resolved
            for op_id, outcome, resolved_ms, latency_ms in outcomes:
                if outcome == fired:
                    schedule_id = op_id.rpartition("@")[0]
                    held = schedules.get(schedule_id)
                    if held is None:  # the engine has not sent it yet (Spark's first batch)
                        self._fired_before[schedule_id] = resolved_ms
                    elif (held[_LAST_FIRED] or 0) < resolved_ms:
                        schedules[schedule_id] = (*held[:_LAST_FIRED], resolved_ms)
                elif op_id not in self._pending:
                    resolved.pop(op_id, None)
                    resolved[op_id] = (outcome, resolved_ms)
                self._recent.append(RecentOutcome(op_id, outcome, resolved_ms, latency_ms))
            while len(resolved) > MAX_RESOLVED:
                del resolved[next(iter(resolved))]

    def _schedule_changed(self, schedule_id: str, entry: Any) -> None:
        schedules = self._schedules
        if entry is None:
            schedules.pop(schedule_id, None)
            self._paused.discard(schedule_id)
            return
        assert entry[0] == SCHEDULE_ENTRY
        series = SeriesEntry._make(entry)
        held = schedules.get(schedule_id)
        last_fired = (self._fired_before.pop(schedule_id, None) if held is None
                      else held[_LAST_FIRED])
        spec_key = tuple(series.spec.items())
        spec = self._specs.get(spec_key)
        if spec is None:
            if len(self._specs) >= 65_536:
                self._specs.clear()
            spec = self._specs[spec_key] = dict(series.spec)
        schedules[schedule_id] = (spec, series.next_ms, series.runs, series.skipped,
                                  series.paused, series.target, series.payload, last_fired)
        if series.paused:
            self._paused.add(schedule_id)
        else:
            self._paused.discard(schedule_id)

    def _operation_changed(self, op_id: str, entry: Any) -> None:
        old = self._pending.pop(op_id, None)
        if old is not None:
            self._deadlines.discard((old[1], op_id))
        if entry is not None:
            watch = WatchFields._make(entry[0])
            self._pending[op_id] = (watch.ts_ms, watch.deadline_ms, tuple(watch.keys),
                                    watch.condition, watch.targets, watch.min_total,
                                    watch.target, watch.payload)
            self._deadlines.add((watch.deadline_ms, op_id))

    def _outcomes(self, outcomes: Iterable[OutcomeRow]) -> None:
        fired = OutcomeKind.FIRED
        for start_rows in _chunks(list(outcomes), _APPLY_CHUNK):
            with self._lock:
                schedules = self._schedules
                resolved = self._resolved
                for row in start_rows[-RECENT_OUTCOMES:]:
                    self._recent.append(RecentOutcome(row.op_id, row.outcome.value,
                                                      row.resolved_ms, row.latency_ms))
                for row in start_rows:
                    if row.outcome is fired:
                        self.fired += 1
                        schedule_id = row.op_id.rpartition("@")[0]
                        held = schedules.get(schedule_id)
                        if held is not None:
                            schedules[schedule_id] = (*held[:_LAST_FIRED], row.resolved_ms)
                        continue
                    self.resolved_total += 1
                    resolved.pop(row.op_id, None)  # to the end: the newest
                    resolved[row.op_id] = (row.outcome.value, row.resolved_ms)
                while len(resolved) > MAX_RESOLVED:
                    del resolved[next(iter(resolved))]

    # -- reading -------------------------------------------------------------------

    def page(self, *, prefix: str = "", state: str | None = None, limit: int = DEFAULT_PAGE,
             cursor: str | None = None) -> SchedulePage:
        """Schedules whose id starts with ``prefix`` (in ``state``, if given), in id
        order, after ``cursor``."""
        if state not in (None, "running", "paused"):
            raise PageError(f"state: 'running' or 'paused', not {state!r}")
        if isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise PageError(f"limit: from 1 to {MAX_PAGE}, not {limit!r}")
        after = None if cursor is None else _after(cursor)
        found: list[ScheduleView] = []
        last: str | None = None
        more = False
        with self._lock:
            index = self._paused if state == "paused" else self._schedules
            start = prefix if after is None or after < prefix else after
            ids = index.irange(minimum=start, inclusive=(after is None or after < prefix,
                                                         True))
            for scanned, schedule_id in enumerate(ids):
                if not schedule_id.startswith(prefix):
                    break
                if len(found) == limit or scanned == MAX_SCANNED:
                    more = True
                    break
                last = schedule_id
                held = self._schedules[schedule_id]
                if state == "running" and held[_PAUSED]:
                    continue
                found.append(self._view(schedule_id, held))
            as_of = self.as_of_ms
        return SchedulePage(found, _cursor(last) if more and last is not None else None, as_of)

    def schedule(self, schedule_id: str) -> ScheduleView | None:
        """One schedule with its next :data:`UPCOMING` fire times, or None."""
        with self._lock:
            held = self._schedules.get(schedule_id)
        if held is None:
            return None
        upcoming = () if held[_PAUSED] else tuple(
            upcoming_fires(schedule_id, held[_SPEC], held[_NEXT], held[_RUNS], UPCOMING))
        return self._view(schedule_id, held, upcoming)

    def operation(self, op_id: str) -> OperationView | None:
        """A pending operation, or one resolved while its id is remembered, or None."""
        with self._lock:
            pending = self._pending.get(op_id)
            resolved = None if pending is not None else self._resolved.get(op_id)
        if pending is not None:
            watched, deadline, keys, condition, targets, min_total, target, payload = pending
            return OperationView(op_id, "pending", watched, deadline, keys, condition,
                                 targets, min_total, target=target, payload=payload)
        if resolved is not None:
            return OperationView(op_id, "resolved", outcome=resolved[0],
                                 resolved_ms=resolved[1])
        return None

    def stats(self, next_deadlines: int = 0) -> ViewStats:
        with self._lock:
            soonest = tuple(self._deadlines.islice(0, next_deadlines)) if next_deadlines else ()
            return ViewStats(len(self._schedules), len(self._paused), len(self._pending),
                             len(self._resolved), self.as_of_ms, self.batch_id, self.fired,
                             self.resolved_total, soonest)

    def recent_outcomes(self) -> list[RecentOutcome]:
        """The newest outcomes, newest first."""
        with self._lock:
            return list(reversed(self._recent))

    @staticmethod
    def _view(schedule_id: str, held: _Held,
              upcoming: tuple[int, ...] | None = None) -> ScheduleView:
        spec, next_ms, runs, skipped, paused, target, payload, last_fired = held
        next_fire = None if paused or next_ms is None else schedule_of(spec).fire_ms(
            schedule_id, next_ms)
        return ScheduleView(schedule_id, "paused" if paused else "running", spec, next_fire,
                            runs, skipped, last_fired, upcoming, target, payload)


def _chunks(rows: list[OutcomeRow], size: int) -> Iterable[list[OutcomeRow]]:
    for start in range(0, len(rows), size):
        yield rows[start:start + size]
