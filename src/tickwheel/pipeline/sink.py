"""Deliver resolved operations to a user's processor through the batching dispatcher.

Each outcome is a task whose id is its ``op_id``: a redelivery (after a restart, or a
retry after congestion) replaces the pending copy instead of doubling it, so the
processor sees each operation at most once per delivery run, and a processor that
stores outcomes by ``op_id`` makes redelivery after a restart harmless.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from tickwheel._clock import Clock
from tickwheel.dispatch import (
    DispatcherOverloaded,
    DispatcherStats,
    TaskProcessor,
    create_batching_dispatcher,
)
from tickwheel.pipeline.reference import OutcomeRow

__all__ = ["Delivery", "deliver_outcomes"]

_NEVER = 2**62


@dataclass(frozen=True)
class Delivery:
    stats: DispatcherStats
    undelivered: int  # still pending when the timeout ran out (reported, not lost)


def deliver_outcomes(
    outcomes: Iterable[OutcomeRow],
    processor: TaskProcessor[OutcomeRow],
    *,
    name: str = "outcomes",
    max_batch_size: int = 250,
    worker_count: int = 4,
    max_batching_delay_ms: int = 50,
    congestion_retry_delay_ms: int = 1_000,
    timeout_s: float = 60.0,
    clock: Clock | None = None,
) -> Delivery:
    """Hand every outcome to ``processor.process_batch`` in batches, retrying after
    congestion or transient errors; wait up to ``timeout_s`` for the last of them."""
    dispatcher = create_batching_dispatcher(
        name, processor, max_buffer_size=max(10_000, max_batch_size),
        max_batch_size=max_batch_size, worker_count=worker_count,
        max_batching_delay_ms=max_batching_delay_ms,
        congestion_retry_delay_ms=congestion_retry_delay_ms, clock=clock)
    try:
        for outcome in outcomes:
            while True:
                try:
                    dispatcher.process(outcome.op_id, outcome, _NEVER)
                    break
                except DispatcherOverloaded:
                    time.sleep(0.001)  # the acceptor is behind: let it catch up
    finally:
        undelivered = dispatcher.close(timeout_s)
    return Delivery(dispatcher.stats(), undelivered)
