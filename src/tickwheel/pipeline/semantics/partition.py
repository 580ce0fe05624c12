"""A partition of either stage behind the engine's clock, as a streaming engine runs
it: rows arrive in micro-batches, out of order within the lateness bound, and are held
until the input's time passes them.

The clock is the input's own. Every partition of stage 1 learns the largest ``ts_ms``
of every slice of input (each slice sends each of them its top), so after a
micro-batch all of them stand at the same *release point* ``R``: the largest ``ts_ms``
read, less the lateness bound (or just past it, once the input has ended). A partition
applies every held row below ``R``, in the resolver's order, and time then stands at
``R - 1``. Stage 1 hands ``R`` to stage 2 with its progress, in the same micro-batch,
so a stage 2 partition releases to the same point once it has every progress row
below it. A row below the release point reached before its micro-batch is late: time
has passed it. Stage 1 judges updates, stage 2 every other row; a watch's copies that
stage 1 finds late are dropped, and stage 2 quarantines the watch.

Schedules read time from every row of the log (see
:mod:`~tickwheel.pipeline.semantics.row_times`): a slice tells stage 1's partition of a
number the times of its rows for stage 2's partition of that number, and each stage 1
partition sends every stage 2 partition the runs of the times it released, which merge
into the log's gaps exactly.

So the outcomes do not depend on how the input was cut into micro-batches, and once the
input has ended, every row is applied as the reference engine applies it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, cast

from tickwheel.pipeline.contract.events import (
    Q_RAW,
    Q_REASON,
    Q_TS,
    T_UPDATE,
    W_TS,
    W_TYPE,
    EventType,
    Quarantined,
    Reason,
    Wire,
    is_quarantined,
    wire_line,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.semantics.key_stage import KeyStage, Progress, is_progress, key_order
from tickwheel.pipeline.semantics.op_stage import OpStage, op_order
from tickwheel.pipeline.semantics.row_times import merge_runs, runs_of
from tickwheel.pipeline.semantics.schedule_book import SCHEDULE_ENTRY

__all__ = ["FIRES_PER_PIECE", "CommittedChanges", "KeyHead", "KeyPartition", "OpHead",
           "OpPartition", "PartitionChanges", "PartitionStatus", "Released", "run_steps"]

T = TypeVar("T")

_LONG_MAX = 2**63 - 1
#: Occurrences of schedules decided between two yields of a release's steps.
FIRES_PER_PIECE = 128
#: Rows handed to a stage in one call, at most (more only within one ``ts_ms``): the
#: compiled stages never let another thread take the interpreter, so a service's server
#: waits behind each call (a piece of watches is under 1 ms; smaller pieces cost no
#: throughput that shows, docs/service.md).
PIECE_ROWS = 128


def _piece_end(rows: list[Any], start: int, n: int) -> int:
    """Where the piece of ``rows`` (sorted by ``ts_ms`` first) that begins at ``start``
    ends: about :data:`PIECE_ROWS` on, cut only where ``ts_ms`` changes, as a stage
    applies a time's rows together."""
    end = min(start + PIECE_ROWS, n)
    while end < n and rows[end][0] == rows[end - 1][0]:
        end += 1
    return end


def _pieces(rows: list[Any]) -> Iterator[list[Any]]:
    """``rows`` in the pieces :func:`_piece_end` cuts."""
    n = len(rows)
    if n <= PIECE_ROWS:
        yield rows
        return
    start = 0
    while start < n:
        end = _piece_end(rows, start, n)
        yield rows[start:end]
        start = end


