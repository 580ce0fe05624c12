"""One shard of a streaming engine: the resolver behind a watermark.

The Spark engine splits the op-id space into shards. Watches and cancels go to the
shard of their ``op_id``; updates and ticks are *shared*, copied to every shard, so an
operation never spans shards and every shard knows every key's value. Each shard
works through its rows in bulk (a Spark group is a shard, not a key: the cost per
group, not per row, is what Spark makes expensive).

Rows arrive in micro-batches, out of order within the lateness bound. A shard holds
rows until the watermark ``W`` passes them and then applies, in ``(ts_ms, kind)``
order, every held row with ``ts_ms < W``; time then stands at ``W - 1`` (deadlines up
to it expire). A row with ``ts_ms < W`` when it arrives is late and is quarantined.
So outcomes never depend on how rows were cut into batches, and once the watermark
passes the last row (the engine's end of input), a shard has applied exactly what the
reference engine applies.

Nothing here imports Spark: the engine moves bytes in and out, this decides.
"""

from __future__ import annotations

import bisect
import marshal
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.events import (
    Event,
    Quarantined,
    Reason,
    Wire,
    compact_wire,
    to_wire,
    wire_line,
)
from tickwheel.pipeline.resolver import OutcomeRow, Resolver, wire_order

__all__ = ["NO_ROWS", "Chunk", "Shard", "ShardStatus", "pack", "pack_rows", "shard_of"]

_LONG_MAX = 2**63 - 1


def shard_of(op_id: str, shards: int) -> int:
    """Stable across processes and runs (``hash()`` of a str is not)."""
    return zlib.crc32(op_id.encode("utf-8", "surrogatepass")) % shards


#: One shard's part of a slice of input: ``(shard, low, top, own rows, shared rows)``.
#: ``low`` is the smallest ``ts_ms`` of its well-formed rows (:data:`NO_ROWS` when it
#: has none); ``top`` the largest of the whole slice's (None when it has none), the
#: same in every shard's chunk, so that every shard knows how far the input reached.
Chunk = tuple[int, int, int | None, bytes, bytes]

#: A chunk's ``low`` when it holds no well-formed row: it bounds nothing. The largest
#: long, so that the value travels in a Spark ``long`` column without nulls.
NO_ROWS = 2**63 - 1


def pack(lines: Iterable[str], shards: int) -> list[Chunk]:
    """:func:`pack_rows` of JSON Lines rows (blank lines are not rows), parsed straight
    to their wire form, without the raw lines :func:`compact_wire` can leave out."""
    return _pack_wire((compact_wire(line) for line in lines if line.strip()), shards)


def pack_rows(rows: Iterable[Event | Quarantined], shards: int) -> list[Chunk]:
    """Cut parsed rows into one :data:`Chunk` per shard. Rows travel ``marshal``'d in
    their wire form (:data:`~tickwheel.pipeline.events.Wire`): parsed once, in parallel
    over the input, instead of once per shard. Shared rows are in every chunk; a
    malformed row goes to the shard of its raw text, which quarantines it; every shard
    gets a chunk, with rows of its own or not, unless the slice has no row at all."""
    return _pack_wire((to_wire(row) for row in rows), shards)


def _pack_wire(rows: Iterable[Wire], shards: int) -> list[Chunk]:
    own: list[list[Wire]] = [[] for _ in range(shards)]
    shared: list[Wire] = []
    lows = [NO_ROWS] * shards
    top: int | None = None
    shared_low = NO_ROWS
    for row in rows:
        if len(row) == 3:  # quarantined: (raw, reason, ts_ms)
            own[shard_of(row[0], shards)].append(row)
            continue
        ts: int = row[0]
        if top is None or ts > top:
            top = ts
        op_id: str | None = row[3]
        if op_id is None:  # update, tick
            shared.append(row)
            shared_low = min(shared_low, ts)
        else:
            where = shard_of(op_id, shards)
            own[where].append(row)
            lows[where] = min(lows[where], ts)
    if top is None and not any(own):
        return []
    # A chunk for every shard, with rows or not: each learns the slice's top. Never
    # empty bytes (the marshal'd empty list is not): those mark a control chunk.
    shared_blob = marshal.dumps(shared)
    return [(shard, min(lows[shard], shared_low), top, marshal.dumps(own[shard]), shared_blob)
            for shard in range(shards)]


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """Counters of one shard; summed over shards they account for every row:
    ``rows_in == rows_applied + quarantined + held``."""

    shard: int
    seq: int
    watermark_ms: int
    rows_in: int
    rows_applied: int
    quarantined: int
    held: int
    pending: int
    ignored_cancels: int
    max_ts_ms: int | None
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    outcomes_by_outcome: dict[str, int] = field(default_factory=dict)


