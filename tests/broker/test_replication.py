"""acks=-1 produce and min-bytes fetch on replicated partitions (seed 002)."""

from __future__ import annotations

import random

import pytest

from tickwheel import ManualClock, Outcome
from tickwheel.broker import BrokerListener
from tickwheel.broker.replication import (
    CONSUMER,
    Errors,
    FetchPartitionData,
    Log,
    ProducePartitionResponse,
    ReplicaManager,
)


class Recorder(BrokerListener):
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def high_watermark_moved(self, partition: str, high_watermark: int) -> None:
        self.events.append(("hw", partition, high_watermark))

    def operation_resolved(self, op: object, outcome: Outcome) -> None:
        self.events.append(("resolved", type(op).__name__, outcome))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0)


@pytest.fixture
def broker(clock: ManualClock) -> ReplicaManager:
    rm = ReplicaManager(broker_id=0, clock=clock, replica_lag_time_max_ms=10_000,
                        segment_bytes=1_000, listener=Recorder())
    rm.create_partition("t-0", replicas=[0, 1, 2])
    rm.create_partition("t-1", replicas=[0, 1, 2])
    return rm


def produce(rm: ReplicaManager, records: dict[str, list[int]], timeout_ms: int = 30_000,
            acks: int = -1) -> list[dict[str, ProducePartitionResponse]]:
    out: list[dict[str, ProducePartitionResponse]] = []
    rm.append_records(records, acks, timeout_ms, out.append)
    return out


def follower_fetch(rm: ReplicaManager, replica: int, offsets: dict[str, int]) -> None:
    rm.fetch(replica, offsets, min_bytes=1, max_bytes=1 << 20, timeout_ms=0,
             callback=lambda _: None)


# -- the log ---------------------------------------------------------------------------


def test_log_rolls_segments_by_size_and_tracks_positions() -> None:
    log = Log(segment_bytes=100)
    assert log.append([40, 40]) == (0, 1)
    assert log.append([40]) == (2, 2)  # 120 > 100: a new segment starting at offset 2
    assert log.segments == 2
    assert log.offset_metadata(1).relative_position == 40
    assert log.offset_metadata(2).segment_base_offset == 2
    assert log.log_end.relative_position == 40
    assert log.bytes_between(0, 3) == 120
    assert log.read(0, 3, max_bytes=90) == (2, 80)
    assert log.read(0, 3, max_bytes=10) == (1, 40)  # an oversized first record still goes


def test_bytes_between_any_two_offsets_is_the_sum_of_their_records() -> None:
    rng = random.Random(5)
    log = Log(segment_bytes=300)
    sizes: list[int] = []
    for _ in range(60):
        batch = [rng.randint(1, 120) for _ in range(rng.randint(1, 4))]
        log.append(batch)
        sizes.extend(batch)
    assert log.segments > 10
    for _ in range(500):
        start, end = sorted(rng.randint(0, len(sizes)) for _ in range(2))
        assert log.bytes_between(start, end) == sum(sizes[start:end])
    assert log.bytes_between(5, 5) == log.bytes_between(9, 4) == 0


def test_retention_deletes_the_oldest_segments_and_keeps_positions_from_offset_zero() -> None:
    log = Log(segment_bytes=100, retention_bytes=250)
    sizes = [60] * 40  # one record in each segment after the first's
    for size in sizes:
        log.append([size])
    assert log.segments == 5  # the active segment, and four more hold the bound (250 B)
    assert log.log_start_offset == 35
    assert log.bytes_between(0, 40) == sum(sizes)  # counted from offset 0 all the same
    assert log.bytes_between(36, 38) == 120
    assert log.offset_metadata(-5).message_offset == 35  # before the start: the start
    with pytest.raises(ValueError, match="log start offset 35"):
        log.bytes_between(3, 38)
    with pytest.raises(ValueError, match="retention"):
        log.offset_metadata(20)
    with pytest.raises(ValueError, match="retention_bytes"):
        Log(retention_bytes=0)


def test_without_retention_a_log_keeps_every_segment() -> None:
    log = Log(segment_bytes=100)
    for _ in range(40):
        log.append([60])
    assert (log.segments, log.log_start_offset) == (40, 0)


# -- produce, acks=-1 ------------------------------------------------------------------


def test_acks_all_waits_for_every_in_sync_replica(broker: ReplicaManager) -> None:
    out = produce(broker, {"t-0": [100, 100]})
    assert out == []
    follower_fetch(broker, 1, {"t-0": 2})
    assert out == []  # replica 2 still at offset 0: HW = 0
    follower_fetch(broker, 2, {"t-0": 1})
    assert out == [] and broker.partitions["t-0"].high_watermark.message_offset == 1
    follower_fetch(broker, 2, {"t-0": 2})
    assert len(out) == 1
    response = out[0]["t-0"]
    assert (response.error, response.base_offset, response.required_offset) == (
        Errors.NONE, 0, 2)
    assert broker.produce_purgatory.watched == 0 and broker.timer.size == 1  # ISR check


def test_acks_1_answers_at_once(broker: ReplicaManager) -> None:
    out = produce(broker, {"t-0": [10]}, acks=1)
    assert len(out) == 1 and out[0]["t-0"].error is Errors.NONE


def test_a_multi_partition_produce_waits_for_all_partitions(broker: ReplicaManager) -> None:
    out = produce(broker, {"t-0": [10], "t-1": [10]})
    for r in (1, 2):
        follower_fetch(broker, r, {"t-0": 1})
    assert out == []
    for r in (1, 2):
        follower_fetch(broker, r, {"t-1": 1})
    assert [s.error for s in out[0].values()] == [Errors.NONE, Errors.NONE]


