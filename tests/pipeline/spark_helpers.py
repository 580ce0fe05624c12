"""What the Spark tests share: input files written as they would land, the reference
engine's outcomes for a directory, and a run's outputs read back in one sorted form."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.pipeline.logs import LATENESS_MS
from tickwheel.pipeline.engines.reference import ReferenceEngine, RunResult
from tickwheel.pipeline.io.log_reader import read_events
from tickwheel.pipeline.io.outputs import read_parquet_rows

__all__ = ["committed_batches", "expected_outcomes", "expected_quarantine", "outcomes_of",
           "quarantine_of", "reference", "spark_rows_in", "write_files"]


def write_files(lines: list[str], directory: Path, files: int, start: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    size = -(-len(lines) // files)
    now = time.time()
    for i in range(files):
        part = lines[i * size:(i + 1) * size]
        path = directory / f"events-{start + i:05d}.jsonl"
        path.write_text("\n".join(part) + "\n")
        # Spark's file source reads files in modification-time order, as they appeared.
        os.utime(path, (now + start + i, now + start + i))


def reference(directory: Path, dedupe_retention_ms: int | None = None) -> RunResult:
    engine = ReferenceEngine(lateness_ms=LATENESS_MS, dedupe_retention_ms=dedupe_retention_ms)
    for row in read_events(directory):
        engine.feed(row)
    return engine.run()


def outcomes_of(output: Path) -> list[tuple[Any, ...]]:
    rows = read_parquet_rows(output / "outcomes")
    return sorted((r["op_id"], r["outcome"], r["resolved_ms"], r["latency_ms"],
                   tuple(r["keys"]), r["error"], r["skipped"]) for r in rows)


def quarantine_of(output: Path) -> list[tuple[Any, ...]]:
    return sorted((r["reason"], r["raw"], r["ts_ms"])
                  for r in read_parquet_rows(output / "quarantine"))


def expected_outcomes(result: RunResult) -> list[tuple[Any, ...]]:
    return sorted((o.op_id, o.outcome.value, o.resolved_ms, o.latency_ms, o.keys, o.error,
                   o.skipped) for o in result.outcomes)


def expected_quarantine(result: RunResult) -> list[tuple[Any, ...]]:
    return sorted((q.reason.value, q.raw, q.ts_ms) for q in result.quarantine)


def spark_rows_in(output: Path) -> int:
    statuses = output / "_checkpoint" / "status"
    if not statuses.is_dir():
        return 0
    latest: dict[tuple[str, int], tuple[int, int]] = {}
    for path in sorted(statuses.glob("batch-*.parquet")):
        with contextlib.suppress(OSError):
            for text in pq.read_table(path)["status"].to_pylist():
                status = json.loads(text)
                key = (status["stage"], status["partition"])
                if key not in latest or status["seq"] >= latest[key][0]:
                    latest[key] = (status["seq"], status["rows_in"])
    return sum(rows for _, rows in latest.values())


def committed_batches(checkpoint: Path) -> int:
    """The micro-batches Spark has committed in the query under ``checkpoint``."""
    commits = checkpoint / "query" / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.is_dir() else 0
