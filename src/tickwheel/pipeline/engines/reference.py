"""The in-process reference engine: the definition of the pipeline's semantics.

It resolves an event log with the :class:`~tickwheel.Purgatory` on a
:class:`~tickwheel.ManualClock`:

1. Rows are read in file order. A row is late when its ``ts_ms`` is below the
   watermark (the largest ``ts_ms`` of a well-formed row read before it, minus the
   lateness bound); late and malformed rows go to the quarantine with a reason.
2. Of the well-formed watches sharing an ``op_id``, a unique earliest one is kept;
   every other is quarantined. At the earliest ``ts_ms``, copies of one watch (equal
   but for their text) are one watch, the least text kept; two different watches are
   both quarantined.
   With ``dedupe_retention_ms``, an id is remembered only while its operation is
   pending and until time passes its first watch's ``ts_ms`` plus the retention; a
   later watch of it starts a new operation.
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

A log larger than ``spill_events`` is sorted on disk (:class:`SpilledRuns`): the
events read are held that many at a time, then sorted and spilled, and :meth:`resolve`
merges the runs as it applies them. The order, and so every outcome, is the same as
sorting in memory; memory holds ``spill_events`` events, a block of each run, and what
the resolver keeps (the pending operations, and the op ids it remembers). A catch-up of
schedules after a gap in the log is decided in shares of about
:data:`~tickwheel.pipeline.contract.limits.OCCURRENCES_PER_BATCH` occurrences, each
yielded by :meth:`resolve` before the next, so its outcomes stream out as the rest do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.contract.events import (
    W_ERROR,
    W_KEY,
    W_KEYS,
    W_OP_ID,
    W_PAYLOAD,
    W_RAW,
    W_TARGET,
    W_TS,
    Event,
    Quarantined,
    Reason,
    Wire,
    from_wire,
    is_quarantined,
    parse_wire,
    to_wire,
    wire_line,
)
from tickwheel.pipeline.contract.limits import (
    DEFAULT_LATENESS_MS,
    DEFAULT_SPILL_BYTES,
    DEFAULT_SPILL_EVENTS,
    MAX_LATENESS_MS,
    MAX_RETENTION_MS,
    OCCURRENCES_PER_BATCH,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.semantics.resolver import Resolver, first_order_at, wire_order
from tickwheel.pipeline.state.spilled_runs import SpilledRuns

__all__ = ["DEFAULT_LATENESS_MS", "ReferenceEngine", "RunResult"]

_FAN_IN = 32  # sorted runs merged at once


@dataclass(slots=True)
class RunResult:
    outcomes: list[OutcomeRow] = field(default_factory=list)
    quarantine: list[Quarantined] = field(default_factory=list)
    rows_in: int = 0
    rows_applied: int = 0
    pending: int = 0
    ignored_cancels: int = 0
    schedules: int = 0  # recurring schedules still held at the end
    skipped: int = 0  # their occurrences passed over by misfire policies

    def quarantined_by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for q in self.quarantine:
            counts[q.reason.value] = counts.get(q.reason.value, 0) + 1
        return counts

    def outcomes_by_outcome(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.outcome.value] = counts.get(o.outcome.value, 0) + 1
        return dict(sorted(counts.items()))


def _text_size(fields: Wire) -> int:
    """About the characters of a well-formed row's text: its raw line, or for one
    held without it (see :func:`~tickwheel.pipeline.contract.events.compact_wire`), its
    strings."""
    raw: str | None = fields[W_RAW]
    if raw is not None:
        return len(raw)
    strings = [fields[W_OP_ID], fields[W_KEY], fields[W_ERROR], fields[W_TARGET],
               fields[W_PAYLOAD], *fields[W_KEYS]]
    return 64 + sum(len(text) for text in strings if text is not None)


class ReferenceEngine:
    """Feed it rows (:meth:`feed_lines`, :meth:`feed`), then :meth:`run` for the whole
    result in memory, or :meth:`resolve` for outcomes as they come.

    ``spill_events``: events held in memory before they are sorted and spilled to
    files in ``spill_dir`` (None: the system's temporary directory); None never
    spills. ``spill_bytes``: the same bound on the events' row text, so that a log of
    large rows spills as soon (a row's text is most of what it holds)."""

    def __init__(self, lateness_ms: int = DEFAULT_LATENESS_MS,
                 dedupe_retention_ms: int | None = None, *,
                 spill_events: int | None = DEFAULT_SPILL_EVENTS,
                 spill_bytes: int = DEFAULT_SPILL_BYTES,
                 spill_dir: Path | None = None) -> None:
        self.lateness_ms = check_positive_int("lateness_ms", lateness_ms, minimum=0,
                                              maximum=MAX_LATENESS_MS)
        self.dedupe_retention_ms = (
            None if dedupe_retention_ms is None
            else check_positive_int("dedupe_retention_ms", dedupe_retention_ms, minimum=0,
                                    maximum=MAX_RETENTION_MS))
        self.spill_events = (None if spill_events is None
                             else check_positive_int("spill_events", spill_events))
        self.spill_bytes = check_positive_int("spill_bytes", spill_bytes)
        self._spill_dir = spill_dir
        self._result = RunResult()
        self._events: list[Wire] = []
        self._held_bytes = 0  # the row text of self._events
        self._runs: SpilledRuns[Wire] | None = None
        self._spilled = 0
        self._max_ts: int | None = None

    def feed_lines(self, lines: Iterable[str]) -> None:
        """Rows in file order; blank lines are not rows."""
        for line in lines:
            if not line.strip():
                continue
            self.feed_wire(parse_wire(line.rstrip("\n")))

    def feed(self, row: Event | Quarantined) -> None:
        """One row, in file order."""
        if isinstance(row, Quarantined):
            self._result.rows_in += 1
            self._result.quarantine.append(row)
            return
        self.feed_wire(to_wire(row))

    def feed_wire(self, fields: Wire) -> None:
        """One row in its wire form (:func:`~tickwheel.pipeline.contract.events.parse_wire`),
        in file order: the form the engine holds and spills, so rows read that way
        become no :class:`Event` on the way."""
        result = self._result
        result.rows_in += 1
        if is_quarantined(fields):
            refused = from_wire(fields)
            assert isinstance(refused, Quarantined)
            result.quarantine.append(refused)
            return
        ts: int = fields[W_TS]
        max_ts = self._max_ts
        if max_ts is not None and ts < max_ts - self.lateness_ms:
            result.quarantine.append(Quarantined(wire_line(fields), Reason.LATE, ts))
            return
        if max_ts is None or ts > max_ts:
            self._max_ts = ts
        events = self._events
        events.append(fields)
        self._held_bytes += _text_size(fields)
        if self.spill_events is not None and (len(events) >= self.spill_events
                                              or self._held_bytes >= self.spill_bytes):
            if self._runs is None:
                # A merge holds a block of each run it merges: blocks of a fan-in'th
                # of a run keep that within one run's memory.
                self._runs = SpilledRuns(
                    wire_order, group_start=first_order_at, directory=self._spill_dir,
                    fan_in=_FAN_IN, block_rows=max(1, min(2048, len(events) // _FAN_IN)),
                    block_bytes=max(1, self.spill_bytes // _FAN_IN), row_bytes=_text_size)
            self._runs.spill(sorted(events, key=wire_order))
            self._spilled += 1
            self._events = []
            self._held_bytes = 0

    @property
    def spilled_runs(self) -> int:
        """Sorted runs of events spilled to disk."""
        return self._spilled

    def take_quarantine(self) -> list[Quarantined]:
        """The rows quarantined on reading (malformed, late) since the last call: a
        caller that writes them as it goes keeps them out of memory."""
        taken = self._result.quarantine
        self._result.quarantine = []
        return taken

    def run(self) -> RunResult:
        """Resolve everything fed; the result holds every outcome and quarantined
        row not taken before."""
        result = self._result
        for outcomes, duplicates in self.resolve():
            result.outcomes.extend(outcomes)
            result.quarantine.extend(duplicates)
        return result

    def resolve(self) -> Iterator[tuple[list[OutcomeRow], list[Quarantined]]]:
        """Resolve everything fed, yielding the outcomes and the duplicate watches
        quarantined as they come: at once for a log held in memory, and a merged
        batch at a time for one sorted on disk (a batch holds whole times: the events
        at one ``ts_ms`` are applied together), and a share of a catch-up at a time.
        ``result.rows_applied`` counts the events applied so far (for progress); the
        other counts of :meth:`run` are set once it ends."""
        result = self._result
        resolver = Resolver(dedupe_retention_ms=self.dedupe_retention_ms)
        try:
            last = sorted(self._events, key=wire_order)
            self._events = []
            for batch in [last] if self._runs is None else self._runs.merge(last):
                applied = 0
                while applied < len(batch):
                    applied = resolver.apply_wire(batch, applied, OCCURRENCES_PER_BATCH)
                    result.rows_applied = resolver.applied  # progress, as it goes
                    yield resolver.drain()
            result.rows_applied = resolver.applied
            result.pending = len(resolver.pending)
            result.ignored_cancels = resolver.ignored_cancels
            result.schedules = len(resolver.schedules)
            result.skipped = resolver.schedules.skipped
        finally:
            resolver.close()
            if self._runs is not None:
                self._runs.close()
                self._runs = None

    @property
    def result(self) -> RunResult:
        """The counts so far, and the rows not taken."""
        return self._result
