"""Follow-mode benchmark: the live workload (``tickwheel generate --follow``) and one
engine at a time in follow mode on the wall clock, each in a process of its own, as a
user runs them.

For each engine, a fresh input, output and checkpoint; the workload starts once the
engine has run its first batch, then ``minutes`` of running:

- every outcome's delay: the wall time its batch file was written (the file's mtime)
  less its deadline for an expiry (the scheduler's promise), or less ``resolved_ms``
  for a completion, an error or a cancel (when the row that resolved it was stamped);
- at each minute, from the engine's metrics endpoint (on loopback) and ``/proc``: the
  operations pending, the rows held, how far time stands behind the wall clock, the
  state's size as the engine last saved it and the checkpoint's size on disk (which
  adds what the store retains of earlier versions), and the resident memory of the
  engine's process, of Spark's JVM and of Spark's Python workers (the engine's other
  descendants);
- the micro-batches' backlog: how far behind the wall clock the last batch's clock
  stands at the end (a growing backlog shows as a growing lag).

Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BatchFileReader", "FollowRun", "follow_table", "run_follow"]


@dataclass
class Minute:
    minute: int
    pending: float
    held: float
    lag_ms: float
    state_mb: float
    checkpoint_mb: float
    engine_rss_mb: float
    jvm_rss_mb: float
    workers_rss_mb: float
    #: CPU seconds the service's processes used in this minute (children they reaped
    #: included): what a batch costs, where delays hide it below the trigger.
    cpu_s: float = float("nan")


@dataclass
class FollowRun:
    engine: str
    rate: int
    expiry_ms: list[int] = field(default_factory=list)
    #: When each expiry's file was written (wall ms), beside its delay: delays by minute.
    expiry_written_ms: list[int] = field(default_factory=list)
    completion_ms: list[int] = field(default_factory=list)
    started_ms: int = 0  # when the workload started (wall ms)
    minutes: list[Minute] = field(default_factory=list)
    rows: int = 0
    exit_code: int | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds used by these processes and the children they reaped."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(f"/proc/{pid}/stat").read_text()
            fields = text[text.rindex(")") + 2:].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def _is_jvm(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        # A process's children are listed by the thread that started each: the JVM
        # starts its Python workers from threads other than its main one.
        children: list[int] = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                with contextlib.suppress(OSError):
                    children += map(int, (task / "children").read_text().split())
        for child in children:
            found.append(child)
            todo.append(child)
    return found


def _du_mb(directory: Path) -> float:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # a file replaced while we walk
                total += (Path(root) / name).stat().st_size
    return total / 1e6


def _scrape(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            text = page.read().decode()
    except OSError:
        return {}
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tickwheel_pipeline_") and "{" in line:
            name = line[len("tickwheel_pipeline_"):line.index("{")]
            values[name] = float(line.rsplit(" ", 1)[1])
    return values


class BatchFileReader(threading.Thread):
    """Reads each batch file of outcomes once, soon after it is written and before a
    compaction merges it (which would lose its modification time), and hands each
    outcome to :meth:`take` with the time its file was written."""

    def __init__(self, outcomes: Path, every_s: float = 0.5) -> None:
        super().__init__(name="bench-batch-files", daemon=True)
        self.outcomes, self.every_s = outcomes, every_s
        self.stop = threading.Event()
        self.read: set[str] = set()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.poll()
        self.poll()

    def poll(self) -> None:
        import pyarrow.parquet as pq

        for path in sorted(self.outcomes.glob("batch-*.parquet")):
            if path.name in self.read:
                continue
            try:
                written_ms = path.stat().st_mtime_ns // 1_000_000
                table = pq.read_table(path, columns=["outcome", "resolved_ms"]).to_pydict()
            except OSError:
                continue  # merged away meanwhile
            self.read.add(path.name)
            for outcome, resolved in zip(table["outcome"], table["resolved_ms"], strict=True):
                self.take(written_ms, outcome, resolved)

    def take(self, written_ms: int, outcome: str, resolved_ms: int) -> None:
        raise NotImplementedError


class _Delays(BatchFileReader):
    def __init__(self, outcomes: Path, run: FollowRun) -> None:
        super().__init__(outcomes)
        self.run_ = run

    def take(self, written_ms: int, outcome: str, resolved_ms: int) -> None:
        if outcome == "expired":
            self.run_.expiry_ms.append(written_ms - resolved_ms)
            self.run_.expiry_written_ms.append(written_ms)
        else:
            self.run_.completion_ms.append(written_ms - resolved_ms)


def run_follow(engine: str, rate: int, minutes: float, lateness_ms: int, trigger_ms: int,
               master: str, progress: Callable[[str], None],
               driver_memory: str | None = None, worker_cache: bool = True,
               dedupe_retention_ms: int | None = None) -> FollowRun:
    run = FollowRun(engine if worker_cache else f"{engine}, no worker cache", rate)
    cli = [sys.executable, "-m", "tickwheel.cli"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-follow-") as tmp:
        inbox, output = Path(tmp) / "in", Path(tmp) / "out"
        inbox.mkdir()
        port = _free_port()
        command = [*cli, "run", "--follow", "--clock", "wall", "--engine", engine,
                   "--input", str(inbox), "--output", str(output),
                   "--lateness-ms", str(lateness_ms), "--trigger-ms", str(trigger_ms),
                   "--metrics-port", str(port)]
        if dedupe_retention_ms is not None:
            command += ["--dedupe-retention-ms", str(dedupe_retention_ms)]
        if engine == "spark":
            command += ["--master", master]
            if driver_memory is not None:
                command += ["--driver-memory", driver_memory]
            if not worker_cache:
                command.append("--no-worker-cache")
        log_path = Path(tmp) / "engine.log"
        with open(log_path, "w") as log_file:
            service = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                       env=env)
            # The engine first: the workload starts once it has run its first batch (a
            # service's readiness), so start-up is not counted as delay.
            deadline = time.monotonic() + 300
            while (_scrape(port).get("batches", 0) < 1
                   and time.monotonic() < deadline):
                if service.poll() is not None:
                    raise RuntimeError(f"the {engine} engine stopped: {log_path.read_text()}")
                time.sleep(0.5)
            generator = subprocess.Popen(
                [*cli, "generate", "--follow", "--rate", str(rate), "--output", str(inbox),
                 "--file-ms", str(min(1_000, lateness_ms))],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
            started = time.monotonic()
            run.started_ms = time.time_ns() // 1_000_000
            delays = _Delays(output / "outcomes", run)
            delays.start()
            cpu_before = _cpu_s([service.pid, *_descendants(service.pid)])
            try:
                for minute in range(1, int(minutes) + 1):
                    while time.monotonic() < started + 60 * minute:
                        if service.poll() is not None:
                            raise RuntimeError(f"the {engine} engine stopped: "
                                               f"{log_path.read_text()[-3000:]}")
                        time.sleep(1)
                    values = _scrape(port)
                    children = _descendants(service.pid)
                    jvms = [pid for pid in children if _is_jvm(pid)]
                    cpu_now = _cpu_s([service.pid, *children])
                    run.minutes.append(Minute(
                        minute, values.get("pending", float("nan")),
                        values.get("held", float("nan")),
                        values.get("lag_ms", float("nan")),
                        values.get("state_bytes", float("nan")) / 1e6,
                        _du_mb(output / "_checkpoint"), _rss_mb(service.pid),
                        sum(_rss_mb(pid) for pid in jvms),
                        sum(_rss_mb(pid) for pid in children if pid not in jvms),
                        cpu_now - cpu_before))
                    cpu_before = cpu_now
                    m = run.minutes[-1]
                    progress(f"{engine}, minute {minute}: {m.pending:,.0f} pending, lag "
                             f"{m.lag_ms:,.0f} ms, RSS {m.engine_rss_mb:,.0f} MB, JVM "
                             f"{m.jvm_rss_mb:,.0f} MB, workers {m.workers_rss_mb:,.0f} MB")
                run.rows = int(_scrape(port).get("rows_in_total", 0))
            finally:
                generator.send_signal(signal.SIGTERM)
                generator.wait(timeout=60)
                service.send_signal(signal.SIGTERM)
                try:
                    run.exit_code = service.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    service.kill()
                    run.exit_code = service.wait()
                delays.stop.set()
                delays.join()
    return run


def _quantiles(values: list[int]) -> str:
    if not values:
        return "n/a | n/a | n/a"
    ordered = sorted(values)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{p50:,.0f} | {p99:,.0f} | {ordered[-1]:,.0f}"


def follow_table(runs: list[FollowRun]) -> str:
    lines = ["| engine | expiries | p50 ms | p99 ms | max ms | completions | p50 ms | p99 ms "
             "| max ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        lines.append(f"| {run.engine} | {len(run.expiry_ms):,} | {_quantiles(run.expiry_ms)} "
                     f"| {len(run.completion_ms):,} | {_quantiles(run.completion_ms)} |")
    lines += ["", "| engine | minute | expiries | their p99 ms | pending | held | lag ms "
              "| state MB | checkpoint MB | engine RSS MB | JVM RSS MB | workers' RSS MB "
              "| CPU s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        for m in run.minutes:
            within = _expiries_in_minute(run, m.minute)
            p99 = _quantiles(within).split(" | ")[1]
            lines.append(f"| {run.engine} | {m.minute} | {len(within):,} | {p99} "
                         f"| {m.pending:,.0f} | {m.held:,.0f} "
                         f"| {m.lag_ms:,.0f} | {m.state_mb:,.1f} | {m.checkpoint_mb:,.1f} "
                         f"| {m.engine_rss_mb:,.0f} "
                         f"| {m.jvm_rss_mb:,.0f} | {m.workers_rss_mb:,.0f} "
                         f"| {m.cpu_s:,.1f} |")
    return "\n".join(lines)


def _expiries_in_minute(run: FollowRun, minute: int) -> list[int]:
    """The delays of the expiries whose files were written in that minute of the run
    (the first is 1): whether the tail is start-up's or the steady state's."""
    start = run.started_ms + (minute - 1) * 60_000
    return [delay for delay, written in zip(run.expiry_ms, run.expiry_written_ms,
                                            strict=True)
            if start <= written < start + 60_000]
