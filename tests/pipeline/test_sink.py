"""Outcomes delivered in batches through the dispatcher, retried on congestion."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tickwheel import ProcessingResult
from tickwheel.pipeline.contract.events import OutcomeKind
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.delivery.sink import OutcomeSink, deliver_outcomes


class Flaky:
    def __init__(self) -> None:
        self.rng = random.Random(3)
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        with self.lock:
            if self.rng.random() < 0.2:
                return ProcessingResult.CONGESTION
            self.seen.extend(t.op_id for t in tasks)
        return ProcessingResult.SUCCESS


def test_every_outcome_is_delivered_once_despite_congestion() -> None:
    rows = [OutcomeRow(f"op-{i}", OutcomeKind.COMPLETED, i, 1, ("k",), None) for i in range(5_000)]
    processor = Flaky()
    delivery = deliver_outcomes(rows, processor, max_batch_size=100,
                                congestion_retry_delay_ms=5)
    assert delivery.undelivered == 0
    assert sorted(processor.seen) == sorted(r.op_id for r in rows)
    assert delivery.stats.batches["congestion"] > 0 and delivery.stats.replayed > 0


def test_a_sink_holds_the_engine_back_instead_of_overflowing_the_dispatcher() -> None:
    # Far more outcomes than the dispatcher's buffer, against a processor that pushes
    # back a fifth of the time: the buffer must never overflow (Eureka drops the oldest
    # task when it does), so every outcome arrives.
    rows = [OutcomeRow(f"op-{i}", OutcomeKind.EXPIRED, i, 5, (), None) for i in range(40_000)]
    processor = Flaky()
    with OutcomeSink(processor, max_buffer_size=2_000, max_batch_size=100,
                     congestion_retry_delay_ms=2) as sink:
        sink.deliver(rows[:20_000])
        sink.deliver(rows[20_000:])
    stats = sink.stats()
    assert (stats.queue_overflows, stats.dropped) == (0, 0)
    assert sorted(processor.seen) == sorted(r.op_id for r in rows)
    assert stats.batches["congestion"] > 0


def test_one_op_id_reused_for_a_later_operation_is_delivered_twice() -> None:
    first = OutcomeRow("job", OutcomeKind.EXPIRED, 10, 10, (), None)
    again = OutcomeRow("job", OutcomeKind.EXPIRED, 510, 10, (), None)  # registered at 500
    processor = Flaky()
    processor.rng = random.Random(0)  # no congestion on the first draws
    assert deliver_outcomes([first, again], processor).undelivered == 0
    assert processor.seen == ["job", "job"]


def test_a_buffer_too_small_for_the_batches_in_flight_is_refused() -> None:
    with pytest.raises(ValueError, match="max_buffer_size"):
        OutcomeSink(Flaky(), max_buffer_size=1_000, max_batch_size=250, worker_count=4)


def test_flush_returns_once_every_outcome_handed_over_is_settled() -> None:
    class Slow(Flaky):
        def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
            time.sleep(0.01)
            return super().process_batch(tasks)

    rows = [OutcomeRow(f"op-{i}", OutcomeKind.COMPLETED, i, 1, (), None) for i in range(3_000)]
    processor = Slow()
    with OutcomeSink(processor, max_batch_size=100, congestion_retry_delay_ms=5) as sink:
        sink.deliver(rows)
        assert sink.flush(timeout_s=60)
        # Settled means the processor has them, before close().
        with processor.lock:
            assert sorted(processor.seen) == sorted(r.op_id for r in rows)


def test_outcomes_a_processor_refuses_for_good_are_settled_not_waited_for() -> None:
    class Refusing(Flaky):
        calls = 0

        def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
            self.calls += 1
            if self.calls % 2:
                raise RuntimeError("downstream rejects this batch")
            return ProcessingResult.PERMANENT_ERROR

    rows = [OutcomeRow(f"op-{i}", OutcomeKind.COMPLETED, i, 1, (), None) for i in range(500)]
    with OutcomeSink(Refusing(), max_batch_size=10) as sink:
        sink.deliver(rows)
        assert sink.flush(timeout_s=30)
    # A raise is not a verdict: counted apart, for an engine to deliver those again.
    assert 0 < sink.failed < 500 and sink.stats().dropped == 500
