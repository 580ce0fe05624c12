"""Summaries of an engine's outputs: outcomes by kind, latency percentiles, quarantine.

The outputs are read as Arrow columns, only those needed, and summed in Arrow and
numpy: a row never becomes a Python object, so a report of tens of millions of
outcomes takes the columns' memory, not ten times it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tickwheel.pipeline.io.outputs import count_outputs, read_output_table

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["MAX_KINDS", "OTHER_KINDS", "Summary", "kind_of", "plot", "summarize"]

#: Kinds a report shows; the rarer ones are counted together as OTHER_KINDS (ids
#: without a numeric suffix, such as UUIDs, are each a kind of their own).
MAX_KINDS = 12
OTHER_KINDS = "(other kinds)"
# kind_of's rule for an Arrow column (RE2): an occurrence's schedule id, then the
# part before a last dash followed by ASCII digits only.
_OCCURRENCE_PATTERN = r"(?s)^(.+)@[0-9]+$"
_KIND_PATTERN = r"(?s)^(.+)-[0-9]+$"


def _strip_number(op_id: str, mark: str) -> str:
    head, _, tail = op_id.rpartition(mark)
    return head if head and tail.isascii() and tail.isdigit() else op_id


def kind_of(op_id: str) -> str:
    """The operation kind of an id such as ``produce-17``: its part before the last
    dash when what follows is a number (ASCII digits), or else the whole id. An
    occurrence of a schedule (``job-3@1767225600000``) is of its schedule's kind."""
    return _strip_number(_strip_number(op_id, "@"), "-")


@dataclass(frozen=True)
class Summary:
    outcomes: dict[str, dict[str, int]]  # kind -> outcome -> count
    latency: dict[str, tuple[int, int, int, int]]  # kind -> p50, p90, p99, max (ms)
    quarantine: dict[str, int]  # reason -> count
    #: Occurrences of recurring schedules skipped by misfire policies (the fired rows'
    #: ``skipped``).
    skipped: int = 0

    @property
    def total_outcomes(self) -> int:
        return sum(sum(v.values()) for v in self.outcomes.values())

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON values: what ``tickwheel report --json`` prints."""
        return {
            "outcomes": self.total_outcomes,
            "kinds": {kind: {"outcomes": counts,
                             "latency_ms": dict(zip(("p50", "p90", "p99", "max"),
                                                    self.latency[kind], strict=True))}
                      for kind, counts in self.outcomes.items()},
            "quarantine": self.quarantine,
            "skipped": self.skipped,
        }


def _nearest_rank(count: int, q: float) -> int:
    """The index of the ``q`` quantile among ``count`` sorted values."""
    return min(count - 1, max(0, round(q * (count - 1))))


def _by_kind(output: Path, columns: list[str]) -> tuple[pa.Table, list[tuple[str, int, int]]]:
    """The outcomes' ``columns`` with a ``kind`` column, sorted by kind then latency,
    and each kind's (name, first row, rows) in that order, OTHER_KINDS last."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = read_output_table(output / "outcomes", ["op_id", *columns])
    kinds = pc.replace_substring_regex(
        pc.replace_substring_regex(table.column("op_id"), pattern=_OCCURRENCE_PATTERN,
                                   replacement=r"\1"),
        pattern=_KIND_PATTERN, replacement=r"\1")
    counts = pc.value_counts(kinds)
    if len(counts) > MAX_KINDS:
        ranked = pa.table({"kind": counts.field("values"), "rows": counts.field("counts")}
                          ).sort_by([("rows", "descending"), ("kind", "ascending")])
        kept = ranked.column("kind").slice(0, MAX_KINDS)
        kinds = pc.if_else(pc.is_in(kinds, value_set=kept.combine_chunks()), kinds,
                           OTHER_KINDS)
    # OTHER_KINDS last: false sorts before true.
    order = [("other", "ascending"), ("kind", "ascending")]
    table = (table.drop_columns(["op_id"]).append_column("kind", kinds)
             .append_column("other", pc.equal(kinds, OTHER_KINDS))
             .sort_by([*order, ("latency_ms", "ascending")]))
    groups = []
    first = 0
    for group in table.group_by(["other", "kind"], use_threads=False).aggregate(
            [("kind", "count")]).sort_by(order).to_pylist():
        groups.append((group["kind"], first, group["kind_count"]))
        first += group["kind_count"]
    return table, groups


