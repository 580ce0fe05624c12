"""Replicated partitions and the two delayed operations of Kafka's broker.

A leader log per partition, made of segments rolled by size; followers that fetch and
so report their log end offsets (LEO); an in-sync replica set (ISR) that drops
followers lagging longer than ``replica_lag_time_max_ms``; and a high watermark (HW)
that is the smallest LEO over the ISR.

- :class:`DelayedProduce` (acks=-1) waits until every partition's HW reaches the offset
  its records need, or an error (not leader, unknown partition) settles it at once.
- :class:`DelayedFetch` waits until ``min_bytes`` have accumulated across partitions
  (followers read up to the LEO, consumers up to the HW), or one of Kafka's early
  cases applies: leader change, unknown partition, a fetch offset on an older segment,
  or an end offset moved back to an older segment. On expiry it returns what is there.

Which event tries which operation, as in Kafka's ``ReplicaManager``: an append may complete follower
fetches (the LEO moved) and, when it moves the HW, produces and consumer fetches; a
follower fetch may move the HW; a leader change completes everything on the partition.
All of it runs on the clock given (a ``ManualClock`` in tests): ``advance_clock`` runs
expirations and the ISR check in the calling thread.
"""

from __future__ import annotations

import bisect
import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tickwheel._clock import Clock, SystemClock
from tickwheel.broker._listener import BrokerListener, watch_observed
from tickwheel.purgatory import DelayedOperation, Purgatory
from tickwheel.timers import TimingWheelTimer

__all__ = [
    "DelayedFetch",
    "DelayedProduce",
    "Errors",
    "FetchPartitionData",
    "Log",
    "LogOffsetMetadata",
    "Partition",
    "ProducePartitionResponse",
    "ReplicaManager",
]

log = logging.getLogger(__name__)

CONSUMER = -1  # replica id of a fetch that comes from a consumer, not a follower


class Errors(enum.Enum):
    NONE = "NONE"
    REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


@dataclass(frozen=True, slots=True)
class LogOffsetMetadata:
    """An offset with where it sits: the base offset of its segment and its byte
    position in that segment (Kafka keeps both so a fetch can count bytes)."""

    message_offset: int
    segment_base_offset: int
    relative_position: int

    def on_older_segment(self, other: LogOffsetMetadata) -> bool:
        return self.segment_base_offset < other.segment_base_offset

    def position_diff(self, other: LogOffsetMetadata) -> int:
        """Bytes between two offsets of the same segment."""
        return self.relative_position - other.relative_position


class _Segment:
    __slots__ = ("base_offset", "positions", "size")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.positions: list[int] = []  # byte position of each record in the segment
        self.size = 0