def run_steps(steps: Generator[None, None, T],
              between: Callable[[], object] | None = None) -> T:
    """Drive a release's ``steps`` to their end, calling ``between`` (if given) where
    they yield; their value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return cast(T, done.value)
        if between is not None:
            between()


class Released(NamedTuple):
    """What a stage 1 partition's :meth:`~KeyPartition.release` gives stage 2: the
    release point, the progress rows, and the runs of row times released
    (:func:`~tickwheel.pipeline.semantics.row_times.runs_of`)."""

    point: int | None
    progress: list[Progress]
    runs: list[int]


class KeyHead(NamedTuple):
    """What a key partition saves beside its entries (:meth:`KeyPartition.head`)."""

    partition: int
    partitions: int
    lateness_ms: int
    held: list[Any]
    release_ms: int | None
    top_ms: int | None
    rows_in: int
    rows_applied: int
    quarantined: int
    seq: int
    quarantined_by_reason: dict[str, int]
    stage_applied: int
    now: int | None
    held_times: list[int]


class OpHead(NamedTuple):
    """What an op partition saves beside its entries and seen op ids
    (:meth:`OpPartition.head`)."""

    partition: int
    lateness_ms: int
    stage: Any  # the resolver's own head (Resolver.head)
    held: list[Any]
    release_ms: int | None
    top_ms: int | None
    rows_in: int
    rows_applied: int
    quarantined: int
    seq: int
    quarantined_by_reason: dict[str, int]
    outcomes_by_outcome: dict[str, int]


class PartitionChanges(NamedTuple):
    """What a partition changed since it last gave its changes: what persistence
    writes, whatever stores it. ``entries`` pairs each id that changed with its entry
    (None: held no more); ``seen`` (an op partition's) pairs each op id first seen with
    its first watch's ``ts_ms``, or an op id forgotten with None."""

    head: KeyHead | OpHead
    entries: list[tuple[Any, Any]]
    seen: list[tuple[str, int | None]]


class CommittedChanges(NamedTuple):
    """What a committed batch changed in an op partition, for a reader of the state
    (such as the service's read view): the partition's entries changed (None: held
    no more) and seen op ids (None: forgotten), the outcomes it resolved, and its
    ``release_ms`` after it (rows below it are applied)."""

    batch_id: int
    entries: list[tuple[str, Any]]
    seen: list[tuple[str, int | None]]
    outcomes: list[OutcomeRow]
    release_ms: int | None


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """Counters of one partition of one stage (``"key"`` or ``"op"``); summed over
    both stages' partitions they account for every row read:
    ``rows_in == rows_applied + quarantined + held``."""

    stage: str
    partition: int
    seq: int
    release_ms: int | None  # rows below it are applied; time stands just before it
    top_ms: int | None  # the largest ts_ms of the input read so far
    rows_in: int
    rows_applied: int
    quarantined: int
    held: int
    pending: int  # operations (op stage) or registrations (key stage)
    ignored_cancels: int
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    outcomes_by_outcome: dict[str, int] = field(default_factory=dict)
    #: Bytes of the state saved after the call (an op partition's with the log of its
    #: seen op ids), where the engine keeps it in a store; 0 where it does not say.
    state_bytes: int = 0
    #: Recurring schedules held (op stage), and their occurrences skipped by misfire
    #: policies, in all.
    schedules: int = 0
    skipped: int = 0
    #: Whether occurrences of schedules wait for the op partition's next call, which
    #: needs no new input (:attr:`OpPartition.catching_up`).
    catching_up: bool = False


class _Partition:
    stage_name = ""

    def __init__(self, partition: int, lateness_ms: int) -> None:
        self.partition = partition
        self.lateness_ms = lateness_ms
        self.held: list[Any] = []
        self.release_ms: int | None = None
        self.top_ms: int | None = None
        self.rows_in = 0
        self.rows_applied = 0
        self.quarantined = 0
        self.quarantined_by_reason: dict[str, int] = {}
        self.outcomes_by_outcome: dict[str, int] = {}
        self.seq = 0

    def _late(self, ts: int) -> bool:
        return self.release_ms is not None and ts < self.release_ms

    def _count_quarantined(self, rows: list[Quarantined]) -> None:
        self.quarantined += len(rows)
        by_reason = self.quarantined_by_reason
        for row in rows:
            by_reason[row.reason.value] = by_reason.get(row.reason.value, 0) + 1

    def _due(self, release_ms: int, order: Any) -> list[Any]:
        """The held rows below ``release_ms``, in order; the rest stay held."""
        held = self.held
        held.sort(key=order)
        cut = bisect.bisect_left(held, release_ms * 8, key=order)
        due = held[:cut]
        del held[:cut]
        return due

    def _take_progress(self, head: KeyHead | OpHead) -> None:
        """Take back the rows held, the time and the counters, as saved."""
        self.held = head.held
        self.release_ms, self.top_ms = head.release_ms, head.top_ms
        self.rows_in, self.rows_applied, self.quarantined, self.seq = (
            head.rows_in, head.rows_applied, head.quarantined, head.seq)
        self.quarantined_by_reason = head.quarantined_by_reason

    def track_changes(self) -> None:
        """Keep what changes, entry by entry, for :meth:`take_changes`."""
        raise NotImplementedError

    def take_changes(self) -> list[Any]:
        """The ids of the entries that changed since the last call or
        :meth:`track_changes` (a key stage's keys and registrations, an op stage's op
        ids)."""
        raise NotImplementedError

    def entries(self, ids: list[Any] | None = None) -> list[tuple[Any, Any]]:
        """``(id, entry)`` for ``ids`` (every entry held if None); an entry is None
        where the partition holds nothing for its id any more."""
        raise NotImplementedError

    def changes(self) -> PartitionChanges:
        """The head, and the entries and seen op ids changed since the last call or
        :meth:`track_changes`: the one thing persistence takes from a partition, besides
        every entry held when it rewrites its log (:meth:`entries`)."""
        return PartitionChanges(self.head(), self.entries(self.take_changes()),
                                self._take_seen_changes())

    def _take_seen_changes(self) -> list[tuple[str, int | None]]:
        return []

    def live_entries(self) -> int:
        """How many entries the partition holds, or at most twice that."""
        raise NotImplementedError

    def head(self) -> KeyHead | OpHead:
        """The partition less its entries: its counters, its time, the rows it holds."""
        raise NotImplementedError

    @staticmethod
    def entry_bytes(item: tuple[Any, Any]) -> int:
        """About how many bytes ``(id, entry)`` takes saved."""
        raise NotImplementedError

    def _status(self, pending: int, ignored_cancels: int, held: int, schedules: int = 0,
                skipped: int = 0, catching_up: bool = False) -> PartitionStatus:
        self.seq += 1
        return PartitionStatus(self.stage_name, self.partition, self.seq, self.release_ms,
                               self.top_ms, self.rows_in, self.rows_applied, self.quarantined,
                               held, pending, ignored_cancels,
                               dict(self.quarantined_by_reason),
                               dict(self.outcomes_by_outcome), schedules=schedules,
                               skipped=skipped, catching_up=catching_up)


class KeyPartition(_Partition):
    """Stage 1: updates and watches' registrations in (:meth:`take`), progress rows out
    (:meth:`release`)."""

    stage_name = "key"

    def __init__(self, partition: int, partitions: int, lateness_ms: int) -> None:
        super().__init__(partition, lateness_ms)
        self.stage = KeyStage(partition, partitions)
        #: The times of stage 2's rows that ride with this partition (see
        #: :meth:`take`), not yet released.
        self.held_times: list[int] = []

    def take(self, rows: list[Wire], top_ms: int | None,
             times: Iterable[int] = ()) -> list[Quarantined]:
        """Hold a slice's rows for this partition (updates, and watches with a key
        here); ``top_ms`` is the slice's largest ``ts_ms``, ``times`` those of its
        well-formed rows for stage 2's partition of this number, whose lateness stage 2
        judges by the same release point. Returns the late updates."""
        if top_ms is not None and (self.top_ms is None or top_ms > self.top_ms):
            self.top_ms = top_ms
        release = self.release_ms
        self.held_times += (ts for ts in times if release is None or ts >= release)
        late: list[Quarantined] = []
        held = self.held
        for fields in rows:
            is_update = fields[W_TYPE] == T_UPDATE
            if is_update:
                self.rows_in += 1
            if self._late(fields[W_TS]):
                if is_update:
                    late.append(Quarantined(wire_line(fields), Reason.LATE, fields[W_TS]))
                continue
            held.append(fields)
        self._count_quarantined(late)
        return late

    def release(self, end_ms: int | None = None) -> Released:
        """Apply the held rows below the release point (the largest ``ts_ms`` read less
        the lateness bound, or ``end_ms`` if that is later: the end of input); return
        that point, the progress rows made, and the runs of the times released (this
        partition's rows and those of stage 2's partition of its number), which every
        stage 2 partition takes: together, every row's time. In one go:
        :meth:`release_steps` is the same in pieces."""
        return run_steps(self.release_steps(end_ms))

    def release_steps(self, end_ms: int | None = None) -> Generator[None, None, Released]:
        """:meth:`release`, yielding between two pieces of the rows it applies (never
        before the first), its value when done: an engine whose thread shares the
        interpreter with one that answers requests gives that one its turn there."""
        point = self.release_ms
        if self.top_ms is not None:
            reached = self.top_ms - self.lateness_ms
            point = reached if point is None else max(point, reached)
        if end_ms is not None:
            point = end_ms if point is None else max(point, end_ms)
        if point is None:
            return Released(None, [], [])
        self.release_ms = point
        due = self._due(point, key_order)
        stage = self.stage
        for index, piece in enumerate(_pieces(due)):
            if index:
                yield
            stage.apply(piece)
        self.rows_applied += sum(1 for fields in due if fields[W_TYPE] == T_UPDATE)
        if stage.now is None or point - 1 > stage.now:
            stage.advance_to(point - 1)
        held_times = self.held_times
        released = [ts for ts in held_times if ts < point]
        if released:
            self.held_times = [ts for ts in held_times if ts >= point]
        runs = runs_of(itertools.chain(released, (fields[W_TS] for fields in due)))
        return Released(point, stage.drain(), runs)

    def end_of_input_ms(self) -> int | None:
        """Just past the latest row of the input read so far."""
        return None if self.top_ms is None else min(self.top_ms + 1, _LONG_MAX)

    def status(self) -> PartitionStatus:
        held = sum(1 for fields in self.held if fields[W_TYPE] == T_UPDATE)
        return self._status(self.stage.registered, 0, held)

    def track_changes(self) -> None:
        self.stage.track_changes()

    def take_changes(self) -> list[Any]:
        return self.stage.take_changes()

    def entries(self, ids: list[Any] | None = None) -> list[tuple[Any, Any]]:
        stage = self.stage
        return [(ident, stage.entry(ident))
                for ident in (stage.entries_held() if ids is None else ids)]

    def live_entries(self) -> int:
        return len(self.stage.values) + self.stage.registered

    @staticmethod
    def entry_bytes(item: tuple[Any, Any]) -> int:
        ident = item[0]
        if isinstance(ident, str):
            return 24 + len(ident)
        return 96 + len(ident[0]) + len(ident[1])

    def head(self) -> KeyHead:
        stage = self.stage
        return KeyHead(self.partition, stage.partitions, self.lateness_ms, self.held,
                       self.release_ms, self.top_ms, self.rows_in, self.rows_applied,
                       self.quarantined, self.seq, self.quarantined_by_reason,
                       stage.applied, stage.now, self.held_times)

    @classmethod
    def from_state(cls, head: KeyHead, entries: Iterable[tuple[Any, Any]]) -> KeyPartition:
        """The partition saved as its :meth:`head` and its :meth:`entries` (in the
        order first saved)."""
        part = cls(head.partition, head.partitions, head.lateness_ms)
        part._take_progress(head)
        part.held_times = list(head.held_times)
        part.stage.restore_entries(entries, head.stage_applied, head.now)
        return part

    def catch_up(self, head: KeyHead, later: dict[Any, Any]) -> bool:
        """Bring this older copy up to date with the :meth:`head` saved since and the
        entries saved since (None: held no more). False if ``head`` is not this
        partition's."""
        stage = self.stage
        if ((head.partition, head.partitions, head.lateness_ms)
                != (self.partition, stage.partitions, self.lateness_ms)
                or (stage.now is not None and (head.now is None or head.now < stage.now))):
            return False
        self._take_progress(head)
        self.held_times = list(head.held_times)
        stage.catch_up(later, head.stage_applied, head.now)
        return True


#: The rows that change a partition's schedules, and so when its next occurrence is.
_SCHEDULE_ROWS = frozenset(kind.value for kind in (EventType.SCHEDULE, EventType.UNSCHEDULE,
                                                   EventType.PAUSE, EventType.RESUME))


def _through_schedule_rows(rows: list[Any], pos: int, end: int) -> int:
    """Where a piece ``rows[pos:end]`` ends so that no row follows, at a later time, a
    schedule row of it: the occurrences that row makes are decided, within a budget,
    before the rows after them."""
    for i in range(pos, end):
        if rows[i][1] in _SCHEDULE_ROWS:
            cut, ts = i + 1, rows[i][0]
            while cut < end and rows[cut][0] == ts:
                cut += 1
            return cut
    return end


class OpPartition(_Partition):
    """Stage 2: watches, cancels, ticks and malformed rows, and stage 1's progress in
    (:meth:`take`); outcomes out (:meth:`release`)."""

    stage_name = "op"

    def __init__(self, partition: int, lateness_ms: int,
                 dedupe_retention_ms: int | None = None) -> None:
        super().__init__(partition, lateness_ms)
        self.stage = OpStage(dedupe_retention_ms=dedupe_retention_ms)
        #: Occurrences of schedules one release decides one by one, about (None: all;
        #: :attr:`ScheduleBook.looked`): a catch-up after an outage or a gap in the log
        #: then takes several batches of bounded size and time. Rows always see every
        #: occurrence before their time fired: they wait.
        self.fire_limit: int | None = None

    def take(self, rows: list[Wire], progress: list[Progress]) -> list[Quarantined]:
        """Hold a slice's rows for this partition and stage 1's progress rows; return
        the rows quarantined (malformed or late)."""
        out: list[Quarantined] = []
        held = self.held
        self.rows_in += len(rows)
        for fields in rows:
            if is_quarantined(fields):
                out.append(Quarantined(fields[Q_RAW], Reason(fields[Q_REASON]), fields[Q_TS]))
            elif self._late(fields[W_TS]):
                out.append(Quarantined(wire_line(fields), Reason.LATE, fields[W_TS]))
            else:
                held.append(fields)
                ts: int = fields[W_TS]
                if self.top_ms is None or ts > self.top_ms:
                    self.top_ms = ts
        held.extend(progress)
        self._count_quarantined(out)
        return out

    def release(self, point: int | None, runs: Iterable[list[int]] = (),
                ) -> tuple[list[OutcomeRow], list[Quarantined]]:
        """:meth:`release_steps` in one go (a catch-up's occurrences decided in one
        share)."""
        return run_steps(self.release_steps(point, runs, shares=False))

    def release_steps(self, point: int | None, runs: Iterable[list[int]] = (), *,
                      shares: bool = True,
                      ) -> Generator[None, None, tuple[list[OutcomeRow], list[Quarantined]]]:
        """Apply the held rows below ``point``, stage 1's release point (which it
        reached with every progress row below it sent); time then stands just before
        it. ``runs`` are the runs of row times every stage 1 partition released with
        it (:meth:`KeyPartition.release`): the log's clock, in event time.

        With a :attr:`fire_limit`, a catch-up of schedules decides about that many
        occurrences a call, fired or passed over one by one: rows after the
        occurrences still to decide wait, held, for the next call (see
        :attr:`catching_up`), as does time.

        Yields between two pieces of the rows it applies and, with ``shares``, between
        shares of :data:`FIRES_PER_PIECE` occurrences (a minute's fires of a million
        daily schedules are hundreds at once); returns the outcomes and the duplicates
        quarantined."""
        stage = self.stage
        book = stage.schedules
        times = merge_runs(runs)
        if times:
            book.row_times.extend(times)
        if point is not None and (self.release_ms is None or point > self.release_ms):
            self.release_ms = point
        point = self.release_ms
        if point is None:
            return [], []
        limit = self.fire_limit
        looked_before = book.looked
        rows = self._due(point, op_order)
        applied: list[Any] = []
        pos, n = 0, len(rows)
        while pos < n:
            ts: int = rows[pos][0]
            if limit is not None and book.behind(ts):
                # The occurrences before these rows first, within the budget left.
                stage.advance_to(ts, max(0, limit - (book.looked - looked_before)))
                if book.behind(ts):
                    self.held.extend(rows[pos:])  # they wait for the next call
                    return self._released(applied, stage)
            end = _piece_end(rows, pos, n)
            if limit is not None:
                end = _through_schedule_rows(rows, pos, end)
            due_ms = book.next_fire_ms() if limit is not None else None
            if due_ms is not None and rows[end - 1][0] >= due_ms:
                # Only up to the next occurrence: the loop decides it, within budget.
                end = max(bisect.bisect_left(rows, due_ms * 8, pos, end, key=op_order),
                          pos + 1)
                while end < n and rows[end][0] == rows[end - 1][0]:
                    end += 1
            piece = rows[pos:end]
            stage.apply_staged(piece)
            applied += piece
            pos = end
            if pos < n:
                yield
        target = None
        if stage.now is None or point - 1 > stage.now:
            target = point - 1
        elif book.behind(stage.now):
            target = stage.now  # a catch-up goes on
        if target is not None:
            yield from self._advance(target, looked_before, shares)
        return self._released(applied, stage)

    def _advance(self, target: int, looked_before: int, shares: bool,
                 ) -> Generator[None, None, None]:
        """Time to ``target``, deciding at most :attr:`fire_limit` occurrences in all
        since ``looked_before``; with ``shares``, in shares of :data:`FIRES_PER_PIECE`
        with a yield after each, as rows go in pieces."""
        stage, book = self.stage, self.stage.schedules
        limit = self.fire_limit
        if limit is None or not shares:
            left = None if limit is None else max(0, limit - (book.looked - looked_before))
            stage.advance_to(target, left)
            return
        while True:
            left = max(0, limit - (book.looked - looked_before))
            looked = book.looked
            stage.advance_to(target, min(left, FIRES_PER_PIECE))
            if (not book.behind(target) or book.looked - looked_before >= limit
                    or book.looked == looked):
                return
            yield

    @property
    def catching_up(self) -> bool:
        """Whether occurrences of schedules (and the rows after them) wait for the next
        calls of :meth:`release`, which need no new input."""
        stage = self.stage
        return stage.now is not None and stage.schedules.behind(stage.now)

    def _released(self, due: list[Any], stage: OpStage,
                  ) -> tuple[list[OutcomeRow], list[Quarantined]]:
        outcomes, duplicates = stage.drain()
        applied = sum(1 for fields in due if not is_progress(fields))
        self.rows_applied += applied - len(duplicates)
        self._count_quarantined(duplicates)
        by_outcome = self.outcomes_by_outcome
        for row in outcomes:
            name: str = row.outcome._value_
            by_outcome[name] = by_outcome.get(name, 0) + 1
        return outcomes, duplicates

    def status(self) -> PartitionStatus:
        held = sum(1 for fields in self.held if not is_progress(fields))
        book = self.stage.schedules
        return self._status(len(self.stage.pending), self.stage.ignored_cancels, held,
                            len(book), book.skipped, self.catching_up)

    def track_changes(self) -> None:
        self.stage.track_op_changes()

    def take_changes(self) -> list[str]:
        return self.stage.take_op_changes()

    def _take_seen_changes(self) -> list[tuple[str, int | None]]:
        return self.stage.take_seen_changes()

    def entries(self, ids: list[str] | None = None) -> list[tuple[str, Any]]:
        stage = self.stage
        return [(op_id, stage.op_entry(op_id))
                for op_id in (stage.entry_ids() if ids is None else ids)]

    def live_entries(self) -> int:
        return len(self.stage.pending) + len(self.stage.schedules)

    @staticmethod
    def entry_bytes(item: tuple[str, Any]) -> int:
        op_id, entry = item
        if entry is None:
            return 32 + len(op_id)
        if entry[0] == SCHEDULE_ENTRY:
            return (160 + 2 * len(op_id) + sum(48 + len(str(v)) for v in entry[2].values())
                    + len(entry[9] or ""))
        fields = entry[0]  # the watch's: ts_ms, raw, op_id, keys, ..., target, payload
        return (160 + len(op_id) + len(fields[1] or "") + sum(64 + len(k) for k in fields[3])
                + len(fields[9] or ""))

    def head(self) -> OpHead:
        """Without the seen op ids, which the caller keeps as a log of
        :meth:`Resolver.take_seen_changes
        <tickwheel.pipeline.semantics.resolver.Resolver.take_seen_changes>`."""
        return OpHead(self.partition, self.lateness_ms, self.stage.head(), self.held,
                      self.release_ms, self.top_ms, self.rows_in, self.rows_applied,
                      self.quarantined, self.seq, self.quarantined_by_reason,
                      self.outcomes_by_outcome)

    @classmethod
    def from_state(cls, head: OpHead, entries: Iterable[tuple[str, Any]],
                   seen: dict[str, int]) -> OpPartition:
        """The partition saved as its :meth:`head`, its :meth:`entries` (in the order
        first saved) and its seen op ids."""
        part = cls(head.partition, head.lateness_ms)
        restored = OpStage.restore_ops(head.stage, (entry for _, entry in entries), seen)
        assert isinstance(restored, OpStage)
        part.stage = restored
        part._take_progress(head)
        part.outcomes_by_outcome = head.outcomes_by_outcome
        return part

    def catch_up(self, head: OpHead, later: dict[Any, Any], seen: dict[str, int]) -> bool:
        """Bring this older copy up to date with the :meth:`head`, entries (None: no
        longer pending) and seen op ids saved since. False if it cannot be: the copy
        must then be let go of (:meth:`OpStage.close`) and the state read whole."""
        if ((head.partition, head.lateness_ms) != (self.partition, self.lateness_ms)
                or not self.stage.catch_up_ops(head.stage, later, seen)):
            return False
        self._take_progress(head)
        self.outcomes_by_outcome = head.outcomes_by_outcome
        return True
