"""The Spark engine's read view: its workers send what each micro-batch changed, so the
service answers what it holds as the local engine's does, and a new run rebuilds it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("sortedcontainers")

from tests.pipeline.logs import LATENESS_MS
from tests.pipeline.spark_helpers import write_files
from tickwheel.pipeline.spark import SparkEngine
from tickwheel.service.view import StateView

pytestmark = pytest.mark.spark


def _rows(*rows: dict[str, Any]) -> list[str]:
    return [json.dumps(row) for row in rows]


FIRST = _rows(
    {"ts_ms": 1_000, "type": "schedule", "schedule_id": "daily-a", "cron": "0 9 * * *"},
    {"ts_ms": 1_000, "type": "schedule", "schedule_id": "daily-b", "cron": "0 9 * * *",
     "tz": "Asia/Tokyo"},
    {"ts_ms": 1_000, "type": "schedule", "schedule_id": "daily-c", "cron": "0 9 * * *"},
    {"ts_ms": 1_100, "type": "watch", "op_id": "w1", "keys": [], "deadline_ms": 1_500,
     "condition": "none"},
    {"ts_ms": 1_100, "type": "watch", "op_id": "w2", "keys": ["k2"],
     "deadline_ms": 10**12, "condition": "any_update"},
    {"ts_ms": 1_100, "type": "watch", "op_id": "w3", "keys": ["k3"],
     "deadline_ms": 10**12, "condition": "any_update"},
    {"ts_ms": 1_200, "type": "update", "key": "k3", "value": 1},
    {"ts_ms": 2_000, "type": "pause", "schedule_id": "daily-b"},
    {"ts_ms": 2_500, "type": "unschedule", "schedule_id": "daily-c"},
    {"ts_ms": 5_000, "type": "tick"})


def _engine(spark: Any, tmp_path: Path, view: StateView) -> SparkEngine:
    return SparkEngine(spark, tmp_path / "in", tmp_path / "out", tmp_path / "ckpt",
                       lateness_ms=LATENESS_MS, partitions=3, on_commit=view.apply)


def test_the_spark_engine_keeps_a_view_of_what_it_holds(spark: Any, tmp_path: Path) -> None:
    write_files(FIRST, tmp_path / "in", files=2)
    view = StateView()
    _engine(spark, tmp_path, view).run(final=False)
    assert [(s.schedule_id, s.state) for s in view.page().schedules] == [
        ("daily-a", "running"), ("daily-b", "paused")]
    daily = view.schedule("daily-a")
    assert daily is not None and daily.next_fire_ms == 9 * 3_600_000
    assert daily.upcoming is not None and len(daily.upcoming) == 5
    pending = view.operation("w2")
    assert pending is not None and pending.keys == ("k2",)
    expired, completed = view.operation("w1"), view.operation("w3")
    assert expired is not None and (expired.outcome, expired.resolved_ms) == ("expired", 1_500)
    assert completed is not None and completed.outcome == "completed"
    assert view.as_of_ms == 5_000 - LATENESS_MS - 1
    assert view.stats().pending == 1


def test_a_new_run_on_the_checkpoint_gives_a_new_view_everything_held(
        spark: Any, tmp_path: Path) -> None:
    write_files(FIRST, tmp_path / "in", files=2)
    _engine(spark, tmp_path, StateView()).run(final=False)
    write_files(_rows({"ts_ms": 6_000, "type": "watch", "op_id": "w4", "keys": [],
                       "deadline_ms": 10**12, "condition": "none"},
                      {"ts_ms": 9_000, "type": "tick"}), tmp_path / "in", files=1, start=2)
    again = StateView()
    # The same session: its workers still keep the partitions they ran, which this
    # view has not had.
    _engine(spark, tmp_path, again).run(final=False)
    assert [s.schedule_id for s in again.page().schedules] == ["daily-a", "daily-b"]
    assert again.operation("w2") is not None and again.operation("w4") is not None
    assert again.stats().pending == 2
