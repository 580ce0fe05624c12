"""Micro-batch outcomes delivered off the query's thread, at least once, with a mark of
the last batch settled (what the Spark engine does with a sink)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import eventually
from tests.pipeline.test_sink import Flaky
from tickwheel import ProcessingResult
from tickwheel.pipeline.contract.events import OutcomeKind
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.delivery.batch_delivery import BatchDelivery, DeliveryLag
from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.pipeline.io.outputs import outcome_rows


def batch(batch_id: int, size: int = 40) -> pa.Table:
    """Outcomes named after their batch, in the contract's columns."""
    ids = [f"b{batch_id}-op{i}" for i in range(size)]
    return pa.table({
        "op_id": ids,
        "outcome": ["error" if i % 7 == 0 else "completed" for i in range(size)],
        "resolved_ms": [1_000 * batch_id + i for i in range(size)],
        "latency_ms": [5] * size,
        "keys": [["k1", "k2"] if i % 2 else [] for i in range(size)],
        "error": ["NOT_LEADER" if i % 7 == 0 else None for i in range(size)],
    })


def files(directory: Path, batch_ids: range) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for b in batch_ids:
        pq.write_table(batch(b), directory / f"batch-{b:09d}.parquet")


def seen_batches(processor: Flaky) -> set[str]:
    return {op_id.split("-")[0] for op_id in processor.seen}


def sink_for(processor: Flaky) -> OutcomeSink:
    return OutcomeSink(processor, max_batch_size=16, max_buffer_size=1_000,
                       congestion_retry_delay_ms=2)


def run_one_batch(tmp_path: Path, batch_id: int) -> tuple[Flaky, BatchDelivery]:
    """A run on ``tmp_path``'s outcomes and mark that submits one new batch."""
    processor = Flaky()
    with sink_for(processor) as sink:
        delivery = BatchDelivery(sink, tmp_path / "outcomes", tmp_path / "delivered")
        delivery.submit(batch_id, batch(batch_id))
        delivery.close()
    return processor, delivery


def test_outcome_rows_read_the_contract_columns() -> None:
    rows = outcome_rows(batch(3, size=8))
    assert rows[0] == OutcomeRow("b3-op0", OutcomeKind.ERROR, 3_000, 5, (), "NOT_LEADER")
    assert rows[1] == OutcomeRow("b3-op1", OutcomeKind.COMPLETED, 3_001, 5, ("k1", "k2"), None)
    assert len(rows) == 8


def test_each_batch_is_settled_and_marked(tmp_path: Path) -> None:
    processor = Flaky()
    with sink_for(processor) as sink:
        delivery = BatchDelivery(sink, tmp_path / "outcomes", tmp_path / "delivered")
        assert delivery.last_settled() == -1
        for b in range(4):
            files(tmp_path / "outcomes", range(b, b + 1))
            delivery.submit(b, batch(b))
        delivery.close()
        assert sorted(processor.seen) == sorted(f"b{b}-op{i}" for b in range(4)
                                                for i in range(40))
    assert delivery.last_settled() == 3 and delivery.delivered_batches == 4
    assert sink.stats().batches["congestion"] > 0  # retried, still all there


def test_a_run_first_delivers_the_batches_after_the_mark(tmp_path: Path) -> None:
    # The last run stopped (a crash, say) after batches 0-3 were written and committed
    # but only 0 and 1 were settled: 2 and 3 come first, then the new batch.
    files(tmp_path / "outcomes", range(4))
    (tmp_path / "outcomes" / "batch-000000009.parquet.crc").write_text("not a batch")
    (tmp_path / "delivered").write_text("1")
    processor, delivery = run_one_batch(tmp_path, 4)
    assert seen_batches(processor) == {"b2", "b3", "b4"}
    assert len(processor.seen) == 3 * 40
    assert (delivery.caught_up_batches, delivery.last_settled()) == (2, 4)


def test_a_batch_written_a_file_per_partition_is_delivered_whole_before_its_mark(
        tmp_path: Path) -> None:
    def write(directory: Path, b: int) -> list[Path]:
        directory.mkdir(exist_ok=True)
        table = batch(b)
        for p, start in enumerate((0, 15, 30)):
            pq.write_table(table.slice(start, 15), directory / f"batch-{b:09d}-{p:05d}.parquet")
        return sorted(directory.glob(f"batch-{b:09d}-*.parquet"))

    outcomes = tmp_path / "outcomes"
    for b in (2, 3):  # 2 was settled before the last run stopped, 3 was not
        write(outcomes, b)
    (tmp_path / "delivered").write_text("2")
    processor = Flaky()
    with sink_for(processor) as sink:
        delivery = BatchDelivery(sink, outcomes, tmp_path / "delivered")
        delivery.submit(4, write(tmp_path / "new", 4))
        delivery.close()
    assert sorted(processor.seen) == sorted(f"b{b}-op{i}" for b in (3, 4) for i in range(40))
    assert (delivery.caught_up_batches, delivery.last_settled()) == (1, 4)


