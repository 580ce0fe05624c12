"""SeenSegments: the op ids a partition has seen, kept beside its state as segment files.

A partition must remember every op id it has seen (with ``--dedupe-retention-ms``, for
as long as the retention says) to quarantine duplicates. Rewritten whole with the
partition's state after every batch, those ids would be most of what a running service
writes. So each batch appends the ids it saw first
(:meth:`~tickwheel.pipeline.semantics.resolver.Resolver.take_seen_changes`) to the open segment,
a :class:`~tickwheel.pipeline.state.batch_log.BatchLog` in a directory of the checkpoint. A
segment spans an eighth of the retention in ``ts_ms``; once the latest ``ts_ms`` in it
is past the retention, it is deleted whole, as Kafka deletes a log segment. The files
hold what the retention keeps plus a segment at the edge, and no id is written twice.
(A single log of changes rewritten at twice what it keeps swung between once and twice
that, and wrote every id kept again at each rewrite.)

Forgotten ids are not written: a reader takes the ids of the segments that remain, and
the resolver forgets those past the retention before it judges the next watch; a
pending operation whose id is no longer among them is past its retention and still
pending, which the resolver restores as such (see
:meth:`~tickwheel.pipeline.semantics.resolver.Resolver.restore`). The Spark engine keeps its
segments the same way, in its state store (``spark/_seen_log.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tickwheel.pipeline.state.batch_log import BatchLog

__all__ = ["MIN_SPAN_MS", "SEGMENTS_PER_RETENTION", "SeenSegments"]

#: A segment spans this fraction of the retention, so the files hold at most about
#: 1 + 1/8 of what the retention keeps.
SEGMENTS_PER_RETENTION = 8
#: The shortest span, so that a short retention does not make a file per batch.
MIN_SPAN_MS = 1_000

_NAME = re.compile(r"(\d{10})\.log")


@dataclass(slots=True)
class _Segment:
    log: BatchLog
    earliest: int  # the least and greatest ts_ms of its ids
    latest: int


class SeenSegments:
    """The segments in ``directory`` for a partition with the dedupe retention
    ``retention_ms`` (None: ids are kept forever, in one segment)."""

    def __init__(self, directory: Path, retention_ms: int | None) -> None:
        self.directory = directory
        self.retention_ms = retention_ms
        self.span_ms = (None if retention_ms is None
                        else max(retention_ms // SEGMENTS_PER_RETENTION, MIN_SPAN_MS))
        self._segments: dict[int, _Segment] = {}  # by number, in the order written
        self.next = 0  # the number the next segment takes

    def read(self, committed: int) -> dict[str, int]:
        """The ids the batches up to ``committed`` saw, each with the ``ts_ms`` of its
        first watch, in the order first seen. A segment that holds only later batches'
        ids (written by a batch that never committed, which runs again) is deleted."""
        self._segments.clear()
        self.next = 0
        ids: dict[str, int] = {}
        if not self.directory.exists():
            return ids
        if not self.directory.is_dir():
            raise ValueError(f"{self.directory} is not a directory of seen op ids")
        numbered: list[tuple[int, Path]] = []
        for path in self.directory.iterdir():
            match = _NAME.fullmatch(path.name)
            if match is None or not path.is_file():
                raise ValueError(f"{path} is not a segment of seen op ids")
            numbered.append((int(match[1]), path))
        for number, path in sorted(numbered):
            segment_log = BatchLog(path)
            pairs: list[tuple[str, int]] = [(op_id, ts) for op_id, ts
                                            in segment_log.read(committed)]
            if not pairs:
                path.unlink()
                continue
            for op_id, ts in pairs:
                if not isinstance(op_id, str) or type(ts) is not int:
                    raise ValueError(f"{path} holds {op_id!r}, {ts!r}, not an op id and "
                                     "its ts_ms")
                ids.pop(op_id, None)  # seen again after it was forgotten: moves on
                ids[op_id] = ts
            stamps = [ts for _, ts in pairs]
            self._segments[number] = _Segment(segment_log, min(stamps), max(stamps))
            self.next = number + 1
        return ids

    def append(self, batch_id: int, changes: Iterable[tuple[str, int | None]]) -> None:
        """Write the ids a batch saw first (``(id, ts_ms)``; ``(id, None)``, an id
        forgotten, is left out) to the open segment, or to a new one once the open one
        spans the span."""
        pairs = [(op_id, ts) for op_id, ts in changes if ts is not None]
        if not pairs:
            return
        earliest = min(ts for _, ts in pairs)
        latest = max(ts for _, ts in pairs)
        last = self._segments.get(self.next - 1)
        if last is None or (self.span_ms is not None
                            and latest - min(last.earliest, earliest) >= self.span_ms):
            self.directory.mkdir(parents=True, exist_ok=True)
            last = _Segment(BatchLog(self._path(self.next)), earliest, latest)
            self._segments[self.next] = last
            self.next += 1
        last.log.append(batch_id, pairs)
        last.earliest = min(last.earliest, earliest)
        last.latest = max(last.latest, latest)

    def drop_past(self, now: int | None) -> int:
        """Delete the segments whose ids are all past the retention at the partition's
        time ``now``; call it once the batch that reached ``now`` has committed.
        Returns how many went."""
        horizon = self._horizon(now)
        if horizon is None:
            return 0
        gone = [number for number, segment in self._segments.items()
                if segment.latest < horizon]
        for number in gone:
            self._segments.pop(number).log.path.unlink(missing_ok=True)
        return len(gone)

    def latest(self) -> dict[int, tuple[int, int]]:
        """Each segment's number, with the latest ``ts_ms`` among its ids and the last
        batch that wrote to it: what a state about to be written relies on."""
        return {number: (segment.latest, segment.log.last_batch)
                for number, segment in self._segments.items()}

    def lacking(self, latest: dict[int, tuple[int, int]], now: int | None) -> list[str]:
        """What :meth:`read` did not find of the segments in ``latest`` (as
        :meth:`latest` gave it when a batch committed) that the retention at the
        partition's time ``now`` keeps: a file gone, or cut short of its last batch."""
        horizon = self._horizon(now)
        found: list[str] = []
        for number, (last_ts, last_batch) in latest.items():
            if horizon is not None and last_ts < horizon:
                continue
            segment = self._segments.get(number)
            # read() deletes a segment left with no committed batch: gone, like a file.
            short = (BatchLog(self._path(number)) if segment is None
                     else segment.log).short_of(last_batch)
            if short is not None:
                found.append(short)
        return found

    def _horizon(self, now: int | None) -> int | None:
        """The ``ts_ms`` before which the retention forgets ids at time ``now`` (None:
        it forgets none)."""
        return None if self.retention_ms is None or now is None else now - self.retention_ms

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:010d}.log"

    @property
    def segments(self) -> int:
        """How many segments there are."""
        return len(self._segments)

    def size(self) -> int:
        """The bytes the segments hold on disk."""
        return sum(segment.log.path.stat().st_size for segment in self._segments.values())
