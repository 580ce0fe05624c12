"""Stage 2 of the partitioned engine: one partition of the op-id space.

An op stage is a :class:`~tickwheel.pipeline.semantics.resolver.Resolver` whose operations learn
what their keys did from stage 1's progress rows (see
:mod:`tickwheel.pipeline.semantics.key_stage`) instead of from the values of every key. Watches,
cancels and ticks come here directly; the resolver's rules apply unchanged: deadlines,
duplicate op ids (and their retention), cancels, and the order within one ``ts_ms``:
watches (with their ``init`` progress), then ``value`` progress, then ``error``
progress (the smallest error of an operation's keys), then cancels.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from tickwheel.pipeline.contract.events import (
    T_CANCEL,
    T_TICK,
    T_WATCH,
    W_TS,
    W_TYPE,
    Condition,
    Event,
    Wire,
    event_from_wire,
)
from tickwheel.pipeline.semantics.key_stage import ERROR_PROGRESS, INIT, Progress, is_progress
from tickwheel.pipeline.semantics.resolver import CANCEL, SCHEDULE, TICK, Resolver, _LogOperation

__all__ = ["OpStage", "op_order"]

def op_order(fields: Wire | Progress) -> int:
    """Sort key of an op stage's rows, as one int: ``ts_ms`` times 8 plus watch and
    ``init`` 0, ``value`` 1, ``error`` 2, cancel 3, tick 4, schedule rows 5."""
    ts: int = fields[W_TS]
    kind = fields[W_TYPE]
    if is_progress(fields):
        return ts * 8 + (0 if kind == INIT else 1 if kind != ERROR_PROGRESS else 2)
    if kind == T_WATCH:
        return ts * 8
    if kind == T_CANCEL:
        return ts * 8 + CANCEL
    return ts * 8 + (TICK if kind == T_TICK else SCHEDULE)


class _StagedOperation(_LogOperation):
    """An operation whose keys' progress comes from stage 1: ``seen_updates`` holds,
    per key, its part (1 for a met target or an update, the amount for a sum), and is
    saved and restored with the operation as the resolver saves it."""

    __slots__ = ()

    def try_complete(self) -> bool:
        ev = self.event
        condition = ev.condition
        parts = self.seen_updates
        if condition is Condition.ALL_AT_LEAST:
            met = len(parts) == len(ev.keys)
        elif condition is Condition.SUM_AT_LEAST:
            met = sum(parts.values()) >= ev.min_total
        elif condition is Condition.ANY_UPDATE:
            met = bool(parts)
        else:
            met = False
        return self.force_complete() if met else False


class OpStage(Resolver):
    """Rows in (:meth:`apply_staged`, in :func:`op_order`): watches, cancels, ticks and
    stage 1's progress rows; outcomes and duplicate watches out (:meth:`drain`)."""

    def __init__(self, now_ms: int | None = None,
                 dedupe_retention_ms: int | None = None) -> None:
        super().__init__(now_ms, dedupe_retention_ms)
        #: (op_id, watch ts_ms) -> key -> part: the ``init`` progress of the watches
        #: being applied.
        self.initial: dict[tuple[str | None, int], dict[str, int]] = {}

    def apply_staged(self, rows: Iterable[Wire | Progress]) -> None:
        """Apply rows sorted by :func:`op_order`, none earlier than :attr:`now`."""
        staged: list[Any] = rows if isinstance(rows, list) else list(rows)
        n = len(staged)
        start = 0
        while start < n:
            ts = staged[start][0]
            end = start + 1
            while end < n and staged[end][0] == ts:
                end += 1
            self._apply_time(staged, start, end)
            start = end

    def _apply_time(self, rows: list[Any], i: int, n: int) -> None:
        """Apply ``rows[i:n]``, the rows of one ``ts_ms``. Split into many partitions,
        most times hold one row, so nothing is allocated that the rows do not need."""
        ts: int = rows[i][0]
        self.advance_to(ts)
        initial: dict[tuple[str | None, int], dict[str, int]] | None = None
        watches: list[Event] | None = None
        while i < n and rows[i][0] * 8 == op_order(rows[i]):  # watches and init
            fields = rows[i]
            if is_progress(fields):
                if initial is None:
                    initial = {}
                initial.setdefault((fields[2], fields[3]), {})[fields[4]] = fields[5]
            elif watches is None:
                watches = [event_from_wire(fields)]
            else:
                watches.append(event_from_wire(fields))
            i += 1
        if watches is not None:
            if initial is None:  # self.initial is empty between times
                self._watch_all(watches)
            else:
                self.initial = initial
                self._watch_all(watches)
                self.initial = {}
        errors: dict[str, str] | None = None
        pending = self.pending
        while i < n and len(rows[i]) == 6:
            _, kind, op_id, watch_ts, key, amount = rows[i]
            i += 1
            op = pending.get(op_id)
            if op is None or op.event.ts_ms != watch_ts:
                continue  # resolved, or a watch this stage did not accept
            if kind == ERROR_PROGRESS:
                if errors is None:
                    errors = {}
                known = errors.get(op_id)
                errors[op_id] = amount if known is None or amount < known else known
            else:
                op.seen_updates[key] = amount
                if self._op_changes is not None:
                    self._op_changes.setdefault(op_id, False)
                op.safe_try_complete()
        if errors is not None:
            for op_id, error in errors.items():
                op = pending.get(op_id)
                if op is not None:
                    op.error = error
                    op.force_complete()
        schedule_rows: list[Event] | None = None
        while i < n:
            ev = event_from_wire(rows[i])
            kind = rows[i][W_TYPE]
            i += 1
            if kind == T_CANCEL:
                self._apply_other(ev, CANCEL, ts)
            elif kind == T_TICK:
                self._apply_other(ev, TICK, ts)
            elif schedule_rows is None:
                schedule_rows = [ev]
            else:
                schedule_rows.append(ev)
        if schedule_rows is not None:
            self._apply_schedule_rows(schedule_rows, ts)

    def _new_operation(self, ev: Event, delay_ms: int,
                       seen_updates: dict[str, int] | None) -> _LogOperation:
        if seen_updates is None:  # a new watch; restored ones bring their parts
            seen_updates = self.initial.get((ev.op_id, ev.ts_ms))
            if seen_updates is None:
                seen_updates = {}
        return _StagedOperation(self, ev, delay_ms, seen_updates)

    def _watch_keys(self, ev: Event) -> tuple[Hashable, ...]:
        # Progress reaches an operation by its id; its keys are stage 1's.
        assert ev.op_id is not None
        return (("op", ev.op_id),)
