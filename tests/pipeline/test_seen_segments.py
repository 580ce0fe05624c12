"""The op ids a partition has seen, kept as segment files: appended batch by batch,
each segment spanning an eighth of the retention, deleted whole once past it."""

from __future__ import annotations

from pathlib import Path

from tickwheel.pipeline.state.seen_segments import MIN_SPAN_MS, SeenSegments


def test_ids_come_back_in_the_order_first_seen_and_one_seen_again_moves_to_the_end(
        tmp_path: Path) -> None:
    segments = SeenSegments(tmp_path, 80_000)
    segments.append(0, [("a", 1), ("b", 2)])
    segments.append(1, [("a", None), ("c", 3)])  # a forgotten id is not written
    segments.append(2, [("a", 9)])
    assert list(SeenSegments(tmp_path, 80_000).read(2).items()) == [
        ("b", 2), ("c", 3), ("a", 9)]
    assert "null" not in "".join(path.read_text() for path in tmp_path.iterdir())


def test_a_segment_spans_an_eighth_of_the_retention(tmp_path: Path) -> None:
    segments = SeenSegments(tmp_path, 80_000)
    assert segments.span_ms == 10_000
    for batch, t in enumerate(range(0, 35_000, 1_000)):
        segments.append(batch, [(f"id{t}", t)])
    assert segments.segments == 4  # 0-9,999, 10,000-19,999, ...
    assert SeenSegments(tmp_path, 500).span_ms == MIN_SPAN_MS


def test_a_segment_whose_ids_are_all_past_the_retention_is_deleted_whole(
        tmp_path: Path) -> None:
    segments = SeenSegments(tmp_path, 16_000)  # segments of 2 s
    for batch, t in enumerate(range(0, 6_000, 500)):
        segments.append(batch, [(f"id{t}", t)])
    assert segments.segments == 3
    assert segments.drop_past(17_500) == 0  # the first segment's latest: 1,500
    assert segments.drop_past(17_501) == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "0000000001.log", "0000000002.log"]
    assert min(SeenSegments(tmp_path, 16_000).read(11).values()) == 2_000


def test_without_a_retention_the_ids_stay_in_one_segment_forever(tmp_path: Path) -> None:
    segments = SeenSegments(tmp_path, None)
    for batch in range(50):
        segments.append(batch, [(f"id{batch}", batch * 10**9)])
    assert segments.drop_past(10**12) == 0
    assert segments.segments == 1
    assert len(SeenSegments(tmp_path, None).read(49)) == 50


def test_a_restart_reads_committed_batches_only_and_deletes_a_segment_of_none(
        tmp_path: Path) -> None:
    segments = SeenSegments(tmp_path, 8_000)  # segments of 1 s
    segments.append(0, [("a", 0)])
    segments.append(1, [("b", 500)])
    segments.append(2, [("c", 1_500)])  # a new segment; its batch never commits
    restored = SeenSegments(tmp_path, 8_000)
    assert restored.read(1) == {"a": 0, "b": 500}
    assert [path.name for path in tmp_path.iterdir()] == ["0000000000.log"]
    restored.append(2, [("c", 1_500)])  # the batch runs again, into the same number
    assert SeenSegments(tmp_path, 8_000).read(2) == {"a": 0, "b": 500, "c": 1_500}
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "0000000000.log", "0000000001.log"]
