"""Recurring schedules held by the engines in follow mode: state, latency, catch-up.

- **State**: N ``schedule`` rows (the next-occurrence mix: half intervals of 1 s to
  1 h, half cron in 20 zones) applied by the local follow engine on event time; the
  memory they hold, counted by tracemalloc from before the batch to after it, per
  schedule, and the checkpoint's bytes per schedule.
- **Latency**: ``tickwheel run --follow --clock wall`` in a process of its own, with
  schedules that fire ``rate`` occurrences a second (each every second, their anchors
  spread over the second); a fired row's delay is its batch file's modification time
  less the occurrence's fire time.
- **Catch-up**: N hourly schedules (``every_ms`` one hour) on the local follow engine
  and a wall clock that jumps six hours, as a service restarted after an outage; the
  time from the jump until the catch-up's last batch, and the fired and skipped counts,
  for ``misfire`` ``latest`` and ``all``; then the same in event time (a log whose next
  rows come six hours later), there and on the Spark engine in follow mode.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._follow import BatchFileReader
from benchmarks._schedules import CRON_SPECS, ZONES

__all__ = ["CatchupRun", "LatencyRun", "StateRun", "catchup", "engine_table", "latency",
           "state"]

HOUR_MS = 3_600_000
#: 2026-01-01T00:30Z: the schedules start half an hour into an hour.
START_MS = 1_767_227_400_000


@dataclass(frozen=True, slots=True)
class StateRun:
    schedules: int
    bytes_per_schedule: float
    checkpoint_bytes_per_schedule: float
    seconds: float
    payload_bytes: int = 0  # each schedule's payload, as JSON text


@dataclass(slots=True)
class LatencyRun:
    engine: str
    rate: int
    lateness_ms: int
    delays_ms: list[int] = field(default_factory=list)

    def quantile(self, q: float) -> int:
        ordered = sorted(self.delays_ms)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True, slots=True)
class CatchupRun:
    misfire: str
    schedules: int
    fired: int
    skipped: int
    batches: int
    seconds: float
    event_time: bool = False  # a gap of six hours in the log, not a wall clock's jump
    engine: str = "local follow"


def _land(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.rename(path)


def _payload(i: int, size: int) -> dict[str, object]:
    """A payload of ``size`` bytes of JSON text, its own to schedule ``i``."""
    head = {"job": i, "note": ""}
    pad = size - len(json.dumps(head, separators=(",", ":")))
    return {"job": i, "note": "x" * max(0, pad)}


def _mixed_rows(n: int, ts: int, seed: int = 7, payload_bytes: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        spec: dict[str, object]
        if i % 2 == 0:
            spec = {"every_ms": rng.randint(1, 3_600) * 1_000}
        else:
            spec = {"cron": rng.choice(CRON_SPECS), "tz": rng.choice(ZONES)}
        if payload_bytes:
            spec["payload"] = _payload(i, payload_bytes)
        rows.append(json.dumps({"ts_ms": ts, "type": "schedule", "schedule_id": f"job-{i}",
                                **spec}, separators=(",", ":")))
    return rows


def state(n: int, progress: Callable[[str], None], payload_bytes: int = 0) -> StateRun:
    """The memory and checkpoint of ``n`` schedules, each with a payload of
    ``payload_bytes`` (0: none)."""
    from tickwheel.pipeline.engines.follow import LocalFollowEngine

    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-schedules-") as tmp:
        inbox = Path(tmp) / "in"
        inbox.mkdir()
        _land(inbox / "a.jsonl", [*_mixed_rows(n, START_MS, payload_bytes=payload_bytes),
                                  json.dumps({"ts_ms": START_MS + 2, "type": "tick"})])
        engine = LocalFollowEngine(inbox, Path(tmp) / "out", lateness_ms=0,
                                   max_bytes_per_batch=1 << 40)
        # A batch of one schedule first: what the first batch imports (pyarrow, for
        # the outputs) is not what the schedules hold.
        warm = Path(tmp) / "warm"
        warm.mkdir()
        _land(warm / "a.jsonl", [*_mixed_rows(1, START_MS),
                                 json.dumps({"ts_ms": START_MS + 2, "type": "tick"})])
        with LocalFollowEngine(warm, Path(tmp) / "warm-out", lateness_ms=0) as first:
            first.step()
        progress(f"state: applying {n:,} schedule rows under tracemalloc ...")
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - started
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        counts = engine.counts()
        assert counts.schedules == n, counts
        engine.close()
    return StateRun(n, held / n, counts.state_bytes / n, seconds, payload_bytes)


class _Delays(BatchFileReader):
    """Each fire's delay, from ``from_ms`` on."""

    def __init__(self, outcomes: Path, run: LatencyRun, from_ms: int) -> None:
        super().__init__(outcomes, every_s=0.2)
        self.run_, self.from_ms = run, from_ms

    def take(self, written_ms: int, outcome: str, resolved_ms: int) -> None:
        if outcome == "fired" and resolved_ms >= self.from_ms:
            self.run_.delays_ms.append(written_ms - resolved_ms)


