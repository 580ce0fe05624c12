"""Stage 1 of the partitioned engine: one partition of the key space.

A key stage holds each of its keys' value and update count, and the *registrations*
of the operations watching its keys: a watch travels to the partition of each of its
keys (and to the partition of its ``op_id``, stage 2). Updates come here only, so an
update is applied once, in one partition, however many partitions there are.

For each registration a key stage says what its key did for the operation, as
*progress rows* that go to the operation's partition (see
:mod:`tickwheel.pipeline.semantics.op_stage`), each at the ``ts_ms`` of the row that caused it:

- ``init``, at the watch's ``ts_ms``, from the values before that time's updates (a
  watch applies first at its time): the key meets its ``all_at_least`` target, or
  gives ``sum_at_least`` that much (the key's value less its start, floored at 0);
- ``value``: an update raised that to the amount given (each ``all_at_least`` key
  once; ``sum_at_least`` at each increase), or updated the key at all
  (``any_update``, once);
- ``error``: an error update of the key (the smallest at that time).

Stage 1 cannot learn that stage 2 has resolved an operation: a registration stays
until its key alone settles the operation (an update for ``any_update``; the target of
a one-key ``all_at_least``; a ``sum_at_least`` part of ``min_total``; an error, which
resolves every operation still watching the key) or until the operation's deadline.
So the registrations held are at most those of watches whose deadline has not passed,
and an operation completed through another key gets progress rows from this one until
then. A duplicate or
late watch registers too; stage 2 ignores the progress of any operation it did not
accept (rows name the operation by its ``op_id`` and its watch's ``ts_ms``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from tickwheel.pipeline.contract.events import (
    T_WATCH,
    W_CONDITION,
    W_DEADLINE,
    W_ERROR,
    W_KEY,
    W_KEYS,
    W_MIN_TOTAL,
    W_OP_ID,
    W_TARGETS,
    W_TS,
    W_TYPE,
    W_VALUE,
    Wire,
)
from tickwheel.pipeline.contract.routing import partition_of

__all__ = ["ERROR_PROGRESS", "INIT", "VALUE_PROGRESS", "KeyStage", "Progress", "is_progress",
           "key_order"]

#: A progress row: ``(ts_ms, kind, op_id, watch_ts_ms, key, amount)``, where ``amount``
#: is a satisfied target or an ``any_update`` (1), a sum's part, or an error string.
Progress = tuple[int, str, str, int, str, "int | str"]



def is_progress(fields: tuple[Any, ...]) -> bool:
    """Whether a row an op stage holds is stage 1's progress (not a row of the log)."""
    return len(fields) == 6


INIT = "init"
VALUE_PROGRESS = "value"
ERROR_PROGRESS = "error"

def key_order(fields: Wire) -> int:
    """Sort key of a key stage's rows (watches and updates), as one int: ``ts_ms``
    times 8 plus watch 0, value 1, error 2, as the resolver applies them."""
    ts: int = fields[W_TS]
    if fields[W_TYPE] == T_WATCH:
        return ts * 8
    return ts * 8 + (1 if fields[W_ERROR] is None else 2)


_NEVER = 2**63  # no part of one key is enough on its own

#: What a key stage saves apart: a key (its value), or ``(key, op_id, watch_ts)`` (a
#: registration).
EntryId = str | tuple[str, str, int]


class _Registration:
    """One operation's watch on one key."""

    __slots__ = ("alone", "condition", "deadline_ms", "enough", "given", "op_id", "target",
                 "watch_ts")

    def __init__(self, op_id: str, watch_ts: int, deadline_ms: int, condition: str,
                 target: int, given: int, enough: int, alone: bool) -> None:
        self.op_id = op_id
        self.watch_ts = watch_ts
        self.deadline_ms = deadline_ms
        self.condition = condition
        self.target = target
        # all_at_least: 1 once the target is met; sum_at_least: the part given so far.
        self.given = given
        # What this key alone must give to complete the operation (parts are never
        # negative, so a sum that reaches min_total by one key completes): then no
        # later value can change the outcome, and the registration goes.
        self.enough = enough
        # The operation's only key: its outcome needs no part short of enough.
        self.alone = alone


