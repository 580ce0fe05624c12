"""SeenFiles: a partition's :class:`~tickwheel.pipeline.state.seen_log.SeenLog` kept in
a directory of the local engine's checkpoint.

The segments go into files, each a :class:`~tickwheel.pipeline.state.batch_log.BatchLog`
whose records are segments, ``[number, latest, base64 digest, base64 ids]``, named by
the number of its first. A file takes the segments of an eighth of the retention in
``ts_ms`` (:data:`FILES_PER_RETENTION`), so that a service with a long retention and a
batch a second keeps a handful of files, not one per batch; a file goes once every
segment in it is removed, after the commit of the batch that removed the last. The
log never merges its segments: many of them cost a file no more than few.

The state records the segments it relies on (:attr:`SeenLog.first` to
:attr:`SeenLog.next`), so that a reader takes those and deletes what a crash left
behind: segments removed by a committed batch, or written by a batch that never
committed.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tickwheel.pipeline.state.batch_log import BatchLog
from tickwheel.pipeline.state.seen_log import SeenLog, SeenSegment

__all__ = ["FILES_PER_RETENTION", "MIN_SPAN_MS", "SeenFiles"]

#: A file spans this fraction of the retention, so the files hold at most about
#: 1 + 1/8 of what the retention keeps.
FILES_PER_RETENTION = 8
#: The shortest span of a file, so that a short retention does not make a file per batch.
MIN_SPAN_MS = 1_000

_NAME = re.compile(r"(\d{10})\.log")


@dataclass(slots=True)
class _File:
    batches: BatchLog
    first_latest: int  # the latest ts_ms of its first segment
    last_number: int  # the number of its last segment


class SeenFiles:
    """The segments in ``directory`` for a partition with the dedupe retention
    ``retention_ms`` (None: ids are kept forever, all in one file). :attr:`log` is what
    they hold."""

    def __init__(self, directory: Path, retention_ms: int | None) -> None:
        self.directory = directory
        self.retention_ms = retention_ms
        self.span_ms = (None if retention_ms is None
                        else max(retention_ms // FILES_PER_RETENTION, MIN_SPAN_MS))
        self.log = SeenLog(merge_at=None, keeps_ids=False)
        self._files: dict[int, _File] = {}  # by the number of their first segment

    def read(self, committed: int, first: int, next_segment: int) -> dict[str, int]:
        """The ids of the segments ``first`` to ``next_segment`` (what the state of batch
        ``committed`` relies on), each with the ``ts_ms`` of its first watch, in the
        order first seen. Files that hold none of them are deleted."""
        self._files.clear()
        found: dict[int, SeenSegment] = {}
        for number, path in self._listing():
            batches = BatchLog(path)
            last = -1
            first_latest: int | None = None
            for record in batches.read(committed):
                seg_number, segment = _segment(record, path)
                if first_latest is None:
                    first_latest = segment.latest
                if first <= seg_number < next_segment:
                    found[seg_number] = segment  # a batch run again writes the same again
                    last = max(last, seg_number)
            if first_latest is None or last < 0:
                path.unlink()
                continue
            self._files[number] = _File(batches, first_latest, last)
        self.log = SeenLog.read(found.items(), next_segment, merge_at=None, keeps_ids=False)
        return self.log.hand_over_ids()

    def lacking(self, first: int, next_segment: int) -> list[str]:
        """What :meth:`read` did not find of the segments the state relies on."""
        if not 0 <= first <= next_segment:
            return [f"{self.directory} (the state names segments {first} to "
                    f"{next_segment - 1})"]
        # read() took only numbers in the range: counted, not listed, for any range.
        missing = next_segment - first - len(self.log.segments)
        if not missing:
            return []
        return [f"{self.directory} (missing {missing} of the segments {first} to "
                f"{next_segment - 1} that the state relies on)"]

    def append(self, batch_id: int, changes: list[tuple[str, int | None]], now: int | None,
               ) -> None:
        """Record a batch's changes at the partition's time ``now``: its new ids go to
        the open file, or to a new one once the open one spans the span."""
        write = self.log.record(changes, now, self.retention_ms)
        segment = write.segment
        if segment is None:
            return
        record: list[Any] = [write.number, segment.latest,
                             base64.b64encode(segment.digest).decode("ascii"),
                             base64.b64encode(segment.blob).decode("ascii")]
        open_file = self._files[max(self._files)] if self._files else None
        if open_file is None or (self.span_ms is not None
                                 and segment.latest - open_file.first_latest >= self.span_ms):
            self.directory.mkdir(parents=True, exist_ok=True)
            open_file = _File(BatchLog(self._path(write.number)), segment.latest, write.number)
            self._files[write.number] = open_file
        open_file.batches.append(batch_id, [record])
        open_file.last_number = write.number

    def drop_removed(self) -> int:
        """Delete the files whose segments are all removed; call it once the batch that
        removed them has committed. Returns how many went."""
        first = self.log.first
        gone = [number for number, file in self._files.items() if file.last_number < first]
        for number in gone:
            self._files.pop(number).batches.path.unlink(missing_ok=True)
        return len(gone)

    def _listing(self) -> list[tuple[int, Path]]:
        if not self.directory.exists():
            return []
        if not self.directory.is_dir():
            raise ValueError(f"{self.directory} is not a directory of seen op ids")
        numbered: list[tuple[int, Path]] = []
        for path in self.directory.iterdir():
            match = _NAME.fullmatch(path.name)
            # A symlink is refused: a checkpoint never makes a read leave its directory.
            if match is None or path.is_symlink() or not path.is_file():
                raise ValueError(f"{path} is not a file of seen op ids")
            numbered.append((int(match[1]), path))
        return sorted(numbered)

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:010d}.log"

    @property
    def files(self) -> int:
        """How many files there are."""
        return len(self._files)

    def size(self) -> int:
        """The bytes the files hold on disk."""
        return sum(file.batches.path.stat().st_size for file in self._files.values())


def _segment(record: object, path: Path) -> tuple[int, SeenSegment]:
    if (not isinstance(record, list) or len(record) != 4 or type(record[0]) is not int
            or type(record[1]) is not int or not isinstance(record[2], str)
            or not isinstance(record[3], str)):
        raise ValueError(f"{path} holds {record!r}, not a segment of seen op ids")
    return record[0], SeenSegment(base64.b64decode(record[3], validate=True),
                                  base64.b64decode(record[2], validate=True), record[1])
