"""EntryFiles: a partition's :class:`~tickwheel.pipeline.state.entry_log.EntryLog` kept
in a file of the local engine's checkpoint.

The file is a :class:`~tickwheel.pipeline.state.batch_log.BatchLog` whose records are the
chunks, each ``[entries, base64 chunk]``: a batch appends the chunks of the entries it
changed, and a rewrite replaces the file whole (written, then renamed) once the state
of the batch that called for it has committed, so that a crash in between leaves the
log as the committed state relies on it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tickwheel.pipeline.state.batch_log import BatchLog
from tickwheel.pipeline.state.entry_log import Entry, EntryLog, EntryWrite

__all__ = ["EntryFiles"]


class EntryFiles:
    """The log at ``path``: :attr:`batches` is the file, :attr:`log` what it holds."""

    def __init__(self, path: Path) -> None:
        self.batches = BatchLog(path)
        self.log = EntryLog()

    def read(self, committed: int) -> list[Entry]:
        """The entries held after the batches up to ``committed``, each id's latest."""
        records = self.batches.read(committed)
        chunks = []
        for number, record in enumerate(records):
            if (not isinstance(record, list) or len(record) != 2
                    or not isinstance(record[1], str)):
                raise ValueError(f"a record of {self.batches.path} is not a chunk of entries")
            chunks.append((number, base64.b64decode(record[1], validate=True)))
        self.log, held = EntryLog.read(chunks)
        return list(held.items())

    def append(self, batch_id: int, changed: list[Entry],
               size: Callable[[Entry], int]) -> None:
        """Write a batch's changed entries (none: nothing is written)."""
        self._write(batch_id, self.log.append(changed, size))

    def rewrite_if_due(self, batch_id: int, held: int, everything: Callable[[], list[Entry]],
                       size: Callable[[Entry], int]) -> bool:
        """Rewrite the file as ``everything()`` held if it holds more than twice the
        ``held`` entries (plus the slack); call it once ``batch_id`` has committed."""
        if not self.log.rewrite_due(held):
            return False
        self._write(batch_id, self.log.rewrite(everything(), size))
        return True

    def _write(self, batch_id: int, write: EntryWrite) -> None:
        records: list[Any] = [[chunk.entries, base64.b64encode(chunk.blob).decode("ascii")]
                              for chunk in write.chunks]
        if write.rewrite:
            self.batches.rewrite(batch_id, records)
        else:
            self.batches.append(batch_id, records)
