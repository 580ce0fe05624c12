"""SubmitJournal: accepted requests landed as input files, and their idempotency keys.

A group commit writes the rows of every request in it as one JSON Lines file, whole,
synced and renamed into the input directory (then the directory fsync'd), named
``submit-<ms>-<seq>.jsonl`` so that names only grow. The engines read it as any other
input file. Only then is any request of it answered.

The keys of a commit's requests are appended to a :class:`~tickwheel.service.key_log.KeyLog`
(synced) *before* its file is written. The writer is serial, so only the log's last
record can name a file that never landed (a crash between the two writes): at start that
record counts only if its file, or a later one, is there. A key is answered again, not
written again, for ``key_ttl_ms`` and within the newest ``max_keys``; a segment of the
log goes once none of its keys is kept.

Once the engine has committed a file (its rows are in the checkpoint), the journal
retires it (:meth:`SubmitJournal.retire`), so that a long-running service's input
directory holds what the engine has not yet committed, not every request ever made.
The newest file stays: its name keeps names growing, and times stamped growing, across
a restart, and it tells that the journal's last record landed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tickwheel.pipeline.contract.events import Wire
from tickwheel.pipeline.engines.feed import FileStat
from tickwheel.pipeline.io.files import fsync_directory, write_bytes_atomically
from tickwheel.service.key_log import SEGMENT_BYTES, KeyedRequest, KeyLog, KeyRecord

__all__ = [
    "DEFAULT_KEY_TTL_MS",
    "DEFAULT_MAX_KEYS",
    "SUBMIT_PREFIX",
    "CommittedInputs",
    "HandOver",
    "JournalStats",
    "Receipt",
    "Submission",
    "SubmitJournal",
]

log = logging.getLogger(__name__)

SUBMIT_PREFIX: Final = "submit-"
DEFAULT_KEY_TTL_MS: Final = 24 * 3_600_000
DEFAULT_MAX_KEYS: Final = 1_000_000
_NAME = re.compile(r"submit-(\d{13})-(\d{6})\.jsonl")
_TEMPORARY = re.compile(r"\.submit-\d{13}-\d{6}\.jsonl\.[0-9a-f]{8}\.tmp")

# Where a kept key's tuple holds when it landed, and its key log segment.
_LANDED_AT: Final = 4
_SEGMENT_AT: Final = 5

#: Which of the named input files the engine has committed.
CommittedInputs = Callable[[Sequence[str]], Collection[str]]
#: An engine in the same process given a file's rows as landed (name, rows, the file's
#: stat), so that it need not parse again what the intake parsed.
HandOver = Callable[[str, list[Wire], FileStat], None]


@dataclass(frozen=True, slots=True)
class Receipt:
    """What an accepted request is answered with, and answered again on a retry."""

    file: str
    accepted: int
    ts_ms: int

    def as_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "file": self.file, "ts_ms": self.ts_ms}


@dataclass(frozen=True, slots=True)
class Submission:
    """One request's validated rows, with its idempotency key (if any) and the digest
    of its body (a key sent again with another body is refused, not replayed)."""

    lines: Sequence[str]
    key: str | None
    digest: str
    ts_ms: int
    rows: Sequence[Wire] | None = None  # the lines' wire form, for an engine alongside


@dataclass(frozen=True, slots=True)
class JournalStats:
    files: int
    rows: int
    keys: int
    retired: int  # files deleted once the engine committed them
    unretired: int  # files landed and still in the input directory


class SubmitJournal:
    def __init__(self, input_dir: Path, state_dir: Path, *, clock: Callable[[], int],
                 key_ttl_ms: int = DEFAULT_KEY_TTL_MS,
                 max_keys: int = DEFAULT_MAX_KEYS,
                 key_segment_bytes: int = SEGMENT_BYTES,
                 hand_over: HandOver | None = None) -> None:
        self.input_dir = input_dir
        self.state_dir = state_dir
        self._clock = clock
        self.key_ttl_ms = key_ttl_ms
        self.max_keys = max_keys
        self.hand_over = hand_over
        # key -> (body digest, file, rows, stamp, when landed, the key log's segment):
        # a plain tuple of strs and ints, which the collector stops tracking: a million
        # keys add nothing to the walk of its full collections.
        self._keys: OrderedDict[str, tuple[str, str, int, int, int, int]] = OrderedDict()
        self._segment_keys: dict[int, int] = {}  # keys kept, by segment
        self._last_name = (0, 0)
        self._files = self._rows = self._retired = 0
        self._landed: deque[str] = deque()  # in name order: the order they landed
        input_dir.mkdir(parents=True, exist_ok=True)
        state_dir.mkdir(parents=True, exist_ok=True)
        self._scan_input()
        self._key_log = KeyLog(state_dir, segment_bytes=key_segment_bytes)
        self._load_keys()

    # -- start -------------------------------------------------------------------

    def _scan_input(self) -> None:
        """The newest name landed before, so names keep growing; temporaries a crash
        left behind go (no reader takes them, and nothing was answered for them)."""
        landed: list[str] = []
        for entry in os.scandir(self.input_dir):
            match = _NAME.fullmatch(entry.name)
            if match is not None:
                landed.append(entry.name)
                self._last_name = max(self._last_name,
                                      (int(match.group(1)), int(match.group(2))))
            elif _TEMPORARY.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        self._landed.extend(sorted(landed))  # fixed width: name order is time order

    def _load_keys(self) -> None:
        cutoff = self._clock() - self.key_ttl_ms
        loaded = self._key_log.load(self._landed_file)
        for number, records in loaded:
            for record in records:
                if record.at < cutoff:
                    continue
                for request in record.requests:
                    self._remember(request, Receipt(record.file, request.accepted,
                                                    request.ts_ms), record.at, number)
        for number, _ in loaded:
            if number not in self._segment_keys:
                self._key_log.remove(number)  # none of its keys is kept

    def _landed_file(self, name: str) -> bool:
        """Whether the file ``name`` landed: it is there, or a later one is (it was
        retired; the newest file never is, and the writer is serial)."""
        return ((self.input_dir / name).exists()
                or (bool(self._landed) and name < self._landed[-1]))

    def _remember(self, request: KeyedRequest, receipt: Receipt, at: int,
                  segment: int) -> None:
        if request.key in self._keys:
            self._forget(request.key)
        self._keys[request.key] = (request.digest, receipt.file, receipt.accepted,
                                   receipt.ts_ms, at, segment)
        self._segment_keys[segment] = self._segment_keys.get(segment, 0) + 1
        while len(self._keys) > self.max_keys:
            self._forget(next(iter(self._keys)))

    def _forget(self, key: str) -> None:
        segment = self._keys.pop(key)[_SEGMENT_AT]
        left = self._segment_keys[segment] - 1
        if left:
            self._segment_keys[segment] = left
        else:
            del self._segment_keys[segment]
            self._key_log.remove(segment)

    def _expire(self) -> None:
        """Keys past their ttl forgotten: they are in landing order, so from the front."""
        cutoff = self._clock() - self.key_ttl_ms
        while self._keys:
            key, kept = next(iter(self._keys.items()))
            if kept[_LANDED_AT] >= cutoff:
                break
            self._forget(key)

    # -- running -----------------------------------------------------------------

    def replay(self, key: str) -> tuple[str, Receipt] | None:
        """(body digest, receipt) of a key already answered, or None."""
        found = self._keys.get(key)
        if found is None:
            return None
        digest, file, accepted, ts_ms, at, _ = found
        if at < self._clock() - self.key_ttl_ms:
            return None
        return digest, Receipt(file, accepted, ts_ms)

    def _next_name(self) -> str:
        now = max(self._clock(), self._last_name[0])
        seq = self._last_name[1] + 1 if now == self._last_name[0] else 0
        if seq > 999_999:  # a million files in one millisecond: take the next one
            now, seq = now + 1, 0
        self._last_name = (now, seq)
        return f"{SUBMIT_PREFIX}{now:013d}-{seq:06d}.jsonl"

    def land(self, batch: Sequence[Submission]) -> list[Receipt]:
        """Every submission of ``batch`` written, durably, as one input file; its
        receipts. OSError (a full disk, say) leaves nothing of it behind."""
        # Encoded first: a line no UTF-8 file can hold fails the commit before its keys
        # are logged.
        data = "".join(f"{line}\n" for s in batch for line in s.lines).encode()
        name = self._next_name()
        receipts = [Receipt(name, len(s.lines), s.ts_ms) for s in batch]
        at = self._clock()
        keyed = [(KeyedRequest(s.key, s.digest, r.accepted, r.ts_ms), r)
                 for s, r in zip(batch, receipts, strict=True) if s.key is not None]
        segment = (self._key_log.append(KeyRecord(name, at, tuple(k for k, _ in keyed)))
                   if keyed else None)
        try:
            write_bytes_atomically(data, self.input_dir / name)
            fsync_directory(self.input_dir)
        except BaseException:
            if segment is not None:
                self._key_log.take_back()
            with contextlib.suppress(OSError):  # landed but not synced: never answered
                (self.input_dir / name).unlink()
            raise
        if segment is not None:
            self._expire()
            for request, receipt in keyed:
                self._remember(request, receipt, at, segment)
        self._files += 1
        self._rows += sum(r.accepted for r in receipts)
        self._landed.append(name)
        self._hand_over(name, batch)
        return receipts

    def _hand_over(self, name: str, batch: Sequence[Submission]) -> None:
        if self.hand_over is None or any(s.rows is None for s in batch):
            return
        try:
            stat = os.stat(self.input_dir / name, follow_symlinks=False)
            self.hand_over(name, [row for s in batch for row in s.rows or ()],
                           FileStat(stat.st_size, stat.st_mtime_ns))
        except Exception:  # landed all the same: the engine reads the file instead
            log.exception("handing %s over to the engine", name)

    def retire(self, committed: CommittedInputs) -> int:
        """Delete the files landed that the engine has ``committed``, all but the
        newest; returns how many went (:meth:`take_retired`, then
        :meth:`delete_retired`)."""
        return self.delete_retired(self.take_retired(committed))

    def take_retired(self, committed: CommittedInputs) -> list[str]:
        """The files landed that the engine has ``committed``, all but the newest, for
        :meth:`delete_retired`. A file the engine has not committed stays, and so do
        those after it: the engines read the input in name order."""
        candidates = list(self._landed)[:-1]
        if not candidates:
            return []
        done = set(committed(candidates))
        taken: list[str] = []
        for name in candidates:
            if name not in done:
                break
            taken.append(name)
        return taken

    def delete_retired(self, names: Sequence[str]) -> int:
        """Delete ``names`` (from :meth:`take_retired`, not yet deleted) from the input
        directory, each counted among the files landed until it is gone; returns how
        many. One thread may call it while another lands files; an OSError leaves the
        names from the one that failed on for the next round."""
        for name in names:
            assert self._landed[0] == name, (self._landed[0], name)
            with contextlib.suppress(FileNotFoundError):  # someone else removed it
                os.unlink(self.input_dir / name)
            self._landed.popleft()  # the loop only appends at the other end
            self._retired += 1
        return len(names)

    @property
    def last_commit_ms(self) -> int:
        """The time in the newest file name landed, before a restart too: at least
        every ``ts_ms`` stamped before it."""
        return self._last_name[0]

    def stats(self) -> JournalStats:
        return JournalStats(self._files, self._rows, len(self._keys), self._retired,
                            len(self._landed))

    def close(self) -> None:
        self._key_log.close()


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