def latency(engine: str, rate: int, seconds: float, lateness_ms: int, master: str,
            progress: Callable[[str], None]) -> LatencyRun:
    run = LatencyRun(engine, rate, lateness_ms)
    now = time.time_ns() // 1_000_000
    rows = [json.dumps({"ts_ms": now, "type": "schedule", "schedule_id": f"tick-{i}",
                        "every_ms": 1_000, "anchor_ms": i * 1_000 // rate},
                       separators=(",", ":")) for i in range(rate)]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-schedules-") as tmp:
        inbox, output = Path(tmp) / "in", Path(tmp) / "out"
        inbox.mkdir()
        _land(inbox / "schedules.jsonl", rows)
        command = [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--clock",
                   "wall", "--engine", engine, "--input", str(inbox), "--output",
                   str(output), "--lateness-ms", str(lateness_ms), "--trigger-ms", "1000"]
        if engine == "spark":
            command += ["--master", master]
        log_path = Path(tmp) / "engine.log"
        with open(log_path, "w") as log_file:
            service = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                       env=env)
            try:
                deadline = time.monotonic() + 300
                while not list((output / "outcomes").glob("batch-*.parquet")):
                    if service.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the {engine} engine did not start: "
                                           f"{log_path.read_text()[-3000:]}")
                    time.sleep(0.2)
                # Measured from a few seconds after the first fires: start-up is not delay.
                from_ms = time.time_ns() // 1_000_000 + 5_000
                delays = _Delays(output / "outcomes", run, from_ms)
                delays.start()
                progress(f"latency, {engine}: {rate:,} fires a second for {seconds:.0f} s")
                time.sleep(5 + seconds)
                delays.stop.set()
                delays.join()
            finally:
                service.send_signal(signal.SIGTERM)
                try:
                    service.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    service.kill()
                    service.wait()
    if not run.delays_ms:
        raise RuntimeError(f"the {engine} engine fired nothing in {seconds:.0f} s")
    return run


class _Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def _tick(ts: int) -> str:
    return json.dumps({"ts_ms": ts, "type": "tick"}, separators=(",", ":"))


def _hourly(n: int, misfire: str) -> list[str]:
    """The catch-up's log before its gap: N hourly schedules, then a tick."""
    return [*(json.dumps({"ts_ms": START_MS, "type": "schedule", "schedule_id": f"hourly-{i}",
                          "every_ms": HOUR_MS, "misfire": misfire}, separators=(",", ":"))
              for i in range(n)), _tick(START_MS + 1_000)]


def _six_hours_later() -> list[str]:
    """The log's rows after its gap; the second tick moves time past the first."""
    return [_tick(START_MS + 6 * HOUR_MS), _tick(START_MS + 6 * HOUR_MS + 1_000)]


def catchup(n: int, misfire: str, progress: Callable[[str], None],
            event_time: bool = False) -> CatchupRun:
    """On the wall clock, a clock that jumps six hours; in event time, a log whose
    next rows come six hours later."""
    from tickwheel.pipeline.engines.follow import LocalFollowEngine
    from tickwheel.pipeline.io.outputs import count_outputs

    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-schedules-") as tmp:
        inbox, output = Path(tmp) / "in", Path(tmp) / "out"
        inbox.mkdir()
        _land(inbox / "a.jsonl", _hourly(n, misfire))
        clock = None if event_time else _Clock(START_MS)
        engine = LocalFollowEngine(inbox, output, lateness_ms=100, clock=clock,
                                   max_bytes_per_batch=1 << 40)
        progress(f"catch-up, {misfire}: applying {n:,} hourly schedules ...")
        if clock is not None:
            clock.ms = START_MS + 1_000
        engine.step()
        if clock is not None:
            clock.ms = START_MS + 6 * HOUR_MS  # six hours without a reading
            progress(f"catch-up, {misfire}: the clock jumps six hours")
        else:
            _land(inbox / "b.jsonl", _six_hours_later())
            progress(f"catch-up, {misfire}: the log's next rows come six hours later")
        started = time.perf_counter()
        batches = 0
        while engine.step() is not None:
            batches += 1
        seconds = time.perf_counter() - started
        counts = engine.counts()
        engine.close()
        fired = count_outputs(output / "outcomes", "outcome").get("fired", 0)
    return CatchupRun(misfire, n, fired, counts.skipped, batches, seconds, event_time)


