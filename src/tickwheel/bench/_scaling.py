"""Scaling benchmark: the pipeline's per-partition logic without Spark, at several
partition counts, for two designs on one generated log.

- *shards*: partitions of the op-id space only (:mod:`tickwheel.pipeline.shard`),
  where every update and tick is copied to every shard;
- *two stages*: a partition of the key space, then one of the op-id space
  (:mod:`tickwheel.pipeline.partitioned`), where an update goes to one partition.

Every partition runs in turn in this process, with the collector paused as the
engine's workers pause it. For each count it reports the CPU of all partitions
(cutting the input into partitions included), the slowest partition's CPU and its
share, and what the shuffles carry per input event: rows, and bytes as marshal'd.
Medians over ``repeat`` rounds; the ratio is to the same design at the first count.
"""

from __future__ import annotations

import gc
import marshal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tickwheel.pipeline.generator import GeneratorConfig, write_event_log
from tickwheel.pipeline.partitioned import run_partitioned
from tickwheel.pipeline.shard import Shard, pack

__all__ = ["ScalingRow", "run_scaling", "scaling_table"]


@dataclass(frozen=True)
class ScalingRow:
    design: str
    partitions: int
    total_cpu_s: float
    slowest_cpu_s: float
    rows_per_event: float
    bytes_per_event: float

    @property
    def slowest_share(self) -> float:
        return self.slowest_cpu_s / self.total_cpu_s


@contextmanager
def _collector_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _shards(lines: list[str], shards: int) -> tuple[float, float, int, int]:
    """(total CPU, slowest shard's CPU, shuffled rows, shuffled bytes)."""
    started = time.process_time()
    chunks = pack(lines, shards)
    total = time.process_time() - started
    rows = size = 0
    slowest = 0.0
    for shard_id, _low, top, own, shared in chunks:
        rows += len(marshal.loads(own)) + len(marshal.loads(shared))
        size += len(own) + len(shared)
        started = time.process_time()
        shard = Shard(shard_id)
        shard.take(own, shared, 0, top)
        end = shard.end_of_input_ms()
        if end is not None:
            shard.release(end)
        spent = time.process_time() - started
        total += spent
        slowest = max(slowest, spent)
    return total, slowest, rows, size


def _two_stages(lines: list[str], partitions: int) -> tuple[float, float, int, int]:
    result = run_partitioned(lines, partitions)
    return (result.total_cpu_s, max(result.partition_cpu_s), result.shuffled_rows,
            result.shuffled_bytes)


DESIGNS: dict[str, Callable[[list[str], int], tuple[float, float, int, int]]] = {
    "shards": _shards,
    "two stages": _two_stages,
}


def run_scaling(events: int, partitions: list[int], repeat: int,
                progress: Callable[[str], None]) -> list[ScalingRow]:
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-scaling-") as tmp:
        log = Path(tmp) / "events"
        progress(f"generating {events:,} events (seed 7)")
        write_event_log(GeneratorConfig(events=events, seed=7), log)
        lines = [line for path in sorted(log.glob("*.jsonl"))
                 for line in path.read_text().splitlines()]
    rows: list[ScalingRow] = []
    for design, run in DESIGNS.items():
        for count in partitions:
            totals, slowest = [], []
            shuffled_rows = shuffled_bytes = 0
            for _ in range(repeat):
                with _collector_paused():
                    total, slow, shuffled_rows, shuffled_bytes = run(lines, count)
                totals.append(total)
                slowest.append(slow)
            row = ScalingRow(design, count, statistics.median(totals),
                             statistics.median(slowest), shuffled_rows / len(lines),
                             shuffled_bytes / len(lines))
            progress(f"{design}, {count} partitions: {row.total_cpu_s:.2f} s CPU, slowest "
                     f"{row.slowest_cpu_s:.2f} s")
            rows.append(row)
    return rows


def scaling_table(rows: list[ScalingRow]) -> str:
    lines = ["| design | partitions | CPU, all | ratio | slowest partition | its share "
             "| shuffled rows/event | shuffled bytes/event |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    first: dict[str, ScalingRow] = {}
    for row in rows:
        base = first.setdefault(row.design, row)
        lines.append(f"| {row.design} | {row.partitions} | {row.total_cpu_s:.2f} s "
                     f"| {row.total_cpu_s / base.total_cpu_s:.2f}x "
                     f"| {row.slowest_cpu_s:.2f} s | {row.slowest_share:.0%} "
                     f"| {row.rows_per_event:.2f} | {row.bytes_per_event:.0f} |")
    return "\n".join(lines)
