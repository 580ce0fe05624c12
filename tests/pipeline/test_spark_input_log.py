"""The Spark engine's input, by number: each input file is numbered once, across
restarts and crashes; a micro-batch run again reads the files it read the first time;
the offsets Spark keeps are two numbers per micro-batch. The source's reader is driven
here as Spark drives it, without Spark."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxFiles

from tickwheel.pipeline.io.log_reader import input_bytes
from tickwheel.pipeline.spark import _input_log
from tickwheel.pipeline.spark._input_log import (
    PUBLISHED_LOG,
    InputLog,
    committed_inputs,
    input_gone,
    skipped_files,
)
from tickwheel.pipeline.spark._source import FilesPartition, InputReader, input_options


def _land(directory: Path, *names: str) -> None:
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).write_text('{"ts_ms":1,"type":"tick"}\n')


def _reader(inbox: Path, checkpoint: Path, max_files: int | None = None,
            partitions: int = 2, follow: bool = True) -> InputReader:
    return InputReader(input_options(inbox, checkpoint, max_files, partitions, follow))


def _read(reader: InputReader, start: int, end: int) -> list[str]:
    parts = reader.partitions({"next": start}, {"next": end})
    return [os.fsdecode(row[0]) for part in parts for row in reader.read(part)]


def test_each_input_file_is_numbered_once_in_name_order(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "b.jsonl", "a.jsonl")
    inputs = InputLog(inbox, checkpoint)
    assert inputs.publish() == 2
    assert inputs.files(0, 2) == [str(inbox / "a.jsonl"), str(inbox / "b.jsonl")]
    assert inputs.publish() == 0
    _land(inbox, "c.jsonl")
    assert inputs.publish() == 1
    assert inputs.files(2, 3) == [str(inbox / "c.jsonl")]


def test_a_file_landing_with_an_undecodable_name_waits_until_it_is_renamed(
        tmp_path: Path) -> None:
    # The engine refuses such a name before any work; one landing while it runs is
    # skipped instead of stopping the query.
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    inputs = InputLog(inbox, checkpoint)
    assert inputs.publish() == 1
    assert skipped_files(checkpoint) == {}
    bad = inbox / os.fsdecode(b"b\xff.jsonl")
    bad.write_text('{"ts_ms":1,"type":"tick"}\n')
    (inbox / "c.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    assert inputs.publish() == 0
    # For the driver to report: this process's log reaches no user.
    assert skipped_files(checkpoint) == {
        bad.name: "its name is not valid UTF-8: rename it",
        "c.jsonl": "a symlink that leads to no file"}
    bad.rename(inbox / "b.jsonl")
    (inbox / "c.jsonl").unlink()
    assert inputs.publish() == 1
    assert inputs.files(1, 2) == [str(inbox / "b.jsonl")]
    assert skipped_files(checkpoint) == {}


def test_a_following_source_waits_for_an_input_directory_that_went_and_keeps_its_numbers(
        tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, *(f"{n}.jsonl" for n in range(3)))
    reader = _reader(inbox, checkpoint)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert end == {"next": 3} and input_gone(checkpoint) is None
    reader.commit(end)
    inbox.rename(tmp_path / "moved")
    # Nothing new while it is gone, and the driver is told why.
    assert reader.latestOffset(end, ReadAllAvailable()) == {"next": 3}
    assert input_gone(checkpoint) == f"input directory {inbox} does not exist"
    (tmp_path / "moved").rename(inbox)
    _land(inbox, "3.jsonl")
    assert reader.latestOffset(end, ReadAllAvailable()) == {"next": 4}
    assert _read(reader, 3, 4) == [str(inbox / "3.jsonl")]  # the others not again
    assert input_gone(checkpoint) is None
    # A run that does not follow refuses a directory gone, as it did at its start.
    inbox.rename(tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _reader(inbox, tmp_path / "ckpt2", follow=False).latestOffset(
            {"next": 0}, ReadAllAvailable())


def test_a_restart_numbers_nothing_again_and_never_reuses_a_number(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl")
    InputLog(inbox, checkpoint).publish()
    _land(inbox, "c.jsonl")
    restarted = InputLog(inbox, checkpoint)
    assert restarted.publish() == 1
    assert restarted.files(0, 3) == [str(inbox / n) for n in ("a.jsonl", "b.jsonl", "c.jsonl")]


def test_a_crash_before_the_log_line_numbers_the_file_again_from_the_same_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    inputs = InputLog(inbox, checkpoint)

    def crash(batch_id: int, records: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(inputs._log, "append", crash)
    with pytest.raises(KeyboardInterrupt):
        inputs.publish()
    # No offset covered it: Spark never saw the number, so it is free.
    restarted = InputLog(inbox, checkpoint)
    assert restarted.publish() == 1
    assert restarted.files(0, 1) == [str(inbox / "a.jsonl")]


def test_a_log_line_torn_by_a_crash_is_cut_off(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    InputLog(inbox, checkpoint).publish()
    with open(checkpoint / PUBLISHED_LOG, "ab") as out:
        out.write(b'[5, [[4, "/x')
    _land(inbox, "b.jsonl")
    restarted = InputLog(inbox, checkpoint)
    assert restarted.publish() == 1
    lines = (checkpoint / PUBLISHED_LOG).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [[1, [[0, "a.jsonl"]]],
                                                    [2, [[1, "b.jsonl"]]]]


def test_files_gone_from_the_input_are_forgotten_once_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_input_log, "_SLACK", 2)
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    inbox.mkdir()
    inputs = InputLog(inbox, checkpoint)
    for n in range(10):
        _land(inbox, f"{n:02d}.jsonl")
        inputs.publish()
        inputs.commit(n + 1)
        if n < 9:
            (inbox / f"{n:02d}.jsonl").unlink()  # the user's retention
    assert len(inputs.numbers) <= 2 * 1 + 2
    assert len((checkpoint / PUBLISHED_LOG).read_text().splitlines()) < 10
    restarted = InputLog(inbox, checkpoint)
    assert restarted.publish() == 0
    assert restarted.next_number == 10
    _land(inbox, "00.jsonl")  # back under an old name: new input
    assert restarted.publish() == 1
    assert restarted.files(10, 11) == [str(inbox / "00.jsonl")]


def test_the_driver_learns_which_files_spark_committed(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl", "c.jsonl")
    inputs = InputLog(inbox, checkpoint)
    names = ["a.jsonl", "b.jsonl", "c.jsonl", "unknown.jsonl"]
    assert committed_inputs(checkpoint, names) == []  # nothing committed yet
    inputs.publish()
    inputs.commit(2)
    assert committed_inputs(checkpoint, names) == ["a.jsonl", "b.jsonl"]
    # A line the source is still appending is skipped by the driver, and left whole.
    with (checkpoint / PUBLISHED_LOG).open("ab") as log:
        log.write(b'[9, [[7, "x.jsonl"]')
    assert committed_inputs(checkpoint, names) == ["a.jsonl", "b.jsonl"]
    assert (checkpoint / PUBLISHED_LOG).read_bytes().endswith(b'"x.jsonl"]')
    inputs.commit(3)
    assert committed_inputs(checkpoint, names) == ["a.jsonl", "b.jsonl", "c.jsonl"]


def test_a_file_gone_before_its_batch_committed_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_input_log, "_SLACK", 0)
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl", "c.jsonl")
    inputs = InputLog(inbox, checkpoint)
    inputs.publish()
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        (inbox / name).unlink()
    _land(inbox, "d.jsonl")
    inputs.publish()  # rewrites the log: 4 records, 1 file listed
    assert InputLog(inbox, checkpoint).files(0, 4) == [
        str(inbox / n) for n in ("a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl")]


def test_the_reader_takes_files_up_to_its_byte_budget_and_one_at_least(
        tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    inbox.mkdir()
    for name, size in (("0", 400), ("1", 400), ("2", 1_500), ("3", 100)):
        (inbox / f"{name}.jsonl").write_bytes(b" " * (size - 1) + b"\n")
    # Encoded in a few hundred bytes; weighed by its rows, over 1 MB.
    pq.write_table(pa.table({"ts_ms": [1] * 10_000, "type": ["tick"] * 10_000}),
                   inbox / "4.parquet")
    reader = InputReader(input_options(inbox, checkpoint, None, 2, True, max_bytes=1_000))
    assert reader.getDefaultReadLimit() == ReadMaxBytes(1_000)
    assert (inbox / "4.parquet").stat().st_size < 1_000 < input_bytes(inbox / "4.parquet")
    ends = [0]
    while ends[-1] < 5:
        ends.append(reader.latestOffset({"next": ends[-1]}, ReadMaxBytes(1_000))["next"])
        reader.commit({"next": ends[-1]})
    assert ends == [0, 2, 3, 4, 5]  # 800 bytes; 1,500 alone; 100, and then not the Parquet
    # Files per trigger, when asked for, are the limit instead.
    assert _reader(inbox, tmp_path / "ckpt2", max_files=2).getDefaultReadLimit() == \
        ReadMaxFiles(2)


def test_odd_file_names_survive_the_log_and_the_source(tmp_path: Path) -> None:
    # Undecodable bytes in a directory's name come as lone surrogates.
    inbox, checkpoint = tmp_path / "in \udcff[x]", tmp_path / "ckpt"
    _land(inbox, "é[1]{a,b}*?.jsonl")
    reader = _reader(inbox, checkpoint)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert _read(reader, 0, end["next"]) == [str(inbox / "é[1]{a,b}*?.jsonl")]
    assert InputLog(inbox, checkpoint).publish() == 0


def test_the_reader_offsets_are_file_numbers_and_respect_the_file_limit(
        tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, *(f"{n}.jsonl" for n in range(5)))
    reader = _reader(inbox, checkpoint, max_files=2)
    assert reader.getDefaultReadLimit() == ReadMaxFiles(2)
    start = reader.initialOffset()
    assert start == {"next": 0}
    end = reader.latestOffset(start, ReadMaxFiles(2))
    assert end == {"next": 2}
    assert _read(reader, 0, 2) == [str(inbox / "0.jsonl"), str(inbox / "1.jsonl")]
    reader.commit(end)
    # Spark may ask for everything regardless of the option (a trigger's own rule).
    assert reader.latestOffset(end, ReadAllAvailable()) == {"next": 5}
    # No new file: the same offset, which tells Spark there is nothing to do.
    assert reader.latestOffset({"next": 5}, ReadAllAvailable()) == {"next": 5}


def test_a_batch_run_again_after_a_restart_reads_the_same_files(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl", "c.jsonl")
    reader = _reader(inbox, checkpoint, partitions=2)
    end = reader.latestOffset({"next": 0}, ReadAllAvailable())
    first = _read(reader, 0, end["next"])
    _land(inbox, "0.jsonl")  # lands while the driver is down; sorts first
    restarted = _reader(inbox, checkpoint, partitions=2)
    assert _read(restarted, 0, end["next"]) == first
    assert restarted.latestOffset(end, ReadAllAvailable()) == {"next": 4}
    assert _read(restarted, 3, 4) == [str(inbox / "0.jsonl")]


def test_a_batch_splits_its_files_into_runs_for_the_tasks(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, *(f"{n}.jsonl" for n in range(5)))
    reader = _reader(inbox, checkpoint, partitions=2)
    reader.latestOffset({"next": 0}, ReadAllAvailable())
    parts = reader.partitions({"next": 0}, {"next": 5})
    assert [len(p.files) for p in parts if isinstance(p, FilesPartition)] == [3, 2]
    assert reader.partitions({"next": 5}, {"next": 5}) == []


def test_trigger_available_now_stops_at_what_was_there_when_it_began(
        tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    reader = _reader(inbox, checkpoint)
    reader.prepareForTriggerAvailableNow()
    _land(inbox, "b.jsonl")
    assert reader.latestOffset({"next": 0}, ReadAllAvailable()) == {"next": 1}


def test_a_run_that_does_not_follow_reads_what_the_directory_held_at_its_start(
        tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl", "c.jsonl")
    reader = _reader(inbox, checkpoint, max_files=2, follow=False)
    assert reader.latestOffset({"next": 0}, ReadMaxFiles(2)) == {"next": 2}
    _land(inbox, "d.jsonl")
    assert reader.latestOffset({"next": 2}, ReadMaxFiles(2)) == {"next": 3}
    assert reader.latestOffset({"next": 3}, ReadMaxFiles(2)) == {"next": 3}
    # The next run reads it.
    assert _reader(inbox, checkpoint, follow=False).latestOffset(
        {"next": 3}, ReadAllAvailable()) == {"next": 4}


def test_a_file_deleted_and_written_again_under_its_name_is_new_input(tmp_path: Path) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl")
    inputs = InputLog(inbox, checkpoint)
    inputs.publish()
    inputs.commit(2)
    (inbox / "b.jsonl").unlink()
    assert inputs.publish() == 0  # b is forgotten, in the log too
    _land(inbox, "b.jsonl")
    assert inputs.publish() == 1 and inputs.files(2, 3) == [str(inbox / "b.jsonl")]
    # The same across a restart: gone while the service was up, back while it was down.
    inputs.commit(3)
    (inbox / "a.jsonl").unlink()
    inputs.publish()
    _land(inbox, "a.jsonl")
    restarted = InputLog(inbox, checkpoint)
    assert restarted.publish() == 1 and restarted.files(3, 4) == [str(inbox / "a.jsonl")]


def test_a_file_deleted_and_written_again_while_no_micro_batch_runs_is_new_input(
        tmp_path: Path) -> None:
    # Idle on the event clock: Spark calls no commit until a micro-batch runs, but
    # asking for the next offset says the last one committed.
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl")
    reader = _reader(inbox, checkpoint)
    assert reader.latestOffset({"next": 0}, ReadAllAvailable()) == {"next": 2}
    (inbox / "b.jsonl").unlink()
    for _ in range(3):  # triggers with nothing new
        assert reader.latestOffset({"next": 2}, ReadAllAvailable()) == {"next": 2}
    _land(inbox, "b.jsonl", "c.jsonl")
    assert reader.latestOffset({"next": 2}, ReadAllAvailable()) == {"next": 4}
    assert _read(reader, 2, 4) == [str(inbox / "b.jsonl"), str(inbox / "c.jsonl")]


@pytest.mark.parametrize("spelling", ["dotdot", "symlink"])
def test_the_input_spelled_another_way_is_the_same_input(tmp_path: Path, spelling: str) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl")
    inputs = InputLog(inbox, checkpoint)
    inputs.publish()
    inputs.commit(2)
    if spelling == "dotdot":
        other = inbox / ".." / "in"
    else:
        other = tmp_path / "link"
        other.symlink_to(inbox)
    assert InputLog(other, checkpoint).publish() == 0


@pytest.mark.parametrize("name", ["../secret.txt", "/etc/passwd", "..", "", "a/b.jsonl"])
def test_a_log_naming_a_file_outside_the_input_is_refused_by_name(tmp_path: Path,
                                                                  name: str) -> None:
    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl")
    InputLog(inbox, checkpoint).publish()
    with open(checkpoint / PUBLISHED_LOG, "a") as out:
        out.write(json.dumps([2, [[1, name]]]) + "\n")
    with pytest.raises(ValueError, match=r"published\.log names .*not a file of its input"):
        InputLog(inbox, checkpoint)


def test_a_file_that_changes_after_it_was_listed_is_noted_for_the_driver(
        tmp_path: Path) -> None:
    from tickwheel.pipeline.spark._input_log import changed_files

    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _land(inbox, "a.jsonl", "b.jsonl")
    inputs = InputLog(inbox, checkpoint)
    inputs.publish()
    assert changed_files(checkpoint) == {}
    with open(inbox / "a.jsonl", "a") as late_writer:
        late_writer.write('{"ts_ms": 9, "type": "tick"}\n')
    inputs.publish()
    inputs.publish()  # noted once per change
    assert changed_files(checkpoint) == {"a.jsonl": 1}


def _clock_reader(inbox: Path, checkpoint: Path, floor: Path | None) -> InputReader:
    return InputReader(input_options(inbox, checkpoint, None, 2, True, wall_clock=True,
                                     floor_file=floor, lateness_ms=100))


def _rows(reader: InputReader, start: dict[str, int], end: dict[str, int],
          ) -> list[tuple[str | None, int | None]]:
    return [(None if file is None else os.path.basename(os.fsdecode(file)), clock)
            for part in reader.partitions(start, end) for file, clock in reader.read(part)]


def test_the_wall_clock_rides_in_the_offsets_held_within_the_lateness_of_the_floor(
        tmp_path: Path) -> None:
    inbox, checkpoint, floor = tmp_path / "in", tmp_path / "ckpt", tmp_path / "floor"
    inbox.mkdir()
    floor.write_text("5000\n")  # a submit server's floor, long ago
    reader = _clock_reader(inbox, checkpoint, floor)
    start = reader.initialOffset()
    assert start == {"next": 0, "clock": 0}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"next": 0, "clock": 5_100}  # the floor plus the lateness bound
    assert _rows(reader, start, end) == [(None, 5_100)]  # a row of the clock alone
    # Neither a file nor a second: the same offset, so no micro-batch.
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    _land(inbox, "a.jsonl")
    later = reader.latestOffset(end, ReadAllAvailable())
    assert later == {"next": 1, "clock": 5_100}
    assert _rows(reader, end, later) == [("a.jsonl", 5_100)]
    floor.write_text("6000\n")
    assert reader.latestOffset(later, ReadAllAvailable()) == {"next": 1, "clock": 6_100}
    floor.write_text("1000\n")  # a stale floor never takes time back
    assert reader._clock(6_100) == 6_100
    floor.unlink()  # not written yet: time waits for it
    assert reader._clock(6_100) == 6_100
    (tmp_path / "elsewhere").write_text("99000\n")
    floor.symlink_to(tmp_path / "elsewhere")  # planted: not followed
    assert reader._clock(6_100) == 6_100
    floor.unlink()
    floor.write_text("9" * 100)  # not a floor the server writes: time waits
    assert reader._clock(6_100) == 6_100


def test_without_a_floor_the_clock_is_the_wall_clock(tmp_path: Path) -> None:
    reader = _clock_reader(tmp_path / "in", tmp_path / "ckpt", None)
    (tmp_path / "in").mkdir()
    before = time.time_ns() // 1_000_000
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert before <= end["clock"] <= time.time_ns() // 1_000_000
    # An event-clock source has no clock at all.
    assert _reader(tmp_path / "in", tmp_path / "ckpt2").initialOffset() == {"next": 0}


def test_on_the_wall_clock_files_left_by_the_read_limit_are_read_at_the_clock_that_listed_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Time stands while a backlog the read limit left waits: a later micro-batch's
    clock would count rows that landed in time as late."""
    from tickwheel.pipeline.spark import _source

    inbox, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    inbox.mkdir()
    for name in "0123":
        (inbox / f"{name}.jsonl").write_bytes(b" " * 399 + b"\n")
    now = [1_000_000]
    monkeypatch.setattr(_source.time, "time_ns", lambda: now[0] * 1_000_000)
    reader = InputReader(input_options(inbox, checkpoint, None, 2, True, max_bytes=800,
                                       wall_clock=True))
    first = reader.latestOffset(reader.initialOffset(), ReadMaxBytes(800))
    assert first == {"next": 2, "clock": 1_000_000, "backlog": 1}
    reader.commit(first)
    now[0] += 1_000
    (inbox / "4.jsonl").write_bytes(b" " * 399 + b"\n")
    second = reader.latestOffset(first, ReadMaxBytes(800))  # leaves 4.jsonl for later
    assert second == {"next": 4, "clock": 1_000_000, "backlog": 1}
    reader.commit(second)
    now[0] += 60_000  # the next micro-batch comes a minute later
    third = reader.latestOffset(second, ReadMaxBytes(800))
    assert third == {"next": 5, "clock": 1_000_000}  # the backlog read: no longer held
    reader.commit(third)
    fourth = reader.latestOffset(third, ReadMaxBytes(800))
    assert fourth == {"next": 5, "clock": 1_061_000}  # then time moves on