def summarize(output: Path) -> Summary:
    import pyarrow.compute as pc

    table, groups = _by_kind(output, ["outcome", "latency_ms", "skipped"])
    latency = table.column("latency_ms")
    outcomes: dict[str, dict[str, int]] = {}
    percentiles: dict[str, tuple[int, int, int, int]] = {}
    for kind, first, rows in groups:
        part = table.slice(first, rows)
        counts = part.group_by("outcome", use_threads=False).aggregate(
            [("outcome", "count")]).sort_by("outcome").to_pylist()
        outcomes[kind] = {c["outcome"]: c["outcome_count"] for c in counts}
        p50, p90, p99 = (latency[first + _nearest_rank(rows, q)].as_py()
                         for q in (0.5, 0.9, 0.99))
        percentiles[kind] = (p50, p90, p99, latency[first + rows - 1].as_py())
    skipped = pc.sum(table.column("skipped")).as_py() or 0
    return Summary(outcomes, percentiles, count_outputs(output / "quarantine", "reason"),
                   skipped)


OUTCOME_COLOURS = {"completed": "#2a9d8f", "expired": "#e76f51", "cancelled": "#8d99ae",
                   "error": "#9b2226", "fired": "#e9c46a"}
_TIME_BARS = 60


def _title_text(path: Path) -> str:
    """``path`` as a plot title shows it: a byte that is not UTF-8 and a control
    character as escapes, and ``$`` literal (matplotlib reads ``$...$`` as math)."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode()
                   for c in text)
    return text.replace("$", r"\$")


def plot(output: Path, path: Path | None = None) -> Path:
    """Write a PNG: the latency distribution per operation kind, and outcomes over event
    time. Needs matplotlib (``pip install 'tickwheel[cli]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
        import pyarrow.compute as pc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("plots need matplotlib: pip install 'tickwheel[cli]'") from exc
    table, groups = _by_kind(output, ["outcome", "latency_ms", "resolved_ms"])
    path = output / "report.png" if path is None else path
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    latency: Any = np.maximum(1, table.column("latency_ms").to_numpy())
    top = int(latency.max()) if len(latency) else 1
    edges = [1.0]
    while edges[-1] < top:
        edges.append(edges[-1] * 1.25)
    for kind, first, rows in groups:
        counts, _ = np.histogram(latency[first:first + rows], bins=edges)
        left.stairs(counts, edges, linewidth=1.6, label=f"{kind} ({rows:,})")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("latency (ms, registration to outcome; 0 is drawn at 1)")
    left.set_ylabel("operations")
    left.set_title("latency per operation kind")
    if groups:
        left.legend(fontsize=8)
    if table.num_rows:
        resolved: Any = table.column("resolved_ms").to_numpy()
        start = int(resolved.min())
        width = max(1, (int(resolved.max()) - start) // _TIME_BARS + 1)
        bar = np.minimum(_TIME_BARS - 1, (resolved - start) // width)
        xs = [i * width / 1000 for i in range(_TIME_BARS)]
        bottom: Any = np.zeros(_TIME_BARS, dtype=np.int64)
        for name, colour in OUTCOME_COLOURS.items():
            mine = pc.equal(table.column("outcome"), name).to_numpy()
            counts = np.bincount(bar[mine], minlength=_TIME_BARS)
            right.bar(xs, counts, width=width / 1000, bottom=bottom, color=colour,
                      label=name, align="edge")
            bottom = bottom + counts
        right.set_ylim(0, int(bottom.max()) * 1.25 + 1)
        right.legend(fontsize=8, loc="upper center", ncol=4)
    right.set_xlabel("event time (s from the first outcome)")
    right.set_ylabel("outcomes")
    right.set_title("outcomes over event time")
    fig.suptitle(f"{table.num_rows:,} outcomes from {_title_text(output)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
