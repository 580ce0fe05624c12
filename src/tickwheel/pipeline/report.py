"""Summaries of an engine's outputs: outcomes by kind, latency percentiles, quarantine."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from tickwheel.pipeline.io import read_parquet_rows

__all__ = ["Summary", "kind_of", "plot", "summarize"]


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


OUTCOME_COLOURS = {"completed": "#2a9d8f", "expired": "#e76f51", "cancelled": "#8d99ae",
                   "error": "#9b2226"}


def plot(output: Path, path: Path | None = None) -> Path:
    """Write a PNG: the latency distribution per operation kind, and outcomes over event
    time. Needs matplotlib (``pip install 'tickwheel[cli]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("plots need matplotlib: pip install 'tickwheel[cli]'") from exc
    rows = read_parquet_rows(output / "outcomes")
    path = output / "report.png" if path is None else path
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    by_kind: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        by_kind[kind_of(row["op_id"])].append(max(1, row["latency_ms"]))
    top = max((max(v) for v in by_kind.values()), default=1)
    edges = [1.0]
    while edges[-1] < top:
        edges.append(edges[-1] * 1.25)
    for kind, values in sorted(by_kind.items()):
        left.hist(values, bins=edges, histtype="step", linewidth=1.6,
                  label=f"{kind} ({len(values):,})")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("latency (ms, registration to outcome; 0 is drawn at 1)")
    left.set_ylabel("operations")
    left.set_title("latency per operation kind")
    left.legend(fontsize=8)
    if rows:
        start = min(r["resolved_ms"] for r in rows)
        end = max(r["resolved_ms"] for r in rows)
        width = max(1, (end - start) // 60 + 1)
        counts: dict[str, list[int]] = {o: [0] * 60 for o in OUTCOME_COLOURS}
        for r in rows:
            counts[r["outcome"]][min(59, (r["resolved_ms"] - start) // width)] += 1
        xs = [(start + i * width - start) / 1000 for i in range(60)]
        bottom = [0] * 60
        for outcome, colour in OUTCOME_COLOURS.items():
            right.bar(xs, counts[outcome], width=width / 1000, bottom=bottom, color=colour,
                      label=outcome, align="edge")
            bottom = [b + c for b, c in zip(bottom, counts[outcome], strict=True)]
        right.set_ylim(0, max(bottom) * 1.25 + 1)
    right.set_xlabel("event time (s from the first outcome)")
    right.set_ylabel("outcomes")
    right.set_title("outcomes over event time")
    right.legend(fontsize=8, loc="upper center", ncol=4)
    fig.suptitle(f"{len(rows):,} outcomes from {output}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
