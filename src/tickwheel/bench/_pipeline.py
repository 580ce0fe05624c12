"""Pipeline benchmark: events/s of the Spark engine on local[1] and local[2] and of
the reference engine, on one generated log.

Each Spark run is a fresh process (a JVM takes its master once) on a fresh
checkpoint; its time is the query's, from start to the end of the input (the
session's start-up is not counted). The reference engine is the anchor.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tickwheel.pipeline.generator import GeneratorConfig, write_event_log
from tickwheel.pipeline.io import read_events
from tickwheel.pipeline.reference import ReferenceEngine

__all__ = ["PipelineResult", "run_pipeline"]

_SPARK_RUN = """
import json, sys, time
from pathlib import Path
from tickwheel.pipeline.spark_engine import SparkEngine, spark_session
log, work, master, shards, per_trigger = sys.argv[1:6]
spark = spark_session(master)
engine = SparkEngine(spark, Path(log), Path(work) / "out", Path(work) / "ckpt",
                     shards=int(shards), max_files_per_trigger=int(per_trigger))
result = engine.run()
print(json.dumps({"seconds": result.seconds, "rows": result.rows_in,
                  "batches": result.batches}))
"""


@dataclass(frozen=True)
class PipelineResult:
    engine: str
    rows: int
    seconds: list[float]

    @property
    def events_per_s(self) -> float:
        return self.rows / statistics.median(self.seconds)


def _reference(log: Path) -> tuple[int, float]:
    started = time.perf_counter()
    engine = ReferenceEngine()
    for row in read_events(log):
        engine.feed(row)
    result = engine.run()
    return result.rows_in, time.perf_counter() - started


def _spark(log: Path, master: str, shards: int, per_trigger: int) -> tuple[int, float, int]:
    work = Path(tempfile.mkdtemp(prefix="tickwheel-bench-spark-"))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SPARK_RUN, str(log), str(work), master, str(shards),
             str(per_trigger)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the Spark run on {master} failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return int(result["rows"]), float(result["seconds"]), int(result["batches"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_pipeline(events: int, repeat: int, shards: int, per_trigger: int,
                 progress: Callable[[str], None]) -> list[PipelineResult]:
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-log-") as tmp:
        log = Path(tmp) / "events"
        progress(f"generating {events:,} events")
        write_event_log(GeneratorConfig(events=events, rows_per_file=50_000), log)
        times: dict[str, list[float]] = {"reference": [], "spark local[1]": [],
                                         "spark local[2]": []}
        rows = 0
        for round_ in range(repeat):
            rows, seconds = _reference(log)
            times["reference"].append(seconds)
            progress(f"round {round_ + 1}: reference {rows / seconds:,.0f} events/s")
            for master in ("local[1]", "local[2]"):
                spark_rows, seconds, batches = _spark(log, master, shards, per_trigger)
                if spark_rows != rows:
                    raise RuntimeError(f"Spark read {spark_rows:,} rows of {rows:,}")
                times[f"spark {master}"].append(seconds)
                progress(f"round {round_ + 1}: spark {master} {rows / seconds:,.0f} events/s "
                         f"({batches} micro-batches)")
        return [PipelineResult(name, rows, seconds) for name, seconds in times.items()]
