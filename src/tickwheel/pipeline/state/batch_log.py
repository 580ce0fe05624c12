"""BatchLog: an append-only log of records in batches, for what a checkpoint must keep
besides its state (the input files read, the op ids seen, the input files numbered).

One JSON line per batch, ``[batch_id, [record, ...]]``, fsync'd per append. A line per
batch, not per record, so that the standard library's encoder writes a whole batch in
one call; a rewrite of the whole log writes lines of a few thousand records, all with
its batch id. A line torn by a crash is cut off on reading:
its batch never committed, and runs again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tickwheel.pipeline.io.files import (
    append_synced,
    read_bytes_nofollow,
    truncate_nofollow,
    write_bytes_atomically,
)

__all__ = ["REWRITE_LINE_RECORDS", "BatchLog"]

#: The most records in one line of a rewritten log (a batch's own line may hold more).
REWRITE_LINE_RECORDS = 8_192


class BatchLog:
    """The log at ``path``. ``records`` counts the records it holds (committed or
    not), so that its owner knows when a rewrite pays; ``last_batch`` is the largest
    batch id in it (-1 for none), and ``last_committed`` the largest that :meth:`read`
    took (-1 for none): its owner can tell a log cut short from a whole one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        self.last_batch = -1
        self.last_committed = -1

    def read(self, committed: int | None = None, *, repair: bool = True) -> list[Any]:
        """The records of the batches up to ``committed`` (all, for None), in order. A
        restart takes the records of committed batches only: a later batch runs again
        and writes its own again. ``repair=False`` reads a log another process may be
        appending to: a line not yet whole is skipped, not cut off."""
        try:
            text = read_bytes_nofollow(self.path)
        except FileNotFoundError:
            return []
        whole = text.rfind(b"\n") + 1
        if whole < len(text) and repair:  # torn by a crash: its batch never committed
            truncate_nofollow(self.path, whole)
        records: list[Any] = []
        count = 0
        for line in text[:whole].decode("utf-8").splitlines():
            batch, batch_records = json.loads(line)
            count += len(batch_records)
            self.last_batch = max(self.last_batch, batch)
            if committed is None or batch <= committed:
                records += batch_records
                self.last_committed = max(self.last_committed, batch)
        self.records = count
        return records

    def short_of(self, last_batch: int) -> str | None:
        """What the log, as :meth:`read` found it, lacks of a state that relied on it
        holding batches up to ``last_batch``: its path and why, or None."""
        if not self.path.exists():
            return f"{self.path} (missing)"
        if self.last_committed < last_batch:
            return (f"{self.path} (cut short: its last batch is {self.last_committed}, not "
                    f"{last_batch})")
        return None

    def append(self, batch_id: int, records: list[Any]) -> None:
        """Add a batch's records (none: nothing is written)."""
        if not records:
            return
        # ensure_ascii (the default): a path's undecodable bytes, which Python holds as
        # lone surrogates, are written as escapes and come back as they were.
        append_synced(self.path, (json.dumps([batch_id, records]) + "\n").encode("ascii"))
        self.records += len(records)
        self.last_batch = max(self.last_batch, batch_id)

    def rewrite(self, batch_id: int, records: list[Any]) -> None:
        """The log as ``records`` alone (what the appended ones add up to), in lines of
        at most :data:`REWRITE_LINE_RECORDS` records: one encoder call over a million
        holds the interpreter for a second, and a thread beside the engine (a submit
        server) would wait that long; between lines it gets its turn."""
        lines = [json.dumps([batch_id, records[i:i + REWRITE_LINE_RECORDS]]) + "\n"
                 for i in range(0, max(len(records), 1), REWRITE_LINE_RECORDS)]
        write_bytes_atomically("".join(lines).encode("ascii"), self.path)
        self.records = len(records)
        self.last_batch = max(self.last_batch, batch_id)
