"""One collector exports every component's counters; a scrape reads them."""

from __future__ import annotations

import prometheus_client
import pytest

from tests.conftest import eventually
from tickwheel import (
    DelayedOperation,
    ManualClock,
    ProcessingResult,
    Purgatory,
    TimingWheelTimer,
    create_batching_dispatcher,
)
from tickwheel.metrics import TickwheelCollector


class Never(DelayedOperation):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass


class Ok:
    def process(self, task: object) -> ProcessingResult:
        return ProcessingResult.SUCCESS

    def process_batch(self, tasks: list[object]) -> ProcessingResult:
        return ProcessingResult.SUCCESS


def test_a_scrape_reads_timers_purgatories_and_dispatchers() -> None:
    clock = ManualClock(0)
    timer = TimingWheelTimer(clock=clock, executor=None)
    timer.schedule(5, lambda: None)
    timer.schedule(50, lambda: None).cancel()
    timer.schedule(10_000, lambda: None)
    clock.advance(7)  # the first one runs 2 ms late
    timer.advance_clock(0)
    purgatory = Purgatory("produce", timer=TimingWheelTimer(clock=clock, executor=None),
                          reaper=False)
    purgatory.try_complete_else_watch(Never(3), ["k1", "k2"])
    dispatcher = create_batching_dispatcher("notify", Ok(), max_batch_size=2,
                                            max_batching_delay_ms=0)
    dispatcher.process("a", "a", 2**62)
    dispatcher.process("a", "a2", 2**62)
    eventually(lambda: dispatcher.stats().tasks["success"] >= 1, 10)

    registry = prometheus_client.CollectorRegistry()
    registry.register(TickwheelCollector().add_timer("requests", timer)
                      .add_purgatory(purgatory).add_dispatcher(dispatcher))
    value = registry.get_sample_value
    t = {"timer": "requests"}
    assert value("tickwheel_timer_pending", t) == 1
    assert value("tickwheel_timer_scheduled_total", t) == 3
    assert value("tickwheel_timer_expired_total", t) == 1
    assert value("tickwheel_timer_cancelled_total", t) == 1
    assert value("tickwheel_timer_lateness_ms_bucket", {**t, "le": "1"}) == 0
    assert value("tickwheel_timer_lateness_ms_bucket", {**t, "le": "2"}) == 1
    assert value("tickwheel_timer_lateness_ms_sum", t) == 2
    p = {"purgatory": "produce"}
    assert (value("tickwheel_purgatory_watched", p), value("tickwheel_purgatory_keys", p),
            value("tickwheel_purgatory_delayed", p)) == (2, 2, 1)
    clock.advance(3)
    purgatory.advance_clock(0)
    assert value("tickwheel_purgatory_expired_total", p) == 1
    assert value("tickwheel_purgatory_watched", p) == 0  # read afresh at every scrape
    d = {"dispatcher": "notify"}
    assert value("tickwheel_dispatcher_accepted_total", d) == 2
    assert value("tickwheel_dispatcher_tasks_total", {**d, "result": "success"}) >= 1
    text = prometheus_client.generate_latest(registry).decode()
    assert "# TYPE tickwheel_dispatcher_batch_size histogram" in text
    dispatcher.close()


def test_a_pipeline_run_is_exported() -> None:
    from tickwheel.pipeline.engines.reference import ReferenceEngine

    engine = ReferenceEngine()
    engine.feed_lines([
        '{"ts_ms": 1, "type": "watch", "op_id": "a", "keys": ["k"], "deadline_ms": 9,'
        ' "condition": "any_update"}',
        '{"ts_ms": 2, "type": "update", "key": "k", "value": 1}',
        "not json",
    ])
    registry = prometheus_client.CollectorRegistry()
    registry.register(TickwheelCollector().add_pipeline_run("local", engine.run()))
    value = registry.get_sample_value
    assert value("tickwheel_pipeline_rows_in_total", {"pipeline": "local"}) == 3
    assert value("tickwheel_pipeline_quarantined_total",
                 {"pipeline": "local", "reason": "unparseable"}) == 1
    assert value("tickwheel_pipeline_outcomes_total",
                 {"pipeline": "local", "outcome": "completed"}) == 1


def test_a_spark_run_is_exported_from_its_partitions_counters() -> None:
    from tickwheel.pipeline.semantics.partition import PartitionStatus
    from tickwheel.pipeline.spark import SparkRunResult

    partitions = [
        PartitionStatus("key", 0, 3, 100, 99, 10, 7, 2, 1, 4, 0, {"late": 1, "unparseable": 1},
                        {}, state_bytes=700),
        PartitionStatus("op", 0, 3, 100, 98, 5, 4, 1, 0, 2, 1, {"late": 1},
                        {"completed": 3, "expired": 3}, state_bytes=5_000)]
    result = SparkRunResult(rows_in=15, rows_applied=11, quarantined=3, held=1, pending=6,
                            ignored_cancels=1, release_ms=100, batches=3, seconds=1.0,
                            partitions=partitions, files_skipped=2)
    registry = prometheus_client.CollectorRegistry()
    registry.register(TickwheelCollector().add_pipeline_run("spark", result))
    value = registry.get_sample_value
    assert value("tickwheel_pipeline_rows_in_total", {"pipeline": "spark"}) == 15
    assert value("tickwheel_pipeline_held", {"pipeline": "spark"}) == 1
    assert value("tickwheel_pipeline_state_bytes", {"pipeline": "spark"}) == 5_700
    assert value("tickwheel_pipeline_files_skipped", {"pipeline": "spark"}) == 2
    assert value("tickwheel_pipeline_quarantined_total",
                 {"pipeline": "spark", "reason": "late"}) == 2
    assert value("tickwheel_pipeline_outcomes_total",
                 {"pipeline": "spark", "outcome": "expired"}) == 3


