"""The in-process reference engine: the definition of the pipeline's semantics.

It resolves an event log with the :class:`~tickwheel.Purgatory` on a
:class:`~tickwheel.ManualClock`:

1. Rows are read in file order. A row is late when its ``ts_ms`` is below the
   watermark (the largest ``ts_ms`` of a well-formed row read before it, minus the
   lateness bound); late and malformed rows go to the quarantine with a reason.
2. Of the well-formed watches sharing an ``op_id``, a unique earliest one is kept;
   every other is quarantined (two at the earliest ``ts_ms`` are both quarantined).
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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.events import Event, Quarantined, Reason, line_of, parse_line
from tickwheel.pipeline.limits import DEFAULT_LATENESS_MS, MAX_LATENESS_MS, MAX_RETENTION_MS
from tickwheel.pipeline.resolver import OutcomeRow, Resolver, order_key

__all__ = ["DEFAULT_LATENESS_MS", "OutcomeRow", "ReferenceEngine", "RunResult"]


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

    def outcomes_by_outcome(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.outcome.value] = counts.get(o.outcome.value, 0) + 1
        return dict(sorted(counts.items()))


class ReferenceEngine:
    """Feed it rows (``feed_lines``), then ``run()``."""

    def __init__(self, lateness_ms: int = DEFAULT_LATENESS_MS,
                 dedupe_retention_ms: int | None = None) -> None:
        self.lateness_ms = check_positive_int("lateness_ms", lateness_ms, minimum=0,
                                              maximum=MAX_LATENESS_MS)
        self.dedupe_retention_ms = (
            None if dedupe_retention_ms is None
            else check_positive_int("dedupe_retention_ms", dedupe_retention_ms, minimum=0,
                                    maximum=MAX_RETENTION_MS))
        self._result = RunResult()
        self._events: list[Event] = []
        self._max_ts: int | None = None

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
            result.quarantine.append(Quarantined(line_of(row), Reason.LATE, row.ts_ms))
            return
        if self._max_ts is None or row.ts_ms > self._max_ts:
            self._max_ts = row.ts_ms
        self._events.append(row)

    def run(self) -> RunResult:
        result = self._result
        events = sorted(self._events, key=order_key)
        self._events = []
        resolver = Resolver(dedupe_retention_ms=self.dedupe_retention_ms)
        resolver.apply(events)
        outcomes, duplicates = resolver.drain()
        result.outcomes.extend(outcomes)
        result.quarantine.extend(duplicates)
        result.rows_applied = resolver.applied
        result.pending = len(resolver.pending)
        result.ignored_cancels = resolver.ignored_cancels
        resolver.close()
        return result
