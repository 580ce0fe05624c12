"""The recurring schedules of an event log, as one resolver holds them.

A ``schedule`` row starts a series (or replaces one: the new spec's occurrences are
those after the row's ``ts_ms``); ``unschedule`` ends it; ``pause`` and ``resume`` stop
and restart it. Only each series' next occurrence is pending, so what a schedule costs
does not grow with its occurrences. Every occurrence becomes one ``fired`` outcome, or
is counted as skipped.

When an occurrence is noticed decides whether it misfired:

- in event time (the default), the log's rows are the clock (see
  :mod:`~tickwheel.pipeline.semantics.row_times`): an occurrence is noticed at the
  first row at or after its fire time, so one inside a gap of the log is noticed at the
  gap's end, and one noticed more than its ``grace_ms`` late is decided by the
  schedule's ``misfire`` policy. Every row of the log counts, whichever partition holds
  it, so the outcomes do not depend on where an engine cuts its input into batches,
  nor on how it partitions it;
- with :attr:`ScheduleBook.clock_notices` (time follows a wall clock), an occurrence
  is noticed at the first reading of the clock at or after it; one noticed more than
  its ``grace_ms`` late (the service was down, or the clock stepped forward) is
  decided by the schedule's ``misfire`` policy (:meth:`~tickwheel.Schedule.plan`);
- a ``resume`` notices the occurrences of its pause at the row's ``ts_ms``, in either
  mode, and its misfire policy decides them, as Quartz's ``resumeTrigger`` does.

A row at ``ts_ms`` acts on the occurrences that fire after it: those at or before it
fired first, as deadlines at or before a row's time expire before it applies.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from typing import Any, Final, NamedTuple

from tickwheel.pipeline.contract.events import T_PAUSE, T_SCHEDULE, T_UNSCHEDULE
from tickwheel.pipeline.semantics.row_times import RowTimes
from tickwheel.schedules import Schedule

__all__ = ["SCHEDULE_ENTRY", "SCHEDULE_KEY", "Fire", "ScheduleBook", "SeriesEntry",
           "occurrence_id", "schedule_of", "upcoming_fires"]

#: The first field of a saved schedule entry: an operation's entry starts with its
#: watch's fields, a tuple.
SCHEDULE_ENTRY: Final = "schedule"
#: Where a resolver's entries are keyed by id, a schedule's key is its id after this
#: lone surrogate: no op id holds one (such a row is ``bad_string``), so a schedule and
#: an operation of one name never meet. Made at run time: a compiled string literal
#: cannot hold a lone surrogate.
SCHEDULE_KEY: Final = chr(0xD800)
#: Occurrences one plan looks at; a catch-up takes as many plans as it needs.
PLAN_BUDGET: Final = 4_096
#: Stale heap items allowed beyond the live ones before they are dropped.
_STALE_SLACK: Final = 4_096


class Fire(NamedTuple):
    """One occurrence that fires: ``fire_ms`` is its time plus its jitter; ``skipped``
    counts the occurrences of the series passed over since its last fire."""

    schedule_id: str
    occurrence_ms: int
    fire_ms: int
    skipped: int
    target: str | None = None
    payload: str | None = None


class SeriesEntry(NamedTuple):
    """A saved series (:meth:`ScheduleBook.entry`, a plain tuple), by name."""

    kind: str  # SCHEDULE_ENTRY
    schedule_id: str
    spec: dict[str, Any]
    after_ms: int  # the last occurrence decided, fired or passed over
    next_ms: int | None  # its next occurrence
    runs: int
    skipped: int  # passed over since the last fire
    paused: bool
    target: str | None
    payload: str | None  # compact JSON text


def upcoming_fires(schedule_id: str, spec: Mapping[str, Any], next_ms: int | None,
                   runs: int, count: int) -> list[int]:
    """When the next ``count`` occurrences from ``next_ms`` fire (jitter included), as
    far as the spec's end and ``max_runs`` let them."""
    sched = schedule_of(spec)
    if sched.max_runs is not None:
        count = min(count, max(0, sched.max_runs - runs))
    fires: list[int] = []
    occurrence = next_ms
    while occurrence is not None and len(fires) < count:
        fires.append(sched.fire_ms(schedule_id, occurrence))
        occurrence = sched.next_after(occurrence)
    return fires


def occurrence_id(schedule_id: str, occurrence_ms: int) -> str:
    """The stable id of an occurrence: its ``fired`` outcome's ``op_id``."""
    return f"{schedule_id}@{occurrence_ms}"


Spec = tuple[tuple[str, Any], ...]
# Equal specs share one spec and one Schedule: a million series of a few specs hold a
# few of each.
_INTERNED: dict[Spec, tuple[Spec, Schedule]] = {}
_INTERNED_MAX = 65_536


def _interned(spec: Mapping[str, Any]) -> tuple[Spec, Schedule]:
    key = tuple(spec.items())
    hit = _INTERNED.get(key)
    if hit is None:
        if len(_INTERNED) >= _INTERNED_MAX:
            _INTERNED.clear()
        hit = _INTERNED[key] = (key, Schedule.from_fields(dict(key)))
    return hit


