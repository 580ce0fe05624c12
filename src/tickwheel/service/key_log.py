"""KeyLog: the idempotency keys of a submit server's commits, on disk, never rewritten.

A record per commit (the file it landed as, when, and each request's key, body digest,
rows and stamp) is appended, synced (``O_DSYNC``), to the open segment,
``keys-<number>.jsonl``; a segment is closed at :data:`SEGMENT_BYTES` and a new one
opened, and each start opens a new one. A segment goes as a whole once none of its keys
is kept any more (:meth:`KeyLog.remove`). Nothing is rewritten, so a commit never waits
for a copy of every key kept, which a single file would need to shed the old ones.

Only the newest segment at a start can end in a record that does not count: torn by a
crash, or naming a file that never landed (the writer is serial, so a crash between the
key's record and its file leaves that record last). :meth:`KeyLog.load` cuts such a
tail off, durably, before the segment after it exists, so that every older segment is
whole and landed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tickwheel.pipeline.io.files import fsync_directory, read_bytes_nofollow, truncate_nofollow

__all__ = ["SEGMENT_BYTES", "KeyLog", "KeyRecord", "KeyedRequest"]

log = logging.getLogger(__name__)

#: A segment is closed once it holds this much (about 40,000 keys).
SEGMENT_BYTES: Final = 4 << 20
_SEGMENT = re.compile(r"keys-(\d{9})\.jsonl")
#: A name no tickwheel writes: the layout before segments, never released. It is refused
#: as checkpoints in another format are (tickwheel.pipeline.state.encoding), not read.
_UNSEGMENTED = "keys.jsonl"
#: Appends durable when they return (``O_DSYNC``): one call per record gives up the
#: interpreter's lock, not a write and an fsync.
_DSYNC: Final = getattr(os, "O_DSYNC", 0)
_CREATE_FLAGS: Final = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _DSYNC
                        | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))


@dataclass(frozen=True, slots=True)
class KeyedRequest:
    """One request's key, the digest of its body, and its receipt's rows and stamp."""

    key: str
    digest: str
    accepted: int
    ts_ms: int


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """The keyed requests of one commit, landed as ``file`` at ``at`` (wall ms)."""

    file: str
    at: int
    requests: tuple[KeyedRequest, ...]

    def encode(self) -> bytes:
        keys = [[r.key, r.digest, r.accepted, r.ts_ms] for r in self.requests]
        return (json.dumps({"file": self.file, "at": self.at, "keys": keys},
                           separators=(",", ":")) + "\n").encode()

    @classmethod
    def decode(cls, raw: bytes) -> KeyRecord:
        """A record, or ValueError (torn, or not one of ours)."""
        try:
            fields = json.loads(raw)
            requests = tuple(KeyedRequest(str(key), str(digest), int(accepted), int(ts))
                             for key, digest, accepted, ts in fields["keys"])
            return cls(str(fields["file"]), int(fields["at"]), requests)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a key record: {exc}") from None


class KeyLog:
    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._fd: int | None = None  # the open segment's, appended to unbuffered
        self.number = -1  # the open segment's
        self._size = self._last_mark = 0

    def _path(self, number: int) -> Path:
        return self.directory / f"keys-{number:09d}.jsonl"

    def segments(self) -> list[int]:
        """The numbers of the segments on disk, oldest first."""
        if os.path.lexists(self.directory / _UNSEGMENTED):
            raise ValueError(f"{self.directory / _UNSEGMENTED}: a key file in a layout "
                             "this version does not read; give the service a new "
                             "directory")
        return sorted(int(match.group(1)) for name in os.listdir(self.directory)
                      if (match := _SEGMENT.fullmatch(name)) is not None)

    def load(self, landed: Callable[[str], bool]) -> list[tuple[int, list[KeyRecord]]]:
        """Every segment's number and the records in it that count, oldest first; then
        a new segment is open for :meth:`append`. ``landed`` tells whether a record's
        file landed (asked only of the newest segment's last record)."""
        numbers = self.segments()
        loaded = [(number, self._read(number, number == numbers[-1], landed))
                  for number in numbers]
        self.number = numbers[-1] if numbers else -1
        self._open_next()
        return loaded

    def _read(self, number: int, newest: bool, landed: Callable[[str], bool],
              ) -> list[KeyRecord]:
        path = self._path(number)
        try:
            data = read_bytes_nofollow(path)
        except (ValueError, IsADirectoryError) as exc:  # planted in the checkpoint
            raise ValueError(f"{path}: not a key segment of this server ({exc})") from None
        records: list[KeyRecord] = []
        ends: list[int] = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            try:
                if end < 0:
                    raise ValueError("no end of line")
                records.append(KeyRecord.decode(data[start:end]))
            except ValueError:
                log.warning("%s: a torn record at byte %d, dropped with what follows",
                            path, start)
                break
            ends.append(end + 1)
            start = end + 1
        if newest and records and not landed(records[-1].file):
            records.pop()  # its file is not in the input: it answers no request
            ends.pop()
        keep = ends[-1] if ends else 0
        if keep < len(data):
            if not newest:
                raise OSError(f"{path}: {len(data) - keep:,} bytes past its last record, "
                              "in a segment that a start should have cut short")
            truncate_nofollow(path, keep)
        return records

    def _open_next(self) -> None:
        self.close()
        self.number += 1
        self._fd = os.open(self._path(self.number), _CREATE_FLAGS, 0o666)
        self._size = self._last_mark = 0
        fsync_directory(self.directory)

    def append(self, record: KeyRecord) -> int:
        """``record`` on disk (synced); the number of its segment. On an OSError the
        segment holds only the records before it."""
        if self._fd is None:
            raise ValueError("load() the log before appending to it")
        if self._size >= self.segment_bytes:
            self._open_next()
        fd = self._fd
        assert fd is not None
        data = memoryview(record.encode())
        mark = self._size
        try:
            written = 0
            while written < len(data):  # unbuffered: a failed write leaves nothing behind
                written += os.write(fd, data[written:])
            if not _DSYNC:
                os.fsync(fd)
        except BaseException:
            self._cut(mark)
            raise
        self._size, self._last_mark = mark + len(data), mark
        return self.number

    def take_back(self) -> None:
        """The record appended last cut off the open segment: its keys must not be
        answered as written (its file did not land)."""
        self._cut(self._last_mark)

    def _cut(self, size: int) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, size)  # shrinking a file needs no free space
        os.fsync(self._fd)
        self._size = size

    def remove(self, number: int) -> None:
        """A segment whose keys are all forgotten, gone (never the open one)."""
        if number == self.number:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(number))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
