"""SpilledRuns: sorted runs on disk merged into one stable order, a whole group at a
time, with files and memory bounded by tiers."""

from __future__ import annotations

import itertools
import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.state.spilled_runs import SpilledRuns


def first(row: tuple[int, int]) -> int:
    return row[0]


def group_of(key: int) -> int:
    return key - key % 4


def spill_all(runs: SpilledRuns[tuple[int, int]], rows: list[tuple[int, int]],
              cuts: list[int]) -> list[tuple[int, int]]:
    """Spill ``rows`` in runs cut at ``cuts``; the rest is returned as the last run."""
    start = 0
    for cut in sorted(set(cuts)):
        if start < cut < len(rows):
            runs.spill(sorted(rows[start:cut], key=first))
            start = cut
    return sorted(rows[start:], key=first)


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(-20, 20), max_size=300),
       cuts=st.lists(st.integers(0, 300), max_size=25),
       fan_in=st.integers(2, 4), block=st.integers(1, 9))
def test_the_merge_is_one_stable_sort_of_every_row_and_never_splits_a_group(
        keys: list[int], cuts: list[int], fan_in: int, block: int) -> None:
    rows = [(k, i) for i, k in enumerate(keys)]  # the second field tells ties apart
    runs: SpilledRuns[tuple[int, int]] = SpilledRuns(first, group_start=group_of,
                                                     fan_in=fan_in, block_rows=block)
    last = spill_all(runs, rows, cuts)
    batches = list(runs.merge(last))
    assert [row for batch in batches for row in batch] == sorted(rows, key=first)
    assert all(batches)
    for before, after in itertools.pairwise(batches):
        assert group_of(before[-1][0]) < group_of(after[0][0])


def test_runs_of_one_tier_are_merged_once_fan_in_of_them_are_on_disk() -> None:
    runs: SpilledRuns[tuple[int, int]] = SpilledRuns(first, fan_in=3)
    files = []
    for i in range(13):
        runs.spill([(i, 0), (i + 100, 1)])
        files.append(runs.files)
    # 13 runs in base 3 is 111: a run of tier 2, one of tier 1, one of tier 0.
    assert files == [1, 2, 1, 2, 3, 2, 3, 4, 1, 2, 3, 2, 3]
    merged = [row for batch in runs.merge() for row in batch]
    assert merged == sorted([(i, 0) for i in range(13)] + [(i + 100, 1) for i in range(13)])
    assert runs.files == 0


def test_rows_of_any_size_are_merged_a_bounded_block_at_a_time() -> None:
    # 8 runs of 20 rows of 100 KB: 16 MB in all, 2 MB in each run.
    def row(key: int, i: int) -> tuple[int, str]:
        return (key, f"{i:06d}" + "x" * 100_000)

    def key_of(r: tuple[int, str]) -> int:
        return r[0]

    runs: SpilledRuns[tuple[int, str]] = SpilledRuns(key_of, block_rows=2048,
                                                     block_bytes=150_000)
    for r in range(8):
        runs.spill([row(k, r * 20 + k) for k in range(20)])
    tracemalloc.start()
    try:
        merged = [(r[0], r[1][:6]) for batch in runs.merge() for r in batch]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert merged == [(k, f"{r * 20 + k:06d}") for k in range(20) for r in range(8)]
    # A block of one row from each run, and what one step takes: not a run of each.
    assert peak < 4_000_000


def test_a_merge_between_tiers_cuts_blocks_by_the_rows_size() -> None:
    # Eight runs of 10 rows of 100 KB, two to a tier: the last spill merges all eight
    # (8 MB). Gathered by count (2,048 rows a block), it peaked at 24 MB.
    def key_of(r: tuple[int, str]) -> int:
        return r[0]

    runs: SpilledRuns[tuple[int, str]] = SpilledRuns(
        key_of, fan_in=2, block_bytes=150_000, row_bytes=lambda r: len(r[1]))
    for r in range(7):
        runs.spill([(k, f"{r}" * 100_000) for k in range(10)])
    last = [(k, "7" * 100_000) for k in range(10)]
    tracemalloc.start()
    try:
        runs.spill(last)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert runs.files == 1
    assert [(k, v[0]) for batch in runs.merge() for k, v in batch] == [
        (k, f"{r}") for k in range(10) for r in range(8)]
    assert peak < 4_000_000


def test_runs_leave_no_file_behind_even_while_they_exist(tmp_path: Path) -> None:
    runs: SpilledRuns[tuple[int, int]] = SpilledRuns(first, directory=tmp_path, fan_in=2)
    for i in range(5):
        runs.spill([(i, i)] * 1000)
    assert runs.bytes_written > 0
    assert os.listdir(tmp_path) == []  # unnamed files: kill -9 leaves nothing
    assert sum(len(batch) for batch in runs.merge()) == 5000


def test_a_merge_stopped_early_closes_its_files() -> None:
    runs: SpilledRuns[tuple[int, int]] = SpilledRuns(first)
    for i in range(3):
        runs.spill([(j, i) for j in range(5000)])
    merge = runs.merge()
    next(merge)
    merge.close()
    assert runs.files == 0


def test_a_fan_in_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="fan_in"):
        SpilledRuns(first, fan_in=1)
