"""The purgatory applied to events: the semantics both engines share.

A :class:`Resolver` takes well-formed events in ``(ts_ms, kind)`` order, in as many
calls as the caller likes, and resolves delayed operations with a
:class:`~tickwheel.Purgatory` on a clock that only the events move:

- before the events at time t, every operation whose deadline is at or before t
  expires (``resolved_ms`` = its deadline);
- at one ``ts_ms``: watches, then updates with a value, then updates with an error,
  then cancels, so no outcome depends on the order rows arrived in;
- of the watches sharing an ``op_id``, a unique earliest one is applied and every
  other is quarantined as ``duplicate_op_id`` (at the earliest ``ts_ms``, copies of
  one watch are one watch, and two different watches are both quarantined), which a
  stream can decide as it goes: every later watch of an id already seen is a
  duplicate; with ``dedupe_retention_ms`` an id is remembered only
  while its operation is pending and until time passes its first watch's ``ts_ms`` +
  ``dedupe_retention_ms`` (then a watch of it starts a new operation), so memory stays
  bounded on an endless stream;
- a watch tries to complete at once (try-complete-else-watch); one whose deadline is
  at or before its ``ts_ms`` tries once and otherwise expires at once
  (``resolved_ms`` = its ``ts_ms``); an update raises its key's value to the largest
  seen and runs ``check_and_complete`` on the key; an error completes every operation
  watching the key (with the smallest error, if several reach it at one ``ts_ms``);
  a cancel of an unknown or resolved operation is counted, not an outcome.

The reference engine runs one resolver over a whole log; the engines that keep state
between batches run one per partition of the op-id space, saved as its :meth:`head`,
its operations' entries (:meth:`Resolver.op_entry`) and its seen ids
(:meth:`Resolver.take_seen_changes`), and brought back by :meth:`Resolver.restore_ops`.
"""

from __future__ import annotations

