"""Where each row of the event log goes in the partitioned engine.

Two stages, each split into the same number of partitions (see
:mod:`tickwheel.pipeline.semantics.key_stage` and :mod:`tickwheel.pipeline.semantics.op_stage`):

- an update goes to the partition of its ``key`` (stage 1);
- a watch goes to the partition of its ``op_id`` (stage 2), and to the partition of
  each of its keys (stage 1; once per partition, however many of its keys are there);
- a cancel goes to the partition of its ``op_id`` (stage 2), and a schedule row
  (``schedule``, ``unschedule``, ``pause``, ``resume``) to the partition of its
  ``schedule_id``;
- a tick goes to stage 2's partition 0: it only moves time, which every partition
  learns from the largest ``ts_ms`` of each slice of input;
- a malformed row goes to stage 2's partition of its raw text, which quarantines it.

So a row travels to at most one partition per key it names plus one: its fan-out does
not grow with the partition count.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from tickwheel.pipeline.contract.events import (
    Q_RAW,
    T_TICK,
    T_UPDATE,
    T_WATCH,
    W_KEY,
    W_KEYS,
    W_OP_ID,
    W_PAYLOAD,
    W_TYPE,
    Wire,
    is_quarantined,
)

__all__ = ["partition_of", "route"]


def partition_of(text: str, partitions: int) -> int:
    """Stable across processes and runs (``hash()`` of a str is not)."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass")) % partitions


def route(rows: Iterable[Wire], partitions: int) -> tuple[list[list[Wire]], list[list[Wire]]]:
    """Rows in their wire form, cut into (stage 1's rows, stage 2's rows) per
    partition."""
    by_key: list[list[Wire]] = [[] for _ in range(partitions)]
    by_op: list[list[Wire]] = [[] for _ in range(partitions)]
    for fields in rows:
        if is_quarantined(fields):
            by_op[partition_of(fields[Q_RAW], partitions)].append(fields)
            continue
        kind = fields[W_TYPE]
        if kind == T_UPDATE:
            by_key[partition_of(fields[W_KEY], partitions)].append(fields)
        elif kind == T_WATCH:
            by_op[partition_of(fields[W_OP_ID], partitions)].append(fields)
            # Only the operation's partition delivers it: its keys' need no payload.
            keyed = fields if fields[W_PAYLOAD] is None else (*fields[:W_PAYLOAD], None)
            keys = fields[W_KEYS]
            if len(keys) == 1:
                by_key[partition_of(keys[0], partitions)].append(keyed)
            else:
                for where in {partition_of(key, partitions) for key in keys}:
                    by_key[where].append(keyed)
        elif kind == T_TICK:
            by_op[0].append(fields)
        else:  # a cancel or a schedule row: op_id holds its id
            by_op[partition_of(fields[W_OP_ID], partitions)].append(fields)
    return by_key, by_op
