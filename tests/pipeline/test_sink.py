"""Outcomes delivered in batches through the dispatcher, retried on congestion."""

from __future__ import annotations

import random
import threading

from tickwheel import ProcessingResult
from tickwheel.pipeline.events import Outcome
from tickwheel.pipeline.reference import OutcomeRow
from tickwheel.pipeline.sink import deliver_outcomes


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
    rows = [OutcomeRow(f"op-{i}", Outcome.COMPLETED, i, 1, ("k",), None) for i in range(5_000)]
    processor = Flaky()
    delivery = deliver_outcomes(rows, processor, max_batch_size=100,
                                congestion_retry_delay_ms=5)
    assert delivery.undelivered == 0
    assert sorted(processor.seen) == sorted(r.op_id for r in rows)
    assert delivery.stats.batches["congestion"] > 0 and delivery.stats.replayed > 0