def spark_catchup(n: int, misfire: str, master: str, progress: Callable[[str], None],
                  ) -> CatchupRun:
    """In event time on the Spark engine in follow mode: a log whose next rows come six
    hours later, timed from their landing to the micro-batch that ends the catch-up
    (the driver starts the micro-batches after the first without input)."""
    import threading

    from tickwheel.pipeline.io.outputs import count_outputs
    from tickwheel.pipeline.spark import SparkEngine, spark_session

    spark = spark_session(master, app_name="tickwheel-bench-catchup", driver_memory="4g")
    try:
        with tempfile.TemporaryDirectory(prefix="tickwheel-bench-schedules-") as tmp:
            inbox = Path(tmp) / "in"
            inbox.mkdir()
            _land(inbox / "a.jsonl", _hourly(n, misfire))
            batches: list[tuple[float, int]] = []  # (when it ended, its outcomes)
            stop = threading.Event()
            engine = SparkEngine(spark, inbox, Path(tmp) / "out", Path(tmp) / "ck",
                                 lateness_ms=100,
                                 on_batch=lambda _b, outcomes, _q: batches.append(
                                     (time.perf_counter(), outcomes)))
            runner = threading.Thread(target=lambda: engine.follow(stop, trigger_ms=500))
            progress(f"catch-up on Spark, {misfire}: applying {n:,} hourly schedules ...")
            runner.start()
            try:
                while not batches and runner.is_alive():
                    time.sleep(0.2)
                first = len(batches)
                _land(inbox / "b.jsonl", _six_hours_later())
                progress(f"catch-up on Spark, {misfire}: the log's next rows come six "
                         "hours later")
                started = time.perf_counter()
                expected = n * (6 if misfire == "all" else 1)
                while (sum(o for _, o in batches[first:]) < expected and runner.is_alive()
                       and time.perf_counter() - started < 3_600):
                    time.sleep(0.2)
            finally:
                stop.set()
                runner.join()
            after = batches[first:]
            if sum(o for _, o in after) < expected:
                raise RuntimeError(f"the Spark catch-up gave {sum(o for _, o in after):,} "
                                   f"outcomes of {expected:,}")
            fired = count_outputs(Path(tmp) / "out" / "outcomes", "outcome").get("fired", 0)
            return CatchupRun(misfire, n, fired, engine.result().skipped,
                              sum(1 for _, o in after if o), after[-1][0] - started, True,
                              f"Spark `{master}`")
    finally:
        spark.stop()


def engine_table(states: list[StateRun], latencies: list[LatencyRun],
                 catchups: list[CatchupRun]) -> str:
    lines = ["| workload | engine | N | result |", "|---|---|---:|---|"]
    for s in states:
        what = (f"with a {s.payload_bytes}-byte payload" if s.payload_bytes
                 else "without a payload")
        lines.append(f"| state: schedules held, {what} | local follow | {s.schedules:,} | "
                     f"{s.bytes_per_schedule:,.0f} B of memory and "
                     f"{s.checkpoint_bytes_per_schedule:,.0f} B of checkpoint per schedule "
                     f"(applied in {s.seconds:,.1f} s) |")
    for r in latencies:
        lines.append(f"| latency: output time - fire time, `--lateness-ms "
                     f"{r.lateness_ms}` | {r.engine} | {r.rate:,}/s | p50 "
                     f"{r.quantile(0.5):,} ms, p99 {r.quantile(0.99):,} ms, max "
                     f"{max(r.delays_ms):,} ms ({len(r.delays_ms):,} fires) |")
    for c in catchups:
        what = "a 6 h gap in the log" if c.event_time else "a 6 h outage (wall clock)"
        lines.append(f"| catch-up after {what}, `misfire={c.misfire}` | {c.engine} | "
                     f"{c.schedules:,} | {c.fired:,} fired, {c.skipped:,} skipped, in "
                     f"{c.seconds:,.1f} s ({c.batches} batches) |")
    return "\n".join(lines)