def schedule_of(spec: Mapping[str, Any]) -> Schedule:
    """The :class:`~tickwheel.Schedule` of a row's spec."""
    return _interned(spec)[1]


class _Series:
    __slots__ = ("after_ms", "due_ms", "next_ms", "paused", "payload", "runs", "schedule",
                 "skipped", "spec", "target")

    def __init__(self, spec: Mapping[str, Any], after_ms: int, shared: _SharedInts,
                 next_ms: int | bool | None = True, target: str | None = None,
                 payload: str | None = None) -> None:
        """``next_ms`` as saved, or True to compute it from ``after_ms``."""
        self.spec, self.schedule = _interned(spec)
        self.after_ms = shared(after_ms)  # the last occurrence decided
        self.next_ms = shared(self.schedule.next_after(after_ms) if next_ms is True
                              else next_ms)
        self.runs = 0
        self.skipped = 0  # passed over since the last fire
        self.paused = False
        self.due_ms: int | None = None  # when its pending occurrence fires, once pushed
        # Held once per series, and shared by every occurrence's outcome.
        self.target = target
        self.payload = payload


class _SharedInts(dict[int, int]):
    """Equal times as one int object: schedules fire together (on the hour, every
    second), so a million series hold a few thousand distinct times, not two million
    ints of 32 bytes."""

    __slots__ = ()

    def __call__(self, value: int | None) -> Any:
        if value is None:
            return None
        shared = self.get(value)
        if shared is None:
            if len(self) >= 65_536:
                self.clear()
            shared = self[value] = value
        return shared


