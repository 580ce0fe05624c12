"""Pipeline benchmark: events/s of the Spark engine on local[1] and local[2] and of
the reference engine, on one generated log.

Each Spark master gets a fresh process (a JVM takes its master once) that runs the
engine twice over the whole log, each time on a fresh checkpoint: *cold* is the
session's first query, which also pays for the JVM's warm-up (code generation, JIT),
for the session state Spark builds on first use (SQL parser, function registry) and
for starting the Python workers; *warm* is the second, as a long-running job sees
it. A run's time is the query's, from start to the end of the input (the
session's own start-up is not counted). The reference engine is the anchor.
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

from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.io.log_reader import read_wire
from tickwheel.pipeline.tools.generator import GeneratorConfig, write_event_log

__all__ = ["PipelineResult", "run_pipeline"]

_SPARK_RUN = """
import json, sys, time
from pathlib import Path
from tickwheel.pipeline.spark import SparkEngine, spark_session
log, work, master, partitions, per_trigger = sys.argv[1:6]
spark = spark_session(master)
runs = {}
for name in ("cold", "warm"):
    engine = SparkEngine(spark, Path(log), Path(work) / name / "out",
                         Path(work) / name / "ckpt", partitions=int(partitions),
                         max_files_per_trigger=int(per_trigger) or None)
    result = engine.run()
    runs[name] = {"seconds": result.seconds, "rows": result.rows_in,
                  "batches": result.batches}
print(json.dumps(runs))
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
    for row in read_wire(log):
        engine.feed_wire(row)
    result = engine.run()
    return result.rows_in, time.perf_counter() - started


def _spark(log: Path, master: str, partitions: int, per_trigger: int | None,
           ) -> dict[str, tuple[int, float, int]]:
    """``{"cold": (rows, seconds, micro-batches), "warm": (...)}``; ``per_trigger``
    None leaves the engine's default (all the input in one micro-batch)."""
    work = Path(tempfile.mkdtemp(prefix="tickwheel-bench-spark-"))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SPARK_RUN, str(log), str(work), master, str(partitions),
             str(per_trigger or 0)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the Spark run on {master} failed:\n{done.stderr[-3000:]}")
        runs = json.loads(done.stdout.strip().splitlines()[-1])
        return {name: (int(r["rows"]), float(r["seconds"]), int(r["batches"]))
                for name, r in runs.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _micro_batches(count: int) -> str:
    return f"{count} micro-batch" if count == 1 else f"{count} micro-batches"


def run_pipeline(events: int, repeat: int, partitions: int, per_trigger: int | None,
                 progress: Callable[[str], None]) -> list[PipelineResult]:
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-log-") as tmp:
        log = Path(tmp) / "events"
        progress(f"generating {events:,} events")
        write_event_log(GeneratorConfig(events=events, rows_per_file=50_000), log)
        times: dict[str, list[float]] = {"reference": []}
        rows = 0
        for round_ in range(repeat):
            rows, seconds = _reference(log)
            times["reference"].append(seconds)
            progress(f"round {round_ + 1}: reference {rows / seconds:,.0f} events/s")
            for master in ("local[1]", "local[2]"):
                for name, (spark_rows, seconds, batches) in _spark(
                        log, master, partitions, per_trigger).items():
                    if spark_rows != rows:
                        raise RuntimeError(f"Spark read {spark_rows:,} rows of {rows:,}")
                    times.setdefault(f"spark {master} {name}", []).append(seconds)
                    progress(f"round {round_ + 1}: spark {master} {name} "
                             f"{rows / seconds:,.0f} events/s ({_micro_batches(batches)})")
        return [PipelineResult(name, rows, seconds) for name, seconds in times.items()]


# The engine and a trivial query at each partition count, in one session on local[2]:
# each runs twice on a fresh checkpoint, and the second (warm) run counts. The trivial
# query reads the same files, groups the rows into as many partitions and only counts
# them in a transformWithStateInPandas processor: Spark's own cost of partitions.
_PARTITIONS_RUN = """
import json, sys, time
from pathlib import Path
import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from tickwheel.pipeline.spark import SparkEngine, spark_session

class Count(StatefulProcessor):
    def init(self, handle):
        self.n = handle.getValueState("n", "n long")
    def handleInputRows(self, key, rows, timerValues):
        seen = sum(len(frame) for frame in rows)
        total = (self.n.get()[0] if self.n.exists() else 0) + seen
        self.n.update((total,))
        yield pd.DataFrame({"grp": [key[0]], "n": [total]})
    def close(self):
        pass

log, work, counts = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
spark = spark_session("local[2]")
out = {}
for count in counts:
    for name in ("cold", "warm"):
        engine = SparkEngine(spark, log, work / f"e{count}{name}" / "out",
                             work / f"e{count}{name}" / "ckpt", partitions=count)
        result = engine.run()
        out[f"engine {count} {name}"] = (result.rows_in, result.seconds)
    spark.conf.set("spark.sql.shuffle.partitions", str(count))
    for name in ("cold", "warm"):
        started = time.perf_counter()
        rows = (spark.readStream.text(str(log))
                .select(F.pmod(F.hash("value"), F.lit(count)).alias("grp"))
                .groupBy("grp")
                .transformWithStateInPandas(Count(), "grp int, n long", "Update", "None"))
        counted = []
        query = (rows.writeStream.trigger(availableNow=True)
                 .option("checkpointLocation", str(work / f"t{count}{name}"))
                 .foreachBatch(lambda frame, _: counted.append(frame.agg(F.sum("n")).first()[0]))
                 .start())
        query.awaitTermination()
        out[f"trivial {count} {name}"] = (int(sum(c or 0 for c in counted)),
                                          time.perf_counter() - started)
print(json.dumps(out))
"""


def run_partition_costs(events: int, counts: list[int], progress: Callable[[str], None],
                        ) -> dict[str, tuple[int, float]]:
    """Warm and cold events/s of the engine and of the trivial query on local[2] at each
    partition count: ``{"engine 2 warm": (rows, seconds), ...}``."""
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-partitions-") as tmp:
        log = Path(tmp) / "events"
        progress(f"generating {events:,} events")
        write_event_log(GeneratorConfig(events=events, rows_per_file=50_000), log)
        progress(f"Spark local[2]: the engine and a trivial query at {counts} partitions")
        done = subprocess.run([sys.executable, "-c", _PARTITIONS_RUN, str(log), tmp,
                               json.dumps(counts)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the Spark runs failed:\n{done.stderr[-3000:]}")
        runs = json.loads(done.stdout.strip().splitlines()[-1])
        return {name: (int(rows), float(seconds)) for name, (rows, seconds) in runs.items()}
