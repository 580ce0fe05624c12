"""Pending benchmark: what a micro-batch costs when the engine holds many pending
operations, against the same micro-batches with few: the Spark engine, and the local
engine in follow mode.

Two logs share the same small files, a micro-batch each (updates, watches that expire
in 5 s, cancels): *quiet* has only those; *busy* has before them one file of watches
whose deadlines lie far ahead, which stay pending throughout. One Spark session runs a
warm-up on the quiet log, then the busy log, then the quiet log again, each on a fresh
checkpoint; the quiet run is the anchor. A micro-batch's time is the time between the
ends of two micro-batches (the engine's progress callback), over the small files from
the third on. The local engine, in a process of its own, lands the files one at a time
in its input and runs a batch (``LocalFollowEngine.step``) for each, on the quiet log
and then the busy one; a batch's time is that call's.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PendingResult", "run_pending", "write_logs"]

_SPARK_RUN = """
import json, shutil, sys, time
from pathlib import Path
from tickwheel.pipeline.spark import SparkEngine, spark_session
quiet, busy, work, master, partitions = sys.argv[1:6]
spark = spark_session(master)
out = {}
for name, log in (("warm-up", quiet), ("busy", busy), ("quiet", quiet)):
    marks = []
    engine = SparkEngine(spark, Path(log), Path(work) / name / "out",
                         Path(work) / name / "ckpt", partitions=int(partitions),
                         max_files_per_trigger=1,
                         on_batch=lambda batch, outcomes, quarantined: marks.append(
                             time.monotonic()))
    result = engine.run()
    size = sum(f.stat().st_size for f in (Path(work) / name / "ckpt").rglob("*")
               if f.is_file())
    out[name] = {"batches": [b - a for a, b in zip(marks, marks[1:])],
                 "pending": result.pending, "state_bytes": result.state_bytes,
                 "checkpoint_bytes": size}
    shutil.rmtree(Path(work) / name, ignore_errors=True)
print(json.dumps(out))
"""


_LOCAL_RUN = """
import json, shutil, sys, time
from pathlib import Path
from tickwheel.pipeline.engines.follow import LocalFollowEngine
work = Path(sys.argv[1])
out = {}
for name in ("quiet", "busy"):
    inbox = work / name / "in"
    inbox.mkdir(parents=True)
    engine = LocalFollowEngine(inbox, work / name / "out")
    times = []
    for path in sorted(Path(sys.argv[2 if name == "quiet" else 3]).iterdir()):
        shutil.copy(path, inbox / path.name)
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    counts = engine.counts()
    size = sum(f.stat().st_size for f in (work / name / "out").rglob("*")
               if f.is_file() and "_checkpoint" in f.parts)
    out[name] = {"batches": times, "pending": counts.pending,
                 "state_bytes": counts.state_bytes, "checkpoint_bytes": size}
    shutil.rmtree(work / name, ignore_errors=True)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class PendingResult:
    engine: str
    log: str
    batch_seconds: list[float]  # the small files' micro-batches, the first two left out
    pending: int
    state_bytes: int
    checkpoint_bytes: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.batch_seconds)


def _line(row: dict[str, object]) -> str:
    return json.dumps(row, separators=(",", ":")) + "\n"


def write_logs(root: Path, pending: int, files: int, rows: int) -> tuple[Path, Path]:
    """The quiet and the busy log under ``root``."""
    quiet, busy = root / "quiet", root / "busy"
    quiet.mkdir(parents=True)
    busy.mkdir(parents=True)
    keys = 5_000
    start = 1_000_000
    with open(busy / "events-00000.jsonl", "w") as out:
        for i in range(pending):
            key = f"job/{i % keys}"
            out.write(_line({"ts_ms": start + i // 100, "type": "watch", "op_id": f"task-{i}",
                             "keys": [key], "deadline_ms": 10**12 + i,
                             "condition": "all_at_least", "targets": {key: 10**9}}))
    choose = random.Random(5)
    t = start + pending // 100 + 10
    for n in range(1, files + 1):
        lines = []
        for j in range(rows):
            t += 1
            r = choose.random()
            if r < 0.5:
                lines.append(_line({"ts_ms": t, "type": "update",
                                    "key": f"job/{choose.randrange(keys)}", "value": t}))
            elif r < 0.8:
                lines.append(_line({"ts_ms": t, "type": "watch", "op_id": f"new-{n}-{j}",
                                    "keys": [f"job/{choose.randrange(keys)}"],
                                    "deadline_ms": t + 5_000, "condition": "any_update"}))
            else:
                lines.append(_line({"ts_ms": t, "type": "cancel",
                                    "op_id": f"task-{choose.randrange(max(pending, 1))}"}))
        text = "".join(lines)
        for log in (quiet, busy):
            (log / f"events-{n:05d}.jsonl").write_text(text)
    return quiet, busy


def _run(script: str, args: list[str], what: str) -> dict[str, dict[str, object]]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {what} runs failed:\n{done.stderr[-3000:]}")
    runs: dict[str, dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return runs


def run_pending(pending: int, files: int, rows: int, partitions: int, master: str,
                engines: list[str], progress: Callable[[str], None]) -> list[PendingResult]:
    work = Path(tempfile.mkdtemp(prefix="tickwheel-bench-pending-"))
    results = []
    try:
        progress(f"writing the logs: {pending:,} pending watches, {files} files of "
                 f"{rows:,} rows")
        quiet, busy = write_logs(work / "logs", pending, files, rows)
        for engine in engines:
            if engine == "spark":
                progress(f"Spark {master}: a warm-up, the busy log, the quiet log")
                runs = _run(_SPARK_RUN, [str(quiet), str(busy), str(work / "runs"), master,
                                         str(partitions)], "Spark")
                # The same small files in both: the third on. The busy log's first
                # micro-batch is the pending file, and a run's first has no gap before it.
                skips = {"quiet": 1, "busy": 2}
            else:
                progress("local engine in follow mode: the quiet log, the busy log")
                runs = _run(_LOCAL_RUN, [str(work / "runs"), str(quiet), str(busy)], "local")
                skips = {"quiet": 2, "busy": 3}
            for name in ("quiet", "busy"):
                run: dict[str, Any] = runs[name]
                results.append(PendingResult(engine, name, run["batches"][skips[name]:],
                                             run["pending"], run["state_bytes"],
                                             run["checkpoint_bytes"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results