class ScheduleBook:
    """The schedules of one resolver, by id; :meth:`advance` fires what time reached."""

    def __init__(self) -> None:
        self._series: dict[str, _Series] = {}
        #: (fire_ms, schedule_id), a heap: each series' pending occurrence. An item
        #: whose time is not its series' ``due_ms`` (replaced, paused, moved on) is
        #: stale and dropped when reached.
        self.due: list[tuple[int, str]] = []
        self._shared = _SharedInts()
        self.clock_notices = False
        #: In event time, the log's row times known so far (the engine gives them).
        self.row_times = RowTimes()
        self.skipped = 0
        self.fired = 0  # occurrences fired
        #: Occurrences decided one by one, fired or passed over (a cron's catch-up
        #: walks them): a release budgets its work by this count's growth.
        self.looked = 0
        self.ignored = 0  # unschedule, pause and resume rows that changed nothing
        self.finished = 0
        #: Schedule ids changed since the resolver last took its changes (None: not
        #: tracked).
        self.changed: set[str] | None = None

    def __len__(self) -> int:
        return len(self._series)

    def ids(self) -> Iterator[str]:
        return iter(self._series)

    # -- rows -------------------------------------------------------------------------

    def apply(self, kind: str, schedule_id: str, spec: Mapping[str, Any], ts: int,
              fires: list[Fire], target: str | None = None,
              payload: str | None = None) -> None:
        """A schedule row at ``ts`` (time already advanced to it); a ``schedule`` row's
        ``target`` and ``payload`` replace the series' from then on."""
        series = self._series.get(schedule_id)
        if kind == T_SCHEDULE:
            # The series replaced leaves its pending occurrence stale.
            fresh = _Series(spec, ts, self._shared, True, target, payload)
            self._series[schedule_id] = fresh
            self._push(schedule_id, fresh)
        elif series is None:
            self.ignored += 1
            return
        elif kind == T_UNSCHEDULE:
            del self._series[schedule_id]
        elif kind == T_PAUSE:
            if series.paused:
                self.ignored += 1
                return
            series.paused = True
            series.due_ms = None  # its pending occurrence is decided at resume
        else:  # resume
            if not series.paused:
                self.ignored += 1
                return
            series.paused = False
            self._plan(schedule_id, series, ts, fires)
        self._changed(schedule_id)

    # -- time -------------------------------------------------------------------------

    def next_fire_ms(self) -> int | None:
        """When the next pending occurrence fires, or None."""
        due = self.due
        while due:
            fire_ms, schedule_id = due[0]
            series = self._series.get(schedule_id)
            if series is not None and series.due_ms == fire_ms:
                return fire_ms
            heapq.heappop(due)
        return None

    def _decidable(self, now: int) -> int | None:
        """Up to when occurrences can be decided at ``now``: in event time, no further
        than the latest row known, as one after it is noticed by a row still to come."""
        if self.clock_notices:
            return now
        frontier = self.row_times.frontier
        return None if frontier is None else min(now, frontier)

    def behind(self, now: int) -> bool:
        """Whether occurrences that fire at or before ``now`` wait to be decided (an
        :meth:`advance` with a ``limit`` left them)."""
        fire = self.next_fire_ms()
        until = self._decidable(now)
        return fire is not None and until is not None and fire <= until

    def advance(self, now: int, fires: list[Fire], limit: int | None = None) -> None:
        """Time is ``now``: occurrences that fire at or before it are decided (in event
        time, up to the latest row known); with a ``limit``, series by series until
        about that many are looked at, fired or passed over, so that a catch-up of
        millions takes several calls, each of bounded memory and time."""
        until = self._decidable(now)
        if until is None:
            return
        due = self.due
        times = self.row_times
        stop_at = None if limit is None else self.looked + limit
        while due and due[0][0] <= until and (stop_at is None or self.looked < stop_at):
            fire_ms, schedule_id = heapq.heappop(due)
            series = self._series.get(schedule_id)
            if series is None or series.due_ms != fire_ms:
                continue
            series.due_ms = None
            occurrence = series.next_ms
            assert occurrence is not None
            noticed = now if self.clock_notices else times.noticed_at(fire_ms)
            if noticed is not None:  # on the wall clock, or in a gap of the log
                self._plan(schedule_id, series, noticed, fires, stop_at)
            else:
                self.looked += 1
                self._fire(schedule_id, series, occurrence, fires)
                series.after_ms = occurrence  # next_ms's object: shared already
                sched = series.schedule
                if sched.max_runs is not None and series.runs >= sched.max_runs:
                    self._finish(schedule_id)
                else:
                    self._move_on(schedule_id, series)
            self._changed(schedule_id)
        # The gaps before every occurrence still undecided are needed no more.
        times.forget_until(min(due[0][0], until) if due else until)

    def _plan(self, schedule_id: str, series: _Series, now: int, fires: list[Fire],
              stop_at: int | None = None) -> None:
        """Decide the occurrences in (after, now] by the misfire policy, in plans of a
        bounded number each; once :attr:`looked` reaches ``stop_at``, the rest wait
        for the next advance (the series stays due)."""
        sched = series.schedule
        while True:
            plan = sched.plan(series.after_ms, now, series.runs, PLAN_BUDGET)
            self.looked += plan.looked
            series.skipped += plan.skipped
            self.skipped += plan.skipped
            for occurrence in plan.fire:
                self._fire(schedule_id, series, occurrence, fires)
            series.after_ms = self._shared(max(series.after_ms, plan.after_ms))
            if plan.finished:
                self._finish(schedule_id)
                return
            if not plan.more or (stop_at is not None and self.looked >= stop_at):
                break
        self._move_on(schedule_id, series)

    def _fire(self, schedule_id: str, series: _Series, occurrence: int,
              fires: list[Fire]) -> None:
        fires.append(Fire(schedule_id, occurrence,
                          series.schedule.fire_ms(schedule_id, occurrence), series.skipped,
                          series.target, series.payload))
        series.runs += 1
        series.skipped = 0
        self.fired += 1

    def _move_on(self, schedule_id: str, series: _Series) -> None:
        series.next_ms = self._shared(series.schedule.next_after(series.after_ms))
        if series.next_ms is None:
            self._finish(schedule_id)
        else:
            self._push(schedule_id, series)

    def _finish(self, schedule_id: str) -> None:
        del self._series[schedule_id]
        self.finished += 1

    def _push(self, schedule_id: str, series: _Series) -> None:
        if series.next_ms is not None and not series.paused:
            series.due_ms = fire_ms = series.schedule.fire_ms(schedule_id, series.next_ms)
            heapq.heappush(self.due, (fire_ms, schedule_id))
            if len(self.due) > 2 * len(self._series) + _STALE_SLACK:
                self._drop_stale()

    def _drop_stale(self) -> None:
        """Keep only the live items: series replaced, paused or ended leave theirs
        behind, and a long-lived book must not hold them until their time comes."""
        series = self._series
        # A series replaced by one due at the same time left an equal item: one stays.
        live = {item for item in self.due
                if (s := series.get(item[1])) is not None and s.due_ms == item[0]}
        self.due[:] = live  # in place: advance() holds the list while it pushes
        heapq.heapify(self.due)

    def _changed(self, schedule_id: str) -> None:
        if self.changed is not None:
            self.changed.add(schedule_id)

    # -- keeping it ---------------------------------------------------------------------

    def entry(self, schedule_id: str) -> tuple[Any, ...] | None:
        """The series as plain values (for ``marshal``), or None if there is none."""
        series = self._series.get(schedule_id)
        if series is None:
            return None
        return (SCHEDULE_ENTRY, schedule_id, dict(series.spec), series.after_ms,
                series.next_ms, series.runs, series.skipped, series.paused, series.target,
                series.payload)

    def restore(self, entry: tuple[Any, ...]) -> None:
        """Take back one series saved as its :meth:`entry` (replacing any of its id)."""
        (_, schedule_id, spec, after_ms, next_ms, runs, skipped, paused, target,
         payload) = entry
        series = _Series(spec, after_ms, self._shared, next_ms, target, payload)
        series.runs, series.skipped, series.paused = runs, skipped, paused
        self._series[schedule_id] = series
        self._push(schedule_id, series)

    def drop(self, schedule_id: str) -> None:
        """Forget a series that a later save no longer holds."""
        self._series.pop(schedule_id, None)