def test_a_slow_follower_leaves_the_isr_and_the_produce_completes(
        broker: ReplicaManager, clock: ManualClock) -> None:
    out = produce(broker, {"t-0": [10]}, timeout_ms=60_000)
    follower_fetch(broker, 1, {"t-0": 1})
    for _ in range(10):  # replica 2 never fetches
        clock.advance(1_000)
        broker.advance_clock(0)
        follower_fetch(broker, 1, {"t-0": 1})
    assert out == []
    clock.advance(6_000)  # past replica_lag_time_max_ms: the ISR check drops replica 2
    broker.advance_clock(0)
    assert broker.partitions["t-0"].isr == {0, 1}
    assert out and out[0]["t-0"].error is Errors.NONE
    # It catches up and rejoins the ISR.
    follower_fetch(broker, 2, {"t-0": 1})
    assert broker.partitions["t-0"].isr == {0, 1, 2}


def test_a_produce_nobody_replicates_times_out(broker: ReplicaManager,
                                               clock: ManualClock) -> None:
    out = produce(broker, {"t-0": [10]}, timeout_ms=500)
    clock.advance(500)
    broker.advance_clock(0)
    assert out[0]["t-0"].error is Errors.REQUEST_TIMED_OUT
    assert ("resolved", "DelayedProduce", Outcome.EXPIRED) in broker.listener.events  # type: ignore[attr-defined]


def test_leader_change_answers_a_waiting_produce_at_once(broker: ReplicaManager) -> None:
    out = produce(broker, {"t-0": [10]})
    broker.change_leader("t-0", 1)
    assert out[0]["t-0"].error is Errors.NOT_LEADER_OR_FOLLOWER
    assert broker.produce_purgatory.num_keys == 0


def test_unknown_partition_and_not_leader_fail_in_the_request(broker: ReplicaManager) -> None:
    broker.change_leader("t-1", 2)
    out = produce(broker, {"nope-0": [10], "t-1": [10]})
    assert out[0]["nope-0"].error is Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert out[0]["t-1"].error is Errors.NOT_LEADER_OR_FOLLOWER


def test_a_partition_deleted_while_waiting(broker: ReplicaManager) -> None:
    out = produce(broker, {"t-0": [10], "t-1": [10]})
    for r in (1, 2):
        follower_fetch(broker, r, {"t-1": 1})
    broker.delete_partition("t-0")
    assert out[0]["t-0"].error is Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert out[0]["t-1"].error is Errors.NONE


# -- fetch, min bytes ------------------------------------------------------------------


def fetch(rm: ReplicaManager, replica: int, offsets: dict[str, int], min_bytes: int,
          timeout_ms: int = 10_000) -> list[dict[str, FetchPartitionData]]:
    out: list[dict[str, FetchPartitionData]] = []
    rm.fetch(replica, offsets, min_bytes, 1 << 20, timeout_ms, out.append)
    return out


def test_a_follower_fetch_waits_for_min_bytes_read_to_the_log_end(
        broker: ReplicaManager) -> None:
    out = fetch(broker, 1, {"t-0": 0}, min_bytes=100)
    assert out == []
    produce(broker, {"t-0": [60]}, acks=1)
    assert out == []
    produce(broker, {"t-0": [50]}, acks=1)  # 110 bytes past the fetch offset
    assert out and out[0]["t-0"].size_bytes == 110 and out[0]["t-0"].records == 2


def test_a_consumer_fetch_reads_to_the_high_watermark_across_two_partitions(
        broker: ReplicaManager) -> None:
    produce(broker, {"t-0": [60], "t-1": [60]}, acks=1)
    out = fetch(broker, CONSUMER, {"t-0": 0, "t-1": 0}, min_bytes=100)
    assert out == []  # 120 bytes appended, but the HW has not moved
    for r in (1, 2):
        follower_fetch(broker, r, {"t-0": 1})
    assert out == []  # 60 bytes below the HW: not enough
    for r in (1, 2):
        follower_fetch(broker, r, {"t-1": 1})
    assert out and sum(p.size_bytes for p in out[0].values()) == 120


def test_a_fetch_on_an_older_segment_completes_at_once(broker: ReplicaManager) -> None:
    produce(broker, {"t-0": [400, 400]}, acks=1)
    out = fetch(broker, 1, {"t-0": 2}, min_bytes=10_000)
    assert out == []
    produce(broker, {"t-0": [400]}, acks=1)  # rolls: the log end is on a newer segment
    assert out, "the fetch offset is now on an older segment: answer at once"
    assert out[0]["t-0"].size_bytes == 400


def test_a_fetch_expires_and_returns_what_is_there(broker: ReplicaManager,
                                                   clock: ManualClock) -> None:
    out = fetch(broker, 1, {"t-0": 0}, min_bytes=10_000, timeout_ms=500)
    produce(broker, {"t-0": [30]}, acks=1)
    assert out == []
    clock.advance(500)
    broker.advance_clock(0)
    assert out and out[0]["t-0"].size_bytes == 30


def test_leader_change_and_unknown_partition_complete_a_fetch(broker: ReplicaManager) -> None:
    a = fetch(broker, CONSUMER, {"t-0": 0}, min_bytes=100)
    b = fetch(broker, CONSUMER, {"t-1": 0}, min_bytes=100)
    broker.change_leader("t-0", 2)
    assert a and a[0]["t-0"].error is Errors.NOT_LEADER_OR_FOLLOWER
    broker.delete_partition("t-1")
    assert b and b[0]["t-1"].error is Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert broker.fetch_purgatory.watched == 0
