"""The op ids a partition has seen, kept in the local engine's files: a segment a batch,
files spanning an eighth of the retention, each deleted once every segment in it is
removed; a restart reads the segments its state relies on, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from tickwheel.pipeline.state.seen_files import MIN_SPAN_MS, SeenFiles


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def _relied_on(files: SeenFiles) -> tuple[int, int]:
    return files.log.first, files.log.next


def test_ids_come_back_in_the_order_first_seen_and_one_seen_again_moves_to_the_end(
        tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, 80_000)
    files.append(0, [("a", 1), ("b", 2)], 2)
    files.append(1, [("a", None), ("c", 3)], 3)  # a forgotten id is not written
    files.append(2, [("a", 9)], 9)
    assert list(SeenFiles(tmp_path, 80_000).read(2, *_relied_on(files)).items()) == [
        ("b", 2), ("c", 3), ("a", 9)]


def test_the_log_hands_its_ids_over_and_holds_only_its_segments(tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, None)
    files.append(0, [(f"id{i}", i) for i in range(100)], 99)
    restored = SeenFiles(tmp_path, None)
    assert len(restored.read(0, 0, 1)) == 100
    assert restored.log.ids == {} and restored.log.segments == {0: (99, restored.log.bytes)}
    restored.append(1, [("x", 200)], 200)
    assert restored.log.ids == {}


def test_a_file_spans_an_eighth_of_the_retention(tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, 80_000)
    assert files.span_ms == 10_000
    for batch, t in enumerate(range(0, 35_000, 1_000)):
        files.append(batch, [(f"id{t}", t)], t)
    assert files.files == 4  # 0-9,999, 10,000-19,999, ...
    assert files.log.next == 35  # a segment a batch
    assert SeenFiles(tmp_path, 500).span_ms == MIN_SPAN_MS


def test_a_file_whose_segments_are_all_past_the_retention_is_deleted_whole(
        tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, 16_000)  # files of 2 s
    for batch, t in enumerate(range(0, 6_000, 500)):
        files.append(batch, [(f"id{t}", t)], t)
    assert files.files == 3
    files.append(12, [], 17_500)  # the first file's latest: 1,500, not past
    assert files.drop_removed() == 0
    files.append(13, [], 17_501)
    assert files.log.first == 4
    assert _names(tmp_path) == ["0000000000.log", "0000000004.log", "0000000008.log"]
    assert files.drop_removed() == 1  # once the batch has committed
    assert _names(tmp_path) == ["0000000004.log", "0000000008.log"]
    assert min(SeenFiles(tmp_path, 16_000).read(13, *_relied_on(files)).values()) == 2_000


def test_without_a_retention_the_ids_stay_in_one_file_forever(tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, None)
    for batch in range(50):
        files.append(batch, [(f"id{batch}", batch * 10**9)], batch * 10**9)
    assert files.drop_removed() == 0
    assert files.files == 1 and files.log.next == 50  # never merged
    assert len(SeenFiles(tmp_path, None).read(49, 0, 50)) == 50


def test_a_restart_reads_committed_batches_only_and_deletes_a_file_of_none(
        tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, 8_000)  # files of 1 s
    files.append(0, [("a", 0)], 0)
    files.append(1, [("b", 500)], 500)
    committed = _relied_on(files)
    files.append(2, [("c", 1_500)], 1_500)  # a new file; its batch never commits
    restored = SeenFiles(tmp_path, 8_000)
    assert restored.read(1, *committed) == {"a": 0, "b": 500}
    assert _names(tmp_path) == ["0000000000.log"]
    restored.append(2, [("c", 1_500)], 1_500)  # the batch runs again, the same
    assert SeenFiles(tmp_path, 8_000).read(2, *_relied_on(restored)) == {
        "a": 0, "b": 500, "c": 1_500}
    assert _names(tmp_path) == ["0000000000.log", "0000000002.log"]


def test_a_restart_after_a_commit_deletes_the_files_it_removed(tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, 8_000)
    files.append(0, [("a", 0)], 0)
    files.append(1, [("b", 5_000)], 5_000)
    files.append(2, [("c", 9_000)], 9_000)  # removes segment 0; a crash before the drop
    restored = SeenFiles(tmp_path, 8_000)
    assert restored.read(2, *_relied_on(files)) == {"b": 5_000, "c": 9_000}
    assert _names(tmp_path) == ["0000000001.log", "0000000002.log"]


def test_a_segment_the_state_relies_on_and_cannot_find_is_named(tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, None)
    files.append(0, [("a", 0)], 0)
    files.append(1, [("b", 1)], 1)
    (tmp_path / "0000000000.log").write_text("")  # cut short
    restored = SeenFiles(tmp_path, None)
    restored.read(1, 0, 2)
    assert restored.lacking(0, 2) == [
        f"{tmp_path} (missing 2 of the segments 0 to 1 that the state relies on)"]
    assert SeenFiles(tmp_path, None).lacking(0, 0) == []


def test_a_range_of_segments_no_state_could_name_is_refused_at_once(tmp_path: Path) -> None:
    files = SeenFiles(tmp_path, None)
    files.append(0, [("a", 0)], 0)
    restored = SeenFiles(tmp_path, None)
    restored.read(0, 0, 10**18)  # a corrupt state: counted, not listed
    assert restored.lacking(0, 10**18) == [
        f"{tmp_path} (missing {10**18 - 1} of the segments 0 to {10**18 - 1} that the "
        "state relies on)"]
    assert restored.lacking(5, 2) == [f"{tmp_path} (the state names segments 5 to 1)"]


@pytest.mark.parametrize("line", ['[0, [["a", 1]]]\n', '[0, [[0, 1, "!", "x"]]]\n'])
def test_a_file_tickwheel_did_not_write_is_refused(tmp_path: Path, line: str) -> None:
    (tmp_path / "0000000000.log").write_text(line)
    with pytest.raises(ValueError):
        SeenFiles(tmp_path, None).read(0, 0, 1)
    (tmp_path / "0000000000.log").unlink()
    (tmp_path / "seen.txt").write_text("")
    with pytest.raises(ValueError, match="not a file of seen op ids"):
        SeenFiles(tmp_path, None).read(0, 0, 1)


def test_a_symlink_among_the_files_is_refused_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.log"
    SeenFiles(tmp_path / "x", None).append(0, [("a", 0)], 0)
    (tmp_path / "x" / "0000000000.log").rename(elsewhere)
    seen = tmp_path / "seen"
    seen.mkdir()
    (seen / "0000000000.log").symlink_to(elsewhere)
    with pytest.raises(ValueError, match=r"0000000000\.log is not a file of seen op ids"):
        SeenFiles(seen, None).read(0, 0, 1)
