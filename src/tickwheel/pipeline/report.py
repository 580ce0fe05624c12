"""Summaries of an engine's outputs: outcomes by kind, latency percentiles, quarantine."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from tickwheel.pipeline.io import read_parquet_rows

__all__ = ["Summary", "kind_of", "summarize"]


def kind_of(op_id: str) -> str:
    """The operation kind of an id such as ``produce-17`` (its part before the last
    dash), or the whole id."""
    head, _, tail = op_id.rpartition("-")
    return head if head and tail.isdigit() else op_id


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


@dataclass(frozen=True)
class Summary:
    outcomes: dict[str, dict[str, int]]  # kind -> outcome -> count
    latency: dict[str, tuple[int, int, int, int]]  # kind -> p50, p90, p99, max (ms)
    quarantine: dict[str, int]  # reason -> count

    @property
    def total_outcomes(self) -> int:
        return sum(sum(v.values()) for v in self.outcomes.values())


def summarize(output: Path) -> Summary:
    outcomes = read_parquet_rows(output / "outcomes")
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    latencies: dict[str, list[int]] = defaultdict(list)
    for row in outcomes:
        kind = kind_of(row["op_id"])
        by_kind[kind][row["outcome"]] += 1
        latencies[kind].append(row["latency_ms"])
    quarantine = Counter(r["reason"] for r in read_parquet_rows(output / "quarantine"))
    latency = {}
    for kind, values in latencies.items():
        values.sort()
        latency[kind] = (_percentile(values, 0.5), _percentile(values, 0.9),
                         _percentile(values, 0.99), values[-1])
    return Summary({k: dict(v) for k, v in sorted(by_kind.items())}, dict(sorted(
        latency.items())), dict(sorted(quarantine.items())))
