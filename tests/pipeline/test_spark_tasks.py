"""The Spark engine's worker code on its own, driven through a stand-in for Spark's state
handle: a worker goes on from the partition it kept only while the state holds the
token it wrote, and otherwise reads the state; what it keeps stays out of the
collector's walk but for a thaw once a minute."""

from __future__ import annotations

import copy
import gc
import json
import logging
import marshal
import os
import random
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tickwheel.pipeline.contract.events import OutcomeKind, Quarantined, Reason, compact_wire
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.io.outputs import outcomes_table, quarantine_table
from tickwheel.pipeline.semantics import partition as partition_module
from tickwheel.pipeline.semantics.partition import PartitionStatus
from tickwheel.pipeline.spark import _tasks, _wire


class _Value:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value


class _List:
    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter(list(self.items))

    def appendList(self, items: list[tuple[Any, ...]]) -> None:
        self.items += items

    def put(self, items: list[tuple[Any, ...]]) -> None:
        self.items = list(items)


class _Map:
    def __init__(self) -> None:
        self.items: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.items[key] = value

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        return self.items.get(key)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        return iter(list(self.items.items()))

    def removeKey(self, key: tuple[Any, ...]) -> None:
        del self.items[key]

    def clear(self) -> None:
        self.items = {}


class _Handle:
    """The state of one grouping key, as Spark's state store commits it."""

    def __init__(self) -> None:
        self.values: dict[str, _Value] = {}
        self.lists: dict[str, _List] = {}
        self.maps: dict[str, _Map] = {}

    def getValueState(self, name: str, schema: str) -> _Value:
        return self.values.setdefault(name, _Value())

    def getListState(self, name: str, schema: str) -> _List:
        return self.lists.setdefault(name, _List())

    def getMapState(self, name: str, key_schema: str, value_schema: str) -> _Map:
        return self.maps.setdefault(name, _Map())

    def committed(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        return ({n: v.value for n, v in self.values.items()},
                {n: list(v.items) for n, v in self.lists.items()},
                {n: dict(v.items) for n, v in self.maps.items()})

    def roll_back(self, to: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
        """As if the batches since ``to`` never committed."""
        for name, value in to[0].items():
            self.values[name].value = value
        for name, items in to[1].items():
            self.lists[name].items = list(items)
        for name, entries in to[2].items():
            self.maps[name].items = dict(entries)


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    _tasks._kept.clear()
    _tasks._freezer.thawed_at = None
    yield
    _tasks._kept.clear()
    _tasks._freezer.thawed_at = None
    gc.unfreeze()  # the rest of the test session's objects go back to the collector


def _op_frame(rows: list[str], point: int) -> pd.DataFrame:
    """Stage 2's input for one call: forwarded rows, then stage 1's release point."""
    blob = _wire.encoded([compact_wire(line) for line in rows])
    return pd.DataFrame({"ts": pd.Series([_wire.NONE, point], dtype="int64"),
                         "rows": pd.Series([blob, b""], dtype=object),
                         "progress": pd.Series([b"", b""], dtype=object),
                         "quarantine": pd.Series([None, None], dtype=object),
                         "status": pd.Series([None, "{}"], dtype=object)})


def _call(processor: Any, frame: pd.DataFrame) -> pd.DataFrame:
    """The frames one call yields, as one."""
    return pd.concat(list(processor.handleInputRows((0,), iter([frame]), None)),
                     ignore_index=True)


def _run(processor: Any, frame: pd.DataFrame) -> list[tuple[str, str]]:
    out = _call(processor, frame)
    table = _wire.from_ipc(out["outcomes"].tolist(), outcomes_table([]))
    return sorted(zip(table["op_id"].to_pylist(), table["outcome"].to_pylist(), strict=True))


def _processor(handle: _Handle, checkpoint: str = "c1") -> Any:
    processor = _tasks.op_processor([0], 10, None, checkpoint)
    processor.init(handle)
    return processor


WATCH = json.dumps({"ts_ms": 1_000, "type": "watch", "op_id": "a", "keys": [],
                    "deadline_ms": 1_100, "condition": "none"}, separators=(",", ":"))


def test_a_worker_goes_on_from_the_partition_it_kept_without_reading_the_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handle = _Handle()
    processor = _processor(handle)
    assert _run(processor, _op_frame([WATCH], 1_001)) == []

    def no_restore(*args: Any) -> None:
        raise AssertionError("the state was read")

    monkeypatch.setattr(partition_module.OpPartition, "from_state", no_restore)
    assert _run(processor, _op_frame([], 2_000)) == [("a", "expired")]


def test_a_batch_that_did_not_commit_sends_the_worker_back_to_the_state() -> None:
    handle = _Handle()
    processor = _processor(handle)
    _run(processor, _op_frame([WATCH], 1_001))
    committed = handle.committed()
    assert _run(processor, _op_frame([], 2_000)) == [("a", "expired")]
    # The batch runs again on the state before it: the kept partition, which has
    # already expired "a", must not be used.
    handle.roll_back(committed)
    assert _run(processor, _op_frame([], 2_000)) == [("a", "expired")]


def test_a_copy_ahead_of_the_state_in_time_is_not_caught_up() -> None:
    handle = _Handle()
    processor = _processor(handle)
    far = json.dumps({"ts_ms": 1_000, "type": "watch", "op_id": "a", "keys": [],
                      "deadline_ms": 5_000, "condition": "none"})
    _run(processor, _op_frame([far], 1_001))
    committed = handle.committed()
    _run(processor, _op_frame([], 3_000))  # only time moves: no entry changes
    handle.roll_back(committed)
    # Its entries' log is the state's, but its time is not: read the state instead.
    assert _run(processor, _op_frame([], 2_000)) == []
    assert _run(processor, _op_frame([], 5_001)) == [("a", "expired")]


def test_a_partition_another_worker_ran_since_is_read_from_the_state() -> None:
    handle = _Handle()
    here, there = _processor(handle), _processor(handle)
    _run(here, _op_frame([WATCH], 1_001))
    kept = copy.copy(_tasks._kept)
    _tasks._kept.clear()  # the other worker's own memory
    assert _run(there, _op_frame([], 2_000)) == [("a", "expired")]
    _tasks._kept.clear()
    _tasks._kept.update(kept)  # back in the first worker, with its older partition
    assert _run(here, _op_frame([], 2_100)) == []  # "a" expired once, not twice


def _watch(op_id: str, ts: int) -> str:
    return json.dumps({"ts_ms": ts, "type": "watch", "op_id": op_id, "keys": [],
                       "deadline_ms": ts + 100, "condition": "none"}, separators=(",", ":"))


def _duplicates(processor: Any, frame: pd.DataFrame) -> list[str]:
    out = _call(processor, frame)
    table = _wire.from_ipc(out["quarantine"].tolist(), quarantine_table([]))
    return sorted(json.loads(raw)["op_id"] for raw, reason in zip(
        table["raw"].to_pylist(), table["reason"].to_pylist(), strict=True)
        if reason == "duplicate_op_id")


def test_a_partitions_status_counts_the_bytes_its_state_and_seen_log_hold() -> None:
    handle = _Handle()
    here, there = _processor(handle), _processor(handle)

    def state_bytes(processor: Any, op_id: str, ts: int) -> int:
        out = _call(processor, _op_frame([_watch(op_id, ts)], ts + 1))
        # Its own, then stage 1's passed on.
        status = json.loads(out["status"].dropna().tolist()[0])
        assert status["stage"] == "op"
        saved = len(handle.values["head"].get()[0])
        entries = sum(len(chunk) for chunk, _ in handle.maps["entries"].items.values())
        chunks = sum(len(segment[0]) for segment in handle.maps["seen"].items.values())
        assert status["state_bytes"] == saved + entries + chunks
        return int(status["state_bytes"])

    first = state_bytes(here, "a", 1_000)  # a new partition
    kept = copy.copy(_tasks._kept)
    _tasks._kept.clear()
    second = state_bytes(there, "b", 1_100)  # read from the state
    _tasks._kept.clear()
    _tasks._kept.update(kept)
    third = state_bytes(here, "c", 1_200)  # an older copy, caught up
    assert 0 < first < second < third
    assert len(handle.maps["seen"].items) == 3


def test_a_batch_writes_the_operations_it_changed_not_every_one_pending() -> None:
    handle = _Handle()
    processor = _processor(handle)
    far = [json.dumps({"ts_ms": 1_000, "type": "watch", "op_id": f"op-{i}", "keys": [],
                       "deadline_ms": 10**9, "condition": "none"}) for i in range(2_000)]
    _call(processor, _op_frame(far, 1_001))
    before = dict(handle.maps["entries"].items)
    _call(processor, _op_frame([_watch("new", 1_500)], 1_501))
    after = handle.maps["entries"].items
    assert {k: after[k] for k in before} == before  # what was written stays
    (added,) = (value for key, value in after.items() if key not in before)
    assert [op_id for op_id, _ in marshal.loads(added[0])] == ["new"]
    assert len(handle.values["head"].get()[0]) < 1_000  # counters, time: no operation


def test_a_worker_back_on_a_partition_catches_its_seen_ids_up_from_the_later_chunks(
        applied_seen_chunks: list[bytes]) -> None:
    handle = _Handle()
    here, there = _processor(handle), _processor(handle)
    _run(here, _op_frame([_watch("a", 1_000)], 1_001))
    kept = copy.copy(_tasks._kept)
    _tasks._kept.clear()
    _run(there, _op_frame([_watch("b", 1_100)], 1_101))
    _tasks._kept.clear()
    _tasks._kept.update(kept)
    applied_seen_chunks.clear()
    frame = _op_frame([_watch("a", 1_200), _watch("b", 1_200), _watch("c", 1_200)], 1_201)
    assert _duplicates(here, frame) == ["a", "b"]
    other_workers_chunk = handle.maps["seen"].items[1,][0]
    assert applied_seen_chunks == [other_workers_chunk]  # and none before it


def test_a_call_that_fails_part_way_keeps_nothing() -> None:
    handle = _Handle()
    processor = _processor(handle)
    _run(processor, _op_frame([WATCH], 1_001))
    assert len(_tasks._kept) == 1
    broken = _op_frame([], 2_000).drop(columns=["progress"])
    with pytest.raises(KeyError):
        next(processor.handleInputRows((0,), iter([broken]), None))
    assert not _tasks._kept
    assert _run(processor, _op_frame([], 2_000)) == [("a", "expired")]


def test_partitions_of_different_checkpoints_are_kept_apart() -> None:
    first, second = _Handle(), _Handle()
    _run(_processor(first, "c1"), _op_frame([WATCH], 1_001))
    assert _run(_processor(second, "c2"), _op_frame([], 2_000)) == []
    assert _run(_processor(first, "c1"), _op_frame([], 2_000)) == [("a", "expired")]


def test_a_worker_keeps_a_few_partitions_at_most() -> None:
    for n in range(5):
        _run(_processor(_Handle(), f"c{n}"), _op_frame([WATCH], 1_001))
    assert len(_tasks._kept) == _tasks._KEPT_MAX


def test_what_a_worker_keeps_is_out_of_the_collectors_walk() -> None:
    gc.unfreeze()
    _run(_processor(_Handle()), _op_frame([WATCH], 1_001))
    assert gc.get_freeze_count() > 0


def test_kept_objects_go_back_to_the_collector_once_a_minute() -> None:
    _tasks._freeze_worker(100.0)
    assert gc.get_freeze_count() > 0
    _tasks._freeze_worker(100.0 + _tasks.THAW_EVERY_S - 0.1)
    assert gc.get_freeze_count() > 0
    _tasks._freeze_worker(100.0 + _tasks.THAW_EVERY_S)
    assert gc.get_freeze_count() == 0
    _tasks._freeze_worker(100.0 + _tasks.THAW_EVERY_S + 1)  # frozen again until the next
    assert gc.get_freeze_count() > 0


class _Node:
    def __init__(self) -> None:
        self.other: _Node = self


def test_a_reference_cycle_frozen_with_the_kept_objects_is_collected_after_the_thaw() -> None:
    cycle = _Node()
    alive = weakref.ref(cycle)
    _tasks._freeze_worker(0.0)
    del cycle
    gc.collect()
    assert alive() is not None  # frozen: no collection reaches it
    _tasks._freeze_worker(_tasks.THAW_EVERY_S)
    gc.collect()  # PySpark's collection after the task
    assert alive() is None


def test_a_partition_a_worker_lets_go_of_leaves_its_operations_to_no_collection() -> None:
    watches = [json.dumps({"ts_ms": 1_000, "type": "watch", "op_id": f"w{n}", "keys": [],
                           "deadline_ms": 1_000 + 37 * n, "condition": "none"},
                          separators=(",", ":")) for n in range(1, 200)]
    handle = _Handle()
    processor = _processor(handle)
    _run(processor, _op_frame(watches, 1_001))  # pending, all over the timing wheel
    committed = handle.committed()
    _run(processor, _op_frame([], 1_050))
    handle.roll_back(committed)  # the batch never committed: the kept one is stale
    gc.collect()
    gc.disable()
    try:
        _run(processor, _op_frame([], 1_050))  # lets go of the stale one
        gc.unfreeze()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    # Closed when let go: its operations were freed then, not left to a full walk.
    assert "_StagedOperation" not in left


def test_a_packer_passes_over_an_input_file_gone_before_it_reads_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import pyarrow as pa

    present = tmp_path / "b.jsonl"
    present.write_text('{"ts_ms":5,"type":"update","key":"k","value":1}\n')
    files = [os.fsencode(tmp_path / "a.jsonl"), os.fsencode(tmp_path / "a.parquet"),
             os.fsencode(present)]
    batch = pa.RecordBatch.from_arrays(
        [pa.array([None] * 3, pa.string()), pa.array(files, pa.binary()),
         pa.array([None] * 3, pa.int64())], names=["path", "file", "clock"])
    with caplog.at_level(logging.WARNING):
        chunks = list(_tasks.packer([0], 1_000)(iter([batch])))
    rows = []
    for chunk in chunks:
        for dest, blob in zip(chunk.column(1).to_pylist(), chunk.column(3).to_pylist(),
                              strict=True):
            if dest == _wire.KEY_ROWS:  # stage 1's rows, and stage 2's rows' times
                key_rows, times = _wire.decoded(blob)
                rows += key_rows
                assert times == []  # the one row is an update: stage 1's
            else:
                rows += _wire.decoded(blob)
    assert [row[0] for row in rows] == [5]  # the file still there, and nothing else
    assert sum("went away before it was read" in r.message for r in caplog.records) == 2


def test_outputs_leave_a_worker_in_blobs_and_frames_of_bounded_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_wire, "BLOB_BYTES", 50_000)
    monkeypatch.setattr(_wire, "FRAME_BYTES", 120_000)
    # 800 KB of hex text: zstd makes it about half, not nothing.
    lines = [random.Random(i).randbytes(10_000).hex() for i in range(40)]
    quarantined = [Quarantined(line, Reason.UNPARSEABLE, None) for line in lines]
    outcomes = [OutcomeRow(f"op-{i}", OutcomeKind.EXPIRED, i, 0, (), None) for i in range(3)]
    status = PartitionStatus("op", 0, 1, None, None, 0, 0, 0, 0, 0, 0)
    out = list(_wire.output_frames(outcomes, quarantined, [status], [(None, "{}")]))
    blobs = [b for frame in out for b in frame["quarantine"].tolist() if b is not None]
    assert len(blobs) == 14  # about 50 KB of rows each: 3 rows of 20 KB
    assert len(out) > 1
    table = _wire.from_ipc(blobs, quarantine_table([]))
    assert table["raw"].to_pylist() == lines
    assert _wire.from_ipc([b for f in out for b in f["outcomes"]], outcomes_table([])
                          )["op_id"].to_pylist() == ["op-0", "op-1", "op-2"]
    assert [s for f in out for s in f["status"] if s is not None][-1] == "{}"


def test_statuses_read_while_a_batch_forgets_a_listed_file_are_the_newer_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tickwheel.pipeline.spark.engine import latest_statuses

    def write(batch: int, seq: int) -> None:
        texts = [json.dumps(dataclasses.asdict(
            PartitionStatus(stage, 0, seq, None, None, seq, seq, 0, 0, 0, 0)))
            for stage in ("key", "op")]
        pq.write_table(pa.table({"status": pa.array(texts, pa.string())}),
                       tmp_path / f"batch-{batch:09d}.parquet")

    write(4, seq=4)
    read_table = pq.read_table
    calls = 0

    def racing(path: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # the engine commits batch 5 and forgets batch 4 meanwhile
            write(5, seq=5)
            (tmp_path / "batch-000000004.parquet").unlink()
        return read_table(path, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", racing)
    statuses = latest_statuses(tmp_path)
    assert [(s.stage, s.seq) for s in statuses] == [("key", 5), ("op", 5)]


def test_a_status_file_that_never_reads_fails_the_reader_instead_of_hanging_it(
        tmp_path: Path) -> None:
    from tickwheel.pipeline.spark.engine import latest_statuses

    (tmp_path / "batch-000000001.parquet").symlink_to(tmp_path / "nowhere.parquet")
    with pytest.raises(FileNotFoundError):
        latest_statuses(tmp_path)
