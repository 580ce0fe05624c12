"""The read benchmark's account of the machine: the CPU a hypervisor took while each
read ran, and the tail of the reads it left alone."""

from __future__ import annotations

from pathlib import Path

from benchmarks._reads import ReadResult, _charge_steal, read_table
from benchmarks._steal import StealSample, StealSampler, read_steal


def _sampler(*samples: tuple[float, int, int]) -> StealSampler:
    sampler = StealSampler()
    sampler.samples.extend(StealSample(*sample) for sample in samples)
    return sampler


def test_the_share_stolen_is_taken_between_the_samples_around_a_span() -> None:
    sampler = _sampler((10.0, 0, 0), (10.1, 0, 20), (10.2, 15, 40), (10.3, 15, 60))
    assert sampler.share() == 15 / 60
    assert sampler.share(10.12, 10.18) == 15 / 20  # from 10.1 to 10.2
    assert sampler.share(10.0, 10.1) == 0.0
    assert sampler.share(10.25, 11.0) == 0.0  # from 10.2 to the last sample


def test_a_stat_file_gives_its_steal_and_all_its_time_or_nothing(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 2 30 800 5 0 1 40 0 0\ncpu0 50 1 15 400 2 0 0 20 0 0\n")
    assert read_steal(stat) == (40, 978)
    for bad in ("cpu  100 2 30 800\n", "cpu  1 2 3 4 5 6 7 x 0 0\n", "intr 1 2 3\n", ""):
        stat.write_text(bad)
        assert read_steal(stat) is None, bad
    assert read_steal(tmp_path / "missing") is None


def test_nothing_is_measured_without_two_samples() -> None:
    assert _sampler().share() is None
    assert _sampler((1.0, 0, 10)).share() is None
    assert not _sampler((1.0, 0, 10)).available


def _result(stolen: float | None) -> ReadResult:
    result = ReadResult(1_000, 2_000, 120.0, rows_acked=120_000, load_seconds=60.0,
                        view_bytes=240.0, dict_bytes=256.0)
    result.page_ms = [5.0] * 98 + [6.0, 400.0]
    result.page_at = [100.0 + i for i in range(100)]
    result.status_ms = [9.0] * 99 + [700.0]
    result.status_at = [100.5 + i for i in range(100)]
    if stolen is not None:
        result.stolen = stolen
        calm: list[float | None] = [0.0] * 99
        result.page_stolen = [*calm, 0.4]
        result.status_stolen = [*calm, 0.5]
        result.minute_stolen = [0.0, 0.025]
    return result


def test_the_table_gives_the_tail_without_the_reads_a_busy_host_held_up() -> None:
    table = read_table(_result(0.012))
    assert "| `GET /v1/schedules?limit=100&cursor=...` | 5.0 | 400.0 | 0.57x |" in table
    assert "took 1.2% of the machine's CPU" in table
    assert "1 pages ran while it took over 10%" in table
    assert "Without those reads: page p99 6.0 ms, status p99 9.0 ms" in table
    assert "400 ms at :19.0 (40% stolen)" in table
    assert "each minute of the run: 5 (0.0% stolen), 400 (2.5% stolen)" in table


def test_the_table_says_when_the_machine_was_not_measured() -> None:
    table = read_table(_result(None))
    assert "was not measured" in table and "Without those reads" not in table


def test_each_read_and_each_minute_is_charged_the_steal_around_it() -> None:
    # Steal only between 130 s and 131 s: the read then, and the first minute.
    sampler = _sampler((100.0, 0, 0), (130.0, 0, 3_000), (131.0, 50, 3_100),
                       (230.0, 50, 13_000))
    result = ReadResult(1_000, 2_000, 120.0)
    result.page_ms, result.page_at = [5.0, 500.0, 5.0], [101.0, 130.9, 200.0]
    result.status_ms, result.status_at = [5.0, 5.0, 5.0], [101.0, 131.0, 200.0]
    _charge_steal(result, sampler)
    assert result.page_stolen == [0.0, 0.5, 0.0]
    assert result.minute_stolen == [50 / 13_000, 0.0]  # the samples around each minute
