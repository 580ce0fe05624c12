"""`make run`'s job (tickwheel.demo) runs end to end on a small workload: the timers'
part on the real clock, then both engines, which must agree, and the delivery."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.spark
@pytest.mark.realtime
@pytest.mark.slow
def test_the_main_job_runs_and_its_engines_agree(tmp_path: Path) -> None:
    output = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "tickwheel.demo", "--events", "3000",
                           "--output", str(output)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "every request was either answered or timed out exactly once" in out
    agreed = re.search(r"the Spark and local engines agree on all ([\d,]+) outcomes", out)
    assert agreed is not None and int(agreed[1].replace(",", "")) > 0, out
    assert re.search(r"delivered through the batching dispatcher: [\d,]+ outcomes in .*, "
                     r"0 undelivered", out), out
    assert "each acknowledged row is applied once, and each outcome reaches the webhook" in out
    plot = re.search(r"plot: (\S+\.png)", out)
    assert plot is not None and Path(plot[1]).is_file()
    assert Path(plot[1]) == output / "spark" / "report.png"
    assert {p.name for p in output.iterdir()} >= {"events", "local", "spark", "checkpoint"}


def test_a_workload_of_no_events_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "tickwheel.demo", "--events", "0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--events must be at least 1, got 0" in done.stderr


def test_an_output_directory_with_something_in_it_is_refused_before_any_work(
        tmp_path: Path) -> None:
    (tmp_path / "left-over").write_text("")
    done = subprocess.run([sys.executable, "-m", "tickwheel.demo", "--output", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert f"--output: {tmp_path} is not an empty directory" in done.stderr
    assert "tickwheel demo" not in done.stdout  # nothing ran


def test_the_schedules_part_goes_through_the_dst_weekend_and_the_stall(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tickwheel.demo import schedules

    schedules()
    out = capsys.readouterr().out
    assert "coupons on the hour, New York     48 fired,  1 skipped" in out  # 01:00 twice
    assert "tags every 15 minutes            193 fired,  0 skipped" in out
    assert "the 01:30 backup ran at: 11-01 01:30 EDT, 11-02 01:30 EST" in out


@pytest.mark.realtime
def test_the_service_part_loses_nothing_across_its_kill_9(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("aiohttp")
    from tickwheel.demo import HEARTBEAT_MS, ORDERS_AFTER, ORDERS_BEFORE, service

    service(tmp_path / "service")
    out = capsys.readouterr().out
    cancelled = ORDERS_BEFORE // 4
    heard = re.search(r"the webhook heard: (\d+) expired, (\d+) cancelled, (\d+) heartbeats "
                      rf"\({HEARTBEAT_MS} ms apart, 0 missing\)", out)
    assert heard is not None, out
    assert (int(heard[1]), int(heard[2])) == (ORDERS_BEFORE + ORDERS_AFTER - cancelled,
                                              cancelled)
    assert int(heard[3]) >= 8  # beats through the kill and the restart, none missing
    assert "(replayed=True) and not written twice" in out
