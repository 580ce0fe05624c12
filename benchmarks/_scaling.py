"""Scaling benchmark: the pipeline's per-partition logic without Spark (see
:mod:`tickwheel.pipeline.engines.partitioned`) at several partition counts, on one generated
log.

Every partition of both stages runs in turn in this process, with the collector paused
as the engine's workers pause it. For each count it reports the CPU of all partitions
(cutting the input into partitions included), the slowest partition's CPU and its
share, and what the shuffles carry per input event: rows, and bytes as marshal'd.
Medians over ``repeat`` rounds, each of which runs every count once; the ratio is to
the first count.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tickwheel.pipeline.engines.partitioned import run_partitioned
from tickwheel.pipeline.state.collector import collector_paused
from tickwheel.pipeline.tools.generator import GeneratorConfig, write_event_log

__all__ = ["ScalingRow", "run_scaling", "scaling_table"]


@dataclass(frozen=True)
class ScalingRow:
    design: str
    partitions: int
    total_cpu_s: float
    slowest_cpu_s: float
    rows_per_event: float
    bytes_per_event: float
    #: The runs of row times the stages exchange once a batch (the whole log here):
    #: they grow with the partitions squared and the log's gaps, not with its rows.
    runs_bytes: int = 0

    @property
    def slowest_share(self) -> float:
        return self.slowest_cpu_s / self.total_cpu_s


def _two_stages(lines: list[str], partitions: int) -> tuple[float, float, int, int, int]:
    result = run_partitioned(lines, partitions)
    return (result.total_cpu_s, max(result.partition_cpu_s), result.shuffled_rows,
            result.shuffled_bytes, result.runs_bytes)


DESIGNS: dict[str, Callable[[list[str], int], tuple[float, float, int, int, int]]] = {
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
        totals: dict[int, list[float]] = {count: [] for count in partitions}
        slowest: dict[int, list[float]] = {count: [] for count in partitions}
        shuffled: dict[int, tuple[int, int, int]] = {}
        # Each round runs every count once, so a machine that slows down for a while
        # slows every count alike instead of the counts that ran in that while.
        for round_ in range(repeat):
            for count in partitions:
                gc.collect()  # each run starts from the same heap
                with collector_paused():
                    total, slow, shuffled_rows, shuffled_bytes, runs_bytes = run(lines, count)
                shuffled[count] = (shuffled_rows, shuffled_bytes, runs_bytes)
                totals[count].append(total)
                slowest[count].append(slow)
                progress(f"{design}, round {round_ + 1}/{repeat}, {count} partitions: "
                         f"{total:.2f} s CPU, slowest {slow:.2f} s")
        for count in partitions:
            shuffled_rows, shuffled_bytes, runs_bytes = shuffled[count]
            rows.append(ScalingRow(design, count, statistics.median(totals[count]),
                                   statistics.median(slowest[count]),
                                   shuffled_rows / len(lines), shuffled_bytes / len(lines),
                                   runs_bytes))
    return rows


def scaling_table(rows: list[ScalingRow]) -> str:
    lines = ["| design | partitions | CPU, all | ratio | slowest partition | its share "
             "| shuffled rows/event | shuffled bytes/event | row-time runs, bytes a batch |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    first: dict[str, ScalingRow] = {}
    for row in rows:
        base = first.setdefault(row.design, row)
        lines.append(f"| {row.design} | {row.partitions} | {row.total_cpu_s:.2f} s "
                     f"| {row.total_cpu_s / base.total_cpu_s:.2f}x "
                     f"| {row.slowest_cpu_s:.2f} s | {row.slowest_share:.0%} "
                     f"| {row.rows_per_event:.2f} | {row.bytes_per_event:.0f} "
                     f"| {row.runs_bytes:,} |")
    return "\n".join(lines)
