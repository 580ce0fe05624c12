"""The in-process reference engine: the definition of the pipeline's semantics.

It resolves an event log with the :class:`~tickwheel.Purgatory` on a
:class:`~tickwheel.ManualClock`:

1. Rows are read in file order. A row is late when its ``ts_ms`` is below the
   watermark (the largest ``ts_ms`` of a well-formed row read before it, minus the
   lateness bound); late and malformed rows go to the quarantine with a reason.
2. Of the well-formed watches sharing an ``op_id``, a unique earliest one is kept;
   every other is quarantined (two at the earliest ``ts_ms`` are both quarantined).
3. Events are applied in ``ts_ms`` order. Before the events at time t, every operation
   whose deadline is at or before t expires (``resolved_ms`` = its deadline). At one
   ``ts_ms``: all watches, then updates with a value, then updates with an error, then
   cancels, so no outcome depends on file or partition order.
4. A watch tries to complete at once against the keys' current values, then is
   watched (try-complete-else-watch); one whose deadline is at or before its
   ``ts_ms`` tries once and otherwise expires at once (``resolved_ms`` = its ``ts_ms``).
   An update raises its key's value to the largest seen and runs
   ``check_and_complete`` on the key; an error completes every operation watching
   the key with that error (the smallest, if several reach it at one ``ts_ms``). A
   cancel of an unknown or resolved operation is counted, not an outcome.
5. Operations still pending when the input ends have no outcome; the run says how
   many.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from tickwheel._clock import ManualClock
from tickwheel.pipeline.events import (
    Condition,
    Event,
    EventType,
    Outcome,
    Quarantined,
    Reason,
    parse_line,
)
from tickwheel.purgatory import DelayedOperation, Purgatory
from tickwheel.purgatory import Outcome as OpOutcome
from tickwheel.timers import TimingWheelTimer

__all__ = ["DEFAULT_LATENESS_MS", "OutcomeRow", "ReferenceEngine", "RunResult"]

DEFAULT_LATENESS_MS = 10_000

# Within one ts_ms: watches, updates with a value, updates with an error, cancels.
_WATCH, _VALUE, _ERROR, _CANCEL, _TICK = range(5)


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    op_id: str
    outcome: Outcome
    resolved_ms: int
    latency_ms: int
    keys: tuple[str, ...]
    error: str | None


@dataclass(slots=True)
class RunResult:
    outcomes: list[OutcomeRow] = field(default_factory=list)
    quarantine: list[Quarantined] = field(default_factory=list)
    rows_in: int = 0
    rows_applied: int = 0
    pending: int = 0
    ignored_cancels: int = 0

    def quarantined_by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for q in self.quarantine:
            counts[q.reason.value] = counts.get(q.reason.value, 0) + 1
        return counts


class _LogOperation(DelayedOperation):
    __slots__ = ("condition", "engine", "error", "event", "seen_updates")

    def __init__(self, engine: ReferenceEngine, event: Event) -> None:
        super().__init__(max(0, event.deadline_ms - event.ts_ms))
        self.engine = engine
        self.event = event
        self.condition = event.condition
        self.error: str | None = None
        self.seen_updates = {k: engine.update_counts.get(k, 0) for k in event.keys}

    def try_complete(self) -> bool:
        engine = self.engine
        ev = self.event
        if engine.errors_now:
            errors = [engine.errors_now[k] for k in ev.keys if k in engine.errors_now]
            if errors:
                self.error = min(errors)
                return self.force_complete()
        values = engine.values
        if self.condition is Condition.ALL_AT_LEAST:
            met = all(k in values and values[k] >= ev.targets[k] for k in ev.keys)
        elif self.condition is Condition.SUM_AT_LEAST:
            total = sum(max(0, values[k] - ev.targets[k]) for k in ev.keys if k in values)
            met = total >= ev.min_total
        elif self.condition is Condition.ANY_UPDATE:
            counts = engine.update_counts
            met = any(counts.get(k, 0) > n for k, n in self.seen_updates.items())
        else:
            met = False
        return self.force_complete() if met else False

    def on_complete(self) -> None:
        ev = self.event
        if self.outcome is OpOutcome.EXPIRED:
            self.engine.record(ev, Outcome.EXPIRED, ev.deadline_ms, None)
        elif self.error is not None:
            self.engine.record(ev, Outcome.ERROR, self.engine.now, self.error)
        else:
            self.engine.record(ev, Outcome.COMPLETED, self.engine.now, None)


class ReferenceEngine:
    """Feed it rows (``feed_lines``), then ``run()``."""

    def __init__(self, lateness_ms: int = DEFAULT_LATENESS_MS) -> None:
        if lateness_ms < 0:
            raise ValueError(f"lateness_ms must be >= 0, got {lateness_ms}")
        self.lateness_ms = lateness_ms
        self._result = RunResult()
        self._events: list[Event] = []
        self._max_ts: int | None = None
        # State while running, read by the operations.
        self.values: dict[str, int] = {}
        self.update_counts: dict[str, int] = {}
        self.errors_now: dict[str, str] = {}
        self.now = 0

    def feed_lines(self, lines: Iterable[str]) -> None:
        """Rows in file order; blank lines are not rows."""
        for line in lines:
            if not line.strip():
                continue
            self.feed(parse_line(line.rstrip("\n")))

    def feed(self, row: Event | Quarantined) -> None:
        result = self._result
        result.rows_in += 1
        if isinstance(row, Quarantined):
            result.quarantine.append(row)
            return
        if self._max_ts is not None and row.ts_ms < self._max_ts - self.lateness_ms:
            result.quarantine.append(Quarantined(row.raw, Reason.LATE, row.ts_ms))
            return
        if self._max_ts is None or row.ts_ms > self._max_ts:
            self._max_ts = row.ts_ms
        self._events.append(row)

    def record(self, ev: Event, outcome: Outcome, resolved_ms: int, error: str | None) -> None:
        assert ev.op_id is not None
        self._result.outcomes.append(OutcomeRow(ev.op_id, outcome, resolved_ms,
                                                resolved_ms - ev.ts_ms, ev.keys, error))

    def run(self) -> RunResult:
        result = self._result
        events = self._drop_duplicate_watches(self._events)
        result.rows_applied = len(events)
        events.sort(key=_order)
        clock = ManualClock(events[0].ts_ms if events else 0)
        purgatory = Purgatory("reference", timer=TimingWheelTimer(clock=clock, executor=None),
                              reaper=False)
        ops: dict[str, _LogOperation] = {}
        for ts, group in itertools.groupby(events, key=lambda e: e.ts_ms):
            clock.set(ts)
            self.now = ts
            purgatory.advance_clock(0)  # deadlines at or before ts expire first
            batch = list(group)
            for ev in batch:
                kind = _order(ev)[1]
                if kind == _WATCH:
                    self._watch(purgatory, ops, ev)
                elif kind == _VALUE:
                    assert ev.key is not None and ev.value is not None
                    if ev.value > self.values.get(ev.key, ev.value - 1):
                        self.values[ev.key] = ev.value
                    self.update_counts[ev.key] = self.update_counts.get(ev.key, 0) + 1
                    purgatory.check_and_complete(ev.key)
                elif kind == _ERROR:
                    assert ev.key is not None and ev.error is not None
                    known = self.errors_now.get(ev.key)
                    self.errors_now[ev.key] = ev.error if known is None else min(known,
                                                                                 ev.error)
                elif kind == _CANCEL:
                    self._flush_errors(purgatory)
                    assert ev.op_id is not None
                    op = ops.get(ev.op_id)
                    if op is not None and op.cancel():
                        self.record(op.event, Outcome.CANCELLED, ts, None)
                    else:
                        result.ignored_cancels += 1
            self._flush_errors(purgatory)
        result.pending = sum(1 for op in ops.values() if not op.is_completed)
        purgatory.close()
        return result

    def _flush_errors(self, purgatory: Purgatory) -> None:
        if self.errors_now:
            for key in list(self.errors_now):
                purgatory.check_and_complete(key)
            self.errors_now.clear()

    def _watch(self, purgatory: Purgatory, ops: dict[str, _LogOperation], ev: Event) -> None:
        assert ev.op_id is not None
        op = _LogOperation(self, ev)
        ops[ev.op_id] = op
        if ev.deadline_ms <= ev.ts_ms:
            if not op.safe_try_complete() and op.cancel():
                self.record(ev, Outcome.EXPIRED, ev.ts_ms, None)
            return
        # `none` watches no key: its own id keeps it in the purgatory until it expires.
        keys: tuple[Hashable, ...] = ev.keys or (("op", ev.op_id),)
        purgatory.try_complete_else_watch(op, keys)

    def _drop_duplicate_watches(self, events: list[Event]) -> list[Event]:
        first: dict[str, list[Event]] = {}
        for ev in events:
            if ev.type is EventType.WATCH:
                assert ev.op_id is not None
                first.setdefault(ev.op_id, []).append(ev)
        keep: set[int] = set()
        for watches in first.values():
            earliest = min(w.ts_ms for w in watches)
            at_earliest = [w for w in watches if w.ts_ms == earliest]
            if len(at_earliest) == 1:
                keep.add(id(at_earliest[0]))
        out = []
        for ev in events:
            if ev.type is EventType.WATCH and id(ev) not in keep:
                self._result.quarantine.append(
                    Quarantined(ev.raw, Reason.DUPLICATE_OP_ID, ev.ts_ms))
            else:
                out.append(ev)
        return out


def _order(ev: Event) -> tuple[int, int]:
    if ev.type is EventType.WATCH:
        return ev.ts_ms, _WATCH
    if ev.type is EventType.UPDATE:
        return ev.ts_ms, _VALUE if ev.error is None else _ERROR
    if ev.type is EventType.CANCEL:
        return ev.ts_ms, _CANCEL
    return ev.ts_ms, _TICK
