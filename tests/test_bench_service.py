"""The service benchmark's tables: a row per engine and phase, the median over its
rounds, each round's p99 beside it, the ratio to the bare server's median p99, and the
CPU the hypervisor took in each round."""

from __future__ import annotations

import pytest

from benchmarks._service import PhaseResult, ack_table, service_table


def _round(engine: str, p99_ms: float, *, land_mean: float = 2.0,
           stolen: float | None = 0.0) -> PhaseResult:
    # 100 requests: 98 at 1 ms, then the two slowest set the p99 (index 99 of 100).
    latencies = [1.0] * 98 + [p99_ms, p99_ms]
    intake = {} if engine == "bare aiohttp" else {
        "ack_ms": {"count": 100, "mean": 4.0, "p99": 20},
        "commit_wait_ms": {"count": 100, "mean": 1.0, "p99": 5},
        "land_ms": {"count": 10, "mean": land_mean, "p99": 5}}
    return PhaseResult(engine, "single", 1, 100, rows_acked=100, seconds=1.0,
                       latency_ms=latencies, intake=intake, load_cpu_s=0.5, stolen=stolen)


def test_a_row_gives_the_median_of_its_rounds_and_each_rounds_p99() -> None:
    results = [_round("bare aiohttp", 2.0), _round("local", 10.0),
               _round("bare aiohttp", 200.0), _round("local", 90.0, stolen=0.125),
               _round("bare aiohttp", 4.0), _round("local", 30.0)]
    rows = service_table(results).splitlines()[2:]
    assert len(rows) == 2  # one row per engine and phase, not per round
    bare, local = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    assert bare[:2] == ["bare aiohttp", "single (1/request)"]
    # One stalled round moves its own p99, not the median.
    assert (bare[5], bare[6]) == ("4.0", "2.0, 200.0, 4.0")
    assert (local[5], local[6]) == ("30.0 (7.5x)", "10.0, 90.0, 30.0")
    assert local[8] == "50% of a core"
    # The round on a busy host says so.
    assert local[11] == "0.0%, 12.5%, 0.0%"


def test_the_time_table_gives_the_median_of_the_servers_histograms() -> None:
    results = [_round("local", 10.0, land_mean=2.0), _round("local", 10.0, land_mean=9.0),
               _round("local", 10.0, land_mean=3.0), _round("bare aiohttp", 1.0)]
    rows = ack_table(results).splitlines()[2:]
    assert len(rows) == 1  # the bare server has no histograms
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[2:] == ["10", "10.0", "4.0 (20)", "1.0 (5)", "3.0 (5)"]


@pytest.mark.parametrize("argv", [["--repeat", "0"], ["--phases", "burst"],
                                  ["--seconds", "-1"]])
def test_bad_arguments_are_refused_before_any_work(argv: list[str]) -> None:
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["service", *argv])
    assert stop.value.code == 2
