"""The times an event log's rows give, by which schedules notice their occurrences in
event time.

In event time the log is the clock: time reads as each row's ``ts_ms``. An occurrence
is noticed at the first row at or after it; where the log has a *gap* (more than
:data:`GAP_MS` with no row), an occurrence inside it is noticed at the gap's end, and
one noticed more than its schedule's ``grace_ms`` late is decided by its ``misfire``
policy, as after an outage on the wall clock. The rows that count are the log's
well-formed rows that are not late.

A partitioned engine's partitions each see some of the rows, so they pass their times
on as *runs*: ``[start, end, start, end, ...]``, each run a stretch of row times no
more than :data:`GAP_MS` apart, its ends exact times of rows. Runs merge exactly (a gap
in the whole log is a gap in every part of it), and a partition's runs are as many as
its gaps, not its rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Final

from tickwheel.pipeline.contract.events import W_TS, Wire, is_quarantined

__all__ = ["GAP_MS", "RowTimes", "merge_runs", "runs_of", "times_of"]

#: Rows closer than this are continuous time: only a longer stretch without a row is a
#: gap. Event time's resolution, so that what partitions exchange grows with the gaps
#: and not with the rows.
GAP_MS: Final = 1_000


def runs_of(times: Iterable[int]) -> list[int]:
    """The runs of row times (any order, repeats allowed), flat and in order."""
    runs: list[int] = []
    for ts in sorted(set(times)):
        if runs and ts - runs[-1] <= GAP_MS:
            runs[-1] = ts
        else:
            runs += (ts, ts)
    return runs


def times_of(rows: Iterable[Wire]) -> list[int]:
    """The distinct ``ts_ms`` of the well-formed rows among ``rows``, in order."""
    return sorted({fields[W_TS] for fields in rows if not is_quarantined(fields)})


def merge_runs(parts: Iterable[list[int]]) -> list[int]:
    """The runs of the union of several parts' rows, from each part's runs."""
    pairs = sorted((part[i], part[i + 1]) for part in parts for i in range(0, len(part), 2))
    runs: list[int] = []
    for start, end in pairs:
        if runs and start - runs[-1] <= GAP_MS:
            runs[-1] = max(runs[-1], end)
        else:
            runs += (start, end)
    return runs


class RowTimes:
    """The row times known final, as the gaps between them that an undecided
    occurrence may still fall in, and the latest of them (the *frontier*): an
    occurrence after it waits for the next row to be noticed."""

    __slots__ = ("frontier", "gaps")

    def __init__(self, frontier: int | None = None, gaps: list[int] | None = None) -> None:
        self.frontier = frontier
        #: ``[after, until, after, until, ...]``: no row in ``(after, until)``, and
        #: ``until - after > GAP_MS``; in order.
        self.gaps: list[int] = [] if gaps is None else list(gaps)

    def see(self, ts: int) -> None:
        """A row at ``ts``, none earlier to come (rows taken one by one, in order)."""
        frontier = self.frontier
        if frontier is None or ts > frontier:
            if frontier is not None and ts - frontier > GAP_MS:
                self.gaps += (frontier, ts)
            self.frontier = ts

    def extend(self, runs: list[int]) -> None:
        """Runs of rows known final, none earlier than the frontier to come."""
        for i in range(0, len(runs), 2):
            self.see(runs[i])
            frontier = self.frontier
            assert frontier is not None
            if runs[i + 1] > frontier:
                self.frontier = runs[i + 1]  # no gap within a run

    def noticed_at(self, ms: int) -> int | None:
        """When an occurrence firing at ``ms`` (at or before the frontier) is noticed,
        if it falls in a gap: the gap's end; None if a row is within :data:`GAP_MS`."""
        gaps = self.gaps
        i = bisect.bisect_right(gaps, ms)  # odd: after a gap's start, before its end
        if i % 2 and gaps[i - 1] < ms:
            return gaps[i]
        return None

    def forget_until(self, ms: int) -> None:
        """Drop the gaps that end at or before ``ms``: every occurrence in them has been
        decided."""
        gaps = self.gaps
        cut = 0
        while cut < len(gaps) and gaps[cut + 1] <= ms:
            cut += 2
        if cut:
            del gaps[:cut]

    def state(self) -> tuple[int | None, list[int]]:
        """What a checkpoint keeps (:class:`RowTimes` takes it back)."""
        return self.frontier, list(self.gaps)