class KeyStage:
    """The keys of partition ``partition`` of ``partitions``: rows in (:meth:`apply`,
    in :func:`key_order`), progress rows out (:meth:`drain`)."""

    def __init__(self, partition: int, partitions: int) -> None:
        self.partition = partition
        self.partitions = partitions
        self.values: dict[str, int] = {}
        self.registrations: dict[str, dict[tuple[str, int], _Registration]] = {}
        self.registered = 0
        # (deadline_ms, key, op_id, watch_ts): when a registration goes.
        self._deadlines: list[tuple[int, str, str, int]] = []
        self.progress: list[Progress] = []
        self.applied = 0  # updates
        self.now: int | None = None
        # Kept only for a caller that saves the state an entry at a time (see
        # `take_changes`): the keys whose value changed, and (key, op_id, watch_ts)
        # of the registrations added, changed or gone; True where the first change
        # was the entry's birth, so one born and gone between saves is not written.
        self._changed: dict[EntryId, bool] | None = None

    def apply(self, rows: Iterable[Wire]) -> None:
        """Apply watches and updates sorted by :func:`key_order`, none earlier than
        :attr:`now`."""
        errors: dict[str, str] = {}
        ts: int | None = None
        for fields in rows:
            t: int = fields[W_TS]
            if t != ts:
                if errors:
                    self._errors(errors, ts)  # type: ignore[arg-type]
                    errors = {}
                self.advance_to(t)
                ts = t
            if fields[W_TYPE] == T_WATCH:
                self._register(fields)
            elif fields[W_ERROR] is None:
                self._value(fields[W_KEY], fields[W_VALUE], t)
            else:
                key: str = fields[W_KEY]
                error: str = fields[W_ERROR]
                self.applied += 1
                known = errors.get(key)
                errors[key] = error if known is None or error < known else known
        if errors:
            assert ts is not None
            self._errors(errors, ts)

    def advance_to(self, t: int) -> None:
        """Time is now ``t``: registrations whose deadline is at or before it go (their
        operations have expired by then)."""
        if self.now is not None and t < self.now:
            raise ValueError(f"t must not go back in time: {t} < now {self.now}")
        self.now = t
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= t:
            _, key, op_id, watch_ts = heapq.heappop(deadlines)
            on_key = self.registrations.get(key)
            if on_key is not None and on_key.pop((op_id, watch_ts), None) is not None:
                self.registered -= 1
                if not on_key:
                    del self.registrations[key]
                if self._changed is not None:
                    self._changed.setdefault((key, op_id, watch_ts), False)

    def forget(self, op_id: str, watch_ts: int, keys: Iterable[str]) -> None:
        """Drop the registrations of an operation already resolved: where stage 2 can
        say so (both stages in one process), they need not wait for its deadline."""
        registrations = self.registrations
        for key in keys:
            on_key = registrations.get(key)
            if on_key is not None and on_key.pop((op_id, watch_ts), None) is not None:
                self.registered -= 1
                if not on_key:
                    del registrations[key]
                if self._changed is not None:
                    self._changed.setdefault((key, op_id, watch_ts), False)
        # A forgotten registration's deadline stays in the heap until it passes; once
        # most entries are such, the heap is rebuilt from the live ones, so that it
        # (and every snapshot) follows what is registered, not what has passed.
        if len(self._deadlines) > 2 * self.registered + 1024:
            self._deadlines = self.deadlines_list()
            heapq.heapify(self._deadlines)

    def drain(self) -> list[Progress]:
        """The progress rows made since the last drain."""
        out, self.progress = self.progress, []
        return out

    def deadlines_list(self) -> list[tuple[int, str, str, int]]:
        """When each registration goes, as :meth:`restore_state` takes it back: live
        ones only."""
        registrations = self.registrations
        live = []
        for entry in self._deadlines:
            on_key = registrations.get(entry[1])
            if on_key is not None and (entry[2], entry[3]) in on_key:
                live.append(entry)
        return live

    def track_changes(self) -> None:
        """Keep the keys that change for :meth:`take_changes`."""
        if self._changed is None:
            self._changed = {}

    def take_changes(self) -> list[EntryId]:
        """The entries that changed since the last call or :meth:`track_changes`: a
        key (its value) or ``(key, op_id, watch_ts)`` (a registration). A caller can
        save just these (:meth:`entry`) instead of everything again. A registration
        added and gone since is left out: what was saved never held it."""
        changed = self._changed
        if changed is None:
            raise RuntimeError("call track_changes() first")
        self._changed = {}
        registrations = self.registrations
        out: list[EntryId] = []
        for ident, born in changed.items():
            if born and isinstance(ident, tuple):
                key, op_id, watch_ts = ident
                on_key = registrations.get(key)
                if on_key is None or (op_id, watch_ts) not in on_key:
                    continue
            out.append(ident)
        return out

    def entry(self, ident: EntryId) -> Any:
        """The value of a key, or a registration's fields (as :meth:`restore_entries`
        takes them back); None if the stage holds none."""
        if isinstance(ident, str):
            return self.values.get(ident)
        key, op_id, watch_ts = ident
        on_key = self.registrations.get(key)
        reg = None if on_key is None else on_key.get((op_id, watch_ts))
        if reg is None:
            return None
        return (reg.deadline_ms, reg.condition, reg.target, reg.given, reg.enough,
                reg.alone)

    def entries_held(self) -> list[EntryId]:
        """Every entry held: the keys with a value, then the registrations."""
        held: list[EntryId] = list(self.values)
        held += [(key, op_id, watch_ts) for key, on_key in self.registrations.items()
                 for op_id, watch_ts in on_key]
        return held

    def restore_entries(self, entries: Iterable[tuple[EntryId, Any]], applied: int,
                        now: int | None) -> None:
        """Take back a state saved an entry at a time (``(ident, entry(ident))``)."""
        values: dict[str, int] = {}
        registrations: list[tuple[str, str, int, int, str, int, int, int, bool]] = []
        deadlines: list[tuple[int, str, str, int]] = []
        for ident, entry in entries:
            if isinstance(ident, str):
                values[ident] = entry
                continue
            key, op_id, watch_ts = ident
            deadline, condition, target, given, enough, alone = entry
            registrations.append((key, op_id, watch_ts, deadline, condition, target, given,
                                  enough, alone))
            deadlines.append((deadline, key, op_id, watch_ts))
        self.restore_state(values, registrations, deadlines, applied, now)

    def catch_up(self, later: dict[EntryId, Any], applied: int, now: int | None) -> None:
        """Bring an older copy up to date with the entries saved since (None: held no
        more), and the count and time saved with them."""
        values = self.values
        registrations = self.registrations
        for ident, entry in later.items():
            if isinstance(ident, str):
                if entry is None:
                    values.pop(ident, None)
                else:
                    values[ident] = entry
                continue
            key, op_id, watch_ts = ident
            on_key = registrations.get(key)
            if entry is None:
                if on_key is not None and on_key.pop((op_id, watch_ts), None) is not None:
                    self.registered -= 1
                    if not on_key:
                        del registrations[key]
                continue
            deadline, condition, target, given, enough, alone = entry
            if on_key is None:
                on_key = registrations[key] = {}
            reg = on_key.get((op_id, watch_ts))
            if reg is not None:
                reg.given = given
                continue
            on_key[op_id, watch_ts] = _Registration(op_id, watch_ts, deadline, condition,
                                                    target, given, enough, alone)
            self.registered += 1
            heapq.heappush(self._deadlines, (deadline, key, op_id, watch_ts))
        self.applied = applied
        self.now = now
        if self._changed is not None:
            self._changed = {}

    def restore_state(self, values: dict[str, int],
                      registrations: list[tuple[str, str, int, int, str, int, int, int, bool]],
                      deadlines: list[tuple[int, str, str, int]], applied: int,
                      now: int | None) -> None:
        """Take back a state saved from :attr:`values`, the registrations (key, then a
        registration's fields in order) and :meth:`deadlines_list`."""
        self.values = values
        self.registrations = {}
        for key, op_id, watch_ts, deadline, condition, target, given, enough, alone in (
                registrations):
            self.registrations.setdefault(key, {})[op_id, watch_ts] = _Registration(
                op_id, watch_ts, deadline, condition, target, given, enough, alone)
        self.registered = len(registrations)
        self._deadlines = [tuple(entry) for entry in deadlines]  # type: ignore[misc]
        heapq.heapify(self._deadlines)
        self.applied = applied
        self.now = now

    # -- internals ---------------------------------------------------------------

    def _register(self, fields: Wire) -> None:
        ts: int = fields[W_TS]
        op_id: str = fields[W_OP_ID]
        deadline: int = fields[W_DEADLINE]
        condition: str = fields[W_CONDITION]
        targets = fields[W_TARGETS]
        out = self.progress
        values = self.values
        for key in fields[W_KEYS]:
            if partition_of(key, self.partitions) != self.partition:
                continue
            value = values.get(key)
            given = 0
            enough = _NEVER
            if condition == "all_at_least":
                if value is not None and value >= targets[key]:
                    given = 1
                if len(fields[W_KEYS]) == 1:
                    enough = 1
            elif condition == "sum_at_least":
                if value is not None and value > targets[key]:
                    given = value - targets[key]
                enough = fields[W_MIN_TOTAL]
            alone = len(fields[W_KEYS]) == 1
            if given and (given >= enough or not alone):
                out.append((ts, INIT, op_id, ts, key, given))
            if deadline <= ts or given >= enough:
                # Tried once at its time, or complete by this key alone: nothing
                # later on this key changes its outcome.
                continue
            on_key = self.registrations.setdefault(key, {})
            born = (op_id, ts) not in on_key
            if born:
                self.registered += 1
            on_key[op_id, ts] = _Registration(op_id, ts, deadline, condition,
                                              targets.get(key, 0), given, enough, alone)
            heapq.heappush(self._deadlines, (deadline, key, op_id, ts))
            if self._changed is not None:
                self._changed.setdefault((key, op_id, ts), born)

    def _value(self, key: str, value: int, ts: int) -> None:
        self.applied += 1
        values = self.values
        known = values.get(key)
        if known is None or value > known:
            values[key] = known = value
            if self._changed is not None:
                self._changed.setdefault(key, False)
        on_key = self.registrations.get(key)
        if not on_key:
            return
        changed = self._changed
        out = self.progress
        done: list[tuple[str, int]] = []
        for ident, reg in on_key.items():
            condition = reg.condition
            if condition == "all_at_least":
                if reg.given or known < reg.target:
                    continue
                reg.given = 1
                if changed is not None:
                    changed.setdefault((key, reg.op_id, reg.watch_ts), False)
                out.append((ts, VALUE_PROGRESS, reg.op_id, reg.watch_ts, key, 1))
            elif condition == "sum_at_least":
                part = known - reg.target
                if part <= reg.given:
                    continue
                reg.given = part
                if changed is not None:
                    changed.setdefault((key, reg.op_id, reg.watch_ts), False)
                if part < reg.enough and reg.alone:
                    continue
                out.append((ts, VALUE_PROGRESS, reg.op_id, reg.watch_ts, key, part))
            else:  # any_update: done with the first update
                out.append((ts, VALUE_PROGRESS, reg.op_id, reg.watch_ts, key, 1))
                done.append(ident)
                if changed is not None:
                    changed.setdefault((key, reg.op_id, reg.watch_ts), False)
                continue
            if reg.given >= reg.enough:
                done.append(ident)
        for ident in done:
            del on_key[ident]
        self.registered -= len(done)
        if not on_key:
            del self.registrations[key]

    def _errors(self, errors: dict[str, str], ts: int) -> None:
        """Errors resolve every operation still watching their keys: the registrations
        go with them."""
        out = self.progress
        for key, error in errors.items():
            on_key = self.registrations.pop(key, None)
            if on_key is None:
                continue
            if self._changed is not None:
                for op_id, watch_ts in on_key:
                    self._changed.setdefault((key, op_id, watch_ts), False)
            self.registered -= len(on_key)
            for reg in on_key.values():
                out.append((ts, ERROR_PROGRESS, reg.op_id, reg.watch_ts, key, error))