class Log:
    """A leader's log: records (only their sizes matter here) in size-rolled segments.

    With ``retention_bytes``, as Kafka's ``retention.bytes``, the oldest segments go
    once the rest hold that many bytes (the active segment always stays): the log
    start offset moves up, and a long-running log takes bounded memory."""

    def __init__(self, segment_bytes: int = 1 << 20, retention_bytes: int | None = None) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        if retention_bytes is not None and retention_bytes < 1:
            raise ValueError(f"retention_bytes must be >= 1, got {retention_bytes}")
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self._segments = [_Segment(0)]
        self._bases = [0]
        # Bytes before each segment: counting bytes from offset 0 (what the event log
        # records for fetches) stays O(log segments) as the log grows.
        self._bytes_before = [0]
        self._size = 0
        self._next_offset = 0

    @property
    def segments(self) -> int:
        return len(self._segments)

    @property
    def log_start_offset(self) -> int:
        return self._bases[0]

    @property
    def log_end_offset(self) -> int:
        return self._next_offset

    @property
    def log_end(self) -> LogOffsetMetadata:
        active = self._segments[-1]
        return LogOffsetMetadata(self._next_offset, active.base_offset, active.size)

    def append(self, sizes: Sequence[int]) -> tuple[int, int]:
        """Append records of the given sizes; return (first offset, last offset)."""
        if not sizes:
            raise ValueError("sizes must name at least one record")
        first = self._next_offset
        for size in sizes:
            if size < 1:
                raise ValueError(f"record sizes must be >= 1 byte, got {size}")
            active = self._segments[-1]
            if active.size and active.size + size > self.segment_bytes:
                active = _Segment(self._next_offset)
                self._segments.append(active)
                self._bases.append(active.base_offset)
                self._bytes_before.append(self._size)
            active.positions.append(active.size)
            active.size += size
            self._size += size
            self._next_offset += 1
        self._apply_retention()
        return first, self._next_offset - 1

    def _apply_retention(self) -> None:
        limit = self.retention_bytes
        if limit is None:
            return
        while len(self._segments) > 1 and self._size - self._bytes_before[1] >= limit:
            del self._segments[0], self._bases[0], self._bytes_before[0]

    def _check_retained(self, offset: int) -> None:
        if 0 < offset < self._bases[0]:
            raise ValueError(f"offset {offset} is below the log start offset {self._bases[0]} "
                             "(deleted by retention)")

    def offset_metadata(self, offset: int) -> LogOffsetMetadata:
        """Where ``offset`` (0 .. log end) sits; offsets past the end sit at the end,
        negative ones at the log start."""
        if offset >= self._next_offset:
            return self.log_end
        self._check_retained(offset)
        offset = max(offset, self._bases[0])
        segment = self._segments[bisect.bisect_right(self._bases, offset) - 1]
        return LogOffsetMetadata(offset, segment.base_offset,
                                 segment.positions[offset - segment.base_offset])

    def bytes_between(self, start: int, end: int) -> int:
        """Bytes of the records in ``[start, end)``, across segments."""
        if end <= start:
            return 0
        return self._position(end) - self._position(start)

    def _position(self, offset: int) -> int:
        """Bytes of the records before ``offset`` (0 .. log end), deleted ones included."""
        if offset >= self._next_offset:
            return self._size
        if offset <= 0:
            return 0
        self._check_retained(offset)
        i = bisect.bisect_right(self._bases, offset) - 1
        segment = self._segments[i]
        return self._bytes_before[i] + segment.positions[offset - segment.base_offset]

    def read(self, start: int, end: int, max_bytes: int) -> tuple[int, int]:
        """Records from ``start`` up to ``end`` within ``max_bytes`` (at least one record,
        as Kafka returns an oversized first record): (record count, bytes)."""
        count = 0
        size = 0
        offset = start
        while offset < end:
            record = self.bytes_between(offset, offset + 1)
            if count and size + record > max_bytes:
                break
            count += 1
            size += record
            offset += 1
        return count, size


