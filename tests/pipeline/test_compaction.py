"""Compaction of a service's outputs: settled batch files merge, rows and their order
kept, and a crash in the middle of a merge reads back without doubles."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tickwheel.pipeline.io.compaction import batch_files as files_of_batch
from tickwheel.pipeline.io.compaction import compact, covered_batches
from tickwheel.pipeline.io.outputs import read_parquet_rows


def batch_files(directory: Path, ids: range) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in ids:
        pq.write_table(pa.table({"batch": [i, i], "row": [0, 1]}),
                       directory / f"batch-{i:09d}.parquet")


def rows(directory: Path) -> list[tuple[int, int]]:
    return [(r["batch"], r["row"]) for path in sorted(directory.iterdir())
            for r in pq.read_table(path).to_pylist()]


def test_settled_files_merge_in_batch_order_and_later_ones_wait(tmp_path: Path) -> None:
    batch_files(tmp_path, range(10))
    assert compact(tmp_path, settled=7, fan_in=4) == 6  # 0-3 and 4-7: one level
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "batch-000000008.parquet", "batch-000000009.parquet",
        "batches-000000000-000000003.parquet", "batches-000000004-000000007.parquet"]
    assert sorted(rows(tmp_path)) == [(i, r) for i in range(10) for r in (0, 1)]
    # Merged a row group at a time, never read whole: a group per file it covers.
    merged = pq.ParquetFile(tmp_path / "batches-000000000-000000003.parquet")
    assert merged.metadata.num_row_groups == 4


def test_merged_files_merge_again_while_they_are_small(tmp_path: Path) -> None:
    batch_files(tmp_path, range(16))
    compact(tmp_path, settled=15, fan_in=4)  # four of 4, then one of 16
    assert [p.name for p in tmp_path.iterdir()] == ["batches-000000000-000000015.parquet"]
    assert [b for b, _ in rows(tmp_path)] == [i for i in range(16) for _ in (0, 1)]
    assert covered_batches(next(tmp_path.iterdir())) == (0, 15)


def test_files_left_by_a_crash_during_a_merge_are_removed_before_reading(
        tmp_path: Path) -> None:
    batch_files(tmp_path / "outcomes", range(4))
    compact(tmp_path / "outcomes", settled=3, fan_in=4)
    batch_files(tmp_path / "outcomes", range(2))  # as if not yet deleted
    compact(tmp_path / "outcomes", settled=3, fan_in=4)
    assert len(rows(tmp_path / "outcomes")) == 8
    assert [p.name for p in (tmp_path / "outcomes").iterdir()] == [
        "batches-000000000-000000003.parquet"]


def partition_files(directory: Path, ids: range, partitions: int) -> None:
    """A batch's files as the Spark engine's executors write them, one per partition."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in ids:
        for p in range(partitions):
            pq.write_table(pa.table({"batch": [i], "row": [p]}),
                           directory / f"batch-{i:09d}-{p:05d}.parquet")


def test_the_files_of_one_batchs_partitions_are_kept_then_merge_in_order(
        tmp_path: Path) -> None:
    partition_files(tmp_path, range(3), partitions=3)
    assert compact(tmp_path, settled=-1, fan_in=4) == 0
    assert len(list(tmp_path.iterdir())) == 9  # none taken for a leftover of another
    assert [p.name for p in files_of_batch(tmp_path, 1)] == [
        f"batch-000000001-{p:05d}.parquet" for p in range(3)]
    compact(tmp_path, settled=2, fan_in=3)  # three merges of a batch each, then one
    assert [p.name for p in tmp_path.iterdir()] == ["batches-000000000-000000002.parquet"]
    assert rows(tmp_path) == [(i, p) for i in range(3) for p in range(3)]


def test_partition_files_a_merged_file_covers_are_removed_before_reading(
        tmp_path: Path) -> None:
    partition_files(tmp_path, range(2), partitions=2)
    compact(tmp_path, settled=1, fan_in=4)
    partition_files(tmp_path, range(1, 2), partitions=2)  # as if not yet deleted
    compact(tmp_path, settled=1, fan_in=4)
    assert [p.name for p in tmp_path.iterdir()] == ["batches-000000000-000000001.parquet"]
    assert len(rows(tmp_path)) == 4


def test_the_readers_take_merged_files(tmp_path: Path) -> None:
    directory = tmp_path / "outcomes"
    directory.mkdir()
    table = pa.table({"op_id": ["a"], "outcome": ["expired"], "resolved_ms": [1],
                      "latency_ms": [0], "keys": [["k"]], "error": [None]},
                     schema=pa.schema([("op_id", pa.string()), ("outcome", pa.string()),
                                       ("resolved_ms", pa.int64()), ("latency_ms", pa.int64()),
                                       ("keys", pa.list_(pa.string())),
                                       ("error", pa.string())]))
    for i in range(3):
        pq.write_table(table, directory / f"batch-{i:09d}.parquet")
    compact(directory, settled=2, fan_in=3)
    assert len(read_parquet_rows(directory)) == 3


