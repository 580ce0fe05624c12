"""The log's row times as runs: exact gaps from any split of the rows, however many
partitions saw them, and the clock schedules read in event time."""

from __future__ import annotations

import itertools
import random

from hypothesis import given
from hypothesis import strategies as st

from tickwheel.pipeline.semantics.row_times import GAP_MS, RowTimes, merge_runs, runs_of

times = st.lists(st.integers(0, 30_000), max_size=60)


def gaps_of(ordered: list[int]) -> list[int]:
    """The gaps, straight from the definition: consecutive row times more than
    GAP_MS apart."""
    distinct = sorted(set(ordered))
    return [x for a, b in itertools.pairwise(distinct) if b - a > GAP_MS
            for x in (a, b)]


@given(times, st.integers(1, 6), st.randoms(use_true_random=False))
def test_runs_merged_from_any_split_are_the_runs_of_all_the_rows(
        rows: list[int], parts: int, rng: random.Random) -> None:
    split: list[list[int]] = [[] for _ in range(parts)]
    for ts in rows:
        split[rng.randrange(parts)].append(ts)
    assert merge_runs(runs_of(part) for part in split) == runs_of(rows)


@given(times)
def test_runs_end_at_row_times_and_hold_no_gap(rows: list[int]) -> None:
    runs = runs_of(rows)
    assert set(runs) <= set(rows)
    starts, ends = runs[::2], runs[1::2]
    assert all(s <= e for s, e in zip(starts, ends, strict=True))
    assert all(nxt - end > GAP_MS for end, nxt in zip(ends, starts[1:], strict=False))


@given(times, st.integers(1, 5), st.randoms(use_true_random=False))
def test_rows_one_by_one_or_runs_batch_by_batch_give_the_same_clock(
        rows: list[int], batches: int, rng: random.Random) -> None:
    ordered = sorted(rows)
    one_by_one = RowTimes()
    for ts in ordered:
        one_by_one.see(ts)
    cuts = sorted(rng.sample(range(len(ordered) + 1), min(batches, len(ordered) + 1)))
    by_runs = RowTimes()
    for start, end in zip([0, *cuts], [*cuts, len(ordered)], strict=True):
        by_runs.extend(runs_of(ordered[start:end]))
    assert one_by_one.state() == by_runs.state() == (
        max(rows, default=None), gaps_of(rows))


def test_an_occurrence_in_a_gap_is_noticed_at_its_end_and_one_near_a_row_on_time() -> None:
    clock = RowTimes()
    clock.extend(runs_of([0, 900, 1_800, 5_000, 5_400, 9_000]))
    assert clock.gaps == [1_800, 5_000, 5_400, 9_000]
    assert clock.frontier == 9_000
    assert clock.noticed_at(1_000) is None  # 800 ms before a row: continuous time
    assert clock.noticed_at(1_800) is None  # at a row
    assert clock.noticed_at(1_801) == 5_000
    assert clock.noticed_at(5_000) is None
    assert clock.noticed_at(8_999) == 9_000
    clock.forget_until(5_000)
    assert clock.gaps == [5_400, 9_000]
    assert clock.noticed_at(2_000) is None  # forgotten: decided already


@given(times, st.integers(-1, 31_000))
def test_an_occurrence_is_noticed_at_the_first_row_at_or_after_it_if_that_ends_a_gap(
        rows: list[int], ms: int) -> None:
    clock = RowTimes()
    clock.extend(runs_of(rows))
    after = [ts for ts in rows if ts >= ms]
    before = [ts for ts in rows if ts < ms]
    if after and before and min(after) != ms and min(after) - max(before) > GAP_MS:
        assert clock.noticed_at(ms) == min(after)
    else:
        assert clock.noticed_at(ms) is None


def test_exactly_a_second_without_a_row_is_not_a_gap() -> None:
    assert runs_of([0, GAP_MS]) == [0, GAP_MS]
    assert runs_of([0, GAP_MS + 1]) == [0, 0, GAP_MS + 1, GAP_MS + 1]


def test_saved_and_taken_back_it_is_the_same_clock() -> None:
    clock = RowTimes()
    clock.extend([0, 10, 5_000, 5_000])
    again = RowTimes(*clock.state())
    assert again.state() == clock.state() == (5_000, [10, 5_000])
    again.see(20_000)
    assert clock.gaps == [10, 5_000]  # a copy: the saved state does not move with it