class Shard:
    """Rows in (:meth:`take`), outcomes out (:meth:`release`).

    ``dedupe_retention_ms`` bounds how long op ids are remembered (see
    :class:`~tickwheel.pipeline.resolver.Resolver`).

    With ``lateness_ms``, :meth:`release` does not wait for the engine's watermark to
    catch up: Spark's watermark lags a micro-batch (it comes from the rows of earlier
    batches), so every row would be held, and saved with the state, for one batch.
    Rows more than ``lateness_ms`` below the latest row this shard has seen are applied
    at once: a row that comes later and is that old is late by the same bound (Spark's
    next watermark is at least that high), so the outcomes do not change.
    """

    def __init__(self, shard: int, lateness_ms: int | None = None,
                 dedupe_retention_ms: int | None = None) -> None:
        self.shard = shard
        self.lateness_ms = (None if lateness_ms is None
                            else check_positive_int("lateness_ms", lateness_ms, minimum=0))
        self.resolver = Resolver(dedupe_retention_ms=dedupe_retention_ms)
        # Held rows stay in their encoded form (see `Wire`). Most rows are held for one
        # micro-batch and saved with the state once; marshal moves builtins at C speed,
        # so a row becomes an `Event` only when it is applied, if at all.
        self.held: list[Wire] = []
        self.rows_in = 0
        self.rows_applied = 0
        self.quarantined = 0
        self.quarantined_by_reason: dict[str, int] = {}
        self.outcomes_by_outcome: dict[str, int] = {}
        self.max_ts: int | None = None  # of rows taken, not late: where time has reached
        # The latest ts_ms of the whole input read so far (every chunk's top), the same
        # in every shard: where the end of input takes time (see end_of_input_ms).
        self.top_ms: int | None = None
        self.seq = 0
        self.timer_ms: int | None = None  # the Spark timer registered for this shard

    def take(self, own: bytes, shared: bytes, watermark_ms: int,
             top_ms: int | None = None) -> list[Quarantined]:
        """Hold the rows of a chunk (:func:`pack`'s blobs; ``top_ms`` its top); return
        those quarantined (malformed or late)."""
        if top_ms is not None and (self.top_ms is None or top_ms > self.top_ms):
            self.top_ms = top_ms
        out: list[Quarantined] = []
        held = self.held
        top = self.max_ts
        late_before = watermark_ms if watermark_ms > 0 else None
        now = self.resolver.now
        if now is not None and (late_before is None or now >= late_before):
            late_before = now + 1  # time has passed it: applying it would go back
        for blob, counted in ((own, True), (shared, self.shard == 0)):
            if not blob:
                continue
            rows = marshal.loads(blob)
            if counted:
                self.rows_in += len(rows)
            for fields in rows:
                if len(fields) == 3:  # malformed: (raw, reason, ts_ms)
                    if counted:
                        out.append(Quarantined(fields[0], Reason(fields[1]), fields[2]))
                    continue
                ts = fields[0]
                if late_before is not None and ts < late_before:
                    if counted:
                        out.append(Quarantined(wire_line(fields), Reason.LATE, ts))
                    continue
                held.append(fields)
                if top is None or ts > top:
                    top = ts
        self.max_ts = top
        self._count_quarantined(out)
        return out

    def release(self, watermark_ms: int, below_ms: int | None = None,
                ) -> tuple[list[OutcomeRow], list[Quarantined]]:
        """Apply every held row below the watermark (or below the latest row seen less
        ``lateness_ms``, if that is higher); time moves to just before that point.

        ``below_ms`` caps that point, for a release in the middle of a micro-batch: no
        row at or after it is applied, nor does time reach it. A caller that knows no
        row still to come in the batch is below ``below_ms`` (the smallest ``low`` of
        the chunks not taken yet) releases what it has taken so far, and the outcomes
        are those of one release after the whole batch: the rows applied are the same,
        in the same order, and none still to come is late by it."""
        resolver = self.resolver
        if self.lateness_ms is not None and self.max_ts is not None:
            watermark_ms = max(watermark_ms, self.max_ts - self.lateness_ms)
        if below_ms is not None and below_ms < watermark_ms:
            watermark_ms = below_ms
        if watermark_ms <= 0:  # Spark's watermark before any event time was seen
            return [], []
        # Sorted in the order they apply (stable: rows tied on ts_ms and kind keep the
        # order they came in), so the due rows are a prefix. What stays held is sorted
        # already, and a sort of mostly sorted rows is a merge.
        held = self.held
        held.sort(key=wire_order)
        cut = bisect.bisect_left(held, watermark_ms * 8, key=wire_order)
        due = held[:cut]
        if due:
            del held[:cut]
            # Held rows are well-formed: take() quarantined the rest.
            resolver.apply_wire(due)
        if resolver.now is None or watermark_ms - 1 > resolver.now:
            resolver.advance_to(watermark_ms - 1)
        outcomes, duplicates = resolver.drain()
        self.rows_applied += self._counted(due) - len(duplicates)
        self._count_quarantined(duplicates)
        by_outcome = self.outcomes_by_outcome
        for row in outcomes:
            # `_value_`, the member's own attribute: `.value` is a Python-level
            # descriptor, 157 instead of 12 ns, twice an outcome.
            name: str = row.outcome._value_
            by_outcome[name] = by_outcome.get(name, 0) + 1
        return outcomes, duplicates

    def _counted(self, rows: list[Wire]) -> int:
        """How many of these rows this shard counts: a shared row (an update or a tick:
        no op_id) counts in shard 0 only, so the shards' counters sum to the rows read."""
        if self.shard == 0:
            return len(rows)
        return sum(1 for fields in rows if fields[3] is not None)

    def _count_quarantined(self, rows: list[Quarantined]) -> None:
        self.quarantined += len(rows)
        by_reason = self.quarantined_by_reason
        for row in rows:
            by_reason[row.reason.value] = by_reason.get(row.reason.value, 0) + 1

    def end_of_input_ms(self) -> int | None:
        """The watermark that ends the input: just past the latest row of the whole
        input read so far, where the reference engine's time stops. The same in every
        shard that took every chunk's top; None before any row."""
        top = self.top_ms if self.top_ms is not None else self.max_ts
        if top is None:
            return None
        return min(top + 1, _LONG_MAX)

    def next_timer_ms(self) -> int | None:
        """When the watermark must next wake this shard: just past its earliest held
        row or pending deadline."""
        held = min((fields[0] for fields in self.held), default=None)
        deadline = self.resolver.next_deadline()
        times = [t for t in (held, deadline) if t is not None]
        return min(times) + 1 if times else None

    def status(self, watermark_ms: int) -> ShardStatus:
        self.seq += 1
        return ShardStatus(self.shard, self.seq, watermark_ms, self.rows_in, self.rows_applied,
                           self.quarantined, self._counted(self.held),
                           len(self.resolver.pending), self.resolver.ignored_cancels,
                           self.max_ts, dict(self.quarantined_by_reason),
                           dict(self.outcomes_by_outcome))

    def snapshot(self, with_seen: bool = True) -> tuple[Any, ...]:
        """See :meth:`Resolver.snapshot <tickwheel.pipeline.resolver.Resolver.snapshot>`
        for ``with_seen``."""
        return (4, self.shard, self.lateness_ms, self.resolver.snapshot(with_seen),
                marshal.dumps(self.held), self.rows_in,
                self.rows_applied, self.quarantined, self.max_ts, self.seq, self.timer_ms,
                self.quarantined_by_reason, self.outcomes_by_outcome, self.top_ms)

    @classmethod
    def restore(cls, snapshot: tuple[Any, ...], seen_op_ids: set[str] | None = None,
                ) -> Shard:
        version = snapshot[0]
        if version not in (2, 3, 4):
            raise ValueError(f"shard snapshot version {version} is not supported")
        if version < 4:  # before chunks said how far the input reached
            snapshot = (*snapshot, None)
        (_, shard_id, lateness_ms, resolver, held, rows_in, applied, quarantined, max_ts, seq,
         timer, by_reason, by_outcome, top_ms) = snapshot
        shard = cls(shard_id, lateness_ms)
        shard.resolver = Resolver.restore(resolver, seen_op_ids)
        shard.held = marshal.loads(held)
        if version == 2:  # held rows were (row, counted) pairs
            shard.held = [fields for fields, _ in shard.held]
        shard.rows_in, shard.rows_applied, shard.quarantined = rows_in, applied, quarantined
        shard.max_ts, shard.seq, shard.timer_ms = max_ts, seq, timer
        shard.top_ms = top_ms
        shard.quarantined_by_reason, shard.outcomes_by_outcome = by_reason, by_outcome
        return shard