class Partition:
    """A partition as its leader sees it: the log, the followers' LEOs, ISR and HW."""

    def __init__(self, name: str, replicas: Sequence[int], leader_id: int, local_id: int,
                 segment_bytes: int, now_ms: int, retention_bytes: int | None = None) -> None:
        if leader_id not in replicas:
            raise ValueError(f"leader {leader_id} is not among the replicas {list(replicas)}")
        self.name = name
        self.replicas = tuple(replicas)
        self.leader_id = leader_id
        self.local_id = local_id
        self.log = Log(segment_bytes, retention_bytes)
        self.isr: set[int] = set(self.replicas)
        self._follower_leo = {r: self.log.offset_metadata(0) for r in self.replicas
                              if r != local_id}
        self._last_caught_up_ms = {r: now_ms for r in self._follower_leo}
        self.high_watermark = self.log.offset_metadata(0)

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_id

    def _leo_metadata(self, replica_id: int) -> LogOffsetMetadata:
        if replica_id == self.local_id:
            return self.log.log_end
        return self._follower_leo[replica_id]

    def maybe_increment_high_watermark(self) -> bool:
        """HW = min LEO over the ISR; True if it moved forward."""
        new_hw = min((self._leo_metadata(r) for r in self.isr),
                     key=lambda m: m.message_offset)
        if new_hw.message_offset > self.high_watermark.message_offset:
            self.high_watermark = new_hw
            return True
        # Same offset, but the log may have rolled: keep the position current.
        if new_hw.message_offset == self.high_watermark.message_offset:
            self.high_watermark = self.log.offset_metadata(new_hw.message_offset)
        return False

    def update_follower(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from ``fetch_offset``: record its LEO, maybe put it back in
        the ISR; True if the HW moved."""
        if replica_id not in self._follower_leo:
            raise ValueError(f"replica {replica_id} is not a follower of {self.name}")
        offset = min(fetch_offset, self.log.log_end_offset)
        self._follower_leo[replica_id] = self.log.offset_metadata(offset)
        if offset >= self.log.log_end_offset:
            self._last_caught_up_ms[replica_id] = now_ms
        if replica_id not in self.isr and offset >= self.high_watermark.message_offset:
            self.isr.add(replica_id)
        return self.maybe_increment_high_watermark()

    def maybe_shrink_isr(self, now_ms: int, lag_max_ms: int) -> bool:
        """Drop followers that have not caught up for ``lag_max_ms``; True if the HW
        moved as a result."""
        lagging = {r for r in self.isr if r != self.local_id
                   and now_ms - self._last_caught_up_ms[r] > lag_max_ms}
        if not lagging:
            return False
        self.isr -= lagging
        log.info("partition %s: ISR shrinks, dropping %s", self.name, sorted(lagging))
        return self.maybe_increment_high_watermark()

    def check_enough_replicas_reach_offset(self, required_offset: int,
                                           min_isr: int) -> tuple[bool, Errors]:
        if not self.is_leader:
            return False, Errors.NOT_LEADER_OR_FOLLOWER
        if self.high_watermark.message_offset >= required_offset:
            if len(self.isr) >= min_isr:
                return True, Errors.NONE
            return True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return False, Errors.NONE


@dataclass(slots=True)
class ProducePartitionResponse:
    error: Errors
    base_offset: int = -1
    required_offset: int = -1
    acks_pending: bool = field(default=False, repr=False)


@dataclass(frozen=True, slots=True)
class FetchPartitionData:
    error: Errors
    high_watermark: int
    records: int
    size_bytes: int


class DelayedProduce(DelayedOperation):
    """acks=-1: done when every partition's HW reaches its required offset, or at
    once on an error. Partitions still pending at the deadline answer
    ``REQUEST_TIMED_OUT``."""

    def __init__(self, delay_ms: int, statuses: dict[str, ProducePartitionResponse],
                 manager: ReplicaManager,
                 callback: Callable[[dict[str, ProducePartitionResponse]], object]) -> None:
        super().__init__(delay_ms)
        for status in statuses.values():
            if status.error is Errors.NONE:
                status.acks_pending = True
                status.error = Errors.REQUEST_TIMED_OUT
        self.statuses = statuses
        self._manager = manager
        self._callback = callback

    def try_complete(self) -> bool:
        for name, status in self.statuses.items():
            if not status.acks_pending:
                continue
            partition = self._manager.partitions.get(name)
            if partition is None:
                enough, error = False, Errors.UNKNOWN_TOPIC_OR_PARTITION
            else:
                enough, error = partition.check_enough_replicas_reach_offset(
                    status.required_offset, self._manager.min_insync_replicas)
            if error is not Errors.NONE or enough:
                status.acks_pending = False
                status.error = error
        if not any(s.acks_pending for s in self.statuses.values()):
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self._callback(self.statuses)


@dataclass(slots=True)
class _FetchStatus:
    start: LogOffsetMetadata
    max_bytes: int


class DelayedFetch(DelayedOperation):
    """Done when ``min_bytes`` are available, or early in Kafka's cases A-C;
    ``on_complete`` reads the logs again and answers with what is there."""

    def __init__(self, delay_ms: int, replica_id: int, statuses: dict[str, _FetchStatus],
                 min_bytes: int, max_bytes: int, manager: ReplicaManager,
                 callback: Callable[[dict[str, FetchPartitionData]], object]) -> None:
        super().__init__(delay_ms)
        self.replica_id = replica_id
        self.statuses = statuses
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self._manager = manager
        self._callback = callback

    @property
    def from_follower(self) -> bool:
        return self.replica_id != CONSUMER

    def try_complete(self) -> bool:
        accumulated = 0
        for name, status in self.statuses.items():
            partition = self._manager.partitions.get(name)
            if partition is None:  # case B: the broker no longer knows the partition
                return self.force_complete()
            if not partition.is_leader:  # case A: no longer the leader
                return self.force_complete()
            end = partition.log.log_end if self.from_follower else partition.high_watermark
            start = status.start
            if end.message_offset == start.message_offset:
                continue
            if end.on_older_segment(start) or start.on_older_segment(end):
                # case C: the end moved back to an older segment (truncation), or the
                # fetch reads an older segment: answer now rather than count bytes.
                return self.force_complete()
            if start.message_offset < end.message_offset:
                accumulated += min(end.position_diff(start), status.max_bytes)
        if accumulated >= self.min_bytes:  # case D
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        offsets = {name: s.start.message_offset for name, s in self.statuses.items()}
        self._callback(self._manager.read(self.replica_id, offsets, self.max_bytes))


class ReplicaManager:
    """One broker's partitions and its produce and fetch purgatories."""

    def __init__(
        self,
        broker_id: int = 0,
        clock: Clock | None = None,
        replica_lag_time_max_ms: int = 30_000,
        min_insync_replicas: int = 1,
        segment_bytes: int = 1 << 20,
        listener: BrokerListener | None = None,
        retention_bytes: int | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.clock = SystemClock() if clock is None else clock
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.min_insync_replicas = min_insync_replicas
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.listener = listener or BrokerListener()
        self.partitions: dict[str, Partition] = {}
        # One timer for both purgatories and the ISR check; `advance_clock` drives it
        # (or `start()` a thread, on a real clock).
        self.timer = TimingWheelTimer(clock=self.clock, executor=None)
        self.produce_purgatory = Purgatory("Produce", timer=self.timer, reaper=False)
        self.fetch_purgatory = Purgatory("Fetch", timer=self.timer, reaper=False)
        self._isr_check = self.timer.schedule_periodic(
            max(1, replica_lag_time_max_ms // 2), self.maybe_shrink_isr)

    # -- partitions ----------------------------------------------------------------------

    def create_partition(self, name: str, replicas: Sequence[int],
                         leader_id: int | None = None) -> Partition:
        partition = Partition(name, replicas, self.broker_id if leader_id is None else leader_id,
                              self.broker_id, self.segment_bytes, self.clock.now_ms(),
                              self.retention_bytes)
        self.partitions[name] = partition
        return partition

    def change_leader(self, name: str, leader_id: int) -> None:
        """Leadership moves; operations waiting on the partition answer at once."""
        self.partitions[name].leader_id = leader_id
        self._complete_delayed_requests(name)

    def delete_partition(self, name: str) -> None:
        del self.partitions[name]
        self._complete_delayed_requests(name)

    def _complete_delayed_requests(self, name: str) -> None:
        self.produce_purgatory.check_and_complete(name)
        self.fetch_purgatory.check_and_complete(name)

    def maybe_shrink_isr(self) -> None:
        now = self.clock.now_ms()
        for name, partition in self.partitions.items():
            if partition.is_leader and partition.maybe_shrink_isr(
                    now, self.replica_lag_time_max_ms):
                self._high_watermark_moved(name, partition)

    def _high_watermark_moved(self, name: str, partition: Partition) -> None:
        self.listener.high_watermark_moved(name, partition.high_watermark.message_offset)
        self.produce_purgatory.check_and_complete(name)
        self.fetch_purgatory.check_and_complete(name)  # consumer fetches read to the HW

    # -- requests ------------------------------------------------------------------------

    def append_records(
        self,
        records: Mapping[str, Sequence[int]],
        acks: int,
        timeout_ms: int,
        callback: Callable[[dict[str, ProducePartitionResponse]], object],
    ) -> DelayedProduce | None:
        """Append record sizes per partition. With ``acks=-1`` answer once every
        partition's HW has passed the records (a DelayedProduce, returned), otherwise
        at once."""
        if acks not in (-1, 0, 1):
            raise ValueError(f"acks must be -1, 0 or 1, got {acks}")
        statuses: dict[str, ProducePartitionResponse] = {}
        for name, sizes in records.items():
            partition = self.partitions.get(name)
            if partition is None:
                statuses[name] = ProducePartitionResponse(Errors.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if not partition.is_leader:
                statuses[name] = ProducePartitionResponse(Errors.NOT_LEADER_OR_FOLLOWER)
                continue
            first, last = partition.log.append(sizes)
            statuses[name] = ProducePartitionResponse(Errors.NONE, first, last + 1)
            self.listener.produce_appended(name, first, last, sum(sizes))
            if partition.maybe_increment_high_watermark():  # e.g. a single-replica ISR
                self._high_watermark_moved(name, partition)
            else:
                self.fetch_purgatory.check_and_complete(name)  # follower fetches: LEO moved
        ok = any(s.error is Errors.NONE for s in statuses.values())
        if acks != -1 or not ok:
            callback(statuses)
            return None
        op = DelayedProduce(timeout_ms, statuses, self, callback)
        self._watch(self.produce_purgatory, op, list(records))
        return op

    def fetch(
        self,
        replica_id: int,
        fetch_offsets: Mapping[str, int],
        min_bytes: int,
        max_bytes: int,
        timeout_ms: int,
        callback: Callable[[dict[str, FetchPartitionData]], object],
    ) -> DelayedFetch | None:
        """A fetch from a follower (``replica_id`` >= 0, reads to the LEO and reports
        its own LEO) or a consumer (``CONSUMER``, reads to the HW). Answers at once if
        ``min_bytes`` are there, on an error, or with ``timeout_ms`` <= 0; otherwise
        returns the DelayedFetch that will answer."""
        if replica_id != CONSUMER:
            now = self.clock.now_ms()
            for name, offset in fetch_offsets.items():
                partition = self.partitions.get(name)
                if partition is None or not partition.is_leader:
                    continue
                self.listener.follower_fetched(name, replica_id, offset)
                if partition.update_follower(replica_id, offset, now):
                    self._high_watermark_moved(name, partition)
        result = self.read(replica_id, fetch_offsets, max_bytes)
        available = sum(r.size_bytes for r in result.values())
        errors = any(r.error is not Errors.NONE for r in result.values())
        if timeout_ms <= 0 or available >= min_bytes or errors or not fetch_offsets:
            callback(result)
            return None
        statuses = {
            name: _FetchStatus(self.partitions[name].log.offset_metadata(offset), max_bytes)
            for name, offset in fetch_offsets.items()
        }
        op = DelayedFetch(timeout_ms, replica_id, statuses, min_bytes, max_bytes, self, callback)
        self._watch(self.fetch_purgatory, op, list(fetch_offsets))
        return op

    def read(self, replica_id: int, fetch_offsets: Mapping[str, int],
             max_bytes: int) -> dict[str, FetchPartitionData]:
        out: dict[str, FetchPartitionData] = {}
        budget = max_bytes
        for name, offset in fetch_offsets.items():
            partition = self.partitions.get(name)
            if partition is None:
                out[name] = FetchPartitionData(Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, 0, 0)
                continue
            hw = partition.high_watermark.message_offset
            if not partition.is_leader:
                out[name] = FetchPartitionData(Errors.NOT_LEADER_OR_FOLLOWER, hw, 0, 0)
                continue
            end = partition.log.log_end_offset if replica_id != CONSUMER else hw
            count, size = partition.log.read(offset, end, max(budget, 0)) if budget > 0 else (
                0, 0)
            budget -= size
            out[name] = FetchPartitionData(Errors.NONE, hw, count, size)
        return out

    def _watch(self, purgatory: Purgatory, op: DelayedOperation, keys: Iterable[str]) -> None:
        watch_observed(purgatory, op, tuple(keys), self.listener)

    # -- time ----------------------------------------------------------------------------

    def advance_clock(self, timeout_ms: int = 0) -> bool:
        """Run expirations and the ISR check due at the clock's time."""
        progressed = self.produce_purgatory.advance_clock(timeout_ms)
        return self.fetch_purgatory.advance_clock(0) or progressed

    def close(self) -> None:
        self.produce_purgatory.close()
        self.fetch_purgatory.close()
        self.timer.close()