def test_a_batch_run_again_is_delivered_again_without_moving_the_mark_back(
        tmp_path: Path) -> None:
    (tmp_path / "delivered").write_text("5")
    processor, delivery = run_one_batch(tmp_path, 4)
    assert seen_batches(processor) == {"b4"}
    assert delivery.last_settled() == 5


def test_the_engine_never_waits_for_delivery_and_later_batches_are_read_back(
        tmp_path: Path) -> None:
    gate, entered = threading.Event(), threading.Event()

    class Gated(Flaky):
        def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
            entered.set()
            gate.wait(30)
            return super().process_batch(tasks)

    outcomes = tmp_path / "outcomes"
    processor = Gated()
    with sink_for(processor) as sink:
        delivery = BatchDelivery(sink, outcomes, tmp_path / "delivered", max_behind=1)
        files(outcomes, range(1))  # written before it is handed over, as engines do
        delivery.submit(0, batch(0))  # taken by the thread, stuck in the processor
        assert entered.wait(30)
        started = time.monotonic()
        for b in range(1, 10):  # 1 waits in memory; 2-9 are left in their files
            files(outcomes, range(b, b + 1))
            delivery.submit(b, batch(b))
        assert time.monotonic() - started < 5  # none of them waited for the processor
        lag = delivery.lag()
        assert (lag.batches, lag.from_files) == (10, True)
        gate.set()
        delivery.close()
    order = [op_id.split("-")[0] for op_id in processor.seen]
    assert sorted(set(order), key=lambda b: int(b[1:])) == [f"b{b}" for b in range(10)]
    assert [b for b in order if b != "b0"] == sorted((b for b in order if b != "b0"),
                                                     key=lambda b: int(b[1:]))  # in order
    assert (delivery.read_back_batches, delivery.last_settled()) == (8, 9)
    assert delivery.lag() == DeliveryLag(0, 0, False)


def test_once_caught_up_batches_wait_in_memory_again(tmp_path: Path) -> None:
    processor = Flaky()
    with sink_for(processor) as sink:
        delivery = BatchDelivery(sink, tmp_path / "outcomes", tmp_path / "delivered",
                                 max_behind=1)
        delivery.submit(0, batch(0))
        assert eventually(lambda: delivery.lag().batches == 0, 30)
        delivery.submit(1, batch(1))  # no file: it must be delivered from memory
        delivery.close()
    assert seen_batches(processor) == {"b0", "b1"}


def test_a_delivery_that_cannot_finish_fails_the_run(tmp_path: Path) -> None:
    processor = Flaky()
    sink = sink_for(processor)
    sink.close()  # nothing delivered from now on: the batch can never be settled
    delivery = BatchDelivery(sink, tmp_path / "outcomes", tmp_path / "delivered")
    with pytest.raises(RuntimeError, match="delivering outcomes to the sink failed"):
        delivery.submit(0, batch(0))
        delivery.close()
    with pytest.raises(RuntimeError):
        delivery.submit(1, batch(1))
    assert delivery.last_settled() == -1


def targeted(batch_id: int, size: int = 30) -> pa.Table:
    """A batch whose outcomes name no target, ``a`` and ``b`` in turn."""
    table = batch(batch_id, size)
    names = [(None, "a", "b")[i % 3] for i in range(size)]
    return table.append_column("target", pa.array(names, pa.string()))


class Stuck(Flaky):
    """A processor that holds every call until released."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        self.released.wait()
        return super().process_batch(tasks)


def test_each_route_takes_its_targets_outcomes_and_keeps_its_own_mark(
        tmp_path: Path) -> None:
    from tickwheel.pipeline.delivery.batch_delivery import Deliveries, mark_path
    from tickwheel.pipeline.io.compaction import settled_batch

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    default, a, stuck = Flaky(), Flaky(), Stuck()
    sinks = {"default": sink_for(default), "a": sink_for(a), "b": sink_for(stuck)}
    deliveries = Deliveries(sinks, tmp_path / "outcomes", checkpoint)
    for b in range(3):
        (tmp_path / "outcomes").mkdir(exist_ok=True)
        pq.write_table(targeted(b), tmp_path / "outcomes" / f"batch-{b:09d}.parquet")
        deliveries.submit(b, targeted(b))
    # b's processor holds: default and a settle every batch meanwhile.
    assert eventually(lambda: len(a.seen) == 30 and len(default.seen) == 30, 30)
    assert eventually(lambda: mark_path(checkpoint, "a").read_text() == "2", 30)
    assert mark_path(checkpoint, "b").read_text() == "-1"  # none settled yet
    assert settled_batch(2, mark_path(checkpoint, "default")) == -1  # b holds merges back
    assert {op.split("-op")[1] for op in a.seen} == {str(i) for i in range(1, 30, 3)}
    assert all(int(op.split("-op")[1]) % 3 == 0 for op in default.seen)
    stuck.released.set()
    assert deliveries.close(timeout_s=30) == 0
    assert len(stuck.seen) == 30 and mark_path(checkpoint, "b").read_text() == "2"
    assert settled_batch(2, mark_path(checkpoint, "default")) == 2
    for sink in sinks.values():
        sink.close()
