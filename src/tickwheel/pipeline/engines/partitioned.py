"""The partitioned engine's logic in one process, without Spark: every partition of
both stages in turn, over a whole log at once, measured.

It is what the Spark engine distributes (stage 1 grouped by key partition, stage 2 by
op-id partition, the shuffles between them) and what the scaling benchmark times: the
CPU of each partition, and the rows and bytes each shuffle carries. Its outcomes are
the reference engine's on any log without late rows (the engine judges lateness by
its release point, which a run over a whole log has no need of).
"""

from __future__ import annotations

import itertools
import marshal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tickwheel.pipeline.contract.events import (
    Q_RAW,
    Q_REASON,
    Q_TS,
    W_TS,
    Quarantined,
    Reason,
    Wire,
    compact_wire,
    is_quarantined,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.contract.routing import partition_of, route
from tickwheel.pipeline.semantics.key_stage import KeyStage, Progress, key_order
from tickwheel.pipeline.semantics.op_stage import OpStage, op_order
from tickwheel.pipeline.semantics.row_times import merge_runs, runs_of, times_of

__all__ = ["PartitionedResult", "run_partitioned"]


@dataclass
class PartitionedResult:
    """Outcomes and counters of a run, and what it cost per partition."""

    partitions: int
    rows_in: int = 0
    rows_applied: int = 0
    pending: int = 0
    ignored_cancels: int = 0
    registered: int = 0  # stage 1 registrations left when the input ended
    outcomes: list[OutcomeRow] = field(default_factory=list)
    quarantine: list[Quarantined] = field(default_factory=list)
    route_cpu_s: float = 0.0
    key_cpu_s: list[float] = field(default_factory=list)  # per partition
    op_cpu_s: list[float] = field(default_factory=list)
    # What the shuffles carry: rows into stage 1, rows into stage 2 (input rows and
    # progress rows), and their bytes as marshal'd per partition.
    shuffled_rows: int = 0
    shuffled_bytes: int = 0
    progress_rows: int = 0
    # The runs of row times every stage 1 partition sends every stage 2 partition: a
    # cost per batch (partitions squared, times the log's gaps), not per row, in blocks
    # the shuffle has anyway, one per pair of partitions.
    runs_bytes: int = 0

    @property
    def partition_cpu_s(self) -> list[float]:
        """Each partition's CPU over both stages."""
        return [k + o for k, o in zip(self.key_cpu_s, self.op_cpu_s, strict=True)]

    @property
    def total_cpu_s(self) -> float:
        return self.route_cpu_s + sum(self.key_cpu_s) + sum(self.op_cpu_s)


def run_partitioned(lines: Iterable[str], partitions: int,
                    dedupe_retention_ms: int | None = None) -> PartitionedResult:
    """Resolve JSON Lines rows (blank lines are not rows) in ``partitions`` partitions
    of each stage, one after another; time ends at the latest row's ``ts_ms``."""
    result = PartitionedResult(partitions)
    started = time.process_time()
    rows = [compact_wire(line) for line in lines if line.strip()]
    result.rows_in = len(rows)
    end = max((fields[W_TS] for fields in rows if not is_quarantined(fields)), default=None)
    by_key, by_op = route(rows, partitions)
    result.route_cpu_s = time.process_time() - started
    del rows

    to_op: list[list[Progress]] = [[] for _ in range(partitions)]
    # Each stage 1 partition's row times (its rows', and those of the stage 2 partition
    # of its number), as runs, which every stage 2 partition takes: its schedules' clock.
    runs: list[list[int]] = []
    for p in range(partitions):
        _count_shuffled(result, by_key[p])
        started = time.process_time()
        runs.append(runs_of(itertools.chain(times_of(by_key[p]), times_of(by_op[p]))))
        stage = KeyStage(p, partitions)
        stage.apply(sorted(by_key[p], key=key_order))
        if end is not None and (stage.now is None or end > stage.now):
            stage.advance_to(end)
        for row in stage.drain():
            to_op[partition_of(row[2], partitions)].append(row)
        result.rows_applied += stage.applied
        result.registered += stage.registered
        result.key_cpu_s.append(time.process_time() - started)
    by_key.clear()

    for p in range(partitions):
        progress = to_op[p]
        result.progress_rows += len(progress)
        own: list[Wire | Progress] = [*by_op[p], *progress]
        _count_shuffled(result, own)
        result.runs_bytes += len(marshal.dumps(runs))
        started = time.process_time()
        result.quarantine.extend(Quarantined(fields[Q_RAW], Reason(fields[Q_REASON]), fields[Q_TS])
                                 for fields in by_op[p] if is_quarantined(fields))
        op = OpStage(dedupe_retention_ms=dedupe_retention_ms)
        op.schedules.row_times.extend(merge_runs(runs))
        op.apply_staged(sorted((fields for fields in own if not is_quarantined(fields)),
                               key=op_order))
        if end is not None and (op.now is None or end > op.now):
            op.advance_to(end)
        outcomes, duplicates = op.drain()
        result.outcomes.extend(outcomes)
        result.quarantine.extend(duplicates)
        result.rows_applied += op.applied
        result.pending += len(op.pending)
        result.ignored_cancels += op.ignored_cancels
        op.close()
        result.op_cpu_s.append(time.process_time() - started)
    return result


def _count_shuffled(result: PartitionedResult, rows: list[Wire] | list[Wire | Progress],
                    ) -> None:
    result.shuffled_rows += len(rows)
    result.shuffled_bytes += len(marshal.dumps(rows))