import _thread
import itertools
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any, NamedTuple

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.contract.events import (
    T_PAUSE,
    T_RESUME,
    T_SCHEDULE,
    T_UNSCHEDULE,
    W_ERROR,
    W_KEY,
    W_TS,
    W_TYPE,
    W_VALUE,
    Condition,
    Event,
    EventType,
    OutcomeKind,
    Quarantined,
    Reason,
    Wire,
    event_from_wire,
    line_of,
    new_event,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.semantics.row_times import RowTimes
from tickwheel.pipeline.semantics.schedule_book import (
    SCHEDULE_ENTRY,
    SCHEDULE_KEY,
    Fire,
    ScheduleBook,
    occurrence_id,
)
from tickwheel.purgatory import DelayedOperation, Outcome, Purgatory
from tickwheel.timers import TimingWheelTimer

__all__ = ["Resolver", "WatchFields", "first_order_at", "order_key",
           "wire_order"]

# Within one ts_ms: watches, updates with a value, updates with an error, cancels,
# ticks, and the schedule rows (schedule, unschedule, pause, resume).
WATCH, VALUE, ERROR, CANCEL, TICK, SCHEDULE = range(6)
_SCHEDULE_TYPES = frozenset({EventType.SCHEDULE, EventType.UNSCHEDULE, EventType.PAUSE,
                             EventType.RESUME})
_SCHEDULE_NAMES = frozenset(t.value for t in _SCHEDULE_TYPES)
# At one ts_ms, one schedule's rows apply in this order.
_SCHEDULE_RANK = {T_SCHEDULE: 0, T_PAUSE: 1, T_RESUME: 2, T_UNSCHEDULE: 3}


def kind_of(ev: Event) -> int:
    if ev.type is EventType.WATCH:
        return WATCH
    if ev.type is EventType.UPDATE:
        return VALUE if ev.error is None else ERROR
    if ev.type is EventType.CANCEL:
        return CANCEL
    if ev.type in _SCHEDULE_TYPES:
        return SCHEDULE
    return TICK


def order_key(ev: Event) -> tuple[int, int]:
    """Sort key that puts events in the order a resolver applies them."""
    return ev.ts_ms, kind_of(ev)


_WATCH = EventType.WATCH.value
_UPDATE = EventType.UPDATE.value
_CANCEL = EventType.CANCEL.value


def wire_order(fields: Wire) -> int:
    """:func:`order_key` of a well-formed row's wire form, as one int (``ts_ms`` times
    8 plus the kind): ints compare faster than tuples, and nothing is allocated."""
    kind = fields[W_TYPE]
    if kind == _WATCH:
        order = WATCH
    elif kind == _UPDATE:
        order = VALUE if fields[W_ERROR] is None else ERROR
    elif kind == _CANCEL:
        order = CANCEL
    elif kind in _SCHEDULE_NAMES:
        order = SCHEDULE
    else:
        order = TICK
    ts: int = fields[W_TS]
    return ts * 8 + order


def first_order_at(order: int) -> int:
    """The smallest :func:`wire_order` at the ``ts_ms`` of ``order``: where the rows
    applied together at one time begin."""
    return order - order % 8


_NO_COUNTS: dict[str, int] = {}  # shared, never written


class _LogOperation(DelayedOperation):
    __slots__ = ("error", "event", "resolver", "seen_updates")

    def __init__(self, resolver: Resolver, event: Event, delay_ms: int,
                 seen_updates: dict[str, int] | None = None) -> None:
        super().__init__(delay_ms, resolver.op_lock)
        self.resolver = resolver
        self.event = event
        self.error: str | None = None
        if seen_updates is None:
            if event.condition is Condition.ANY_UPDATE:
                counts = resolver.update_counts
                seen_updates = {k: counts.get(k, 0) for k in event.keys}
            else:
                seen_updates = _NO_COUNTS  # only any_update looks at them
        self.seen_updates = seen_updates

    def try_complete(self) -> bool:
        resolver = self.resolver
        ev = self.event
        if resolver.errors_now:
            errors = [resolver.errors_now[k] for k in ev.keys if k in resolver.errors_now]
            if errors:
                self.error = min(errors)
                return self.force_complete()
        values = resolver.values
        condition = ev.condition
        if condition is Condition.ALL_AT_LEAST:
            met = all(k in values and values[k] >= ev.targets[k] for k in ev.keys)
        elif condition is Condition.SUM_AT_LEAST:
            total = sum(max(0, values[k] - ev.targets[k]) for k in ev.keys if k in values)
            met = total >= ev.min_total
        elif condition is Condition.ANY_UPDATE:
            counts = resolver.update_counts
            met = any(counts.get(k, 0) > n for k, n in self.seen_updates.items())
        else:
            met = False
        return self.force_complete() if met else False

    def on_complete(self) -> None:
        ev = self.event
        resolver = self.resolver
        assert resolver.now is not None
        if self.outcome is Outcome.EXPIRED:
            resolver.record(ev, OutcomeKind.EXPIRED, ev.deadline_ms, None)
        elif self.error is not None:
            resolver.record(ev, OutcomeKind.ERROR, resolver.now, self.error)
        else:
            resolver.record(ev, OutcomeKind.COMPLETED, resolver.now, None)


class _ResolverClock:
    """A resolver's time, as its timer reads it. Only ``advance_to`` moves it, on the
    resolver's one thread, after checking that it does not go back: a ManualClock's
    lock would cost every (partition, timestamp) group of the op stage for nothing."""

    __slots__ = ("ms",)

    def __init__(self, ms: int) -> None:
        self.ms = ms

    @property
    def realtime(self) -> bool:
        return False

    def now_ms(self) -> int:
        return self.ms


def _copies_kept(watches: list[Event], counts: dict[str, int]) -> dict[str, Event]:
    """Of the op ids watched more than once at one ``ts_ms``, those whose watches are
    copies of one watch (equal but for their text), each with the copy kept: the least
    text, so that which copy is kept depends on no arrival order. A producer that sends a
    watch twice has sent one watch; two different watches of one id are ambiguous."""
    groups: dict[str, list[Event]] = {}
    for ev in watches:
        op_id = ev.op_id
        assert op_id is not None
        if counts[op_id] > 1:
            groups.setdefault(op_id, []).append(ev)
    kept: dict[str, Event] = {}
    for op_id, group in groups.items():
        first = group[0][3:]
        if all(ev[3:] == first for ev in group):
            kept[op_id] = min(group, key=line_of)
    return kept


class Resolver:
    """Resolves operations from events given in order; see the module doc.

    Outcomes and duplicate watches accumulate in ``outcomes`` and ``quarantine``; the
    caller takes them away (:meth:`drain`) as often as it likes.
    """

    def __init__(self, now_ms: int | None = None,
                 dedupe_retention_ms: int | None = None) -> None:
        self.dedupe_retention_ms = (
            None if dedupe_retention_ms is None
            else check_positive_int("dedupe_retention_ms", dedupe_retention_ms, minimum=0))
        self.values: dict[str, int] = {}
        self.update_counts: dict[str, int] = {}
        self.errors_now: dict[str, str] = {}
        # The ids seen, each with its first watch's ts_ms, in the order first seen,
        # which is time order. With a retention, `_seen_order` holds them in that
        # order too, and ids past their retention whose operation is still pending
        # move to `_lingering`. A restore from the log of changes copies both whole:
        # no tuple and no sort per id. (Not the dict's own front: reaching it costs
        # a scan over the entries deleted there.)
        self._seen: dict[str, int] = {}
        self._seen_order: deque[str] = deque()
        self._lingering: set[str] = set()
        # Kept only for a caller that saves the seen ids as a log of changes (see
        # `take_seen_changes`): id -> its first watch's ts_ms, or None once forgotten.
        self._seen_changes: dict[str, int | None] | None = None
        # Kept only for a caller that saves the operations one at a time (see
        # `take_op_changes`): the ids of operations added, changed or resolved.
        # True where the first change was the operation's registration, so one
        # registered and resolved between saves is not written.
        self._op_changes: dict[str, bool] | None = None
        self.pending: dict[str, _LogOperation] = {}
        self.outcomes: list[OutcomeRow] = []
        self.quarantine: list[Quarantined] = []
        self.applied = 0
        self.ignored_cancels = 0
        #: The recurring schedules (see :mod:`tickwheel.pipeline.semantics.schedule_book`).
        self.schedules = ScheduleBook()
        self.now = now_ms
        # One lock for all its operations, as Kafka shares a group's lock: a resolver
        # is used by one thread, and a lock of their own cost every operation an
        # allocation.
        self.op_lock = _thread.RLock()
        self._clock: _ResolverClock | None = None
        self._purgatory: Purgatory | None = None
        self._timer: TimingWheelTimer | None = None

    # -- applying events ---------------------------------------------------------

    def apply(self, events: Iterable[Event]) -> None:
        """Apply events sorted by :func:`order_key`, none earlier than ``now``."""
        times = self.schedules.row_times
        for ts, group in itertools.groupby(events, key=lambda e: e.ts_ms):
            times.see(ts)
            self.advance_to(ts)
            batch = list(group)
            self._watch_all([ev for ev in batch if ev.type is EventType.WATCH])
            purgatory = self._the_purgatory()
            schedule_rows: list[Event] = []
            for ev in batch:
                kind = kind_of(ev)
                if kind == WATCH:
                    continue
                if kind == VALUE:
                    assert ev.key is not None and ev.value is not None
                    self._apply_value(ev.key, ev.value, purgatory)
                elif kind == SCHEDULE:
                    schedule_rows.append(ev)
                else:
                    self._apply_other(ev, kind, ts)
            self._flush_errors()
            if schedule_rows:
                self._apply_schedule_rows(schedule_rows, ts)

    def apply_wire(self, rows: list[Wire], start: int = 0,
                   fire_limit: int | None = None) -> int:
        """:meth:`apply` for well-formed rows in their wire form, sorted by
        :func:`wire_order`, from ``rows[start]`` on; where it stopped (``len(rows)``:
        all applied). A value update, the most common row and one every shard of the
        Spark engine applies, becomes no :class:`Event` on the way.

        With ``fire_limit``, a call decides about that many occurrences of schedules
        (:attr:`ScheduleBook.looked`) and stops at the first row with occurrences
        before it still to decide: a catch-up of millions goes in bounded shares, each
        drained before the next call goes on from where this one stopped."""
        n = len(rows)
        i = start
        book = self.schedules
        times = book.row_times
        stop_at = None if fire_limit is None else book.looked + fire_limit
        while i < n:
            ts = rows[i][0]
            end = i + 1
            while end < n and rows[end][0] == ts:
                end += 1
            times.see(ts)
            if stop_at is not None and book.due:
                self.advance_to(ts, max(0, stop_at - book.looked))
                if book.behind(ts):
                    return i  # the occurrences before these rows first
            else:
                self.advance_to(ts)
            first_other = i
            while first_other < end and rows[first_other][1] == _WATCH:
                first_other += 1
            self._watch_all([event_from_wire(rows[m]) for m in range(i, first_other)])
            purgatory = self._the_purgatory()
            schedule_rows: list[Event] | None = None
            for m in range(first_other, end):
                fields = rows[m]
                if fields[W_TYPE] == _UPDATE and fields[W_ERROR] is None:
                    self._apply_value(fields[W_KEY], fields[W_VALUE], purgatory)
                else:
                    ev = event_from_wire(fields)
                    kind = kind_of(ev)
                    if kind != SCHEDULE:
                        self._apply_other(ev, kind, ts)
                    elif schedule_rows is None:
                        schedule_rows = [ev]
                    else:
                        schedule_rows.append(ev)
            self._flush_errors()
            if schedule_rows is not None:
                self._apply_schedule_rows(schedule_rows, ts)
            i = end
        return n

    def _apply_value(self, key: str, value: int, purgatory: Purgatory) -> None:
        self.applied += 1
        values = self.values
        if value > values.get(key, value - 1):
            values[key] = value
        counts = self.update_counts
        counts[key] = counts.get(key, 0) + 1
        purgatory.check_and_complete(key)

    def _apply_other(self, ev: Event, kind: int, ts: int) -> None:
        """An error update, a cancel or a tick."""
        self.applied += 1
        if kind == ERROR:
            assert ev.key is not None and ev.error is not None
            known = self.errors_now.get(ev.key)
            self.errors_now[ev.key] = ev.error if known is None else min(known, ev.error)
        elif kind == CANCEL:
            self._flush_errors()
            assert ev.op_id is not None
            op = self.pending.get(ev.op_id)
            if op is not None and op.cancel():
                del self.pending[ev.op_id]
                self.record(op.event, OutcomeKind.CANCELLED, ts, None)
            else:
                self.ignored_cancels += 1

    def _apply_schedule_rows(self, rows: list[Event], ts: int) -> None:
        """The schedule rows at one ``ts_ms``, each schedule's in a fixed order
        (schedule, pause, resume, unschedule; rows of one type by their line), so no
        outcome depends on the order they arrived in."""
        self._flush_errors()
        if len(rows) > 1:
            rows.sort(key=lambda ev: (ev.op_id, _SCHEDULE_RANK[ev.type._value_],
                                      line_of(ev)))
        book = self.schedules
        fires: list[Fire] = []
        for ev in rows:
            assert ev.op_id is not None
            self.applied += 1
            book.apply(ev.type._value_, ev.op_id, ev.targets, ts, fires, ev.target,
                       ev.payload)
        self._record_fires(fires)

    def _record_fires(self, fires: list[Fire]) -> None:
        outcomes = self.outcomes
        for fire in fires:
            outcomes.append(tuple.__new__(OutcomeRow, (
                occurrence_id(fire.schedule_id, fire.occurrence_ms), OutcomeKind.FIRED,
                fire.fire_ms, fire.fire_ms - fire.occurrence_ms, (), None, fire.skipped,
                fire.target, fire.payload)))

    def advance_to(self, t: int, fire_limit: int | None = None) -> None:
        """Time is now ``t``: operations with a deadline at or before it expire, and
        schedules' occurrences that fire at or before it fire (with ``fire_limit``,
        about that many at most: see :meth:`ScheduleBook.advance
        <tickwheel.pipeline.semantics.schedule_book.ScheduleBook.advance>`)."""
        if self.now is not None and t < self.now:
            raise ValueError(f"t must not go back in time: {t} < now {self.now}")
        self.now = t
        if self._clock is None:
            self._clock = _ResolverClock(t)
        else:
            self._clock.ms = t
        self._the_purgatory().advance_clock(0)
        book = self.schedules
        due = book.due
        if due and due[0][0] <= t:
            fires: list[Fire] = []
            book.advance(t, fires, fire_limit)
            self._record_fires(fires)
        elif book.row_times.gaps:
            book.row_times.forget_until(due[0][0] if due else t)

    def record(self, ev: Event, outcome: OutcomeKind, resolved_ms: int, error: str | None) -> None:
        assert ev.op_id is not None
        self.pending.pop(ev.op_id, None)
        if self._op_changes is not None:
            self._op_changes.setdefault(ev.op_id, False)
        if self._lingering and ev.op_id in self._lingering:
            self._lingering.discard(ev.op_id)
            self._forgotten(ev.op_id)
        # tuple.__new__: the named tuple's own __new__ is a Python function.
        self.outcomes.append(tuple.__new__(OutcomeRow, (ev.op_id, outcome, resolved_ms,
                                                        resolved_ms - ev.ts_ms, ev.keys,
                                                        error, 0, ev.target, ev.payload)))

    def drain(self) -> tuple[list[OutcomeRow], list[Quarantined]]:
        """What was resolved and quarantined since the last drain."""
        outcomes, quarantine = self.outcomes, self.quarantine
        self.outcomes, self.quarantine = [], []
        return outcomes, quarantine

    def next_deadline(self) -> int | None:
        """The earliest deadline of a pending operation, in event time, or None: from
        the purgatory's timing wheel, which holds each at its deadline and looks into
        its first buckets only."""
        fire = self.schedules.next_fire_ms()
        if self._timer is None or not self.pending:
            return fire
        deadline = self._timer.next_expiration_ms()
        if fire is None or (deadline is not None and deadline < fire):
            return deadline
        return fire

    def close(self) -> None:
        if self._purgatory is not None:
            self._purgatory.close()

    # -- keeping it between micro-batches -----------------------------------------

    @property
    def seen_op_ids(self) -> set[str]:
        """The op ids whose next watch is a duplicate (a copy)."""
        return {*self._seen, *self._lingering}

    def track_seen_changes(self) -> None:
        """Keep the changes to :attr:`seen_op_ids` for :meth:`take_seen_changes`."""
        if self._seen_changes is None:
            self._seen_changes = {}

    def take_seen_changes(self) -> list[tuple[str, int | None]]:
        """The ids seen (with the ``ts_ms`` of their first watch) and forgotten (with
        None) since the last call or :meth:`track_seen_changes`: a caller can append
        these to a log instead of saving the whole set again."""
        changes = self._seen_changes
        if changes is None:
            raise RuntimeError("call track_seen_changes() first")
        self._seen_changes = {}
        return list(changes.items())

    def track_op_changes(self) -> None:
        """Keep the ids of the operations that change for :meth:`take_op_changes`."""
        if self._op_changes is None:
            self._op_changes = {}
            self.schedules.changed = set()

    def take_op_changes(self) -> list[str]:
        """The ids of the operations added, changed or resolved since the last call or
        :meth:`track_op_changes`: a caller can save just these (:meth:`op_entry`)
        instead of every pending operation again. One registered and resolved since
        is left out: what was saved never held it."""
        changes = self._op_changes
        if changes is None:
            raise RuntimeError("call track_op_changes() first")
        self._op_changes = {}
        pending = self.pending
        ids = [op_id for op_id, born in changes.items() if not born or op_id in pending]
        changed = self.schedules.changed
        if changed:
            ids += [SCHEDULE_KEY + schedule_id for schedule_id in changed]
            changed.clear()
        return ids

    def entry_ids(self) -> list[str]:
        """The ids of every entry :meth:`op_entry` gives: the pending operations', and
        each schedule's (:data:`~tickwheel.pipeline.semantics.schedule_book.SCHEDULE_KEY` and its
        id)."""
        return [*self.pending, *(SCHEDULE_KEY + schedule_id
                                 for schedule_id in self.schedules.ids())]

    def op_entry(self, op_id: str) -> tuple[Any, ...] | None:
        """The pending operation ``op_id`` as :meth:`restore_ops` takes it back (its
        watch and the parts its keys gave), or None if none is pending.

        Whether its id is past its retention is left out: a resolver restored without
        it holds such an id among those seen, and moves it apart again the next time
        it forgets ids, which it does before it judges any watch. So an id is not
        written again when it passes its retention."""
        if op_id.startswith(SCHEDULE_KEY):
            return self.schedules.entry(op_id[1:])
        op = self.pending.get(op_id)
        if op is None:
            return None
        return _event_fields(op.event), op.seen_updates

    def _schedule_counts(self) -> tuple[int, int, int]:
        book = self.schedules
        return book.skipped, book.ignored, book.finished

    def _set_schedule_counts(self, counts: tuple[int, int, int]) -> None:
        book = self.schedules
        book.skipped, book.ignored, book.finished = counts

    def head(self) -> tuple[Any, ...]:
        """What the resolver holds besides the seen ids and the pending operations,
        which a caller saves apart (:meth:`take_seen_changes`, :meth:`op_entry`);
        :meth:`restore_ops` takes all three back. Only an op stage's resolver is saved:
        one that applied updates (values and counts) holds what a head leaves out."""
        if self.values or self.update_counts:
            raise ValueError("a resolver holding values cannot be saved as a head")
        return (self.now, self.applied, self.ignored_cancels, self.dedupe_retention_ms,
                self._schedule_counts(), self.schedules.row_times.state())

    @classmethod
    def restore_ops(cls, head: tuple[Any, ...], ops: Iterable[tuple[Any, ...]],
                    seen: dict[str, int]) -> Resolver:
        """The resolver saved as its :meth:`head`, its operations' entries (in
        registration order) and its seen ids (each with the ``ts_ms`` of its first
        watch: the changes of :meth:`take_seen_changes` applied in order)."""
        now, applied, ignored, retention, counts, times = head
        resolver = cls(now, retention)
        resolver._set_schedule_counts(counts)
        resolver.schedules.row_times = RowTimes(*times)
        resolver._seen = dict(seen)  # in the order first seen
        if retention is not None:
            resolver._seen_order = deque(resolver._seen)
        resolver.applied = applied
        resolver.ignored_cancels = ignored
        if now is not None:
            resolver.advance_to(now)
            for entry in ops:
                if entry[0] == SCHEDULE_ENTRY:
                    resolver.schedules.restore(entry)
                else:
                    fields, seen_updates = entry
                    resolver._register(_event_from_fields(fields), seen_updates)
        # A pending operation whose id the seen ids lack is past its retention.
        resolver._linger_unseen()
        return resolver

    def catch_up_ops(self, head: tuple[Any, ...], later: dict[str, Any],
                     seen: dict[str, int]) -> bool:
        """Bring an older copy of a resolver saved as :meth:`head`, entries and seen
        ids up to date: ``head`` and ``seen`` as saved since, ``later`` the entries
        saved since (None: no longer pending). False if the copy cannot be (it is not
        older, or time fired an operation on the way): it must then be let go of."""
        now, applied, ignored, retention = head[:4]
        if retention != self.dedupe_retention_ms or (
                self.now is not None and (now is None or now < self.now)):
            return False
        pending = self.pending
        lingering = self._lingering
        new = []
        book = self.schedules
        book.row_times = RowTimes(*head[5])  # before time moves: see restore_ops
        for op_id, entry in later.items():
            if op_id.startswith(SCHEDULE_KEY):
                # Before time moves: a series saved since has decided its occurrences
                # up to the saved time, so moving the copy's time fires none.
                if entry is None:
                    book.drop(op_id[1:])
                else:
                    book.restore(entry)
                continue
            op = pending.get(op_id)
            if op is not None:
                if entry is not None and op.event.ts_ms == entry[0][0]:  # the same watch
                    op.seen_updates = entry[1]
                    continue
                del pending[op_id]
                op.cancel()
            lingering.discard(op_id)
            if entry is not None:
                new.append(entry)
        # Every operation the copy holds that expired since is gone: moving time
        # fires none.
        if now is not None:
            self.advance_to(now)
        for fields, seen_updates in new:
            self._register(_event_from_fields(fields), seen_updates)
        self._seen = dict(seen)
        for op_id in lingering:
            self._seen.pop(op_id, None)
        self._linger_unseen()
        if retention is not None:
            self._seen_order = deque(self._seen)
        self.applied = applied
        self.ignored_cancels = ignored
        self._set_schedule_counts(head[4])
        if self._seen_changes is not None:
            self._seen_changes = {}
        if self._op_changes is not None:
            self._op_changes = {}
            self.schedules.changed = set()
        return not self.outcomes and not self.quarantine

    # -- internals ---------------------------------------------------------------

    def _the_purgatory(self) -> Purgatory:
        if self._purgatory is None:
            assert self._clock is not None, "advance_to() first"
            self._timer = TimingWheelTimer(clock=self._clock, executor=None)
            self._purgatory = Purgatory("resolver", timer=self._timer, reaper=False)
        return self._purgatory

    def _watch_all(self, watches: list[Event]) -> None:
        if not watches:
            return
        counts: dict[str, int] = {}
        for ev in watches:
            assert ev.op_id is not None
            counts[ev.op_id] = counts.get(ev.op_id, 0) + 1
        seen = self._seen
        order = self._seen_order
        lingering = self._lingering
        ts = watches[0].ts_ms
        retention = self.dedupe_retention_ms
        if retention is not None:
            self._forget_before(ts - retention)
        kept = _copies_kept(watches, counts) if len(counts) < len(watches) else None
        for ev in watches:
            op_id = ev.op_id
            assert op_id is not None
            if (op_id in seen or (lingering and op_id in lingering)
                    or (counts[op_id] > 1 and (kept is None or kept.get(op_id) is not ev))):
                self.quarantine.append(Quarantined(line_of(ev), Reason.DUPLICATE_OP_ID, ev.ts_ms))
            else:
                self.applied += 1
                self._watch(ev)
        changes = self._seen_changes
        for op_id in counts:
            if op_id not in seen and not (lingering and op_id in lingering):
                seen[op_id] = ts
                if retention is not None:
                    order.append(op_id)
                if changes is not None:
                    changes.pop(op_id, None)  # forgotten earlier: in order, seen again
                    changes[op_id] = ts

    def _forget_before(self, t: int) -> None:
        """Forget the ids first seen before ``t``, once their operations resolve."""
        seen = self._seen
        order = self._seen_order
        while order and seen[order[0]] < t:
            op_id = order.popleft()
            del seen[op_id]
            if op_id in self.pending:
                self._lingering.add(op_id)
            else:
                self._forgotten(op_id)

    def _linger_unseen(self) -> None:
        """A pending operation whose id the seen ids given back lack is past its
        retention (a log that drops such ids whole, pending or not, leaves it out):
        it stays apart until it resolves, as :meth:`_forget_before` would keep it."""
        if self.dedupe_retention_ms is None:
            return
        seen = self._seen
        for op_id in self.pending:
            if op_id not in seen:
                self._lingering.add(op_id)

    def _forgotten(self, op_id: str) -> None:
        """``op_id`` left the seen ids: a watch of it starts a new operation from now on."""
        if self._seen_changes is not None:
            self._seen_changes[op_id] = None

    def _watch(self, ev: Event) -> None:
        assert ev.op_id is not None
        if ev.deadline_ms <= ev.ts_ms:
            op = self._new_operation(ev, 0, None)
            if not op.safe_try_complete() and op.cancel():
                self.record(ev, OutcomeKind.EXPIRED, ev.ts_ms, None)
            return
        self._register(ev, None)

    def _register(self, ev: Event, seen_updates: dict[str, int] | None) -> None:
        assert ev.op_id is not None and self.now is not None
        op = self._new_operation(ev, ev.deadline_ms - self.now, seen_updates)
        if self._op_changes is not None:
            self._op_changes.setdefault(ev.op_id, ev.op_id not in self.pending)
        self.pending[ev.op_id] = op
        self._the_purgatory().try_complete_else_watch(op, self._watch_keys(ev))

    def _new_operation(self, ev: Event, delay_ms: int,
                       seen_updates: dict[str, int] | None) -> _LogOperation:
        """The delayed operation of an accepted watch (a hook: a resolver whose
        conditions are decided elsewhere makes its own kind)."""
        return _LogOperation(self, ev, delay_ms, seen_updates)

    def _watch_keys(self, ev: Event) -> tuple[Hashable, ...]:
        """The purgatory keys an operation is watched by: its keys, and for `none`,
        which watches no key, its own id, which keeps it there until it expires."""
        assert ev.op_id is not None
        return ev.keys or (("op", ev.op_id),)

    def _flush_errors(self) -> None:
        if self.errors_now:
            purgatory = self._the_purgatory()
            for key in list(self.errors_now):
                purgatory.check_and_complete(key)
            self.errors_now.clear()


class WatchFields(NamedTuple):
    """The first part of a pending operation's entry (:meth:`Resolver.op_entry`), by
    name: its watch's fields, saved as a plain tuple."""

    ts_ms: int
    raw: str | None
    op_id: str
    keys: tuple[str, ...]
    deadline_ms: int
    condition: str
    targets: Any
    min_total: int | None
    target: str | None
    payload: str | None


def _event_fields(ev: Event) -> tuple[Any, ...]:
    assert ev.condition is not None
    return (ev.ts_ms, ev.raw, ev.op_id, ev.keys, ev.deadline_ms, ev.condition.value,
            ev.targets, ev.min_total, ev.target, ev.payload)


def _event_from_fields(fields: tuple[Any, ...]) -> Event:
    ts, raw, op_id, keys, deadline, condition, targets, min_total, target, payload = fields
    return new_event(ts, EventType.WATCH, raw, op_id=op_id, keys=tuple(keys),
                     deadline_ms=deadline, condition=Condition(condition), targets=targets,
                     min_total=min_total, target=target, payload=payload)
