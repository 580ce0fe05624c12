"""An op partition's seen op ids as the Spark engine keeps them: segments in a
``MapState`` keyed by their number, one per batch that saw new ids (its ``(op_id,
ts_ms)`` pairs, encoded by :mod:`~tickwheel.pipeline.state.encoding`), each stored with
the latest ``ts_ms`` among its ids and the digest of the log up to it.

With a dedupe retention, a segment whose ids are all past it (its latest ``ts_ms``
before the partition's time less the retention) is removed whole, as Kafka deletes a
log segment: the state holds the ids the retention keeps, plus one batch's worth at
the edge, and no id is written twice. (A log of changes rewritten at twice what it
keeps swung between once and twice that, and wrote every id kept again at each
rewrite.) Forgotten ids are not written: a reader takes the ids of the segments that
remain, and the resolver forgets those past the retention before it judges the next
watch; a pending operation whose id is no longer among them is past its retention and
still pending, which the resolver restores as such (see
:meth:`~tickwheel.pipeline.semantics.resolver.Resolver.restore_ops`).

Replaying the segments costs what the retention keeps, and a worker replays them
whenever it runs a partition that another worker ran last. So each segment carries the
digest of the segments before it and itself (BLAKE2b, keyed with the previous digest):
a worker's older copy whose last segment is still stored with the same digest is
caught up with the segments after it, instead of replayed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from tickwheel.pipeline.state.encoding import chain_digest, decode, encode

__all__ = ["MAX_SEGMENTS", "SeenLog", "Segment"]

#: The most segments kept before they are merged into one (without a retention, or with
#: one much longer than a trigger, they would otherwise grow by one per batch).
MAX_SEGMENTS = 4096

#: A stored segment: its ids as encoded ``(op_id, ts_ms)`` pairs, the digest of
#: the log up to it, and the latest ``ts_ms`` among its ids.
Segment = tuple[bytes, bytes, int]


class SeenLog:
    """The ids the segments give (:attr:`ids`: each with the ``ts_ms`` of its first
    watch, in the order first seen), which segments are stored (number: latest
    ``ts_ms``, bytes), the number the next one takes, and the digest of the log up to
    the last one written."""

    __slots__ = ("_order", "bytes", "digest", "ids", "next", "segments")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        # (op_id, ts_ms) in the order seen, to forget from the front in O(1) each; an
        # id seen again has a later pair, and only its latest counts.
        self._order: deque[tuple[str, int]] = deque()
        self.segments: dict[int, tuple[int, int]] = {}
        self.next = 0
        self.bytes = 0  # of the segments stored
        self.digest = b""

    @classmethod
    def read(cls, segments: Iterable[tuple[int, Segment]], next_segment: int) -> SeenLog:
        """The log of the stored ``(number, segment)`` pairs (in any order); the next
        segment takes the number ``next_segment``."""
        log = cls()
        for number, segment in sorted(segments):
            log._apply(number, segment)
        log.next = next_segment
        return log

    def catch_up(self, next_segment: int,
                 segment_of: Callable[[int], Segment | None]) -> bool:
        """Take the segments written since this older copy of the log was, if its last
        segment is still stored as it has it (``segment_of(n)``: segment ``n``, or None
        if none is stored). False, and the copy left as it was, if not."""
        if self.next > next_segment:
            return False
        if self.next:
            last = segment_of(self.next - 1)
            if last is None or last[1] != self.digest:
                return False
        for number in range(self.next, next_segment):
            segment = segment_of(number)
            if segment is not None:  # else removed since: all its ids are past retention
                self._apply(number, segment)
        self.next = next_segment
        return True

    def record(self, changes: Iterable[tuple[str, int | None]], now: int | None,
               retention: int | None) -> tuple[Segment | None, list[int], bool]:
        """Apply a batch's changes (``(id, ts_ms)`` seen, ``(id, None)`` forgotten) at
        the partition's time ``now``. Returns the segment to store under the number
        :attr:`next` had (None if no id is new), the numbers of the segments to remove,
        and True if every stored segment goes (they were merged into the new one)."""
        ids = self.ids
        order = self._order
        new: list[tuple[str, int]] = []
        for op_id, ts in changes:
            ids.pop(op_id, None)
            if ts is not None:
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
            for number, (latest, size) in list(self.segments.items()):
                if latest >= horizon:
                    break  # segments are in time order: the rest are later
                del self.segments[number]
                self.bytes -= size
                removed.append(number)
        merge = len(self.segments) >= MAX_SEGMENTS and bool(new)
        if merge:
            new = list(ids.items())
            removed = list(self.segments)
            self.segments.clear()
            self.bytes = 0
        if not new:
            return None, removed, merge
        blob = encode(new)
        self.digest = chain_digest(self.digest, blob)
        latest = max(ts for _, ts in new)
        self.segments[self.next] = (latest, len(blob))
        self.bytes += len(blob)
        self.next += 1
        return (blob, self.digest, latest), removed, merge

    def _apply(self, number: int, segment: Segment) -> None:
        blob, digest, latest = segment
        ids = self.ids
        order = self._order
        pairs: list[tuple[str, int]] = decode(blob)
        for op_id, ts in pairs:
            ids.pop(op_id, None)
            ids[op_id] = ts
            order.append((op_id, ts))
        self.segments[number] = (latest, len(blob))
        self.bytes += len(blob)
        self.digest = digest