def test_an_event_loops_wheel_is_exported() -> None:
    import asyncio

    import tickwheel.aio

    loop = tickwheel.aio.new_event_loop()
    try:
        now = [100.0]
        loop.time = lambda: now[0]  # type: ignore[method-assign]
        loop.call_later(0.25, lambda: None)  # due at 100.25 s: exact in binary
        loop.call_later(60, lambda: None).cancel()
        loop.call_later(60, lambda: None)
        now[0] = 100.5  # the first runs 250 ms past its millisecond
        loop.run_until_complete(asyncio.sleep(0))
        registry = prometheus_client.CollectorRegistry()
        registry.register(TickwheelCollector().add_event_loop("api", loop))
        value = registry.get_sample_value
        labels = {"loop": "api"}
        assert value("tickwheel_aio_pending", labels) == 1
        assert value("tickwheel_aio_scheduled_total", labels) == 3
        assert value("tickwheel_aio_expired_total", labels) == 1
        assert value("tickwheel_aio_cancelled_total", labels) == 1
        assert value("tickwheel_aio_fires_total", labels) >= 1
        assert value("tickwheel_aio_lateness_ms_sum", labels) == 250
    finally:
        loop.close()


def test_two_components_are_never_exported_under_one_name() -> None:
    clock = ManualClock(0)

    def heartbeat() -> Purgatory:
        return Purgatory("Heartbeat", timer=TimingWheelTimer(clock=clock, executor=None),
                         reaper=False)

    first, second = heartbeat(), heartbeat()
    second.try_complete_else_watch(Never(100), ["member"])
    collector = TickwheelCollector().add_purgatory(first).add_purgatory(first)  # same one
    with pytest.raises(ValueError, match="a purgatory named 'Heartbeat' is already exported"):
        collector.add_purgatory(second)
    collector.add_purgatory(second, name="Heartbeat-2")
    timer = TimingWheelTimer(clock=clock, executor=None)
    collector.add_timer("requests", timer)
    with pytest.raises(ValueError, match="a timer named 'requests'"):
        collector.add_timer("requests", TimingWheelTimer(clock=clock, executor=None))
    with pytest.raises(ValueError, match="non-empty str"):
        collector.add_timer("", timer)
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    value = registry.get_sample_value
    assert value("tickwheel_purgatory_delayed", {"purgatory": "Heartbeat"}) == 0
    assert value("tickwheel_purgatory_delayed", {"purgatory": "Heartbeat-2"}) == 1


def test_a_webhook_and_a_submit_api_are_exported() -> None:
    from dataclasses import dataclass

    from tickwheel._histogram import Histogram
    from tickwheel.service.server import IntakeStats

    @dataclass
    class Delivered:
        delivered: int = 7
        congested: int = 2
        transient: int = 1
        dead_letters: int = 3
        failed: int = 8
        retried: int = 5
        lag_ms: int | None = 250

    acks, waits, lands = Histogram(), Histogram(), Histogram()
    acks.record_many([3, 14, 40])
    waits.record_many([1, 9, 9])
    lands.record(4)
    taken = IntakeStats(requests=5, accepted_rows=40, commits=2, replayed=1, refused_bad=1,
                        refused_busy=0, refused_too_large=0, refused_unauthorized=0,
                        backlog_rows=12, keys=4,
                        retired_files=7, unretired_files=2, writing_requests=0,
                        connections=9, refused_connections=11, timed_out_connections=13,
                        floor_lag_ms=0, ack_ms=acks.snapshot(),
                        commit_wait_ms=waits.snapshot(), land_ms=lands.snapshot())

    class Source:
        def __init__(self, stats: object) -> None:
            self._stats = stats

        def stats(self) -> object:
            return self._stats

    registry = prometheus_client.CollectorRegistry()
    registry.register(TickwheelCollector().add_webhook("hook", Source(Delivered()))
                      .add_intake("api", Source(taken)))
    value = registry.get_sample_value
    assert value("tickwheel_webhook_dead_letters_total", {"target": "hook"}) == 3
    assert value("tickwheel_webhook_retried_total", {"target": "hook"}) == 5
    assert value("tickwheel_webhook_failed_total", {"target": "hook"}) == 8
    assert value("tickwheel_webhook_lag_ms", {"target": "hook"}) == 250
    assert value("tickwheel_intake_accepted_rows_total", {"intake": "api"}) == 40
    assert value("tickwheel_intake_backlog_rows", {"intake": "api"}) == 12
    assert value("tickwheel_intake_retired_files_total", {"intake": "api"}) == 7
    assert value("tickwheel_intake_unretired_files", {"intake": "api"}) == 2
    assert value("tickwheel_intake_connections", {"intake": "api"}) == 9
    assert value("tickwheel_intake_refused_connections_total", {"intake": "api"}) == 11
    assert value("tickwheel_intake_timed_out_connections_total", {"intake": "api"}) == 13
    assert value("tickwheel_intake_ack_ms_count", {"intake": "api"}) == 3
    assert value("tickwheel_intake_ack_ms_bucket", {"intake": "api", "le": "20"}) == 2
    assert value("tickwheel_intake_commit_wait_ms_sum", {"intake": "api"}) == 19
    assert value("tickwheel_intake_land_ms_bucket", {"intake": "api", "le": "2"}) == 0
    assert value("tickwheel_intake_land_ms_bucket", {"intake": "api", "le": "5"}) == 1
