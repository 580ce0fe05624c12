"""A batch log: what a checkpoint keeps beside its state, batch by batch, read back as
far as the state committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tickwheel.pipeline.io.files import write_bytes_atomically
from tickwheel.pipeline.state.batch_log import BatchLog


def test_a_restart_reads_the_records_of_committed_batches_only(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "files.log")
    log.append(0, ["a", "b"])
    log.append(1, ["c"])
    log.append(2, ["d"])  # its state never committed
    restarted = BatchLog(tmp_path / "files.log")
    assert restarted.read(1) == ["a", "b", "c"]
    assert restarted.records == 4  # what the log holds, for its owner's rewrite
    assert restarted.last_batch == 2
    assert restarted.last_committed == 1  # the last batch read, for its owner's check
    assert BatchLog(tmp_path / "files.log").read() == ["a", "b", "c", "d"]


def test_a_missing_log_reads_as_empty(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "none.log")
    assert log.read(5) == []
    assert (log.records, log.last_batch, log.last_committed) == (0, -1, -1)


def test_a_batch_without_records_writes_nothing(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "files.log")
    log.append(0, [])
    assert not log.path.exists()


def test_a_line_torn_by_a_crash_is_cut_off(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "files.log")
    log.append(0, ["a"])
    with open(log.path, "ab") as out:
        out.write(b'[1, ["b", "c')
    restarted = BatchLog(log.path)
    assert restarted.read(1) == ["a"]
    assert restarted.last_batch == 0
    restarted.append(1, ["b"])
    assert BatchLog(log.path).read(1) == ["a", "b"]


def test_a_rewrite_keeps_its_batch_id_even_with_no_records(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "published.log")
    log.append(3, [[0, "x"], [1, "y"], [2, "z"]])
    log.rewrite(7, [])
    restarted = BatchLog(log.path)
    assert restarted.read() == []
    assert (restarted.records, restarted.last_batch) == (0, 7)


def test_undecodable_names_and_other_scripts_come_back_as_they_were(tmp_path: Path) -> None:
    names = ["in \udcff[x].jsonl", "é{a,b}*?.jsonl", "日本.jsonl"]
    log = BatchLog(tmp_path / "files.log")
    log.append(0, names)
    assert BatchLog(log.path).read(0) == names


def test_an_atomic_write_leaves_no_hidden_file_behind(tmp_path: Path) -> None:
    target = tmp_path / "state"
    write_bytes_atomically(b"one", target)
    write_bytes_atomically(b"two", target)
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_a_rewrite_of_many_records_reads_back_whole_across_its_lines(tmp_path: Path) -> None:
    from tickwheel.pipeline.state.batch_log import REWRITE_LINE_RECORDS

    records = [[n, f"id-{n}"] for n in range(2 * REWRITE_LINE_RECORDS + 5)]
    log = BatchLog(tmp_path / "published.log")
    log.rewrite(9, records)
    log.append(10, [[-1, "later"]])
    assert len(log.path.read_text().splitlines()) == 4  # three of the rewrite, one append
    restarted = BatchLog(log.path)
    assert restarted.read(committed=9) == records
    assert (restarted.last_committed, restarted.last_batch) == (9, 10)


def test_a_log_planted_as_a_symlink_is_neither_read_nor_appended_to(tmp_path: Path) -> None:
    outside = tmp_path / "outside.log"
    outside.write_bytes(b'[0, ["secret"]]\n')
    (tmp_path / "files.log").symlink_to(outside)
    log = BatchLog(tmp_path / "files.log")
    with pytest.raises(ValueError, match="symbolic link"):
        log.read()
    with pytest.raises(ValueError, match="symbolic link"):
        log.append(1, ["x"])
    assert outside.read_bytes() == b'[0, ["secret"]]\n'
