"""SeenLog: an op partition's seen op ids as numbered segments, whichever store keeps them.

A partition must remember every op id it has seen (with ``--dedupe-retention-ms``, for
as long as the retention says) to quarantine duplicates. Rewritten whole with the
partition's state after every batch, those ids would be most of what a running service
writes. So each batch that sees new ids writes them (its ``(op_id, ts_ms)`` pairs,
encoded by :mod:`~tickwheel.pipeline.state.encoding`) as one segment, stored with the
latest ``ts_ms`` among them and the digest of the log up to it.

With a dedupe retention, a segment whose ids are all past it (its latest ``ts_ms``
before the partition's time less the retention) is removed whole, as Kafka deletes a
log segment: the store holds the ids the retention keeps, plus one batch's worth at the
edge, and no id is written twice. Segments are numbered in time order and removed from
the front, so the stored ones are always the numbers from :attr:`SeenLog.first` to
:attr:`SeenLog.next`. Forgotten ids are not written: a reader takes the ids of the
segments that remain, and the resolver forgets those past the retention before it
judges the next watch; a pending operation whose id is missing from them is past its
retention and still pending, which the resolver restores as such.

Two stores keep the segments: files for the local engine
(:class:`~tickwheel.pipeline.state.seen_files.SeenFiles`) and, in the Spark engine, a
``MapState`` keyed by segment number (``spark/_tasks.py``). Each segment extends a
digest of the log (:func:`~tickwheel.pipeline.state.encoding.chain_digest`): a worker's
older copy whose last segment is still stored with the same digest is caught up with
the segments after it (:meth:`SeenLog.catch_up`), instead of replayed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

from tickwheel.pipeline.state.encoding import chain_digest, decode, encode

__all__ = ["MAX_SEGMENTS", "SeenLog", "SeenSegment", "SeenWrite"]

#: The most segments a store keyed by segment kept before they are merged into one
#: (without a retention, or with one much longer than a trigger, they would otherwise
#: grow by one per batch).
MAX_SEGMENTS = 4096


class SeenSegment(NamedTuple):
    """A segment as stored: its ids as encoded ``(op_id, ts_ms)`` pairs, the digest of
    the log up to it, and the latest ``ts_ms`` among its ids."""

    blob: bytes
    digest: bytes
    latest: int


class SeenWrite(NamedTuple):
    """What a batch changes in the store: ``segment`` to store under ``number`` (None
    if no id is new), and the numbers of the segments to remove (every stored one if
    ``merged``: ``segment`` holds all their ids)."""

    segment: SeenSegment | None
    number: int
    removed: list[int]
    merged: bool


class SeenLog:
    """The ids the segments give (:attr:`ids`: each with the ``ts_ms`` of its first
    watch, in the order first seen), which segments are stored (number: latest
    ``ts_ms``, bytes), the number the next one takes, and the digest of the log up to
    the last one written. With ``merge_at``, that many stored segments are merged into
    one; None suits a store for which many segments cost little (files grouped by time).
    Without ``keeps_ids``, the log gives its ids to the partition it restores
    (:meth:`hand_over_ids`) and keeps its segments only, so that they are not held
    twice; only a log that never merges can (a merge writes the ids kept)."""

    __slots__ = ("_keeps_ids", "_order", "bytes", "digest", "ids", "merge_at", "next",
                 "segments")

    def __init__(self, merge_at: int | None = MAX_SEGMENTS, keeps_ids: bool = True) -> None:
        assert keeps_ids or merge_at is None, "a log that merges keeps its ids"
        self.merge_at = merge_at
        self.ids: dict[str, int] = {}
        # (op_id, ts_ms) in the order seen, to forget from the front in O(1) each; an
        # id seen again has a later pair, and only its latest counts.
        self._order: deque[tuple[str, int]] = deque()
        self._keeps_ids = keeps_ids
        self.segments: dict[int, tuple[int, int]] = {}
        self.next = 0
        self.bytes = 0  # of the segments stored
        self.digest = b""

    @classmethod
    def read(cls, segments: Iterable[tuple[int, SeenSegment]], next_segment: int,
             merge_at: int | None = MAX_SEGMENTS, keeps_ids: bool = True) -> SeenLog:
        """The log of the stored ``(number, segment)`` pairs (in any order); the next
        segment takes the number ``next_segment``."""
        log = cls(merge_at, keeps_ids)
        for number, segment in sorted(segments):
            log._apply(number, segment)
        log.next = next_segment
        return log

    @property
    def first(self) -> int:
        """The number of the first segment stored (:attr:`next` if none is)."""
        return next(iter(self.segments), self.next)

    def hand_over_ids(self) -> dict[str, int]:
        """The ids a log that does not keep them read, given to the partition that
        restores them."""
        assert not self._keeps_ids, "a log that keeps its ids holds on to them"
        ids = self.ids
        self.ids = {}
        return ids

    def catch_up(self, next_segment: int,
                 segment_of: Callable[[int], SeenSegment | None]) -> bool:
        """Bring this older copy up to the stored log of ``next_segment`` segments by
        applying the segments it lacks, provided the store still holds this copy's last
        segment with the same digest (``segment_of(n)``: segment ``n``, or None if none
        is stored). Returns False, changing nothing, otherwise."""
        if self.next > next_segment:
            return False
        if self.next:
            last = segment_of(self.next - 1)
            if last is None or last.digest != self.digest:
                return False
        for number in range(self.next, next_segment):
            segment = segment_of(number)
            if segment is not None:  # else removed since: all its ids are past retention
                self._apply(number, segment)
        self.next = next_segment
        return True

    def record(self, changes: Iterable[tuple[str, int | None]], now: int | None,
               retention: int | None) -> SeenWrite:
        """Apply a batch's changes (``(id, ts_ms)`` seen, ``(id, None)`` forgotten) at
        the partition's time ``now``, and say what to store."""
        keeps = self._keeps_ids
        ids = self.ids
        order = self._order
        new: list[tuple[str, int]] = []
        for op_id, ts in changes:
            if keeps:
                ids.pop(op_id, None)
            if ts is not None:
                if keeps:
                    ids[op_id] = ts
                    order.append((op_id, ts))
                new.append((op_id, ts))
        removed: list[int] = []
        if retention is not None and now is not None:
            horizon = now - retention
            while order and order[0][1] < horizon:
                op_id, ts = order.popleft()
                if ids.get(op_id) == ts:
                    del ids[op_id]
            # Segments are in time order: those past the horizon are a prefix, found
            # without copying the rest (a file store keeps a segment per batch).
            for number, (latest, _) in self.segments.items():
                if latest >= horizon:
                    break
                removed.append(number)
            for number in removed:
                self.bytes -= self.segments.pop(number)[1]
        merged = (self.merge_at is not None and len(self.segments) >= self.merge_at
                  and bool(new))
        if merged:
            new = list(ids.items())
            removed = list(self.segments)
            self.segments.clear()
            self.bytes = 0
        number = self.next
        if not new:
            return SeenWrite(None, number, removed, merged)
        blob = encode(new)
        self.digest = chain_digest(self.digest, blob)
        latest = max(ts for _, ts in new)
        self.segments[number] = (latest, len(blob))
        self.bytes += len(blob)
        self.next += 1
        return SeenWrite(SeenSegment(blob, self.digest, latest), number, removed, merged)

    def _apply(self, number: int, segment: SeenSegment) -> None:
        ids = self.ids
        pairs: list[tuple[str, int]] = decode(segment.blob)
        for op_id, ts in pairs:
            ids.pop(op_id, None)
            ids[op_id] = ts
        if self._keeps_ids:
            self._order.extend(pairs)
        self.segments[number] = (segment.latest, len(segment.blob))
        self.bytes += len(segment.blob)
        self.digest = segment.digest