def test_a_reader_during_a_merge_counts_each_row_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A service merges as a report reads: the merged file is in place before the files
    # it covers go, and a file listed may be gone when it is opened.
    from tickwheel.pipeline.io import outputs

    partition_files(tmp_path, range(4), partitions=2)
    merged = tmp_path.parent / "merged"
    partition_files(merged, range(2), partitions=2)
    compact(merged, settled=1, fan_in=4)
    (merged / "batches-000000000-000000001.parquet").rename(
        tmp_path / "batches-000000000-000000001.parquet")  # the originals still there
    assert sorted(outputs.count_outputs(tmp_path, "batch").items()) == [(0, 2), (1, 2), (2, 2),
                                                                   (3, 2)]
    opened = outputs.open_parquet
    gone = tmp_path / "batch-000000002-00000.parquet"

    def merging(path: Path) -> Any:
        if path == gone and path.exists():  # merged away between listing and reading
            pq.write_table(pa.concat_tables([pq.read_table(p) for p in (
                gone, tmp_path / "batch-000000002-00001.parquet")]),
                tmp_path / "batches-000000002-000000002.parquet")
            path.unlink()
            (tmp_path / "batch-000000002-00001.parquet").unlink()
        return opened(path)

    monkeypatch.setattr(outputs, "open_parquet", merging)
    assert sorted(outputs.read_output_table(tmp_path, ["batch"]).column(0).to_pylist()) == [
        0, 0, 1, 1, 2, 2, 3, 3]


def test_batches_a_sink_has_not_settled_do_not_merge(tmp_path: Path) -> None:
    from tickwheel.pipeline.io.compaction import settled_batch

    mark = tmp_path / "delivered"
    assert settled_batch(10, mark) == 10  # no sink ever: committed is settled
    mark.write_text("3")
    assert settled_batch(10, mark) == 3
    batch_files(tmp_path / "outcomes", range(8))
    compact(tmp_path / "outcomes", settled_batch(7, mark), fan_in=4)
    assert sorted(p.name for p in (tmp_path / "outcomes").iterdir()) == [
        *(f"batch-{i:09d}.parquet" for i in range(4, 8)),
        "batches-000000000-000000003.parquet"]


def test_a_merged_file_and_its_name_are_on_disk_before_the_files_it_covers_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batch_files(tmp_path, range(4))
    events: list[str] = []
    fsync, replace, unlink = os.fsync, os.replace, Path.unlink

    def fsync_of(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        events.append("fsync " + ("directory" if os.path.isdir(name) else Path(name).name))
        fsync(fd)

    def replace_of(src: str | Path, dst: str | Path) -> None:
        events.append(f"rename {Path(dst).name}")
        replace(src, dst)

    def unlink_of(path: Path, missing_ok: bool = False) -> None:
        events.append(f"delete {path.name}")
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(os, "fsync", fsync_of)
    monkeypatch.setattr(os, "replace", replace_of)
    monkeypatch.setattr(Path, "unlink", unlink_of)
    compact(tmp_path, settled=3, fan_in=4)
    assert re.fullmatch(r"fsync \.batches-000000000-000000003\.parquet\.[0-9a-f]{8}\.tmp",
                        events[0])
    assert events[1:] == ["rename batches-000000000-000000003.parquet", "fsync directory",
                      *(f"delete batch-{i:09d}.parquet" for i in range(4))]


def test_outcome_files_written_before_the_skipped_column_merge_with_newer_ones(
        tmp_path: Path) -> None:
    from tickwheel.pipeline.contract.events import OutcomeKind
    from tickwheel.pipeline.contract.outcomes import OutcomeRow
    from tickwheel.pipeline.io.outputs import outcomes_table

    directory = tmp_path / "outcomes"
    directory.mkdir()
    new = outcomes_table([OutcomeRow("s@5", OutcomeKind.FIRED, 5, 0, (), None, 2)])
    old = new.drop_columns(["skipped"]).set_column(0, "op_id", pa.array(["op"]))
    pq.write_table(old, directory / "batch-000000000.parquet")
    pq.write_table(new, directory / "batch-000000001.parquet")
    assert compact(directory, settled=1, fan_in=2) == 1
    assert [(r["op_id"], r["skipped"]) for r in read_parquet_rows(directory)] == [
        ("op", 0), ("s@5", 2)]
